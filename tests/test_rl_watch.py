"""`draftkit watch`: only complete checkpoints count (index with every file, whole safetensors,
or a marker; shards need their index); SIGTERM stops it cleanly mid-refresh with nothing
published, and a restart publishes the refresh exactly once. Events land in the JSONL log and an
offline wandb run. Rollout files count only when complete (a .done marker, or settled), a bad
row sets aside only its own file, a checkpoint that fails to load is retried, then skipped."""

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
from safetensors.torch import save_file

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
    no_index = ckpts / "step_6"  # whole shards, but the index is not written yet
    no_index.mkdir()
    (no_index / "config.json").write_text((full / "config.json").read_text())
    for i in (1, 2):
        save_file({"w": torch.zeros(2)}, no_index / f"model-0000{i}-of-00002.safetensors")
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
    (rolls / "step_1.jsonl.done").touch()  # the writer's marker: complete
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


def _log(store: DraftStore) -> list[dict]:
    return [json.loads(x) for x in (store.root / "watch-log.jsonl").read_text().splitlines()]


def _rows(path: Path, n: int, bad_line: int | None = None) -> Path:
    rows = [json.dumps({"prompt_ids": [1, 2, 3 + i], "response_ids": [4, 5, 6]})
            for i in range(n)]
    if bad_line is not None:
        rows[bad_line - 1] = '{"prompt_ids": [1, 2], "response_ids": []}'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r + "\n" for r in rows))
    return path


@pytest.fixture
def fake_refresh(monkeypatch):
    """watch's refresh replaced: records the files (and their line counts) it was given."""
    from draftkit.rl import watch

    calls = []

    def record(run, hf, files, overrides, **kw):
        calls.append({"files": [Path(f).name for f in files], "set_aside": kw.get("set_aside"),
                      "lines": [len(Path(f).read_text().splitlines()) for f in files]})
        return {"status": "published", "version": f"v{len(calls):04d}"}

    monkeypatch.setattr(watch, "refresh", record)
    return calls


def test_bad_rollouts_are_logged_and_skipped(tmp_path, tiny_target, fake_refresh):
    from draftkit.rl.watch import Watcher

    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_3")
    rolls.mkdir()
    (rolls / "step_3.jsonl").write_text('{"prompt_ids": [1, 2], "response_ids": []}\n')
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none", "refresh.rollout_settle_s=0"],
                every=1)
    w.tick()  # the daemon goes on; the error names file:line; the file is set aside
    store = DraftStore(run)
    last = _log(store)[-1]
    assert last["event"] == "rollouts_set_aside" and "step_3.jsonl:1" in last["detail"]
    assert w.state["seen"] == [] and w.state["last_refresh_step"] is None  # still waiting
    assert store.versions() == [] and fake_refresh == []
    w.tick()  # nothing new: no second attempt
    assert len(_log(store)) == 1


def test_a_bad_row_sets_aside_only_its_file(tmp_path, tiny_target, fake_refresh):
    from draftkit.rl.watch import Watcher

    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_1")
    good, bad = _rows(rolls / "a.jsonl", 4), _rows(rolls / "b.jsonl", 4, bad_line=2)
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none", "refresh.rollout_settle_s=0"],
                every=1)
    w.tick()
    assert [c["files"] for c in fake_refresh] == [["a.jsonl"]]  # the good file still used
    assert fake_refresh[0]["set_aside"][0]["path"] == str(bad.resolve())
    aside = [e for e in _log(DraftStore(run)) if e["event"] == "rollouts_set_aside"]
    assert len(aside) == 1 and f"{bad}:2" in aside[0]["detail"]
    assert "b.jsonl:2" in w.state["rejected_rollouts"][str(bad.resolve())]["reason"]
    assert w.state["used_rollouts"] == [str(good.resolve())]
    _rows(bad, 5)  # the writer fixes it: looked at again with the next checkpoint
    save_policy(tiny_target, ckpts / "step_2")
    w.tick()  # changed since the last tick: one more tick to settle
    w.tick()
    assert [c["files"] for c in fake_refresh] == [["a.jsonl"], ["b.jsonl"]]
    assert str(bad.resolve()) not in w.state["rejected_rollouts"]


def test_a_rollout_file_being_appended_waits_until_complete(tmp_path, tiny_target,
                                                             fake_refresh):
    from draftkit.rl.watch import Watcher

    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_1")
    f = _rows(rolls / "step_1.jsonl", 2)  # whole lines so far, more to come
    _rows(rolls / "step_2.jsonl.tmp", 3)  # written under a temp name: never read
    _rows(rolls / ".step_3.jsonl", 3)
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none"], every=1)  # settle: 30 s
    w.tick()
    with f.open("a") as fh:
        fh.write(json.dumps({"prompt_ids": [1, 2], "response_ids": [7, 8]}) + "\n")
    w.tick()
    assert fake_refresh == [] and w.state["seen"] == []  # not used half-written
    from draftkit.rl.watch import complete_rollouts, rollout_complete

    assert not rollout_complete(f, settle_s=30) and rollout_complete(f, 30, time.time() + 31)
    (rolls / "step_1.jsonl.done").touch()  # the writer is done
    assert complete_rollouts(rolls, settle_s=30) == [f]
    w.tick()
    assert fake_refresh == [{"files": ["step_1.jsonl"], "set_aside": [], "lines": [3]}]
    with f.open("a") as fh:  # written to after a refresh used it: said loudly
        fh.write(json.dumps({"prompt_ids": [1, 2], "response_ids": [9, 9]}) + "\n")
    w.tick()
    changed = [e for e in _log(DraftStore(run)) if e["event"] == "rollout_changed"]
    assert len(changed) == 1 and changed[0]["path"] == str(f.resolve())
    w.tick()  # reported once per change
    assert len([e for e in _log(DraftStore(run)) if e["event"] == "rollout_changed"]) == 1


def test_a_file_changed_between_ticks_waits_one_more_tick(tmp_path, tiny_target,
                                                           fake_refresh):
    from draftkit.rl.watch import Watcher

    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    ckpts.mkdir()
    f = _rows(rolls / "r.jsonl", 2)
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none", "refresh.rollout_settle_s=0"],
                every=1)
    w.tick()  # no checkpoint yet; the tick saw the file with 2 rows ...
    _rows(f, 3)  # ... then it grew (whole lines again): wait one more tick
    save_policy(tiny_target, ckpts / "step_1")
    w.tick()
    assert fake_refresh == []
    w.tick()  # unchanged since the last tick: used
    assert [c["lines"] for c in fake_refresh] == [[3]]


def test_a_checkpoint_that_fails_to_load_is_retried_then_skipped(tmp_path, tiny_target):
    from draftkit.rl.watch import CHECKPOINT_TRIES, Watcher

    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    full = save_policy(tiny_target, tmp_path / "full")
    (_half_written(full, ckpts / "step_1") / "COMPLETE").touch()  # a marker that lies
    _rows(rolls / "a.jsonl", 4)
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none", "refresh.rollout_settle_s=0"],
                every=1)
    for _ in range(CHECKPOINT_TRIES):
        w.tick()  # no exception: the watch goes on
    events = [e["event"] for e in _log(DraftStore(run))]
    assert events.count("checkpoint_error") == CHECKPOINT_TRIES
    assert events[-1] == "checkpoint_skipped" and w.state["seen"] == ["step_1"]
    assert "step_1" in _log(DraftStore(run))[-2]["detail"]
    assert w.state["used_rollouts"] == []  # kept for the next checkpoint
