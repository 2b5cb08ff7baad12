"""Pushes into rollout servers under faults, without vLLM (issue 44): stand-in HTTP servers
that die mid-answer, redirect, or answer as a server whose probe could not run; two pushers
of one run; the exit codes of `draftkit swap`. Every failure is that engine's record, decides
nothing about the draft unless its acceptance was measured, and the secret never leaves the
engine it was meant for. Each test names the finding of issue 44 it covers."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from _runs import make_run
from safetensors.torch import save_file

from draftkit.rl import rollout_servers as engines
from draftkit.rl.publish import DraftStore
from draftkit.serving import rollout_client
from draftkit.serving.drafter_swap import SECRET_ENV, record_sig

SECRET = "s3cret-for-push"


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run whose store holds v0001 (current) and v0002; probes come from its eval split."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    run = make_run(tmp_path, name="push", prompts=[[1, 2, 3], [4, 5, 6]],
                   overrides=["tracking.backend=none", "refresh.engine_timeout_s=2"])
    store = DraftStore(run)
    for v in ("v0001", "v0002"):
        def write(tmp, final):
            (tmp / "config.json").write_text("{}")
            save_file({"w": torch.ones(2)}, str(tmp / "model.safetensors"))
        store.publish(v, write, {"parent": None, "al_after": {"T=0": {"al": 2.0}},
                                 "decided_on": "T=0", "rollouts": []})
    store.set_current("v0001")
    return run


def _log(store: DraftStore) -> list[dict]:
    path = store.root / "watch-log.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _dying_server():
    """Answers every request with a Content-Length it never sends (dies mid-body)."""
    class Dying(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"ok": tr')
            self.wfile.flush()
            self.close_connection = True

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Dying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_server_dying_mid_answer_is_that_engines_record(run, tmp_path):
    """Finding 4 (failed on ff81543: http.client.IncompleteRead out of sync_engines)."""
    from draftkit.rl.watch import Watcher

    server, url = _dying_server()
    try:
        (tmp_path / "ck").mkdir()
        (tmp_path / "ro").mkdir()
        w = Watcher(run, tmp_path / "ck", tmp_path / "ro", ["tracking.backend=none"],
                    every=1, engines=[url])
        w.sync_engines()  # does not raise
    finally:
        server.shutdown()
    rec = engines.read(DraftStore(run))["engines"][url]
    assert rec["status"] in ("unreachable", "unknown") and "IncompleteRead" in rec["error"]
    assert DraftStore(run).failure("v0001") is None
    assert [e["event"] for e in _log(DraftStore(run))] == ["engines_swap_failed"]


# ------------------------------------------------------- finding 5: one pusher at a time


def test_two_pushers_of_one_run_take_turns(run, monkeypatch):
    """Finding 5 (failed on ff81543: both pushes ran at once, and the last engines.json
    write won)."""

    inside, overlap = [], []

    def swap_engine(url, directory, kind, probes, min_al, max_tokens, timeout, candidates,
                    version, reload_held, min_drafts=8, weights=None):
        inside.append(version)
        if len(inside) > 1:
            overlap.append(list(inside))
        time.sleep(0.3)
        inside.remove(version)
        return {"al": 2.0, "swap_s": 0.1, "pause_s": 0.2, "probe_s": 0.3, "loaded": True,
                "path": "native", "verdict": "passed"}

    monkeypatch.setattr(rollout_client, "swap_engine", swap_engine)
    store = DraftStore(run)
    threads = [threading.Thread(target=engines.push, args=(run, ["http://a:1"],
                                                          store.root / v)) for v in
               ("v0001", "v0002")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap == []


# ----------------------------------------- findings 2 and 7: verdicts, and no redirects


class _Stub(BaseHTTPRequestHandler):
    """A rollout server stand-in: `server.routes[(method, path)]` = (status, JSON, headers)."""

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        self.server.seen.append((self.command, self.path, self.headers.get("X-Draftkit-Secret"),
                                 body))
        path = self.path.split("?")[0]
        status, out, headers = self.server.routes.get((self.command, path), (404, {}, {}))
        if callable(out):
            out = out(body)
        data = json.dumps(out).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def stubs():
    made = []

    def make(routes):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
        server.routes, server.seen = routes, []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        made.append(server)
        return server

    yield make
    for s in made:
        s.shutdown()


def test_a_probe_the_engine_could_not_run_condemns_no_draft(run, stubs):
    """Finding 2 (failed on ff81543: the server answered /swap, then /v1/models said 401 (the
    watch had no VLLM_API_KEY) and the client's verdict `failed` marked a good draft failed)."""

    store = DraftStore(run)

    def swap(body):  # today's server: the probe runs there and could not run
        if body.get("txn"):
            rec = {"ok": False, "txn": body["txn"], "state": "rolled_back", "verdict": "error",
                   "restored": True, "previous": str(store.root / "v0001"),
                   "previous_version": "v0001", "error": "the probe raised ValueError: "
                   "prompt too long. ... lower refresh.probe_max_tokens ... Nothing was decided"}
            return {**rec, "sig": record_sig(rec, SECRET)}  # the server signs its verdicts
        return {"ok": True, "directory": str(store.root / "v0002"), "version": "v0002",
                "previous": str(store.root / "v0001"), "previous_version": "v0001",
                "loaded": True, "swap_s": 0.1, "pause_s": 0.2, "path": "native"}

    stub = stubs({("POST", "/draftkit/swap"): (200, swap, {}),
                  ("POST", "/draftkit/state"): (200, {}, {}),
                  ("GET", "/v1/models"): (401, {"error": "Unauthorized"}, {})})
    with pytest.raises(engines.EngineSwapError):
        engines.push(run, [stub.url], store.root / "v0002")
    assert store.failure("v0002") is None and store.current() == "v0001"
    rec = engines.read(store)["engines"][stub.url]
    assert rec["verdict"] in ("error", "transport") and rec["version"] == "v0001"
    assert "probe_max_tokens" in rec["error"]


def test_a_redirect_never_carries_the_secret_across(run, stubs):
    """Finding 7 (failed on ff81543: urllib followed the 302 and sent X-Draftkit-Secret to the
    other host)."""

    other = stubs({})
    hop = {"Location": other.url + "/draftkit/swap"}
    first = stubs({(m, p): (302, {}, hop) for m in ("GET", "POST")
                   for p in ("/draftkit/swap", "/draftkit/state")})
    with pytest.raises(engines.EngineSwapError, match="redirect"):
        engines.push(run, [first.url], DraftStore(run).root / "v0002")
    assert other.seen == [] and all(s[2] == SECRET for s in first.seen)
    assert DraftStore(run).failure("v0002") is None


def test_cli_swap_exits_0_when_every_engine_serves_and_2_when_one_does_not(run, stubs):
    """The exit codes of `draftkit swap` (a gap of issue 44: only `cli.run` raising was
    checked)."""
    import subprocess
    import sys

    store = DraftStore(run)

    def swap(body):
        verdict = "passed" if body["version"] == "v0001" else "failed"
        rec = {"ok": verdict == "passed", "txn": body["txn"], "verdict": verdict,
               "state": "committed" if verdict == "passed" else "rolled_back",
               "directory": body["directory"], "version": body["version"], "al": 2.0,
               "previous": str(store.root / "v0001"), "previous_version": "v0001",
               "restored": True, "loaded": True, "swap_s": 0.1, "pause_s": 0.2,
               "probe_s": 0.3, "path": "native", "error": "probe AL 1.000 <= minimum 1.2"}
        return {**rec, "sig": record_sig(rec, SECRET)}

    stub = stubs({("POST", "/draftkit/swap"): (200, swap, {})})
    env = {**os.environ, SECRET_ENV: SECRET}
    codes = {}
    for v in ("v0001", "v0002"):
        p = subprocess.run([sys.executable, "-m", "draftkit.cli", "swap", stub.url, "--draft",
                            str(store.root / v)], env=env, capture_output=True, text=True,
                           timeout=300)
        codes[v] = (p.returncode, p.stdout + p.stderr)
    assert codes["v0001"][0] == 0 and f"{stub.url}: serving v0001" in codes["v0001"][1]
    assert codes["v0002"][0] == 2 and "do not serve v0002" in codes["v0002"][1]
    env.pop(SECRET_ENV)
    p = subprocess.run([sys.executable, "-m", "draftkit.cli", "swap", stub.url, "--draft",
                        str(store.root / "v0001")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and SECRET_ENV in p.stderr
