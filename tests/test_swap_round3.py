"""Issue 52 (swaps, round 3): an engine's state is asked, not assumed; a probe that measured
nothing decides nothing; the secret never leaves for a proxy. The server side runs on a bare
FastAPI app with test_swap_txn's stand-in engine; the push side on stub HTTP servers bound to
loopback. Each test names its finding (N1 ... N11); each failed on da386a3."""

# ruff: noqa: F811 - fixtures imported from a sibling test module are these tests' arguments
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from test_swap_txn import OK, Engine, _app, _body, fakes  # noqa: F401 - fakes is a fixture

from draftkit.core.config import ConfigError, RefreshConfig
from draftkit.serving import drafter_swap as ds


def _swap(engine, body) -> dict:
    from fastapi.testclient import TestClient

    app, _ = _app(engine)
    with TestClient(app) as client:
        return client.post("/draftkit/swap", json=body, headers=OK).json()


# ------------------------------------------------------------------ N1: measure, then judge


@pytest.mark.parametrize("histogram", [(0, 0, 0, 0), (1, 0, 0, 0)])
def test_a_probe_that_measured_nothing_decides_nothing(fakes, histogram):
    # N1: 0 drafts (probe_max_tokens=1, a k-schedule with no drafting, a saturated engine)
    # read as AL 1.0 and so `failed`; da386a3 condemned the good draft on every engine
    out = _swap(Engine(histogram=histogram), _body(fakes.draft, txn="t-none"))
    assert out["state"] == "rolled_back" and out["verdict"] == "error", out
    assert "decided" in out["error"] and "min_probe_drafts" in out["error"]
    assert fakes.log[-1] == "roll_back v0001"


def test_a_probe_that_cannot_draft_or_fit_is_refused_before_any_pause(fakes):
    # N1: max_tokens < k + 2, or a probe past --max-model-len, was found only after a pause and
    # a load (and then judged); now refused up front, nothing paused or loaded
    for k, limit, words in ((3, 4096, "k + 2"), (1, 6, "max-model-len")):
        engine = Engine()
        engine.vllm_config.speculative_config = SimpleNamespace(num_speculative_tokens=k)
        engine.vllm_config.model_config = SimpleNamespace(max_model_len=limit)
        out = _swap(engine, _body(fakes.draft, max_tokens=4))
        assert out["verdict"] == "refused" and words in out["error"], out
        assert fakes.log == [] and not [c for c in engine.calls if "pause" in c]


def test_the_in_process_swap_reads_no_drafts_as_undecided(monkeypatch):
    # N1: drafter_swap.swap_into / health_check read 0 drafts as AL 1.0: `failed`
    report = {"directory": "/d", "version": "v0002", "path": "native", "previous": "/p",
              "previous_version": "v0001", "held": [{}], "hash_problems": [], "loaded": True,
              "swap_s": 0.0}
    monkeypatch.setattr(ds, "require_measurable", lambda llm: None)
    monkeypatch.setattr(ds, "load_checked", lambda *a, **k: dict(report))
    monkeypatch.setattr(ds, "probe_al", lambda *a, **k: None)  # nothing drafted
    monkeypatch.setattr(ds, "roll_back", lambda *a, **k: ("restored", True))
    with pytest.raises(ds.DraftSwapError) as e:
        ds.swap_into(object(), "/d", SimpleNamespace(name="eagle3"), [[1, 2]], 1.2)
    assert e.value.verdict == "error" and "decided" in str(e.value)
    monkeypatch.setattr(ds, "hash_problems", lambda *a: [])
    with pytest.raises(ds.DraftSwapError) as e:
        ds.health_check(object(), None, "/d", [[1, 2]], 1.2)
    assert e.value.verdict == "error"


@pytest.mark.parametrize("key,value", [
    ("probe_max_tokens", 1), ("probe_max_tokens", 4), ("engine_timeout_s", math.nan),
    ("engine_timeout_s", -1.0), ("poll_s", 0.0), ("poll_s", math.inf), ("probe_prompts", 0),
    ("min_probe_drafts", 0)])
def test_refresh_numbers_are_validated(key, value):
    # N1 (probe_max_tokens was never validated) and N11 (NaN and negative numbers)
    cfg = RefreshConfig(**{key: value})
    with pytest.raises(ConfigError, match=f"refresh.{key}"):
        cfg.check(k=3)
    RefreshConfig().check(k=3)


