"""Swaps and the store under faults, without vLLM (issue 44): what the watch does with rollout
files that do not read as text or JSON and with a server that dies mid-answer, what the
in-process refresher does when `current` moves under it or its check cannot measure, crash
points of the store (weights synced before the lineage, a failed `current` recovered on
start), a replay file that retention deleted, and the store's push lock. Each test names the
finding of issue 44 it covers; tests/test_swap_push.py and tests/test_swap_txn.py cover the
push and the server, tests/test_swap_faults_vllm.py runs the faults against real servers."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from _rl_helpers import make_run as make_rl_run
from _rl_helpers import save_policy
from _runs import make_run
from safetensors.torch import save_file

from draftkit.core.errors import DraftkitError
from draftkit.rl import job as job_mod
from draftkit.rl.publish import DraftStore
from draftkit.serving.drafter_swap import SECRET_ENV, DraftSwapError

SECRET = "s3cret-for-faults"


def _version(store: DraftStore, v: str, lineage: dict | None = None) -> None:
    def write(tmp, final):
        (tmp / "config.json").write_text("{}")
        save_file({"w": torch.ones(2)}, str(tmp / "model.safetensors"))
    store.publish(v, write, {"parent": None, "al_after": {"T=0": {"al": 2.0}},
                             "decided_on": "T=0", "rollouts": [], **(lineage or {})})


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run whose store holds v0001 (current) and v0002; probes come from its eval split."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    run = make_run(tmp_path, name="faults", prompts=[[1, 2, 3], [4, 5, 6]],
                   overrides=["tracking.backend=none", "refresh.engine_timeout_s=2"])
    store = DraftStore(run)
    for v in ("v0001", "v0002"):
        _version(store, v)
    store.set_current("v0001")
    return run


# ------------------------------------------------------------ finding 4: a watch never dies


def _log(store: DraftStore) -> list[dict]:
    path = store.root / "watch-log.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


@pytest.fixture
def fake_refresh(monkeypatch):
    from draftkit.rl import watch

    calls = []

    def record(run, hf, files, overrides, **kw):
        calls.append([Path(f).name for f in files])
        return {"status": "published", "version": f"v{len(calls):04d}"}

    monkeypatch.setattr(watch, "refresh", record)
    return calls


def test_a_file_that_is_not_utf8_or_nests_10000_deep_is_set_aside_and_the_watch_goes_on(
        tmp_path, tiny_target, fake_refresh):
    """Finding 4 (failed on ff81543: UnicodeDecodeError, then RecursionError out of tick)."""
    from draftkit.rl.watch import Watcher

    run = make_rl_run(tmp_path / "runs", tiny_target)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    save_policy(tiny_target, ckpts / "step_1")
    rolls.mkdir()
    good = json.dumps({"prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6]}) + "\n"
    (rolls / "a.jsonl").write_text(good)
    (rolls / "b.jsonl").write_bytes(good.encode() + b'{"prompt": "caf\xe9"}\n')  # latin-1
    (rolls / "c.jsonl").write_text(good + "[" * 10_000 + "]" * 10_000 + "\n")
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none", "refresh.rollout_settle_s=0"],
                every=1)
    w.tick()
    assert fake_refresh == [["a.jsonl"]]  # the good file is used; the watch is alive
    aside = {Path(e["path"]).name: e["detail"] for e in _log(DraftStore(run))
             if e["event"] == "rollouts_set_aside"}
    assert set(aside) == {"b.jsonl", "c.jsonl"}
    assert "b.jsonl:2" in aside["b.jsonl"] and "UTF-8" in aside["b.jsonl"]
    assert "c.jsonl:2" in aside["c.jsonl"] and "nested" in aside["c.jsonl"]


# ------------------------------------------- finding 6 and 2: the in-process refresher


def test_swap_into_reads_current_once(run, monkeypatch):
    """Finding 6 (failed on ff81543: v0002, published during probes(), was swapped in, and
    v0001, never tried, was marked failed)."""
    from draftkit.rl.refresher import DraftRefresher
    from draftkit.serving import drafter_swap

    store, tried = DraftStore(run), []
    refresher = DraftRefresher(run)

    def probes(version=None):
        store.set_current("v0002")  # a refresh publishes while the probes are read
        return [[1, 2, 3]]

    def swap_into(llm, directory, kind, probes, min_al, max_tokens, candidates=()):
        tried.append(Path(directory).resolve().name)
        raise DraftSwapError("probe AL 1.000 vs minimum 1.2", "failed", str(directory),
                             str(store.root / "v0000"), True)

    monkeypatch.setattr(refresher, "probes", probes)
    monkeypatch.setattr(drafter_swap, "swap_into", swap_into)
    with pytest.raises(DraftSwapError):
        refresher.swap_into(_engine("summary"))
    assert tried == ["v0001"]
    assert store.failure("v0001") is not None and store.failure("v0002") is None


def test_a_check_that_raised_or_an_engine_it_cannot_measure_condemns_nothing(run, monkeypatch):
    """Finding 2, in process (failed on ff81543: verdict "error", e.g. the probe's
    `AssertionError: Stat logging disabled`, marked a good version failed)."""
    from draftkit.rl.refresher import DraftRefresher
    from draftkit.serving import drafter_swap

    store = DraftStore(run)
    store.set_current("v0002")

    tried = []

    def swap_into(llm, directory, kind, probes, min_al, max_tokens, candidates=()):
        tried.append(directory)
        raise DraftSwapError("drafter swap raised AssertionError: Stat logging disabled",
                             "error", str(directory), str(store.root / "v0001"), True)

    monkeypatch.setattr(drafter_swap, "swap_into", swap_into)
    with pytest.raises(DraftSwapError):  # a measurable engine whose check raised
        DraftRefresher(run).swap_into(_engine("summary"), probes=[[1, 2, 3]])
    assert store.failure("v0002") is None and store.current() == "v0002"
    assert store.events()[-1]["event"] == "swap_failed" and len(tried) == 1
    # weak test of issue 52: require_measurable was patched away; an engine the probe cannot
    # read (stat logging off, no per-request metrics) is refused before anything loads
    with pytest.raises(DraftSwapError, match="cannot measure") as e:
        DraftRefresher(run).swap_into(_engine("none", log_stats=False), probes=[[1, 2, 3]])
    assert e.value.verdict == "refused" and len(tried) == 1
    assert store.failure("v0002") is None and store.current() == "v0002"


def _engine(per_request: str, log_stats: bool = True):
    """An in-process LLM as drafter_swap.probe_source reads it."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(observability_config=SimpleNamespace(
        per_request_spec_decode_metrics=per_request))
    return SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=cfg, log_stats=log_stats))


