"""Rollout servers without vLLM (issue 37): what `draftkit swap` / `watch --engines` do when an
engine is unreachable, answers 4xx/5xx or times out (a stub HTTP server stands in: a real one
adds nothing), what a failure on one engine of several means for the store, the secret rules of
draftkit's routes, and /metrics parsing. Every error names the engine; nothing published is
lost. tests/test_rollout_servers_vllm.py runs the same paths against real `vllm serve`s."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch
from _runs import make_run
from safetensors.torch import save_file

from draftkit import cli
from draftkit.core.errors import DraftkitError
from draftkit.rl import rollout_servers as engines
from draftkit.rl import watch as watch_mod
from draftkit.rl.publish import DraftStore
from draftkit.serving import rollout_client, rollout_routes
from draftkit.serving.drafter_swap import SECRET_ENV

SECRET = "s3cret-for-tests"


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run whose store holds v0001 (current) and v0002; probes come from its eval split."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    run = make_run(tmp_path, name="rs", prompts=[[1, 2, 3], [4, 5, 6]],
                   overrides=["tracking.backend=none", "refresh.engine_timeout_s=1"])
    store = DraftStore(run)
    for v in ("v0001", "v0002"):
        def write(tmp, final):
            (tmp / "config.json").write_text("{}")
            save_file({"w": torch.ones(2)}, str(tmp / "model.safetensors"))
        store.publish(v, write, {"parent": None, "al_after": {"T=0": {"al": 2.0}},
                                 "decided_on": "T=0", "rollouts": []})
    store.set_current("v0001")
    return run


class _Stub(BaseHTTPRequestHandler):
    """Answers every request as `server.mode` says: a status + JSON, or a long silence."""

    def _answer(self):
        mode = self.server.mode
        self.server.seen.append((self.command, self.path, self.headers.get("X-Draftkit-Secret")))
        if mode == "slow":
            time.sleep(3)
        status, body = self.server.reply
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.mode, server.reply, server.seen = "ok", (200, {}), []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()


def _unchanged(run) -> None:
    store = DraftStore(run)
    assert store.versions() == ["v0001", "v0002"] and store.current() == "v0001"
    assert store.failure("v0001") is None and store.failure("v0002") is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_timeout_and_http_errors_name_the_engine_and_lose_nothing(run, stub):
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(engines.EngineSwapError, match="unreachable") as e:
        engines.push(run, [dead], DraftStore(run).root / "v0002")
    assert dead in str(e.value) and e.value.results[dead]["status"] == "unreachable"
    _unchanged(run)

    stub.mode = "slow"  # answers, slowly, with nothing a swap transaction says
    with pytest.raises(engines.EngineSwapError, match="not finished by the deadline") as e:
        engines.push(run, [stub.url], DraftStore(run).root / "v0002")
    assert stub.url in str(e.value)
    _unchanged(run)

    stub.mode = "ok"
    for status, body, words in (
            (404, {"detail": "Not Found"}, "VLLM_PLUGINS=draftkit"),
            (401, {"ok": False, "error": "wrong or missing X-Draftkit-Secret header"}, "401"),
            (500, {"ok": False, "error": "RuntimeError: boom", "verdict": "error",
                   "restored": True, "previous": str(DraftStore(run).root / "v0001")}, "boom")):
        stub.reply = (status, body)
        with pytest.raises(engines.EngineSwapError, match=words) as e:
            engines.push(run, [stub.url], DraftStore(run).root / "v0002")
        assert f"engine {stub.url}" in str(e.value)
        _unchanged(run)  # a refused swap or a swap that raised is not the draft's verdict
    assert stub.seen[-1][2] == SECRET  # every draftkit call carries the secret
    rec = engines.read(DraftStore(run))["engines"]
    assert rec[dead]["status"] == "unreachable"  # none of these decided anything: asked again
    assert rec[stub.url]["status"] == "behind" and rec[stub.url]["retry_at"] > time.time()
    assert watch_mod._settled(rec[stub.url], "v0002")  # N7: backs off, with jitter ...
    assert not watch_mod._settled({**rec[stub.url], "retry_at": 0}, "v0002")  # ... then again
    events = [x["event"] for x in DraftStore(run).events()]
    assert events.count("engine_swap_failed") == 5


def test_no_secret_fails_before_any_call(run, stub, monkeypatch):
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(DraftkitError, match=SECRET_ENV):
        engines.push(run, [stub.url])
    assert stub.seen == []


def _fake_swaps(monkeypatch, verdicts: dict):
    """rollout_client.swap_engine stand-in: each URL passes (None) or fails with a verdict."""
    def swap_engine(url, directory, kind, probes, min_al, max_tokens, timeout, candidates,
                    version, reload_held, min_drafts=8, weights=None):
        assert probes == [[1, 2, 3], [4, 5, 6]] and min_al > 1.0
        if verdicts[url] is None:
            return {"al": 2.0, "swap_s": 0.1, "pause_s": 0.2, "probe_s": 0.3, "loaded": True,
                    "path": "native"}
        raise rollout_client.EngineError(url, "probe AL 1.000 <= minimum 1.2", verdicts[url], True,
                                  str(directory).replace("v0002", "v0001"), "v0001")
    monkeypatch.setattr(rollout_client, "swap_engine", swap_engine)


def test_one_engine_of_two_fails_the_version_fails_and_both_go_back(run, monkeypatch):
    # issue 52 (what to build 3): a version that failed on any engine that served it is failed,
    # and no engine is left serving it: the engine that passed it is swapped back too (before,
    # each engine kept its own version and v0002 stayed current)
    a, b = "http://a:1", "http://b:2"
    _fake_swaps(monkeypatch, {a: None, b: "failed"})
    store = DraftStore(run)
    store.set_current("v0002")
    with pytest.raises(engines.EngineSwapError, match="2 of 2 engines do not serve v0002") as e:
        engines.push(run, [a, b])
    assert b in str(e.value) and "swapped back" in str(e.value)
    rec = engines.read(store)["engines"]
    assert rec[a]["version"] == "v0001" and rec[a]["status"] == "serving"
    assert rec[b] == {**rec[b], "version": "v0001", "status": "refused", "refused": "v0002",
                      "restored": True}
    assert store.current() == "v0001" and store.failure("v0002") is not None
    assert engines.read(store)["verdicts"]["v0001"] == {a: "passed"}
    back = [e for e in store.events() if e["event"] == "swap_back"]
    assert back == [{**back[0], "version": "v0002", "to": "v0001", "engines": [a]}]


def test_a_long_error_keeps_its_verdict_and_restored_tail(run, monkeypatch):
    """A check's error names two draft paths; under a deep run directory (CI's
    /tmp/pytest-of-root/pytest-101/...) the summary once cut it before "is restored"."""
    deep = "/very/deep/ci/tmp/pytest-of-root/pytest-101/rollout0/" + "x" * 120
    def swap_engine(url, directory, *args, **kwargs):
        raise rollout_client.EngineError(
            url, f"engine {url}: swap to {deep}/v0002 failed its check: probe AL 1.000 <= "
            f"minimum 1.2 over 312 drafts; the previous draft {deep}/v0001 is restored (worker "
            "hashes equal those before the swap)", "failed", True, f"{deep}/v0001", "v0001")
    monkeypatch.setattr(rollout_client, "swap_engine", swap_engine)
    store = DraftStore(run)
    store.set_current("v0002")
    with pytest.raises(engines.EngineSwapError) as e:
        engines.push(run, ["http://a:1"])
    assert "failed its check" in str(e.value) and "v0001 is restored" in str(e.value)
    assert "is restored" in store.failure("v0002")["reason"]


def test_a_draft_every_engine_refuses_is_marked_failed(run, monkeypatch):
    a, b = "http://a:1", "http://b:2"
    _fake_swaps(monkeypatch, {a: "failed", b: "failed"})
    store = DraftStore(run)
    store.set_current("v0002")
    with pytest.raises(engines.EngineSwapError, match="2 of 2"):
        engines.push(run, [a, b])
    assert store.failure("v0002") is not None and store.current() == "v0001"
    with pytest.raises(DraftkitError, match="marked failed"):  # never pushed again
        engines.push(run, [a], store.root / "v0002")
    # the watch's bookkeeping: both refused v0002, so neither is asked again for it
    assert all(watch_mod._settled(r, "v0002") for r in engines.read(store)["engines"].values())
    assert not watch_mod._settled(engines.read(store)["engines"][a], "v0003")


def test_secret_rules_of_the_routes(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert rollout_routes.refusal(SECRET)[0] == 403  # a server without a secret: closed
    monkeypatch.setenv(SECRET_ENV, SECRET)
    assert rollout_routes.refusal(None)[0] == 401
    assert rollout_routes.refusal("s3cret-for-test")[0] == 401
    assert rollout_routes.refusal(SECRET) is None


def test_metrics_parse_the_spec_decode_counters(stub):
    text = ("".join(f"python_gc_objects_collected_total{{generation=\"{i}\"}} {i}.0\n"
                    for i in range(200)) +  # a real /metrics page is long
            "# HELP vllm:spec_decode_num_drafts_total drafts\n"
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8.0\n')
    stub.reply = (200, text)
    c = rollout_client.metrics(stub.url)
    assert (c.drafts, c.draft_tokens, c.accepted) == (10, 30, 12)
    assert c.acceptance_length == pytest.approx(2.2)


def test_cli_swap_needs_a_run_draft_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with pytest.raises(DraftkitError, match="not a draft dir of a run"):
        cli.run(["swap", "http://a:1", "--draft", str(tmp_path)])
    args = cli.build_parser().parse_args(["watch", "r", "--checkpoints", "c", "--rollouts", "o",
                                          "--engines", "http://a:1,http://b:2"])
    assert args.engines == ["http://a:1", "http://b:2"]


def test_routes_pause_and_always_resume_behind_the_secret(monkeypatch, tmp_path):
    """The endpoint plugin's routes on a bare FastAPI app with a stand-in engine client: the
    secret gates them, a swap without probes is refused before anything, and a swap that is
    refused after its pause still resumes the engine (tests/test_swap_txn.py: the rest)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    calls = []

    class Engine:
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            calls.append(method)
            return {"draftkit_drafter_path": ["/gone"], "draftkit_drafter_hashes": [{}],
                    "draftkit_native_ready": [True]}[method]

        async def get_weight_version(self):
            return "default"

        async def pause_generation(self, mode, clear_cache):
            calls.append(f"pause {mode}")

        async def resume_generation(self):
            calls.append("resume")

        async def is_paused(self):
            return False

        vllm_config = SimpleNamespace(observability_config=SimpleNamespace(
            per_request_spec_decode_metrics="summary"))

    monkeypatch.setenv("DRAFTKIT_STATE_DIR", str(tmp_path))
    app = FastAPI()
    rollout_routes.DraftkitEndpoints().attach_router(app)
    app.state.engine_client = Engine()
    client, ok = TestClient(app), {"X-Draftkit-Secret": SECRET}
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert client.get("/draftkit/state", headers=ok).status_code == 403
    monkeypatch.setenv(SECRET_ENV, SECRET)
    assert client.get("/draftkit/state").status_code == 401 and calls == []
    assert client.get("/draftkit/state", headers=ok).json()["transfer"] == "native"
    r = client.post("/draftkit/swap", json={"directory": str(tmp_path)}, headers=ok)
    assert r.status_code == 400 and "config.json" in r.json()["error"]  # nothing paused
    (tmp_path / "config.json").write_text("{}")
    r = client.post("/draftkit/swap", json={"directory": str(tmp_path)}, headers=ok)
    assert r.status_code == 400 and "probe" in r.json()["error"]  # the check cannot be skipped
    calls.clear()
    r = client.post("/draftkit/swap", json={"directory": str(tmp_path), "probes": [[1, 2]],
                                            "min_al": 1.2}, headers=ok)
    assert r.status_code == 409 and r.json()["verdict"] == "refused"  # no dir holds its weights
    engine_side = [c for c in calls if c != "draftkit_drafter_path"]  # the metric's read after
    assert engine_side[0] == "pause keep" and engine_side[-1] == "resume"