def test_the_server_refuses_numbers_it_cannot_honour(fakes):
    # N11: pause_wait_s=NaN waited forever holding the lock; no cap on the probes
    for bad in ({"pause_wait_s": "nan"}, {"probe_timeout_s": -1}, {"wait_s": "inf"},
                {"probes": [[1, 2]] * 65}, {"probes": [[1] * 9000]}, {"min_al": "nan"}):
        out = _swap(Engine(), _body(fakes.draft, **bad))
        assert out["verdict"] == "refused" and out["ok"] is False, (bad, out)
    assert fakes.log == []


# ------------------------------------------------------------- N8: the server's state file


def _save_many(state_dir: str, who: str, n: int, base: float) -> None:
    """One API process of a server (its own OS process) saving `n` transaction records."""
    import os

    from draftkit.serving import swap_txn

    os.environ["DRAFTKIT_STATE_DIR"] = state_dir
    txns = swap_txn.Transactions("8000")
    for i in range(n):
        txns._save({"txn": f"{who}-{i}", "state": "queued", "started": base + i})


def test_two_api_processes_in_two_os_processes_lose_no_record(tmp_path):
    # N8 and the weak test_swap_txn two-processes test (one event loop, so no race could
    # happen): the state file was read-modify-written without a lock, so one API process's
    # write dropped a record the other had just saved. b's 10 records are the newest (always
    # kept); a writes 400 older ones at the same time
    import multiprocessing as mp
    import os

    from draftkit.serving import swap_txn

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), "a", 400, 0.0)),
             ctx.Process(target=_save_many, args=(str(tmp_path), "b", 10, 1e9))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    os.environ["DRAFTKIT_STATE_DIR"] = str(tmp_path)
    try:
        saved = swap_txn.Transactions("8000")._load()
    finally:
        del os.environ["DRAFTKIT_STATE_DIR"]
    assert {f"b-{i}" for i in range(10)} <= set(saved), sorted(saved)