# ------------------------------------------------------------ finding 8: store crash points


def test_publish_syncs_the_weights_before_the_lineage(tmp_path, monkeypatch):
    """Finding 8 (failed on ff81543: only lineage.json was fsynced)."""
    store, synced = DraftStore(tmp_path / "run"), []
    real = os.fsync

    def fsync(fd):
        try:
            synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        except OSError:
            synced.append("?")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _version(store, "v0001")
    names = [n for n in synced if not n.startswith(".v0001")]
    assert "model.safetensors" in names and "config.json" in names
    assert names.index("model.safetensors") < max(i for i, n in enumerate(synced)
                                                  if "lineage.json" in n)


def test_a_failed_current_left_by_a_crash_moves_back_on_start(run):
    """Finding 8 (failed on ff81543: a crash between failed.json and the move back left
    `current` on the failed version: every push refused, a restarted server loaded it)."""
    from draftkit.core import artifacts
    from draftkit.rl.refresher import DraftRefresher

    store = DraftStore(run)
    store.set_current("v0002")
    artifacts.write_json_atomic(store.root / "v0002" / "failed.json",
                                {"version": "v0002", "reason": "probe AL 1.0"})  # then crash
    DraftRefresher(run)  # any start: a refresher, a watch, a push
    assert store.current() == "v0001"
    assert any(e["event"] == "recovered" for e in store.events())


def test_engines_json_is_written_atomically_with_its_directory_synced(run, monkeypatch):
    """Finding 8 (failed on ff81543: no directory fsync after the rename)."""
    store, synced = DraftStore(run), []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.write_record("engines.json", {"engines": {}})
    assert json.loads((store.root / "engines.json").read_text()) == {"engines": {}}
    assert os.path.realpath(store.root) in synced


