"""bench_refresh on a tiny smoke setting (tiny-llama, random EAGLE-3 head as draft v0, a
perturbed copy of the policy as vN with its own rollouts): every variant is measured at T=1 and
T=0 (the free method: suffix decoding; n-gram shares its code path and eval's test serves it), the refresh ran on a copy (the draft run is untouched), the swap was timed, and the JSON,
Markdown and PNG are written. The numbers mean nothing here; the goals are evaluated, not
asserted. Plus config errors without vLLM."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from _rl_helpers import make_run, write_rollouts
from _runs import script

from benchmarks.rl import refresh as bench
from draftkit.core.errors import DraftkitError


def test_config_needs_policy_and_rollouts():
    with pytest.raises(DraftkitError, match="policy_vn, rollouts"):
        bench.load_config(["draft_run=r"])
    cfg = bench.load_config(["draft_run=r", "policy_vn=p", "rollouts=[a.jsonl]",
                             "temperatures=[1.0]"])
    assert cfg.rollouts == ["a.jsonl"] and cfg.temperatures == [1.0]
    assert cfg.draft_sampling == "greedy"  # what the committed results were measured with
    with pytest.raises(DraftkitError, match="choose one of greedy, probabilistic"):
        bench.load_config(["draft_run=r", "policy_vn=p", "rollouts=[a.jsonl]",
                           "draft_sampling=sampled"])


def _policy_vn(tiny_target, path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target.path, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))  # a moved policy of the same lineage
    model.save_pretrained(path)
    tiny_target.tokenizer.save_pretrained(path)
    return SimpleNamespace(model=model.eval(), tokenizer=tiny_target.tokenizer)


@pytest.mark.slow
@pytest.mark.vllm
def test_bench_smoke(tmp_path, tiny_target):
    bench_refresh = script("bench_refresh")  # the driver, as `python scripts/bench_refresh.py`
    run = make_run(tmp_path / "runs", tiny_target)
    vn = _policy_vn(tiny_target, tmp_path / "vn")
    rollouts = write_rollouts(vn, tmp_path / "rollouts" / "step-1.jsonl", 12)
    before = sorted(p.name for p in run.iterdir())
    bench_refresh.main(["--out", str(tmp_path / "out"), f"draft_run={run}",
                        "policy_v0=tiny-llama", f"policy_vn={tmp_path / 'vn'}",
                        f"rollouts=[{rollouts}]", "prompts=4", "max_tokens=16", "batch_size=4",
                        "max_model_len=512", f"work_dir={tmp_path / 'work'}",
                        "draft_sampling=probabilistic",  # the product's default drafting
                        "free_methods=[suffix]",
                        "refresh_overrides=[refresh.budget_steps=10, refresh.lr=3e-3,"
                        " refresh.gate=false]"])
    result = json.loads((tmp_path / "out" / "bench_refresh.json").read_text())
    assert list(result["rows"]) == ["v0/v0", "stale", "refreshed", "suffix", "none"]
    for row in result["rows"].values():
        assert set(row) == {"T=1", "T=0"}
        assert all(r["tokens_per_s"] > 0 and r["al"] >= 1.0 for r in row.values())
    assert result["config"]["draft_sampling"] == "probabilistic"
    assert result["rows"]["none"]["T=0"]["al"] == 1.0  # no speculation, no drafts
    assert result["rows"]["none"]["T=0"]["tokens_per_step"] == 1.0
    for name in ("stale", "refreshed"):  # EAGLE-3 drafts every step: tok/step ~ its AL
        t0 = result["rows"][name]["T=0"]
        assert 1.0 <= t0["tokens_per_step"] <= t0["al"] * 1.1, (name, t0)
    assert result["refresh"]["steps"] == 10 and result["refresh"]["tokens_trained"] > 0
    assert result["swap"]["load_s"] > 0 and result["swap"]["restart"] is False
    assert result["goals"]["recovers_90pct_of_scratch"]["ok"] is None  # no scratch run
    assert result["rows"]["suffix"]["T=0"]["per_position"]  # suffix decoding drafted
    assert result["goals"]["faster_than_suffix"]["ok"] is not None
    assert result["goals"]["faster_than_ngram"] == {"ok": None,
                                                    "detail": "not measured (free_methods)"}
    assert sorted(p.name for p in run.iterdir()) == before  # refreshed a copy, not the run
    assert (tmp_path / "work" / "refresh-run" / "drafts").is_dir()  # the copy: not in --out
    assert not (tmp_path / "out" / "refresh-run").exists()
    assert result["refresh"]["dir"] == os.path.relpath(
        tmp_path / "work" / "refresh-run" / "drafts" / "v0001")
    assert "| refreshed |" in (tmp_path / "out" / "bench_refresh.md").read_text()
    assert (tmp_path / "out" / "bench_refresh.png").stat().st_size > 1000
