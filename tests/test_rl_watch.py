"""`draftkit watch`: only complete checkpoints count (index with every file, whole safetensors,
or a marker); SIGTERM stops it cleanly mid-refresh with nothing published, and a restart
publishes the refresh exactly once. Events land in the JSONL log and an offline wandb run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _rl_helpers import make_run, save_policy, write_rollouts

from draftkit.rl.publish import DraftStore
from draftkit.rl.watch import checkpoint_complete, complete_checkpoints

ROOT = Path(__file__).resolve().parents[1]


def _half_written(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        data = f.read_bytes()
        (dst / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors" else data)
    return dst


def test_only_complete_checkpoints_count(tmp_path, tiny_target):
    ckpts = tmp_path / "ckpts"
    full = save_policy(tiny_target, ckpts / "step_1")
    _half_written(full, ckpts / "step_2")
    (ckpts / "global_step_3" / "actor" / "huggingface").mkdir(parents=True)  # verl layout
    save_policy(tiny_target, ckpts / "global_step_3" / "actor" / "huggingface")
    sharded = ckpts / "step_4"  # an index naming a shard that is not there yet
    sharded.mkdir()
    (sharded / "config.json").write_text((full / "config.json").read_text())
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors",
                        "b": "model-00002-of-00002.safetensors"}}))
    marked = _half_written(full, ckpts / "step_5")
    assert not checkpoint_complete(marked)
    (marked / "COMPLETE").touch()  # the trainer's own marker wins
    assert [s for s, _ in complete_checkpoints(ckpts)] == [1, 3, 5]


def _watch(run, ckpts, rollouts, *extra):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "draftkit.cli", "watch", str(run), "--checkpoints", str(ckpts),
         "--rollouts", str(rollouts), "--every", "1", "refresh.poll_s=0.5",
         "refresh.lr=3e-3", "refresh.batch_tokens=2048", "tracking.backend=wandb", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _events(store: DraftStore) -> list[str]:
    path = store.root / "watch-log.jsonl"
    return [json.loads(x)["event"] for x in path.read_text().splitlines()] \
        if path.is_file() else []


@pytest.mark.slow
def test_sigterm_then_restart_publishes_once(tmp_path, tiny_target):
    torch.set_num_threads(1)
    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_1")
    _half_written(ckpts / "step_1", ckpts / "step_2")  # newer, but still being written
    write_rollouts(tiny_target, rolls / "step_1.jsonl", 12)
    (rolls / "step_2.jsonl").write_text('{"prompt_ids": [1, 2], "respo')  # half a line
    store = DraftStore(run)

    proc = _watch(run, ckpts, rolls, "refresh.budget_steps=0", "refresh.budget_s=60")
    deadline = time.time() + 120
    while "refresh_started" not in _events(store):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
        time.sleep(0.3)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert _events(store)[-2:] == ["refresh_interrupted", "stopped"] and store.versions() == []

    proc = _watch(run, ckpts, rolls, "refresh.budget_steps=20", "--once")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert store.versions() == ["v0001"] and store.current() == "v0001"
    lin = store.lineage("v0001")
    assert lin["policy"]["source"].endswith("step_1") and lin["policy"]["step"] == 1
    assert [Path(r["path"]).name for r in lin["rollouts"]] == ["step_1.jsonl"]
    state = json.loads((store.root / "watch-state.json").read_text())
    assert state["seen"] == ["step_1"] and state["last_refresh_step"] == 1

    proc = _watch(run, ckpts, rolls, "refresh.budget_steps=20", "--once")  # nothing new
    proc.communicate(timeout=300)
    assert store.versions() == ["v0001"]
    assert list((store.root / "wandb").glob("offline-run-*"))


def test_bad_rollouts_are_logged_and_skipped(tmp_path, tiny_target):
    from draftkit.rl.watch import Watcher

    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_3")
    rolls.mkdir()
    (rolls / "step_3.jsonl").write_text('{"prompt_ids": [1, 2], "response_ids": []}\n')
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none"], every=1)
    w.tick()  # the daemon goes on; the error names file:line
    store = DraftStore(run)
    last = [json.loads(x) for x in (store.root / "watch-log.jsonl").read_text().splitlines()][-1]
    assert last["event"] == "refresh_failed" and "step_3.jsonl:1" in last["detail"]
    assert w.state["seen"] == ["step_3"] and w.state["last_refresh_step"] is None
    assert store.versions() == []
    w.tick()  # nothing new: no second attempt
    assert len((store.root / "watch-log.jsonl").read_text().splitlines()) == 2
