"""rl/in_loop.py's step end without an engine (the swap into engines and the refresh job are
stand-ins): a refresh or a swap that raises becomes an event and the loop goes on; a raising
refresh waits `every` steps before the next try with its rollouts still pending; a background
refresh runs while step ends return, on a copy of the policy, and the step end after it
finished swaps in what it published. The engines end to end: tests/test_trl_dist.py."""

from __future__ import annotations

import threading

import pytest
import torch

from draftkit.rl import engines, in_loop
from draftkit.serving.counters import SpecCounters

LINEAGE = {"al_after": {"T=0": {"al": 2.0}}, "decided_on": "T=0"}  # what settle reads


@pytest.fixture()
def loop_of(tmp_path, tiny_target, monkeypatch):
    from _rl_helpers import make_run

    run = make_run(tmp_path, tiny_target)
    swaps = []

    def swap_all(refresher, llm, ranks, version):
        swaps.append(version)
        if version == "boom":
            raise RuntimeError("a swap that raises (test)")
        return {"ok": True, "version": version, "verdict": "ok", "restored": None,
                "engines": [{"rank": 0, "engine": 0, "version": version, "ok": True,
                             "al": 2.0, "swap_s": 0.1}]}

    monkeypatch.setattr(engines, "swap_all", swap_all)
    monkeypatch.setattr(in_loop.drafter_swap, "drafter_path", lambda llm: llm["path"])

    def make(**kw):
        loop = in_loop.SpeculativeRollouts(in_loop.DraftkitConfig(run=str(run), **kw))
        loop.bind({"path": str(loop.draft_dir)}, engines.Ranks())
        return loop, swaps

    return make


def _rollouts(loop, step: int) -> None:
    loop.record(step, [[1, 2, 3]] * 2, [[4, 5, 6, 7]] * 2, SpecCounters(2, 6, 3), 0.1)


def test_a_refresh_that_raises_is_an_event_and_waits_every_steps(loop_of):
    loop, swaps = loop_of(every=2)
    calls = []

    def job(model, tok, files, step, *a, **kw):
        calls.append((step, len(files)))
        if step == 2:
            raise RuntimeError("out of memory (test)")
        return {"status": "published", "version": "v0001", "lineage": LINEAGE}

    loop.refresher.job = job
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3, 4):
        _rollouts(loop, step - 1)
        loop.step_end(step, model, None)
    assert calls == [(2, 2), (4, 4)]  # the raising refresh's rollouts stayed pending
    refresh = [e for e in loop.events if e["event"] == "refresh"]
    assert [(e["step"], e["status"]) for e in refresh] == [(2, "error"), (4, "published")]
    assert "out of memory (test)" in refresh[0]["error"] and "swap" not in refresh[0]
    assert refresh[1]["swap"]["ok"] and swaps == ["v0001"]
    assert loop.engines[0]["version"] == "v0001"


def test_a_swap_that_raises_is_an_event(loop_of):
    loop, swaps = loop_of(every=1)
    loop.refresher.job = lambda *a, **kw: {"status": "published", "version": "boom",
                                           "lineage": LINEAGE}
    _rollouts(loop, 0)
    loop.step_end(1, torch.nn.Linear(2, 2), None)
    swap = loop.events[-1]["swap"]
    assert (swap["ok"], swap["verdict"]) == (False, "error")
    assert "a swap that raises (test)" in swap["error"]


def test_a_background_refresh_runs_while_steps_go_on(loop_of):
    loop, swaps = loop_of(every=1, refresh_in="background")
    release, seen = threading.Event(), []

    def job(model, tok, files, step, *a, **kw):
        seen.append(model)
        assert release.wait(60)
        return {"status": "published", "version": "v0001", "lineage": LINEAGE}

    loop.refresher.job = job
    model = torch.nn.Linear(2, 2)
    _rollouts(loop, 0)
    loop.step_end(1, model, None)  # starts the worker, returns at once
    _rollouts(loop, 1)
    loop.step_end(2, model, None)  # the worker still runs: no second refresh, no swap
    assert swaps == [] and not [e for e in loop.events if e["event"] == "refresh"]
    release.set()
    loop._worker.thread.join(60)
    loop.step_end(3, model, None)  # books it and swaps it in
    assert seen and seen[0] is not model  # the refresh read a copy of the policy
    torch.testing.assert_close(seen[0].weight, model.weight)
    refresh = [e for e in loop.events if e["event"] == "refresh"]
    assert [(e["step"], e["mode"], e["status"]) for e in refresh][0] == (
        1, "background", "published")
    assert refresh[0]["swap"]["ok"] and swaps == ["v0001"]


def test_the_config_refuses_an_unknown_refresh_place():
    from draftkit.core.errors import DraftkitError

    with pytest.raises(DraftkitError, match="refresh_in"):
        in_loop.DraftkitConfig(run="x", refresh_in="elsewhere")


def test_a_step_end_leaves_the_random_stream_as_it_found_it(loop_of):
    """Under vLLM's external launcher the engine samples (T=1, rejection sampling) from the
    trainer process's torch generator, and the engines of one TP group must draw the same
    numbers: a refresh that ran on rank 0 alone and drew numbers there left rank 0's engine
    sampling other tokens than rank 1's, and TRL's next generate call hung (tests/scripts/
    trl_ranks.py with TP=2). Every step end gives the generator back as it found it."""
    loop, _ = loop_of(every=1)

    def job(model, tok, files, step, *a, **kw):
        torch.rand(100)  # the refresh's own training draws numbers
        return {"status": "published", "version": "v0001", "lineage": LINEAGE}

    loop.refresher.job = job
    _rollouts(loop, 0)
    model = torch.nn.Linear(2, 2)
    state = torch.get_rng_state()
    loop.step_end(1, model, None)
    assert [e["status"] for e in loop.events if e["event"] == "refresh"] == ["published"]
    assert torch.equal(torch.get_rng_state(), state)


def test_tensor_parallel_engines_refresh_in_sync_or_watch_not_in_a_thread(tmp_path, tiny_target):
    """With vllm TP > 1 a refresh is no longer refused (the check covers shards); a background
    refresh is, naming the fix: its thread would draw from the generator the engine samples
    with while the engine runs."""
    from _rl_helpers import make_run

    run = make_run(tmp_path, tiny_target)
    loop = in_loop.SpeculativeRollouts(in_loop.DraftkitConfig(run=str(run)))
    loop.bind({"path": str(loop.draft_dir)}, engines.Ranks(tp_size=2))
    assert loop.refresher is not None
    loop = in_loop.SpeculativeRollouts(in_loop.DraftkitConfig(run=str(run),
                                                              refresh_in="background"))
    with pytest.raises(in_loop.DraftkitError, match="refresh_in='sync' or 'watch'"):
        loop.bind({"path": str(loop.draft_dir)}, engines.Ranks(tp_size=2))
