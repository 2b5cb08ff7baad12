"""`DraftRefresher` in an RL loop on the tiny target: observe -> should_refresh (interval, AL
drop) -> refresh with the policy in memory (no checkpoint) -> a published version."""

from __future__ import annotations

import json

import torch
from _rl_helpers import make_run, write_rollouts

from draftkit.rl.refresher import DraftRefresher


def test_interval_and_al_drop_triggers_then_refresh_in_memory(tmp_path, tiny_target, one_thread):
    run = make_run(tmp_path / "runs", tiny_target)
    f = write_rollouts(tiny_target, tmp_path / "r.jsonl", 12)
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    r = DraftRefresher(run, ["refresh.budget_steps=30", "refresh.lr=3e-3", "refresh.gate=false"],
                       every=3, al_drop=0.2)  # no gate: this test is about the flow
    assert not r.should_refresh()  # nothing observed
    r.observe(rows[:6], policy_step=1, al=2.0)  # the first AL after a (re)start: the reference
    assert not r.should_refresh() and r.al_ref == 2.0
    r.observe(rows[6:], policy_step=2, al=1.5)  # 1.5 < 0.8 * 2.0
    assert r.should_refresh() and r.reason.startswith("AL drop")
    r.al_drop = 0.0
    assert not r.should_refresh()
    r.observe([], policy_step=3)
    assert r.should_refresh() and r.reason.startswith("interval")
    assert len(r.pending) == 2 and all(p.is_file() for p in r.pending)
    res = r.refresh(tiny_target.model, tiny_target.tokenizer)  # in memory
    assert res["status"] == "published" and r.store.current() == "v0001"
    lin = r.store.lineage("v0001")
    assert lin["policy"]["source"] == "memory" and lin["policy"]["step"] == 3
    assert len(lin["rollouts"]) == 2 and r.pending == [] and r.last_refresh_step == 3
    assert not r.should_refresh()
    assert len(r.probes()) == 8 and all(isinstance(t, int) for t in r.probes()[0])
    assert torch.is_tensor(tiny_target.model.lm_head.weight)  # the policy was not touched


def test_an_undecided_refresh_keeps_its_rollouts_for_the_next_one(tmp_path, tiny_target,
                                                                 one_thread):
    run = make_run(tmp_path / "runs", tiny_target)
    f = write_rollouts(tiny_target, tmp_path / "r.jsonl", 6)
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    r = DraftRefresher(run, ["refresh.budget_steps=2", "refresh.min_heldout_starts=100000"],
                       every=1)
    r.observe(rows, policy_step=1)
    assert r.should_refresh()
    res = r.refresh(tiny_target.model, tiny_target.tokenizer)
    assert res["status"] == "undecided" and r.store.current() is None
    assert len(r.pending) == 1 and r.last_refresh_step is None  # nothing lost, still due
    assert r.should_refresh()
