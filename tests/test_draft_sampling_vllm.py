"""draft.draft_sample_method reaches vLLM and does what it says at T > 0. With the target as
its own draft (method draft_model, q = p) probabilistic drafting is accepted almost always,
while greedy drafting is accepted only with the target's p(argmax): the tiny random target's
flat distributions make that rare. The trained EAGLE-3 export is served both ways too."""

from __future__ import annotations

import pytest
from _runs import DRAFT, chat_prompts, make_run, save_best

from draftkit.core import config
from draftkit.core.config import ConfigError
from draftkit.export import stage as export
from draftkit.serving import speculative, vllm_engine
from draftkit.targets.load import run_target_dir

K, PROMPTS, GEN = 3, 8, 32


def test_speculative_config_carries_the_sample_method():
    assert speculative.method_config("eagle3", K, "/d", "probabilistic") == {
        "method": "eagle3", "model": "/d", "num_speculative_tokens": K,
        "draft_sample_method": "probabilistic"}
    assert "draft_sample_method" not in speculative.method_config("draft-lm", K, "/d")
    with pytest.raises(ConfigError, match="draft.draft_sample_method='sampled'.*greedy"):
        speculative.method_config("eagle3", K, "/d", "sampled")


def _acceptance(cfg, prompts, method: str, draft, sample: str) -> float:
    """Accepted / drafted tokens at T=1 (engine seed eval.seed)."""
    spec = vllm_engine.run_engine_spec(
        cfg, speculative.method_config(method, K, draft, sample), prompts,
        batch_size=len(prompts))
    with vllm_engine.engine(spec) as llm:
        m = vllm_engine.measure(llm, prompts, vllm_engine.sampling(1.0, GEN),
                                batch_size=len(prompts))
    assert m["spec"] and m["spec"]["draft_tokens"] > 0, m["spec"]
    return m["spec"]["accepted"] / m["spec"]["draft_tokens"]


@pytest.mark.vllm
def test_probabilistic_drafting_accepts_a_matching_draft(tmp_path, tiny_target):
    prompts = chat_prompts(tiny_target.tokenizer, PROMPTS)
    run = make_run(tmp_path, prompts=prompts, overrides=["eval.dtype=float32"])
    cfg = config.load(run)
    target = run_target_dir(cfg.target)
    greedy = _acceptance(cfg, prompts, "draft-lm", target, "greedy")
    sampled = _acceptance(cfg, prompts, "draft-lm", target, "probabilistic")
    assert sampled > 0.9, (greedy, sampled)
    assert greedy < 0.5, (greedy, sampled)


@pytest.mark.vllm
def test_eagle3_export_drafts_probabilistically(tmp_path, trained_draft):
    """The session's trained head (conftest.trained_draft: the same DRAFT overrides,
    train.ttt_steps=3, 8 chat prompts, 40 new tokens; training does not read the sample
    method), exported by a run that drafts probabilistically."""
    prompts = trained_draft["prompts"]
    assert len(prompts) == PROMPTS
    run = make_run(tmp_path, prompts=prompts, name="sampled",
                   overrides=[*DRAFT, "train.ttt_steps=3", "eval.dtype=float32",
                              "draft.draft_sample_method=probabilistic"])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    out = export.export(run, ["export.check=false"])
    sc = speculative.export_config(out)
    assert sc["draft_sample_method"] == "probabilistic"
    cfg = config.load(run)
    greedy = _acceptance(cfg, prompts, "eagle3", out, "greedy")
    sampled = _acceptance(cfg, prompts, "eagle3", out, "probabilistic")
    print(f"eagle3 acceptance at T=1: greedy {greedy:.3f}, probabilistic {sampled:.3f}")
    assert sampled > greedy, (greedy, sampled)
