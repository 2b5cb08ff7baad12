"""scripts/bench_trl.py's arithmetic and report (benchmarks/rl/trl_grpo.py) on two variants'
per-step records: tokens per target step, rollout tokens/s, refresh share, the Markdown table
with its command and commit, the PNG. The GRPO runs themselves are tests/test_trl_vllm.py's."""

from __future__ import annotations

import json

import pytest

from benchmarks.rl import trl_grpo


def step(i, tokens, seconds, accepted, step_time):
    return {"step": i, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "drafts": 1 if accepted else 0, "accepted": accepted, "al": None,
            "tokens_per_target_step": tokens / (tokens - accepted), "step_time": step_time,
            "reward": 0.0}


RESULT = {"config": {"steps": 2, "prompts": 2, "generations": 2, "max_tokens": 16, "every": 1},
          "meta": {"argv": ["scripts/bench_trl.py", "run=runs/demo"], "git_sha": "abcdef0123",
                   "hardware": {"cpu_model": "Some CPU"}},
          "runs": [{"variant": "none", "steps": [step(0, 64, 4.0, 0, 10.0), step(1, 64, 4.0, 0, 10.0)],
                    "events": [], "taps_copy_s": None},
                   {"variant": "refresh", "steps": [step(0, 64, 2.0, 32, 8.0), step(1, 64, 2.0, 16, 12.0)],
                    "events": [{"event": "refresh", "step": 1, "refresh_s": 5.0,
                                "capture": {"seconds": 0.5, "taps": {"rows": 4, "computed_rows": 0}},
                                "swap": {"ok": True}}],
                    "taps_copy_s": 0.2}]}


def test_summary_and_report(tmp_path):
    result = {**RESULT, "summary": [trl_grpo.summary(r) for r in RESULT["runs"]]}
    none, ref = result["summary"]
    assert none["rollout_tokens_per_s"] == 16.0 and none["tokens_per_target_step"] == 1.0
    assert ref["rollout_tokens_per_s"] == 32.0
    assert ref["tokens_per_target_step"] == pytest.approx(128 / (128 - 48))
    assert ref["refresh_share_of_step"] == pytest.approx(5.0 / 10.0)
    assert (ref["rows_from_taps"], ref["rows_computed"], ref["swaps_ok"]) == (4, 0, 1)
    md = trl_grpo.markdown(result)
    assert "| refresh | 32.0 | 2.00x | 1.60 | 10.00 | 1 |" in md
    assert "`python scripts/bench_trl.py run=runs/demo` at code `abcdef0`" in md and "Some CPU" in md
    trl_grpo.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    json.dumps(result)  # what write_report stores


def test_the_refresh_overhead_is_counted_in_frozen_grpo_steps():
    """(variant's train wall time - frozen's) / refreshes / frozen's mean step time."""
    sums = [{"variant": "frozen", "refreshes": 0, "mean_step_time": 10.0, "train_s": 100.0},
            {"variant": "refresh", "refreshes": 2, "mean_step_time": 12.0, "train_s": 140.0,
             "rollout_tokens_per_s": 1.0, "tokens_per_target_step": 1.0, "swaps_ok": 2,
             "mean_refresh_s": 20.0, "mean_capture_s": 1.0, "refresh_share_of_step": 2.0,
             "rows_from_taps": None, "rows_computed": None, "taps_copy_s_per_step": None},
            {"variant": "refresh-bg", "refreshes": 2, "mean_step_time": 11.0, "train_s": 105.0,
             "rollout_tokens_per_s": 1.0, "tokens_per_target_step": 1.0, "swaps_ok": 2,
             "mean_refresh_s": 20.0, "mean_capture_s": 1.0, "refresh_share_of_step": 2.0,
             "rows_from_taps": None, "rows_computed": None, "taps_copy_s_per_step": None}]
    out = {s["variant"]: s["extra_steps_per_refresh"] for s in trl_grpo.overhead(sums)}
    assert out == {"frozen": None, "refresh": 2.0, "refresh-bg": 0.25}
    sums[0]["rollout_tokens_per_s"], sums[0]["tokens_per_target_step"] = 1.0, 1.0
    sums[0]["swaps_ok"] = 0
    md = trl_grpo.markdown({"config": {**RESULT["config"], "processes": 2}, "summary": sums})
    assert "2 trainer process(es)" in md
    assert "| refresh | 2 | 140.0 | 2.00 |" in md and "| refresh-bg | 2 | 105.0 | 0.25 |" in md


def test_resume_keeps_a_record_of_the_same_settings_only(tmp_path, monkeypatch):
    """`resume=true` measures only what an earlier run into the same --out lacks: a variant's
    record is kept when every setting but the variant list matches, run again otherwise."""
    cfg = trl_grpo.load_config(["run=runs/demo", "steps=2", "resume=true",
                                "variants=[none,frozen]"])
    runs = tmp_path / "bench_trl_runs"
    runs.mkdir()
    same = {**RESULT["runs"][0], "config": {**trl_grpo.asdict(cfg), "variants": ["none"]}}
    other = {**RESULT["runs"][1], "variant": "frozen",
             "config": {**trl_grpo.asdict(cfg), "steps": 3}}  # another run's steps: not kept
    (runs / "none.json").write_text(json.dumps(same))
    (runs / "frozen.json").write_text(json.dumps(other))
    launched = []
    monkeypatch.setattr(trl_grpo, "_child", lambda c, v, out: launched.append(v) or
                        {**RESULT["runs"][0], "variant": v, "config": trl_grpo.asdict(c)})
    result = trl_grpo.run(cfg, tmp_path)
    assert launched == ["frozen"]
    assert [r["variant"] for r in result["runs"]] == ["none", "frozen"]
    assert result["runs"][0]["steps"] == RESULT["runs"][0]["steps"]  # the kept record itself