def test_the_state_lives_in_a_private_directory(tmp_path, monkeypatch):
    # N8: the state file lived in the shared /tmp, where another user can pre-create or read it
    import os
    import tempfile

    from draftkit.serving import swap_txn

    monkeypatch.delenv("DRAFTKIT_STATE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = swap_txn.state_dir()
    assert path.parent == tmp_path and (path.stat().st_mode & 0o777) == 0o700
    path.chmod(0o777)  # someone opened it up
    with pytest.raises(ds.DraftSwapError, match="private"):
        swap_txn.state_dir()
    assert os.stat(path).st_mode & 0o777 == 0o777


def test_a_restart_ends_unfinished_records_and_an_error_keeps_previous(fakes):
    # N8: unfinished records were kept across restarts, and an error after the load saved
    # the record from before it (losing `previous`, the draft to put back)
    import asyncio

    from draftkit.serving import rollout_routes, swap_txn

    old = swap_txn.Transactions("9000")
    old._save({"txn": "t-old", "state": "probing", "started": 1.0})
    assert swap_txn.Transactions("9000").end_stale() == ["t-old"]
    assert swap_txn.Transactions("9000").get("t-old")["verdict"] == "error"

    class Breaks(Engine):
        async def pause_generation(self, mode="abort", clear_cache=True):
            if "resume" in self.calls:  # the rollback's pause raises
                raise RuntimeError("engine dead")
            await super().pause_generation(mode, clear_cache)

    engine = Breaks(histogram=(10, 0, 0, 0))  # AL 1.0: a rollback

    async def scenario():
        txns = swap_txn.Transactions("9001")
        adapter = rollout_routes.EngineAdapter(engine, asyncio.get_running_loop())
        args = rollout_routes._swap_args(_body(fakes.draft), probe=True)
        _, task = txns.start(adapter, {**args, "txn": "t-err"})
        return await task

    rec = asyncio.run(scenario())
    assert rec["verdict"] == "error" and "engine dead" in rec["error"]
    assert rec["previous"].endswith("v0001") and rec["previous_version"] == "v0001"


def test_a_pause_taken_during_the_probe_is_left_alone(fakes):
    # weak test_swap_txn pause test (only a pause taken before the swap): a policy sync that
    # pauses while the probe runs stalls it; the rollback runs inside that pause, leaves it
    # paused, and the verdict is undecided
    class PausedMidProbe(Engine):
        async def generate(self, prompt, params, request_id):
            self.paused = True  # another client's pause, after draftkit resumed
            async for out in super().generate(prompt, params, request_id):
                yield out

    engine = PausedMidProbe()
    engine.probe_delay = 2.0
    out = _swap(engine, _body(fakes.draft, txn="t-mid", probe_timeout_s=0.3))
    assert out["state"] == "rolled_back" and out["verdict"] == "error", out
    assert [c for c in engine.calls if c.startswith(("pause", "resume"))] == [
        "pause keep", "resume"]  # draftkit's own, before the probe; none around the rollback
    assert engine.paused is True and fakes.log[-1] == "roll_back v0001"


# ---------------------------------------------------------------------- N11: the limits


def test_the_server_loads_only_from_its_draft_roots(fakes, monkeypatch):
    # N11: no allow-list: any directory the server could read was loaded
    from draftkit.serving import rollout_routes

    monkeypatch.setenv(rollout_routes.ROOTS_ENV, str(fakes.tmp / "elsewhere"))
    out = _swap(Engine(), _body(fakes.draft))
    assert out["verdict"] == "refused" and rollout_routes.ROOTS_ENV in out["error"]
    assert fakes.log == []
    monkeypatch.setenv(rollout_routes.ROOTS_ENV, str(fakes.tmp))
    assert _swap(Engine(), _body(fakes.draft))["verdict"] == "passed"


def test_a_hung_engine_call_ends_the_transaction(fakes, monkeypatch):
    # N11: no timeouts on is_paused / pause / resume: a hung engine held the lock for ever
    import asyncio

    from draftkit.serving import swap_txn

    class Hangs(Engine):
        async def is_paused(self):
            await asyncio.sleep(3600)

    monkeypatch.setattr(swap_txn, "ENGINE_CALL_S", 0.2)
    out = _swap(Hangs(), _body(fakes.draft))
    assert out["verdict"] == "error" and "is_paused did not answer" in out["error"]
    assert fakes.log == []


def test_a_timed_out_rpc_is_cancelled_and_leaves_no_update_active(monkeypatch):
    # N11: the 300 s RPC timeout did not cancel the call (the rollback then hit "update
    # already active"), and a native update that raised left its session open
    import asyncio
    import threading

    from draftkit.serving import rollout_routes

    monkeypatch.setattr(rollout_routes, "RPC_TIMEOUT_S", 0.2)
    cancelled = threading.Event()

    class Slow:
        async def collective_rpc(self, method, args=(), kwargs=None):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    async def scenario():
        adapter = rollout_routes.EngineAdapter(Slow(), asyncio.get_running_loop())
        with pytest.raises(TimeoutError, match="cancelled"):
            await asyncio.to_thread(adapter.collective_rpc, "draftkit_drafter_hashes")
        await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert cancelled.is_set()

    calls = []

    class Native:
        def start_draft_weight_update(self):
            calls.append("start")

        def update_weights(self, request):
            raise TimeoutError("an engine call did not answer")

        def finish_weight_update(self, weight_version=None):
            calls.append(("finish", weight_version))

    with pytest.raises(TimeoutError):
        ds.native_load(Native(), "/d")
    assert calls == ["start", ("finish", None)]  # closed; N10: no weight version set


def test_the_secret_is_in_no_repr_log_or_record(fakes, caplog, tmp_path):
    # N11: the secret appeared in DraftkitUpdateInfo's repr (vLLM logs update requests)
    import logging

    from test_swap_txn import SECRET

    from draftkit.serving.weight_transfer import DraftkitUpdateInfo

    assert SECRET not in repr(DraftkitUpdateInfo(directory="/d", secret=SECRET))
    with caplog.at_level(logging.DEBUG):
        out = _swap(Engine(histogram=(10, 0, 0, 0)), _body(fakes.draft, txn="t-s"))
    assert out["verdict"] == "failed"
    seen = caplog.text + json.dumps(out) + "".join(
        p.read_text(errors="replace") for p in (fakes.tmp / "state").iterdir() if p.is_file())
    assert SECRET not in seen and len(caplog.records) > 0


def test_files_changed_since_publish_are_refused_before_loading(fakes):
    # N11: the hash check compared the engine with a second read of the directory, so a
    # draft whose files were replaced after publish passed as the published version
    import hashlib

    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(fakes.draft / "model.safetensors"))
    digest = hashlib.sha256((fakes.draft / "model.safetensors").read_bytes()).hexdigest()
    save_file({"w": torch.zeros(2)}, str(fakes.draft / "model.safetensors"))  # edited later
    out = _swap(Engine(), _body(fakes.draft, weights={"model.safetensors": digest}))
    assert out["verdict"] == "refused" and "changed since it was published" in out["error"]
    assert fakes.log == []
    save_file({"w": torch.ones(2)}, str(fakes.draft / "model.safetensors"))
    assert _swap(Engine(), _body(fakes.draft, weights={"model.safetensors": digest}))[
        "verdict"] == "passed"


