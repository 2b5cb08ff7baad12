"""Eval splits beyond the run's own (draftkit/eval/splits.py): new problems of the training
templates that are never a training prompt, and the shipped hand-written problems, rendered
like the run's eval prompts."""

from __future__ import annotations

import json

import pytest
from _runs import conversations, make_run, write_split

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.eval import splits
from draftkit.prepare import mathgen


def _prompt(tok, text: str) -> list[int]:
    return list(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=True)["input_ids"])


def test_splits_render_like_eval_prompts_and_skip_training_prompts(tmp_path, tiny_target):
    tok = tiny_target.tokenizer
    run = make_run(tmp_path, tok)
    cfg = config.load(run)
    first = mathgen.generate("train", 16, seed=10_000 + cfg.data.seed)
    trained = [p.question for p in first[:3]]  # the first three candidates are training prompts
    write_split(run, "train", tok, [[{"role": "user", "content": q},
                                     {"role": "assistant", "content": "x"}] for q in trained]
                + conversations(4, 0), "t")
    artifacts.write_json_atomic(run / "data" / "meta.json", {"stage": "prepare"})
    got = splits.build(run, cfg, 5)
    assert list(got) == list(splits.NAMES)
    assert got["seen-templates"] == [_prompt(tok, p.question) for p in first[3:8]]
    rows = [json.loads(line) for line in splits.HANDWRITTEN.read_text().splitlines()]
    assert len(rows) >= 24  # enough for a measurement
    assert got["hand-written"] == [_prompt(tok, r["prompt"]) for r in rows[:5]]
    assert len(got["unseen-templates"]) == 5
    with pytest.raises(DraftkitError, match="unknown eval splits"):
        splits.build(run, cfg, 5, ("hand-written", "handwritten"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok?"}\n{"question": "no prompt key"}\n')
    with pytest.raises(DraftkitError, match=r"lines \[2\]"):
        splits.hand_written(run, cfg, 5, path=bad)


def test_splits_carry_the_system_prompt_prepare_adds(tmp_path, tiny_target):
    tok = tiny_target.tokenizer
    run = make_run(tmp_path, tok, overrides=["data.system_prompt=Think step by step."])
    cfg = config.load(run)
    [ids] = splits.hand_written(run, cfg, 1)
    first = json.loads(splits.HANDWRITTEN.read_text().splitlines()[0])["prompt"]
    assert ids == list(tok.apply_chat_template(
        [{"role": "system", "content": "Think step by step."},
         {"role": "user", "content": first}], tokenize=True,
        add_generation_prompt=True)["input_ids"])
    assert ids != _prompt(tok, first)


def test_a_run_never_prepared_evals_on_the_prompts_prepare_would_give(tmp_path, capsys):
    """An imported draft's run has no data/ (init --from-draft): its eval prompts are the
    recipe's held-out prompts templated as prepare templates them, the same ids prepare's eval
    split holds, with a line saying where they came from; nothing else is written."""
    from draftkit import api

    over = ["data.source=local", "data.max_samples=12", "data.eval_samples=6",
            "data.regenerate=false", "data.system_prompt=Think step by step."]
    run = api.init("tiny-llama", "math", name="prepared", runs_dir=tmp_path, overrides=over)
    bare = api.init("tiny-llama", "math", name="bare", runs_dir=tmp_path, overrides=over)
    api.prepare(run)
    cfg = config.load(run)
    want = splits.own_prompts(run, cfg, 4)
    assert len(want) == 4
    capsys.readouterr()
    got = splits.own_prompts(bare, config.load(bare), 4)
    assert got == want
    assert "was never prepared" in capsys.readouterr().out
    assert not (bare / "data" / "eval").exists()  # eval did not prepare the run
    assert splits.build(bare, config.load(bare), 4, (splits.OWN,)) == {splits.OWN: want}
    assert len(splits.seen_templates(bare, cfg, 3)) == 3  # no training prompt to skip