# ------------------------------------------------------- finding 9: replay degrades, warns


def test_a_replay_file_that_is_gone_or_changed_is_skipped_with_a_warning(tmp_path, tiny_target):
    """Finding 9 (failed on ff81543: DraftkitError on every refresh, forever)."""
    from draftkit.core import artifacts

    store = DraftStore(tmp_path / "run")
    files = []
    for i in range(3):
        f = tmp_path / f"r{i}.jsonl"
        f.write_text(json.dumps({"prompt_ids": [1, 2, 3 + i], "response_ids": [4, 5, 6]}) + "\n")
        files.append({"path": str(f), "sha256": artifacts.sha256_file(f)})
        _version(store, f"v000{i + 1}", {"rollouts": [files[-1]]})
    Path(files[0]["path"]).unlink()  # retention deleted it
    with open(files[1]["path"], "a") as fh:  # a writer appended to it
        fh.write(json.dumps({"prompt_ids": [9, 9, 9], "response_ids": [4, 5, 6]}) + "\n")
    rows, used, skipped = job_mod.replay_rows(store, set(), 10, tiny_target.tokenizer, 1000, 64)
    assert used == [files[2]["path"]] and len(rows) == 1
    assert {s["path"]: s["why"].split(":")[0] for s in skipped} == {
        files[0]["path"]: "gone", files[1]["path"]: "changed"}


def test_the_push_lock_is_a_file_lock_that_waits(run):
    """Finding 5: the store's push lock holds across processes (flock) and waits its turn."""
    store, order = DraftStore(run), []

    def second():
        with store.push_lock(timeout=10):
            order.append("second")

    with store.push_lock(timeout=10):
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.3)
        order.append("first")
    t.join()
    assert order == ["first", "second"]
    with store.push_lock(timeout=10), pytest.raises(DraftkitError, match="another push"):
        with DraftStore(run).push_lock(timeout=0.2):
            pass


# ------------------------------------------- a gap of issue 44: the watch's --al-drop trigger


def test_watch_al_drop_refreshes_only_when_the_estimated_al_falls_far_enough(
        tmp_path, tiny_target, fake_refresh, monkeypatch):
    """`watch --al-drop 0.15` with no interval: a checkpoint whose rollouts the current draft
    scores at AL 1.9 (published at 2.0) is skipped, one at 1.6 (< 0.85 x 2.0) refreshes."""
    import shutil

    from draftkit.core import artifacts
    from draftkit.rl import drift
    from draftkit.rl.watch import Watcher

    run = make_rl_run(tmp_path / "runs", tiny_target)
    store = DraftStore(run)
    export = artifacts.RunPaths(run).export
    store.publish("v0001", lambda tmp, final: [shutil.copy(f, tmp / f.name)
                                               for f in export.iterdir() if f.is_file()],
                  {"parent": None, "rollouts": [], "decided_on": "T=0",
                   "al_after": {"T=0": {"al": 2.0}}})
    store.set_current("v0001")
    scored, al_now = [], {}

    def estimate(kind, model, policy_model, rows, k, temperatures, *a, **kw):
        scored.append(len(rows))
        return {drift.label(t): {"al": al_now["al"]} for t in temperatures}

    monkeypatch.setattr(drift, "estimate", estimate)
    ckpts, rolls = tmp_path / "ckpts", tmp_path / "rollouts"
    w = Watcher(run, ckpts, rolls, ["tracking.backend=none", "refresh.rollout_settle_s=0"],
                every=0, al_drop=0.15)
    row = json.dumps({"prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6]}) + "\n"
    for step, al in ((1, 1.9), (2, 1.6)):
        al_now["al"] = al
        save_policy(tiny_target, ckpts / f"step_{step}")
        rolls.mkdir(exist_ok=True)
        (rolls / f"s{step}.jsonl").write_text(row)
        w.tick()
    events = [e["event"] for e in _log(store)]
    assert scored == [1, 2] and fake_refresh == [["s1.jsonl", "s2.jsonl"]]
    assert events.count("drift") == 2 and "skipped" in events and "refresh_started" in events
    started = next(e for e in _log(store) if e["event"] == "refresh_started")
    assert started["reason"].startswith("AL drop: 1.600 < (1 - 0.15) * 2.000")
