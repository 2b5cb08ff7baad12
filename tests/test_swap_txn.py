"""The server side of a swap into a rollout server, without vLLM (issue 44): draftkit's routes on
a bare FastAPI app with a stand-in engine client, the load and rollback replaced by recorders.
A swap is one transaction the server finishes whatever happens to its client: the probe runs
on the server and reads its own requests' acceptance, a lost client asks /draftkit/state, a
pause draftkit did not take is never resumed, a cancelled handler gives up neither the lock nor
the pause while a load runs; the worker-extension load wants the secret too. Each test names
the finding of issue 44 it covers."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from draftkit.serving import drafter_swap as ds
from draftkit.serving import rollout_routes
from draftkit.serving.drafter_swap import SECRET_ENV

SECRET = "s3cret-for-txn"
OK = {"X-Draftkit-Secret": SECRET}


class Metrics(SimpleNamespace):
    """vLLM's RequestSpecDecodeMetrics: accepted-draft histogram per verify step."""


class Engine:
    """The EngineClient calls the routes make; `al_of` gives each probe request's histogram."""

    def __init__(self, histogram=(0, 0, 0, 10), paused=False, per_request=True):
        self.calls, self.histogram, self.paused = [], list(histogram), paused
        self.generated = []
        self.vllm_config = SimpleNamespace(observability_config=SimpleNamespace(
            per_request_spec_decode_metrics="summary" if per_request else "none"))
        self.probe_delay = 0.0

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(method)
        return {"draftkit_drafter_path": ["/gone"], "draftkit_drafter_hashes": [{}],
                "draftkit_native_ready": [True]}[method]

    async def get_weight_version(self):
        return "v0001"

    async def pause_generation(self, mode="abort", clear_cache=True):
        self.calls.append(f"pause {mode}")
        self.paused = True

    async def resume_generation(self):
        self.calls.append("resume")
        self.paused = False

    async def is_paused(self):
        return self.paused

    async def is_sleeping(self):
        return False

    async def generate(self, prompt, params, request_id):
        self.generated.append(request_id)
        await asyncio.sleep(self.probe_delay)
        m = Metrics(histogram=list(self.histogram), num_draft_tokens=3 * sum(self.histogram),
                    num_spec_tokens=3)
        yield SimpleNamespace(outputs=[SimpleNamespace(spec_decode_metrics=m)], finished=True)

    async def abort(self, ids):
        self.calls.append("abort")


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    """load_checked / roll_back recorders; a draft dir the routes accept."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv("DRAFTKIT_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    draft = tmp_path / "v0002"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    log, gate = [], threading.Event()
    gate.set()

    def load_checked(llm, kind, directory, candidates=(), version=None, reload_held=True):
        log.append("load")
        gate.wait(30)
        log.append("loaded")
        return {"directory": str(directory), "version": version or "v0002", "path": "native",
                "previous": str(tmp_path / "v0001"), "previous_version": "v0001",
                "held": [{"w": ["float32", "h"]}], "hash_problems": [], "loaded": True,
                "swap_s": 0.01}

    def roll_back(llm, kind, previous, held, version=None):
        log.append(f"roll_back {version}")
        return "restored (worker hashes equal those before the swap)", True

    monkeypatch.setattr(ds, "load_checked", load_checked)
    monkeypatch.setattr(ds, "roll_back", roll_back)
    return SimpleNamespace(draft=draft, log=log, gate=gate, tmp=tmp_path)


def _app(engine):
    from fastapi import FastAPI

    plugin = rollout_routes.DraftkitEndpoints()
    app = FastAPI()
    plugin.attach_router(app)
    app.state.engine_client = engine
    return app, plugin


def _body(draft, **kw):
    return {"directory": str(draft), "kind": "eagle3", "version": "v0002",
            "probes": [[1, 2, 3], [4, 5, 6]], "min_al": 1.2, "max_tokens": 8,
            "probe_timeout_s": 5, "pause_wait_s": 0.3, "wait_s": 60, **kw}


def _pauses(engine) -> list[str]:
    return [c for c in engine.calls if c.startswith(("pause", "resume"))]


def _wait_done(client, txn: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = client.get(f"/draftkit/state?txn={txn}", headers=OK).json().get("txn") or {}
        if rec.get("state") in ("committed", "rolled_back", "refused", "error"):
            return rec
        time.sleep(0.05)
    raise AssertionError(f"transaction {txn} did not finish")


def test_the_probe_runs_on_the_server_and_reads_its_own_requests(fakes):
    """Finding 10 (failed on ff81543: the route never probed; the client read /metrics,
    server-wide counters that any other client moves)."""
    from fastapi.testclient import TestClient

    engine = Engine(histogram=(2, 2, 2, 4))  # 10 steps, 18 accepted: AL 2.8
    app, _ = _app(engine)
    with TestClient(app) as client:
        r = client.post("/draftkit/swap", json=_body(fakes.draft, txn="t-ok"), headers=OK)
    out = r.json()
    assert r.status_code == 200 and out["state"] == "committed" and out["verdict"] == "passed"
    assert out["al"] == pytest.approx(2.8) and out["probe"]["drafts"] == 20
    assert engine.generated == ["draftkit-probe-t-ok-0", "draftkit-probe-t-ok-1"]
    assert fakes.log == ["load", "loaded"]
    assert _pauses(engine) == ["pause keep", "resume"]


def test_a_client_that_dies_after_the_swap_leaves_no_unchecked_draft(fakes):
    """Finding 1 (failed on ff81543: the server loaded, hash-checked and resumed; the probe
    and the rollback were the client's, so a dead client left the zeroed draft serving)."""
    from fastapi.testclient import TestClient

    engine = Engine(histogram=(10, 0, 0, 0))  # a zeroed draft: AL 1.0
    app, _ = _app(engine)
    with TestClient(app) as client:
        r = client.post("/draftkit/swap", json=_body(fakes.draft, txn="t-dead", wait_s=0),
                        headers=OK)  # the client goes away at once
        assert r.status_code in (200, 202, 409)
        rec = _wait_done(client, "t-dead")  # what a restarted client asks
    assert rec["state"] == "rolled_back" and rec["verdict"] == "failed"
    assert rec["restored"] is True and "probe AL 1.000" in rec["error"]
    assert fakes.log == ["load", "loaded", "roll_back v0001"]
    assert _pauses(engine) == ["pause keep", "resume"] * 2 and engine.paused is False


def test_a_probe_that_cannot_finish_rolls_back_and_decides_nothing(fakes):
    """Finding 2 (failed on ff81543: a probe that timed out, got 401/503, or did not fit
    max_model_len returned verdict `failed`: the good draft was condemned)."""
    from fastapi.testclient import TestClient

    engine = Engine()
    engine.probe_delay = 2.0
    app, _ = _app(engine)
    with TestClient(app) as client:
        r = client.post("/draftkit/swap", json=_body(fakes.draft, txn="t-slow",
                                                     probe_timeout_s=0.2), headers=OK)
    out = r.json()
    assert out["state"] == "rolled_back" and out["verdict"] == "error"
    assert "did not finish within 0.2s" in out["error"] and "engine_timeout_s" in out["error"]
    assert fakes.log[-1] == "roll_back v0001" and "abort" in engine.calls


def test_an_engine_without_per_request_metrics_is_refused_before_loading(fakes):
    """Finding 0/10: an engine whose probe cannot be measured is refused up front, naming
    the fix (failed on ff81543: loaded, then judged by server-wide counters)."""
    from fastapi.testclient import TestClient

    app, _ = _app(Engine(per_request=False))
    with TestClient(app) as client:
        r = client.post("/draftkit/swap", json=_body(fakes.draft), headers=OK)
    assert r.json()["verdict"] == "refused" and fakes.log == []
    assert "--per-request-spec-decode-metrics" in r.json()["error"]


def test_a_pause_draftkit_did_not_take_is_never_resumed(fakes):
    """Finding 3 (failed on ff81543: the swap paused and resumed a paused engine, unpausing a
    framework's policy sync half-way)."""
    from fastapi.testclient import TestClient

    engine = Engine(paused=True)  # a policy sync holds the engine paused
    app, _ = _app(engine)
    with TestClient(app) as client:
        r = client.post("/draftkit/swap", json=_body(fakes.draft, txn="t-paused"), headers=OK)
    out = r.json()
    assert "resume" not in engine.calls and engine.paused is True and fakes.log == []
    assert out["verdict"] == "refused" and "draftkit did not pause it" in out["error"]


def test_a_cancelled_handler_gives_up_neither_the_lock_nor_the_pause_while_loading(fakes):
    """Finding 12 (failed on ff81543: the cancelled handler resumed the engine and released the
    lock while the load thread went on)."""
    engine = Engine()
    _, plugin = _app(engine)
    fakes.gate.clear()  # the load blocks

    async def scenario():
        adapter = rollout_routes.EngineAdapter(engine, asyncio.get_running_loop())
        handler = asyncio.ensure_future(plugin._swap(adapter, _body(fakes.draft, txn="t-c")))
        while fakes.log != ["load"]:
            await asyncio.sleep(0.01)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        await asyncio.sleep(0.2)
        during = list(engine.calls)
        fakes.gate.set()
        for _ in range(200):
            if "resume" in engine.calls:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        return during

    during = asyncio.run(scenario())
    assert "resume" not in during  # still paused while the load ran
    assert "resume" in engine.calls and fakes.log[:2] == ["load", "loaded"]


def test_a_transaction_cancelled_at_shutdown_resumes_only_after_its_load(fakes):
    """Finding 12: even the transaction's own task, cancelled, waits for its load thread."""
    from draftkit.serving import swap_txn

    async def scenario():
        gate, order = threading.Event(), []

        def work():
            gate.wait(10)
            order.append("load done")

        async def txn():
            try:
                await swap_txn.uncancellable(asyncio.to_thread(work))
            finally:
                order.append("resume")

        task = asyncio.ensure_future(txn())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.sleep(0.1)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return order

    assert asyncio.run(scenario()) == ["load done", "resume"]


def test_the_worker_extension_load_wants_the_secret(monkeypatch, tmp_path):
    """Finding 11 (failed on ff81543: `draftkit_load_drafter(dir)` through /collective_rpc in
    dev mode loaded any directory)."""
    from vllm.model_executor.model_loader.reload import inplace

    monkeypatch.setenv(SECRET_ENV, SECRET)
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    loads = []
    monkeypatch.setattr(inplace, "reload_weights", lambda *a, **k: loads.append(a))
    model = SimpleNamespace(draftkit_path="/start")
    worker = SimpleNamespace(vllm_config=None, model_runner=SimpleNamespace(
        drafter=SimpleNamespace(model=model)))
    worker._draftkit_drafter = lambda: model
    worker.draftkit_drafter_path = lambda: model.draftkit_path
    for given in ((), ("wrong",)):
        with pytest.raises(Exception, match="secret"):
            ds.DrafterSwap.draftkit_load_drafter(worker, str(tmp_path), *given)
    assert loads == [] and model.draftkit_path == "/start"
    ds.DrafterSwap.draftkit_load_drafter(worker, str(tmp_path), SECRET)
    assert len(loads) == 1


def test_engine_kwargs_give_an_engine_the_probe_can_measure():
    """Finding 0 (failed on ff81543: engine_kwargs() left vLLM's stat logging off, the LLM
    default, so the probe raised `AssertionError: Stat logging disabled` and every refreshed
    version was condemned)."""
    from draftkit.serving import policy_sync

    for kw in (ds.engine_kwargs(), policy_sync.engine_kwargs()):  # the RL loop's engine too
        assert kw["disable_log_stats"] is False
        assert kw["per_request_spec_decode_metrics"] == "summary"
    blind = SimpleNamespace(llm_engine=SimpleNamespace(log_stats=False, vllm_config=SimpleNamespace(
        observability_config=SimpleNamespace(per_request_spec_decode_metrics="none"))))
    with pytest.raises(ds.DraftSwapError, match="engine_kwargs") as e:
        ds.require_measurable(blind)
    assert e.value.verdict == "refused"


def test_two_api_processes_of_one_server_swap_one_at_a_time(fakes):
    """Finding 5: `--api-server-count 2` gives each API process its own plugin and asyncio
    lock; the file lock keyed by the port still lets one transaction run at a time, and the
    state file lets either process answer for the other's transaction."""
    from draftkit.serving import swap_txn

    engine = Engine()
    fakes.gate.clear()

    async def scenario():
        a, b = swap_txn.Transactions("8000"), swap_txn.Transactions("8000")
        adapter = rollout_routes.EngineAdapter(engine, asyncio.get_running_loop())
        args = rollout_routes._swap_args(_body(fakes.draft), probe=True)
        _, first = a.start(adapter, {**args, "txn": "t-a"})
        while fakes.log != ["load"]:
            await asyncio.sleep(0.01)
        _, second = b.start(adapter, {**args, "txn": "t-b"})
        await asyncio.sleep(0.3)
        waiting = (list(fakes.log), b.get("t-b")["state"], b.get("t-a")["state"])
        fakes.gate.set()
        await asyncio.gather(first, second)
        return waiting, a.get("t-b")["state"]

    waiting, seen_by_a = asyncio.run(scenario())
    assert waiting == (["load"], "queued", "loading")  # b waits; b sees a's transaction
    assert fakes.log == ["load", "loaded", "load", "loaded"] and seen_by_a == "committed"
