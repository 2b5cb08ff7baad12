"""draftkit's vLLM plugin: the CPU `expand_kernel` fix, its registration as a vLLM general
plugin, and sampled (T=1) speculative decoding in a real vLLM-CPU engine."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

from draftkit.serving import vllm_plugin


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_into_matches_the_kernel_contract(dtype):
    x = torch.tensor([7, 0, 3, 5], dtype=dtype)
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)  # request 1 has no draft tokens
    out = torch.full((6,), -1, dtype=dtype)
    vllm_plugin.expand_into(out, x, cu, 0, 1)
    assert torch.equal(out, torch.tensor([7, 7, 3, 3, 3, 5], dtype=dtype))


def loses_float_writes(output, *args):
    """vllm-cpu 0.32.0's fallback: it fills an int64 copy of a float32/int32 output."""
    vllm_plugin.expand_into(output.to(torch.int64), *args)


def test_probe_tells_a_lost_write_from_a_working_kernel():
    assert vllm_plugin.expand_is_broken(loses_float_writes)
    assert not vllm_plugin.expand_is_broken(vllm_plugin.expand_into)


def test_registered_as_a_vllm_general_plugin():
    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("draftkit") == "draftkit.serving.vllm_plugin:register"


def test_plugin_fixes_vllms_temperature_expansion():
    """vLLM's own `expand_batch_to_tokens` through the CPU kernel registry, as the rejection
    sampler calls it for per-token temperatures."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    assert current_platform.is_cpu(), "tests run on vllm-cpu (`make setup` installs the cpu extra)"
    vllm_plugin.register()
    current_platform.register_triton_kernel_overrides()
    temperature = torch.tensor([0.7, 0.0, 1.3])
    cu = torch.tensor([2, 3, 5], dtype=torch.int32)
    for _ in range(3):  # uninitialised memory can be right by chance once
        got = expand_batch_to_tokens(temperature, cu, 5, replace_from=0, replace_to=1)
        assert torch.equal(got, torch.tensor([0.7, 0.7, 1.0, 1.3, 1.3]))


def test_register_replaces_only_a_broken_cpu_fallback(monkeypatch):
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils as cpu_tl

    monkeypatch.setattr(cpu_tl, "_expand_kernel_impl", loses_float_writes)
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    vllm_plugin.register()  # a GPU platform: untouched
    assert cpu_tl._expand_kernel_impl is loses_float_writes
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: True)
    vllm_plugin.register()
    assert cpu_tl._expand_kernel_impl is vllm_plugin.expand_into

    def fixed_upstream(*args, **kwargs):
        vllm_plugin.expand_into(*args, **kwargs)

    monkeypatch.setattr(cpu_tl, "_expand_kernel_impl", fixed_upstream)
    vllm_plugin.register()  # a working fallback is left alone
    assert cpu_tl._expand_kernel_impl is fixed_upstream


@pytest.mark.slow
@pytest.mark.vllm
def test_sampled_speculation_follows_the_target():
    """At T=1 the next numbers of a count are near-certain for the target: the text must stay
    a count and n-gram drafts must be accepted about as often as at T=0. With the unfixed kernel
    vLLM-CPU accepted nothing (AL 1.0) and wrote unrelated words."""
    from transformers import AutoTokenizer

    from draftkit.serving import speculative, vllm_engine
    from draftkit.targets.load import target_dir

    model = target_dir("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(model)
    prompt = tok("Count from 1 to 60: 1, 2, 3, 4, 5, 6, 7, 8,")["input_ids"]
    spec = vllm_engine.EngineSpec(str(model), speculative.ngram_config(3),
                                  dtype="float32", max_model_len=256, max_num_seqs=8)
    with vllm_engine.engine(spec) as llm:
        greedy = vllm_engine.measure(llm, [prompt] * 8, vllm_engine.sampling(0.0, 24), 8)
        sampled = vllm_engine.measure(llm, [prompt] * 8, vllm_engine.sampling(1.0, 24, seed=3), 8)
    texts = [tok.decode(t) for t in sampled["outputs"]]
    assert sum(t.startswith(" 9, 10, 11") for t in texts) >= 6, texts
    # Near-deterministic text: sampled verification accepts about what greedy does.
    assert greedy["spec"]["accepted"] > 0
    assert sampled["spec"]["accepted"] >= 0.6 * greedy["spec"]["accepted"], (greedy["spec"],
                                                                               sampled["spec"])
