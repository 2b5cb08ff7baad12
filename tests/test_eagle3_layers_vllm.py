"""A two-layer EAGLE-3 head (draft.num_layers=2) is served by vLLM as it is: the drafter holds
layer 1's tensors, and vLLM's acceptance counters match a replay of the same greedy generations
with our `Eagle3Draft.step` (one fp32 engine, the tiny target)."""

from __future__ import annotations

import json

import _runs
import pytest
import torch
from _runs import DRAFT, assert_al_matches_replay, make_run, probe_drafter, replay, save_best

from draftkit.core import config
from draftkit.export import stage as export
from draftkit.serving import speculative, vllm_engine

pytestmark = pytest.mark.vllm

K, GEN = 3, 40


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_target):
    prompts = _runs.chat_prompts(tiny_target.tokenizer, 8)
    run = make_run(tmp_path_factory.mktemp("r"), name="two-layers", prompts=prompts,
                   overrides=[*DRAFT, "draft.num_layers=2", "train.ttt_steps=3",
                              "eval.dtype=float32", f"eval.max_new_tokens={GEN}"])
    with _runs.one_thread():
        model, metrics = _runs.train_draft(run, tiny_target, prompts, new_tokens=GEN)
    save_best(run, model, metrics, step=150)
    out = export.export(run, ["export.check=false"])
    assert json.loads((out / "config.json").read_text())[
        "transformer_layer_config"]["num_hidden_layers"] == 2
    cfg = config.load(run)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
        import cloudpickle

        cloudpickle.register_pickle_by_value(_runs)  # probe_drafter
        spec = vllm_engine.run_engine_spec(cfg, None, prompts, batch_size=len(prompts))
        spec.speculative_config = speculative.export_config(out)
        with vllm_engine.engine(spec) as llm:
            greedy = vllm_engine.measure(llm, prompts, vllm_engine.sampling(0.0, GEN),
                                         batch_size=len(prompts))
            yield {"llm": llm, "model": model, "prompts": prompts, "greedy": greedy}


def test_vllm_drafter_holds_layer_one(served):
    got = served["llm"].collective_rpc(probe_drafter)[0]
    ours = served["model"].export_state_dict()
    p = "layers.1."
    pairs = {
        f"model.{p}self_attn.qkv_proj.weight": torch.cat(
            [ours[f"{p}self_attn.{x}_proj.weight"] for x in "qkv"]),
        f"model.{p}mlp.gate_up_proj.weight": torch.cat(
            [ours[f"{p}mlp.gate_proj.weight"], ours[f"{p}mlp.up_proj.weight"]]),
        f"model.{p}mlp.down_proj.weight": ours[f"{p}mlp.down_proj.weight"],
        f"model.{p}self_attn.o_proj.weight": ours[f"{p}self_attn.o_proj.weight"],
        f"model.{p}input_layernorm.weight": ours[f"{p}input_layernorm.weight"],
        f"model.{p}post_attention_layernorm.weight": ours[f"{p}post_attention_layernorm.weight"],
    }
    assert pairs[f"model.{p}self_attn.qkv_proj.weight"].shape[1] == 128  # H inputs, not 2H
    for name, value in pairs.items():
        assert name in got, f"{name} not in vLLM's drafter: {sorted(got)}"
        torch.testing.assert_close(got[name].float(), value.float(), atol=1e-6, rtol=0,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_vllm_acceptance_matches_our_two_layer_replay(served, tiny_target):
    greedy = served["greedy"]
    assert_al_matches_replay(greedy, [
        replay(served["model"], tiny_target, prompt, gen, K)
        for prompt, gen in zip(served["prompts"], greedy["outputs"], strict=True)])
