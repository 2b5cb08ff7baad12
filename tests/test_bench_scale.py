"""scripts/bench_scale.py (benchmarks/cost/scale.py) at tiny scale on the CPU (what it
measures, and that its projections follow from its measurements), and scripts/gpu_check.py: the
driver of scripts/gpu_check.sh run on the CPU through the whole lifecycle, and its record of a
failing step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _runs import one_thread, script

from benchmarks.cost import scale_report
from draftkit.core import hardware

RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.mark.slow  # trains a head and a draft LM for a few steps
def test_bench_scale_measures_each_phase_and_projects_from_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    bench = script("bench_scale")
    with one_thread():
        assert bench.main(["--out", str(tmp_path), "--seqs", "8", "--seq-len", "128",
                           "--train-steps", "2", "--refresh-steps", "2", "--warmup", "1",
                           "--verify-batches", "1,2", "--verify-context", "16",
                           "--disk-mb", "4", "--dir", str(tmp_path / "work")]) == 0
    res = json.loads((tmp_path / "bench_scale.json").read_text())
    assert (tmp_path / "bench_scale.png").stat().st_size > 10_000
    assert res["target"] == "random:tiny-llama" and res["data"]["tokens"] == 8 * 128
    h, b, t, r = res["harvest"], res["bare_forward"], res["train"], res["refresh"]
    assert h["tokens"] == b["tokens"] == 8 * 128  # harvest and bare forward: the same tokens
    assert res["harvest_vs_bare"] == pytest.approx(h["tokens_per_s"] / b["tokens_per_s"])
    dec = res["bare_decoder"]  # what harvest computes: the decoder without lm_head
    assert dec["tokens"] == h["tokens"] and res["harvest_vs_decoder"] == pytest.approx(
        h["tokens_per_s"] / dec["tokens_per_s"])
    assert h["bytes_per_token"] == 4 * 128 * 2  # 3 aux + last states of hidden 128, bf16
    assert t["batch_shapes"] == [[8, 128]] and t["tokens"] == 2 * 8 * 128  # 2 timed steps
    assert (r["heldout_rows"], r["train_rows"]) == (1, 7)
    assert r["projected_s"] == pytest.approx(
        2 * r["estimate_s"] + r["capture_s"] + r["budget_steps"] * r["finetune_step_s"])
    full, spec = res["projections"]["full_tier"], res["projections"]["specbundle"]
    assert full["train_h"] == pytest.approx(5 * 589_171 / t["tokens_per_s"] / 3600)
    assert full["harvest_h"] == pytest.approx(589_171 / h["tokens_per_s"] / 3600)
    assert spec["tokens"] == 1_400_000 * 1024 and spec["online_h"] == pytest.approx(
        spec["tokens"] * (1 / b["tokens_per_s"] + 1 / t["tokens_per_s"]) / 3600)
    assert all(x["peak_gib"] > 0 for x in (h, b, t, r))
    # what the hardware allows (#55): the null sink ran the same tokens, the disk was timed,
    # MFU follows from the FLOPs written out, the verify curve is relative to q=1
    ns = res["null_sink"]
    assert ns["tokens"] == h["tokens"] and res["null_sink_vs_decoder"] == pytest.approx(
        ns["tokens_per_s"] / dec["tokens_per_s"])
    assert res["disk"]["bytes"] == 4 << 20 and res["disk"]["bytes_per_s"] > 0
    f = res["train_flops"]
    assert f["total"] == pytest.approx(3 * (f["terms"]["fc"] + 3 * (
        f["terms"]["layer_per_ttt_step"] + f["terms"]["lm_head_per_ttt_step"]))
        + f["terms"]["verifier_logits"])
    assert res["mfu"]["vs_measured_matmul"] == pytest.approx(
        f["total"] * t["tokens_per_s"] / res["matmul_peak"]["measured_flops"])
    rows = res["verify"]["rows"]
    assert [r["batch"] for r in rows] == [1, 2] and all(
        r["relative"]["1"] == 1.0 and set(r["relative"]) == {"1", "2", "3", "4"} for r in rows)
    assert res["projection"]["label"].startswith("PROJECTION")
    assert '"al"' not in json.dumps(res).lower()  # random weights: no acceptance reported
    md = (tmp_path / "bench_scale.md").read_text()
    assert hardware.detect().cpu_model in md and res["git_sha"][:10] in md
    assert "| EAGLE-3 head training, batch 8192 tokens |" in md
    assert "null sink" in md and "GFLOP per token" in md and "PROJECTION" in md
    assert "GB/s sequential write" in md


def test_full_tier_figures_are_the_measured_recipes():
    """bench_scale projects `make demo TIER=full`: its harvest tokens and epochs."""
    bench, demo = scale_report, script("demo")
    measured = json.loads((RESULTS / "bench_learning_1120_sub2e5.json").read_text())
    setting = measured["settings"]["sub-2-e5"]
    assert setting["harvest_tokens"] == bench.FULL_TIER_TOKENS
    epochs = f"train.epochs={bench.FULL_TIER_EPOCHS}"
    assert epochs in setting["overrides"] and epochs in demo.FULL_OVERRIDES


STEPS = ["init", "prepare", "harvest", "train_eagle3_offline", "train_eagle3_online",
         "train_draft_lm", "export", "eval_reference", "policy_load", "rollouts", "drift",
         "refresh"]


@pytest.mark.slow  # trains a head and a draft LM for a few steps
def test_gpu_check_runs_the_lifecycle_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "out" / "gpu_check.json"
    with one_thread():
        rc = script("gpu_check").main(["--device", "cpu", "--out", str(out),
                                       "--dir", str(tmp_path / "work")])
    summary = json.loads(out.read_text())
    assert [s["name"] for s in summary["steps"]] == STEPS
    assert rc == 0 and summary["ok"], [s for s in summary["steps"] if s["status"] != "ok"]
    assert summary["steps"][-1]["detail"]["status"] in ("published", "rejected", "undecided")
    assert summary["vllm"]["status"] == "skipped" and summary["vllm"]["not_checked"]
    assert (tmp_path / "work" / "check" / "export" / "speculative_config.json").is_file()


def test_gpu_check_records_a_failed_step_and_falls_back(tmp_path, monkeypatch):
    """A train that fails on the device: the error and traceback are kept, a CPU-trained head
    stands in for export/eval/drift/refresh, steps that need a failed one are skipped."""
    from draftkit import api
    from draftkit.rl import policy

    gc = script("gpu_check")
    run = tmp_path / "check"

    def train(run_dir, overrides=None):
        if "train.device=cpu" not in (overrides or []):
            raise RuntimeError("Expected all tensors to be on the same device, cuda:0 and cpu!")
        return run_dir

    for name in ("prepare", "harvest", "export", "evaluate"):
        monkeypatch.setattr(api, name, lambda *a, **k: None)
    monkeypatch.setattr(api, "init", lambda *a, **k: run)
    monkeypatch.setattr(api, "train", train)
    monkeypatch.setattr(api, "drift", lambda *a, **k: {"rows": 3})
    monkeypatch.setattr(api, "refresh", lambda *a, **k: 1 / 0)
    monkeypatch.setattr(policy, "load_policy", lambda *a, **k: "policy")
    monkeypatch.setattr(gc, "copy_data", lambda run_dir, other: other)
    monkeypatch.setattr(gc, "draft_lm", lambda *a: train(run))
    monkeypatch.setattr(gc, "write_rollouts", lambda *a: tmp_path / "r.jsonl")
    check = gc.Check(tmp_path / "gpu_check.json", "cuda")
    gc.lifecycle(check, tmp_path, "cuda")
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    status = {s["name"]: s["status"] for s in summary["steps"]}
    assert status == {**dict.fromkeys(STEPS, "ok"), "train_eagle3_offline": "error",
                      "train_eagle3_offline_cpu_fallback": "ok",
                      "train_eagle3_online": "error", "train_draft_lm": "error",
                      "refresh": "error"}
    failed = next(s for s in summary["steps"] if s["name"] == "train_eagle3_offline")
    assert "same device" in failed["error"] and "RuntimeError" in failed["traceback"]
    assert summary["ok"] is False and summary["steps"][-2]["detail"] == {"rows": 3}
    check.step("later", lambda: 1, needs=("train_eagle3_online",))
    assert check.data["steps"][-1] == {"name": "later", "status": "skipped",
                                       "reason": "needs train_eagle3_online"}
