"""Issue 52, N9: the watch streams rollout files (bounded lines, memory flat in the file's
size), records its progress before each expensive step so a kill (OOM) does not loop on the
same file or checkpoint, and lives on through a tick that raises (up to TICK_FAILURES in a
row). Each test failed on da386a3."""

# ruff: noqa: F811 - fixtures imported from a sibling test module are these tests' arguments
from __future__ import annotations

import json
import tracemalloc

import pytest
from _rl_helpers import make_run, save_policy
from test_rl_watch import _rows, fake_refresh  # noqa: F401 - a fixture

from draftkit.core.errors import DraftkitError
from draftkit.rl import rollouts
from draftkit.rl import watch as watch_mod
from draftkit.rl.watch import Watcher

SETTINGS = ["tracking.backend=none", "refresh.rollout_settle_s=0"]


def test_rollout_rows_are_streamed_with_bounded_lines(tmp_path, monkeypatch):
    # N9: the watch read whole rollout files into memory, and one line had no bound
    path = tmp_path / "big.jsonl"
    row = json.dumps({"prompt_ids": [1, 2, 3], "response_ids": list(range(4, 104))})
    path.write_text((row + "\n") * 20000)
    tracemalloc.start()
    n = sum(1 for _ in rollouts.iter_rollouts([path], None, 1000))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == 20000 and peak < 4 << 20, peak  # a list of these rows is ~60 MiB
    monkeypatch.setattr(rollouts, "MAX_LINE_BYTES", 100)
    with pytest.raises(DraftkitError, match=r"big.jsonl:1: .*longer than 100 bytes"):
        next(rollouts.iter_rollouts([path], None, 1000))


def test_the_screen_never_holds_a_file_whole(tmp_path, tiny_target, fake_refresh, monkeypatch):
    # N9: screen() built every row of a file in a list (read_rollouts) only to check it
    def whole(*a, **k):
        raise AssertionError("read whole")
    monkeypatch.setattr(watch_mod, "read_rollouts", whole)
    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_1")
    _rows(rolls / "a.jsonl", 4)
    w = Watcher(run, ckpts, rolls, SETTINGS, every=1)
    w.tick()
    assert [c["files"] for c in fake_refresh] == [["a.jsonl"]]


def test_a_watch_killed_mid_step_does_not_loop_on_it(tmp_path, tiny_target, fake_refresh):
    # N9: an OOM kill came before save(), so every restart read the same file (or ran the
    # same refresh) and died again
    run = make_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_1")
    big = _rows(rolls / "big.jsonl", 4)
    w = Watcher(run, ckpts, rolls, SETTINGS, every=1)
    w.state["screening"] = str(big.resolve())  # what screen() saved before it was killed
    w.save()
    w = Watcher(run, ckpts, rolls, SETTINGS, every=1)
    w.recover_deaths()
    assert "out of memory" in w.state["rejected_rollouts"][str(big.resolve())]["reason"]
    w.tick()
    assert fake_refresh == []  # the file is set aside, not read again
    for death in range(1, 4):  # killed during the refresh of step 1, three times
        w.state["refreshing"] = "1"
        w.save()
        w = Watcher(run, ckpts, rolls, SETTINGS, every=1)
        w.recover_deaths()
        assert w.state["refresh_deaths"]["1"] == death
    assert "step_1" in w.state["seen"]  # skipped: the next checkpoint goes on


def test_a_tick_that_raises_is_an_event_and_the_watch_lives_on(tmp_path, tiny_target,
                                                              monkeypatch):
    # N9: exceptions other than CheckpointError/DraftkitError ended the watch
    run = make_run(tmp_path / "runs", tiny_target)
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "rollouts").mkdir()
    ticks = []

    def tick(self):
        ticks.append(1)
        raise MemoryError("a rollout row too big")
    monkeypatch.setattr(Watcher, "tick", tick)
    w = Watcher(run, tmp_path / "ckpts", tmp_path / "rollouts",
                [*SETTINGS, "refresh.poll_s=0.01"], every=1)
    w.run_forever(once=True)  # lives on
    events = [json.loads(x)["event"] for x in w.log_path.read_text().splitlines()]
    assert "tick_failed" in events and events[-1] == "stopped"
    w = Watcher(run, tmp_path / "ckpts", tmp_path / "rollouts",
                [*SETTINGS, "refresh.poll_s=0.01"], every=1)
    with pytest.raises(DraftkitError, match=f"{watch_mod.TICK_FAILURES} ticks in a row"):
        w.run_forever()  # ... up to a cap
    assert len(ticks) == 1 + watch_mod.TICK_FAILURES
