"""`draftkit refresh` on the tiny target: publish with lineage, exactly once; a crash between
writing a version and moving `current`; a worse draft never published; the lock. Reruns of old
jobs after newer publishes are superseded (`current` never moves back); the gate refuses to
decide on too few held-out draft starts; GRPO siblings stay on one side of the split; ranges
are checked at config load; a torn refresh-log line is skipped; a missing replay file is an
error."""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest
import torch
from _rl_helpers import make_run, save_policy, write_rollouts
from _runs import one_thread

from draftkit.core import config
from draftkit.core.errors import DraftkitError
from draftkit.rl import finetune
from draftkit.rl.job import draft_starts, heldout_split, refresh
from draftkit.rl.publish import DraftStore, RefreshLocked
from draftkit.rl.rollouts import Rollout, prompt_key

FAST = ["refresh.budget_steps=40", "refresh.lr=3e-3", "refresh.batch_tokens=2048"]
# the crash test is about publishing, not gain: accept any draft (refresh.gate=false)
SECOND = [*FAST, "refresh.replay=4", "refresh.gate=false"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target):
    tmp = tmp_path_factory.mktemp("refresh")
    with one_thread():
        yield {"run": make_run(tmp / "runs", tiny_target), "target": tiny_target,
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


def test_rerun_of_an_old_job_after_a_newer_publish_leaves_current(setup):
    run, store = setup["run"], DraftStore(setup["run"])
    assert store.lineage("v0001")["parent"] == "export" and store.current() != "v0001"
    before = (store.current(), store.versions())
    res = refresh(run, setup["policy"], [setup["r1"]], FAST)  # v0001's job, retried late
    assert res["status"] == "superseded" and "v0001" in res["reason"]
    assert (store.current(), store.versions()) == before
    assert store.events()[-1]["event"] == "superseded"


def test_a_job_that_crashed_midway_is_superseded_by_a_newer_publish(setup, tmp_path):
    run, store = setup["run"], DraftStore(setup["run"])
    mine = ["refresh.seed=11", "refresh.budget_steps=3"]
    with pytest.raises(finetune.Stopped):  # killed during its fine-tune
        refresh(run, setup["policy"], [setup["r1"]], [*FAST, *mine],
                should_stop=lambda: True)
    latest = tmp_path / "latest.jsonl"  # the same file under a second name: read once
    latest.symlink_to(setup["r2"])
    res = refresh(run, setup["policy"], [setup["r2"], latest],
                  [*SECOND, *mine, "refresh.max_seq_len=40"])
    assert res["status"] == "published"
    lin = res["lineage"]
    assert len(lin["rollouts"]) == 1 and len(lin["rows"]["dropped"]["duplicate_files"]) == 1
    assert lin["rows"]["read"] == 16 and lin["rows"]["cut"] == 16  # prompts + 24 > 40 tokens
    current = store.current()
    res = refresh(run, setup["policy"], [setup["r1"]], [*FAST, *mine])  # the scheduler retries
    assert res["status"] == "superseded" and "did not finish" in res["reason"]
    assert store.current() == current


def test_too_few_heldout_draft_starts_is_undecided(setup, tmp_path):
    store = DraftStore(setup["run"])
    before = (store.current(), store.versions())
    small = write_rollouts(setup["target"], tmp_path / "small.jsonl", 4, 40)  # 1 held out
    res = refresh(setup["run"], setup["policy"], [small], FAST)
    assert res["status"] == "undecided" and (store.current(), store.versions()) == before
    assert "only 23 held-out draft starts" in res["reason"]
    assert "refresh.min_heldout_starts=64" in res["reason"]
    assert "heldout_fraction" in res["reason"] and "more rollouts" in res["reason"]
    assert store.events()[-1]["event"] == "undecided"


def _grpo_rows(prompts: int, group: int) -> list[Rollout]:
    """GRPO-shaped rows as a trainer writes them: sample-major (every prompt's sample 0, then
    every prompt's sample 1, ...), one file, distinct responses."""
    return [Rollout([1, 2, 10 + p] + [20 + s, 30 + s, 40], [0, 0, 0, 1, 1, 1], 3,
                    f"step_1.jsonl:{s * prompts + p + 1}")
            for s in range(group) for p in range(prompts)]


def test_grpo_siblings_never_straddle_the_split():
    rows = _grpo_rows(10, 4)
    train, held = heldout_split(rows, 0.2)
    held_prompts = {prompt_key(r) for r in held}
    assert len(held_prompts) == 2 and len(held) == 8  # ceil(0.2 * 10) prompts, all samples
    assert not held_prompts & {prompt_key(r) for r in train}
    shuffled = random.Random(0).sample(rows, len(rows))  # wherever the rows come from
    assert {prompt_key(r) for r in heldout_split(shuffled, 0.2)[1]} == held_prompts
    assert draft_starts(held) == 8 * 2  # 3 response tokens: 2 starts each
    with pytest.raises(DraftkitError, match="2 distinct prompts"):
        heldout_split(_grpo_rows(1, 4), 0.2)


def test_draft_starts_counts_what_the_estimate_scores(setup):
    from draftkit.rl import drift
    from draftkit.rl import job as refresh_mod
    from draftkit.rl.rollouts import read_rollouts

    kind, tok = refresh_mod.kinds.get("eagle3"), setup["target"].tokenizer  # the kind registry
    rows = read_rollouts([setup["r1"]], tok, setup["target"].model.config.vocab_size)[:3]
    model = kind.load(DraftStore(setup["run"]).current_dir(), setup["target"].model, 3)
    est = drift.estimate(kind, model, setup["target"].model, rows, 3)
    assert est["T=0"]["starts"] == draft_starts(rows) == 3 * 23


@pytest.mark.parametrize("override, needle", [
    ("refresh.min_gain=-0.5", "refresh.min_gain=-0.5 must be >= 0"),
    ("refresh.min_probe_al=1.0", "refresh.min_probe_al=1.0 must be > 1.0"),
    ("refresh.heldout_fraction=1.0", r"refresh.heldout_fraction=1.0 must be in \(0, 1\)"),
    ("refresh.heldout_fraction=0", "heldout_fraction"),
    ("refresh.min_heldout_starts=0", "min_heldout_starts"),
])
def test_gate_ranges_are_checked_at_config_load(setup, override, needle):
    with pytest.raises(config.ConfigError, match=needle):
        config.load(setup["run"], [override])


def test_a_torn_log_line_is_skipped_with_a_warning(tmp_path):
    store = DraftStore(tmp_path)
    store.log("published", job="a", version="v0001")
    with open(store.log_path, "a") as f:
        f.write('{"time": "2026", "event": "rej')  # a crash mid-write: no newline
    store.log("rejected", job="b", reason="r")  # appended onto the torn line
    store.log("published", job="c", version="v0002")
    with pytest.warns(UserWarning, match="torn line"):
        events = store.events()
    assert [e["job"] for e in events] == ["a", "b", "c"]


def test_a_missing_replay_file_is_skipped_and_named_in_the_lineage(setup, tmp_path):
    run = tmp_path / "replay-run"  # a copy whose newest version trained on a file now gone
    shutil.copytree(setup["run"], run, symlinks=True)
    store = DraftStore(run)
    newest = store.versions()[-1]
    lin = store.lineage(newest)
    gone = tmp_path / "gone.jsonl"
    lin["rollouts"] = [{"path": str(gone), "sha256": "0" * 64}]
    (store.root / newest / "lineage.json").write_text(json.dumps(lin))
    res = refresh(run, setup["policy"], [setup["r1"]], [*FAST, "refresh.replay=4",
                                                        "refresh.seed=13"])
    assert res["status"] in ("published", "rejected")  # issue 44: replay what is there
    skipped = res["lineage"]["replay"]["skipped"]
    assert [s["path"] for s in skipped] == [str(gone)] and skipped[0]["why"].startswith("gone")
