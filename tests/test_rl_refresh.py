"""`draftkit refresh` on the tiny target: publish with lineage, exactly once; a crash between
writing a version and moving `current`; a worse draft never published; the lock."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _rl_helpers import make_run, save_policy, write_rollouts
from _runs import one_thread

from draftkit.core.errors import DraftkitError
from draftkit.rl import finetune
from draftkit.rl.publish import DraftStore, RefreshLocked
from draftkit.rl.refresh import refresh

FAST = ["refresh.budget_steps=40", "refresh.lr=3e-3", "refresh.batch_tokens=2048"]
# the crash test is about publishing, not gain: accept any draft (refresh.gate=false)
SECOND = [*FAST, "refresh.replay=4", "refresh.gate=false"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target):
    tmp = tmp_path_factory.mktemp("refresh")
    with one_thread():
        yield {"run": make_run(tmp / "runs", tiny_target),
               "policy": save_policy(tiny_target, tmp / "ckpt" / "step_1"),
               "r1": write_rollouts(tiny_target, tmp / "rollouts" / "step_1.jsonl", 16, 0),
               "r2": write_rollouts(tiny_target, tmp / "rollouts" / "step_2.jsonl", 16, 16,
                                    step=2)}


def test_publish_lineage_once_then_crash_before_current_then_resume(setup, monkeypatch):
    run, store = setup["run"], DraftStore(setup["run"])
    res = refresh(run, setup["policy"], [setup["r1"]], FAST)
    assert res["status"] == "published" and store.current() == "v0001"
    lin = store.lineage("v0001")
    assert lin["parent"] == "export" and lin["policy"]["step"] == 1 and lin["steps"] == 40
    assert lin["rollouts"][0]["sha256"] and lin["tokens_trained"] > 0
    assert len(lin["al_before"]["T=0"]["per_position"]) == 3
    assert lin["al_after"]["T=0"]["al"] > lin["al_before"]["T=0"]["al"]
    for f in ("config.json", "model.safetensors", "speculative_config.json", "meta.json"):
        assert (store.root / "v0001" / f).is_file()
    sc = json.loads((store.root / "v0001" / "speculative_config.json").read_text())
    assert sc["method"] == "eagle3" and sc["num_speculative_tokens"] == 3
    again = refresh(run, setup["policy"], [setup["r1"]], FAST)  # same job: nothing new
    assert again["resumed"] and store.versions() == ["v0001"]

    def crash(self, version):
        raise KeyboardInterrupt("power cut")  # after the version dir is complete

    with monkeypatch.context() as m:
        m.setattr(DraftStore, "set_current", crash)
        with pytest.raises(KeyboardInterrupt):
            refresh(run, setup["policy"], [setup["r2"]], SECOND)
    assert store.versions() == ["v0001", "v0002"] and store.current() == "v0001"
    assert (store.root / os.readlink(store.current_link) / "model.safetensors").is_file()
    res = refresh(run, setup["policy"], [setup["r2"]], SECOND)
    assert res["resumed"] and res["version"] == "v0002" and store.current() == "v0002"
    assert store.versions() == ["v0001", "v0002"]  # published once
    assert store.lineage("v0002")["replay"]["rows"] == 4
    assert [e["event"] for e in store.events()] == ["published", "resumed"]


def test_worse_draft_is_never_published(setup, monkeypatch):
    store = DraftStore(setup["run"])
    before = (store.current(), store.versions())
    real = finetune.finetune

    def ruin(model, *a, **kw):  # train, then break the head: AL falls to 1
        out = real(model, *a, **kw)
        with torch.no_grad():
            model.fc.weight.zero_()
        return out

    monkeypatch.setattr(finetune, "finetune", ruin)
    res = refresh(setup["run"], setup["policy"], [setup["r1"]], FAST + ["refresh.seed=5"])
    assert res["status"] == "rejected" and "not above" in res["reason"]
    assert (store.current(), store.versions()) == before
    assert store.events()[-1]["event"] == "rejected"
    assert "not above" in store.events()[-1]["reason"]


def test_lock_keeps_two_refreshes_apart(setup):
    with DraftStore(setup["run"]).lock(), pytest.raises(RefreshLocked, match="pid"):
        refresh(setup["run"], setup["policy"], [setup["r1"]], FAST)


def test_needs_a_budget(setup):
    with pytest.raises(DraftkitError, match="budget"):
        refresh(setup["run"], setup["policy"], [setup["r1"]],
                ["refresh.budget_steps=0", "refresh.seed=9"])


def test_cli_verbs(setup, capsys):
    from draftkit import cli

    store = DraftStore(setup["run"])
    args = [str(setup["run"]), "--policy", str(setup["policy"]), "--rollouts", str(setup["r1"])]
    assert cli.run(["drift", *args]) == 0
    assert "drift v0002 T=0: AL" in capsys.readouterr().out
    assert store.events()[-1]["event"] == "drift"
    n = len(store.versions())
    # overrides after the rollout list are overrides, not rollout paths
    assert cli.run(["refresh", *args, "--budget-steps", "3", "--policy-step", "7",
                    "refresh.gate=false", "refresh.batch_tokens=2048"]) == 0
    assert len(store.versions()) == n + 1
    lin = store.lineage(store.current())
    assert lin["steps"] == 3 and lin["policy"]["step"] == 7 and len(lin["rollouts"]) == 1