# -------------------------------------- N6, N10: the draft's hash and version where asked


class _Serving(Engine):
    """The stand-in engine, its drafter loaded from `drafter` (a real dir)."""

    def __init__(self, drafter, **kw):
        super().__init__(**kw)
        self.drafter = drafter

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if method == "draftkit_drafter_path":
            self.calls.append(method)
            return [str(self.drafter)]
        return await super().collective_rpc(method, timeout, args, kwargs)


def test_the_state_and_the_metrics_name_the_served_drafts_version_and_hash(fakes):
    # N6: /draftkit/state said version and boot id but no hash, so an engine serving other
    # weights under the recorded name went unnoticed; N10: the draft's version was in no
    # metric once vLLM's weight version went back to the policy
    from fastapi.testclient import TestClient
    from prometheus_client import REGISTRY, generate_latest
    from safetensors.torch import save_file

    from draftkit.core.artifacts import sha256_file
    from draftkit.serving import draft_info

    start = fakes.tmp / "export"
    start.mkdir()
    save_file({"w": torch.zeros(2)}, str(start / "model.safetensors"))
    save_file({"w": torch.ones(2)}, str(fakes.draft / "model.safetensors"))
    weights = {"model.safetensors": sha256_file(fakes.draft / "model.safetensors")}
    engine = _Serving(start)
    app, _ = _app(engine)
    with TestClient(app) as client:
        st = client.get("/draftkit/state", headers=OK).json()
        assert st["draft_version"] == "export"
        assert st["draft_hash"] == draft_info.weights_hash(draft_info.file_digests(start))
        out = client.post("/draftkit/swap", json=_body(fakes.draft, txn="t-hash",
                                                       weights=weights), headers=OK).json()
        assert out["state"] == "committed" and out["draft_hash"] == draft_info.weights_hash(
            weights)
        engine.drafter = fakes.draft  # what the fake load did
        st = client.get("/draftkit/state", headers=OK).json()
    assert (st["draft_version"], st["draft_hash"]) == ("v0002", draft_info.weights_hash(weights))
    text = generate_latest(REGISTRY).decode()
    shown = [line for line in text.splitlines() if line.startswith(draft_info.METRIC + "{")]
    assert f'hash="{st["draft_hash"]}",version="v0002"}} 1.0' in "\n".join(shown), shown
    assert any('version="export"} 0.0' in line for line in shown)  # no longer served


# ----------------------------------------------- N1, N7: probes ahead of queued rollouts


class _Scheduled(Engine):
    """The stand-in engine on a `--scheduling-policy`; records each probe's priority."""

    def __init__(self, policy, **kw):
        super().__init__(**kw)
        self.vllm_config.scheduler_config = SimpleNamespace(policy=policy)
        self.priorities = []

    async def generate(self, prompt, params, request_id, priority=0):
        self.priorities.append(priority)
        async for out in super().generate(prompt, params, request_id):
            yield out


def test_probes_run_ahead_under_priority_and_fcfs_is_said_once(fakes, caplog):
    # N1/N7: probes queued behind rollouts silently (a saturated engine timed out every probe);
    # draftkit's launchers now start servers on the priority policy, and a server on fcfs says
    # so, naming the fix, once
    from draftkit.serving import swap_txn

    engine = _Scheduled("priority")
    out = _swap(engine, _body(fakes.draft, txn="t-prio"))
    assert out["state"] == "committed" and out["scheduling"] == "priority"
    assert engine.priorities and set(engine.priorities) == {swap_txn.PROBE_PRIORITY}
    engine = _Scheduled("fcfs")
    with caplog.at_level("WARNING", logger="draftkit.serving.swap_txn"):
        for txn in ("t-fcfs-1", "t-fcfs-2"):
            out = _swap(engine, _body(fakes.draft, txn=txn))
            assert out["state"] == "committed" and out["scheduling"] == "fcfs"
    assert set(engine.priorities) == {0}  # nothing to jump the queue with
    said = [r for r in caplog.records if "--scheduling-policy priority" in r.getMessage()]
    assert len(said) == 1
