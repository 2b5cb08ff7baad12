"""Issue 52 (swaps, round 3) on the push side: a version is judged over every engine that
measured it, a crash at any write is finished by the next tick, a push resolves `current` under
its lock, the engines are asked what they serve, servers start on a checked version, `behind`
backs off, and the secret never goes to a proxy or trusts an unsigned verdict. Stand-ins: the
swap client (test_rollout_servers._fake_swaps) and stub HTTP servers on 127.0.0.1. Each test
names its finding; each failed on da386a3."""

# ruff: noqa: F811 - fixtures imported from a sibling test module are these tests' arguments
from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_rollout_servers import SECRET, _fake_swaps, _free_port, run, stub  # noqa: F401

from draftkit.core.errors import DraftkitError
from draftkit.rl import publish
from draftkit.rl import rollout_servers as engines
from draftkit.rl import watch as watch_mod
from draftkit.rl.publish import DraftStore
from draftkit.serving import rollout_client, serve

A, B = f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"


def _push(run, urls, draft=None):
    """One push; an EngineSwapError (some engine does not serve it) is its normal outcome."""
    try:
        return engines.push(run, urls, draft)
    except engines.EngineSwapError as e:
        return e.results


def _tick(run, urls) -> None:
    """What the watch does each tick with its engines (without observe: no servers here)."""
    store = DraftStore(run)
    engines.settle(store, urls)
    record, current = engines.read(store)["engines"], store.current() or "export"
    todo = [u for u in urls if not watch_mod._settled(record.get(u) or {}, current)]
    if todo:
        _push(run, todo)


# ------------------------------------------------- N2: every engine that served it judges


def test_a_version_that_failed_on_any_engine_is_failed_and_left_by_every_engine(
        run, monkeypatch):
    # N2: A serves v0002, B was unreachable; the next tick pushes only to B, whose failure
    # marked v0002 failed and moved `current` back while A still served it. The rule (what to
    # build 3): failed on any engine that served it -> failed, and no engine is left on it
    store = DraftStore(run)
    store.set_current("v0002")
    _fake_swaps(monkeypatch, {A: None, B: "transport"})
    _push(run, [A, B])
    assert store.checked() == "v0002"  # passed where it was measured
    _fake_swaps(monkeypatch, {A: None, B: "failed"})
    out = _push(run, [B])
    assert store.failure("v0002") is not None and store.current() == "v0001"
    assert engines.read(store)["verdicts"]["v0002"] == {A: "passed", B: "failed"}
    rec = engines.read(store)["engines"]
    assert rec[A]["version"] == "v0001" and rec[A]["status"] == "serving"  # swapped back
    assert out[A]["version"] == "v0001" and rec[B]["version"] == "v0001"
    assert store.checked() == "v0001"  # what A passed again on the way back


def test_current_walks_back_past_a_version_that_failed_on_some_engine(run, monkeypatch):
    # issue 52: `current` goes back to the last version that passed on every engine that
    # served it, not merely to one not marked failed (v0001 failed on B under the old rule,
    # which left it unmarked because A passed it)
    store = DraftStore(run)
    record = engines.read(store)
    record["verdicts"]["v0001"] = {A: "passed", B: "failed"}
    engines._write(store, record)
    store.set_current("v0002")
    _fake_swaps(monkeypatch, {A: "failed"})
    _push(run, [A])
    assert store.failure("v0002") is not None and store.failure("v0001") is not None
    assert store.current() is None  # the export serves


def test_a_rollback_that_did_not_restore_still_carries_its_verdict(run, monkeypatch):
    # N2: a failure whose rollback did not restore was recorded without a verdict: never
    # marked, `current` stayed on the bad draft (and the engine may still serve it)
    store = DraftStore(run)
    store.set_current("v0002")

    def swap_engine(url, directory, *a, **k):
        raise rollout_client.EngineError(url, "probe AL 1.000 <= minimum 1.2; NOT restored",
                                         "failed", False, None, None)
    monkeypatch.setattr(rollout_client, "swap_engine", swap_engine)
    _push(run, [A])
    rec = engines.read(store)["engines"][A]
    assert rec["status"] == "unknown" and rec["verdict"] == "failed"
    assert store.failure("v0002") is not None and store.current() == "v0001"
    assert not watch_mod._settled(rec, "v0001")  # the engine gets v0001 pushed next tick


# ------------------------------------------------------------- N3: a crash at each write


class Crash(BaseException):
    """A process killed right after a write (BaseException: nothing catches it)."""


def _crash_after(monkeypatch, n: int) -> list[str]:
    """Make the n-th write of the store (engines.json, failed.json/checked.json, a link, a
    log line) crash right after it is done; returns the writes seen."""
    seen = []

    def wrap(name, real):
        def wrapped(*a, **k):
            out = real(*a, **k)
            seen.append(name)
            if len(seen) == n:
                raise Crash(name)
            return out
        return wrapped

    monkeypatch.setattr(DraftStore, "write_record", wrap("engines.json", DraftStore.write_record))
    monkeypatch.setattr(DraftStore, "_point_current",
                        wrap("current", DraftStore._point_current))
    monkeypatch.setattr(DraftStore, "log", wrap("log", DraftStore.log))
    monkeypatch.setattr(publish.artifacts, "write_json_atomic",
                        wrap("marker", publish.artifacts.write_json_atomic))
    return seen


@pytest.mark.parametrize("n", range(1, 11))  # 9 writes; 10: no crash
def test_a_crash_at_any_write_of_a_failing_push_is_finished_by_the_next_tick(
        run, monkeypatch, n):
    # N3: the engines' refused records were written before the version was marked failed; after
    # a crash between the two the watch never asked again and recover() fixed only a current
    # already marked: the bad version stayed current
    store = _crash_a_push_then_tick(run, monkeypatch, n, lambda url, name: name == "v0001")
    assert store.failure("v0002") is not None and store.current() == "v0001"
    assert store.failure("v0001") is None
    rec = engines.read(store)["engines"]
    assert all(rec[u]["version"] == "v0001" for u in (A, B))  # nobody serves the failed one


@pytest.mark.parametrize("n", range(1, 16))  # 14 writes; 15: no crash
def test_a_crash_at_any_write_of_a_swap_back_is_finished_by_the_next_tick(run, monkeypatch, n):
    # issue 52: v0002 passes on A and fails on B: it is failed and A must go back to v0001;
    # a crash anywhere in that (the verdicts, the mark, the swap back) is finished by the
    # restarted watch: nobody is left serving v0002
    store = _crash_a_push_then_tick(run, monkeypatch, n,
                                    lambda url, name: url == A or name == "v0001")
    assert store.failure("v0002") is not None and store.current() == "v0001"
    rec = engines.read(store)["engines"]
    assert all(rec[u]["version"] == "v0001" for u in (A, B))


# ------------------------------------------------------------ N5: resolve under the lock


def test_a_queued_push_never_pushes_a_version_marked_failed_meanwhile(run, monkeypatch):
    # N5: push resolved `current` and read failed.json before it took the lock, so a
    # `draftkit swap --draft drafts/current` queued behind the watch pushed a failed version
    store = DraftStore(run)
    store.set_current("v0002")
    pushed = []

    def swap_engine(url, directory, *a, **k):
        pushed.append(os.path.basename(directory))
        return {"al": 2.0, "swap_s": 0.1, "pause_s": 0.2, "probe_s": 0.3, "loaded": True,
                "path": "native"}
    monkeypatch.setattr(rollout_client, "swap_engine", swap_engine)
    out = {}
    with store.push_lock():
        t = threading.Thread(target=lambda: out.update(
            engines.push(run, [A], store.root / "current")))
        t.start()
        time.sleep(1.5)  # the push waits for the lock
        store.mark_failed("v0002", "failed on another engine")  # what the lock holder decided
    t.join(60)
    assert pushed == ["v0001"] and out[A]["version"] == "v0001"


# ------------------------------------------------------- N6: the engine is asked; start


def test_the_watch_asks_each_engine_what_it_serves(run, stub):
    # N6: the watch trusted engines.json and never asked: a restarted engine, or two backends
    # behind one URL, went unnoticed
    store = DraftStore(run)
    v1 = str(store.root / "v0001")
    record = engines.read(store)
    record["engines"][stub.url] = {"version": "v0001", "status": "serving", "boot_id": "b1"}
    engines._write(store, record)
    stub.reply = (200, {"ok": True, "draft_version": "v0001", "drafter_path": v1,
                        "boot_id": "b1", "txn": None})
    assert engines.observe(store, [stub.url]) == []  # as recorded: nothing to do
    stub.reply = (200, {"ok": True, "draft_version": "v0001", "drafter_path": v1,
                        "boot_id": "b2", "txn": None})  # restarted (or another backend)
    assert engines.observe(store, [stub.url]) == [stub.url]
    rec = engines.read(store)["engines"][stub.url]
    assert rec["status"] == "behind" and rec["boot_id"] == "b2"
    assert not watch_mod._settled(rec, "v0001")  # pushed (so probed) again
    stub.reply = (200, {"ok": True, "draft_version": "export", "drafter_path": "/x/export",
                        "boot_id": "b2", "txn": None})  # serves another draft than recorded
    assert engines.observe(store, [stub.url]) == [stub.url]
    assert engines.read(store)["engines"][stub.url]["version"] == "export"
    assert [e["event"] for e in store.events()].count("engine_observed") == 2


def test_a_server_starts_on_a_checked_version_not_an_unchecked_current(run, monkeypatch):
    # N6: a refresh makes a version current before any engine probed it, and rollout servers
    # started on drafts/current: a server restarted mid-run served an unchecked draft
    store = DraftStore(run)
    store.set_current("v0002")
    with pytest.raises(DraftkitError, match="no engine has checked"):
        serve.command("target", store.root / "current", 3)
    _fake_swaps(monkeypatch, {A: None})
    _push(run, [A])  # passed on an engine: checked
    assert store.checked() == "v0002"
    assert "--speculative-config" in serve.command("target", store.root / "current", 3)
    assert "--speculative-config" in serve.command("target", store.root / "checked", 3)
    store.mark_failed("v0002", "operator")
    with pytest.raises(DraftkitError, match="marked failed"):
        serve.command("target", store.root / "v0002", 3)
    assert not (store.root / "checked").is_symlink()  # none left: the export serves


# ------------------------------------------------------------------------ N7: backoff


def test_an_engine_behind_backs_off_with_jitter(run, monkeypatch):
    # N7: `error`/`refused` became `behind` and were retried every poll_s, forever: two pauses
    # and two loads per tick on an engine whose probe never fits
    store = DraftStore(run)
    store.set_current("v0002")
    _fake_swaps(monkeypatch, {A: "error"})
    waits = []
    for _ in range(4):
        _push(run, [A])
        rec = engines.read(store)["engines"][A]
        waits.append(rec["retry_at"] - time.time())
        assert watch_mod._settled(rec, "v0002")  # not asked again before retry_at
    assert rec["tries"] == 4 and waits[-1] > waits[0]
    delays = {round(engines.backoff(3, 10.0), 6) for _ in range(20)}
    assert len(delays) > 1 and all(20 <= d <= 40 for d in delays)  # jittered, 0.5x-1x
    assert engines.backoff(50, 10.0) <= 600


# --------------------------------------------------------- N4: no proxy, signed verdicts


class _Proxy(BaseHTTPRequestHandler):
    """An HTTP proxy that records what it was sent and forges a committed verdict."""

    def do_POST(self):  # noqa: N802
        self.server.seen.append(dict(self.headers))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = json.dumps({"ok": True, "txn": body.get("txn"), "state": "committed",
                           "verdict": "passed", "al": 3.0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST

    def log_message(self, *args):
        pass


def test_the_secret_never_goes_to_a_proxy_and_a_forged_verdict_decides_nothing(
        run, monkeypatch, stub):
    # N4: with HTTP_PROXY set, urllib sent X-Draftkit-Secret to the proxy, and the client took
    # the proxy's JSON for the engine's verdict (a forged `committed`)
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    proxy.seen = []
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for var in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        with pytest.raises(rollout_client.EngineError) as e:
            rollout_client.swap_engine(A, DraftStore(run).root / "v0002", "eagle3", [[1, 2, 3]],
                                       1.2, 8, 1.0)
        assert e.value.verdict == "transport" and proxy.seen == []  # went direct: refused
        monkeypatch.setenv(rollout_client.PROXY_ENV, "1")  # opted in: a warning, and the
        with pytest.warns(UserWarning, match="sees the swap secret"), \
                pytest.raises(rollout_client.EngineError, match="not bound") as e:
            rollout_client.swap_engine(A, DraftStore(run).root / "v0002", "eagle3",
                                       [[1, 2, 3]], 1.2, 8, 1.0)
        assert e.value.verdict == "transport" and len(proxy.seen) >= 1  # forgery refused
    finally:
        proxy.shutdown()
    monkeypatch.delenv(rollout_client.PROXY_ENV)
    stub.reply = (200, {"ok": True, "txn": "x", "state": "committed", "verdict": "passed"})
    with pytest.raises(rollout_client.EngineError, match="not bound"):  # a stale listener
        rollout_client.swap_engine(stub.url, DraftStore(run).root / "v0002", "eagle3",
                                   [[1, 2, 3]], 1.2, 8, 1.0)


def test_a_push_sends_the_digests_recorded_at_publish(run, monkeypatch):
    # N11: the server's check had nothing recorded at publish to compare the files with
    store = DraftStore(run)
    sent = []

    def swap_engine(url, directory, *a, **k):
        sent.append(a[-1])
        return {"al": 2.0, "swap_s": 0.1, "pause_s": 0.2, "probe_s": 0.3, "loaded": True,
                "path": "native"}
    monkeypatch.setattr(rollout_client, "swap_engine", swap_engine)
    engines.push(run, [A], store.root / "v0002")
    want = store.lineage("v0002")["weights"]
    assert sent == [want] and list(want) == ["model.safetensors"] and len(want[
        "model.safetensors"]) == 64


def test_draftkit_swap_asks_the_engines_first(run, stub, monkeypatch):
    # N6: `draftkit swap` trusted engines.json as the watch did
    store = DraftStore(run)
    stub.reply = (200, {"ok": True, "draft_version": "export", "drafter_path": "/x/export",
                        "boot_id": "b9", "txn": None})
    _fake_swaps(monkeypatch, {stub.url: None})
    engines.swap([stub.url], store.root / "v0002")
    events = [e["event"] for e in store.events()]
    assert events.index("engine_observed") < events.index("engine_swapped")
    assert engines.read(store)["engines"][stub.url]["version"] == "v0002"


def test_an_engine_serving_other_weights_under_the_recorded_name_is_pushed_again(run, stub,
                                                                                monkeypatch):
    # N6: the engine was asked its version and boot id only: weights that differ from the
    # recorded version's (a refit overwrote the drafter, another dir named v0001) went unseen
    from draftkit.serving import draft_info

    store = DraftStore(run)
    good = draft_info.weights_hash(store.lineage("v0001")["weights"])
    record = engines.read(store)
    record["engines"][stub.url] = {"version": "v0001", "status": "serving", "boot_id": "b1"}
    engines._write(store, record)
    state = {"ok": True, "draft_version": "v0001", "drafter_path": str(store.root / "v0001"),
             "boot_id": "b1", "draft_hash": good, "txn": None}
    stub.reply = (200, state)
    assert engines.observe(store, [stub.url]) == []  # the published weights: as recorded
    stub.reply = (200, {**state, "draft_hash": "0" * 64})
    assert engines.observe(store, [stub.url]) == [stub.url]
    rec = engines.read(store)["engines"][stub.url]
    assert rec["status"] == "behind" and rec["hash"] == "0" * 64
    assert not watch_mod._settled(rec, "v0001")  # pushed (so checked) again
    _fake_swaps(monkeypatch, {stub.url: None})
    monkeypatch.setattr(rollout_client, "swap_engine", lambda url, *a, **k: {
        "al": 2.0, "swap_s": 0.1, "pause_s": 0.2, "probe_s": 0.3, "loaded": True,
        "path": "native", "draft_hash": good})
    engines.push(run, [stub.url], store.root / "v0001")
    assert engines.read(store)["engines"][stub.url]["hash"] == good  # recorded at the push
    stub.reply = (200, state)
    assert engines.observe(store, [stub.url]) == []


# ------------------------------ N11, N1: draftkit's launchers (allow-list, priority policy)


def test_draftkits_launcher_sets_the_allow_list_and_the_priority_policy(run, monkeypatch):
    # N11: the allow-list existed only as an env var a user had to know; N1: servers started
    # on fcfs, so probes queued behind rollouts
    store = DraftStore(run)
    _fake_swaps(monkeypatch, {A: None})
    _push(run, [A], store.root / "v0001")  # checked: a server may start on it
    argv = serve.command("target", store.root / "checked", 3)
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    env = serve.environment("s", draft_dir=store.root / "checked")
    assert env["DRAFTKIT_DRAFT_ROOTS"].split(os.pathsep) == [
        os.path.realpath(run / "drafts"), os.path.realpath(run / "export")]
    assert "DRAFTKIT_DRAFT_ROOTS" not in serve.environment("s")  # unknown: the server warns
    seen = {}
    monkeypatch.setattr(os, "execve", lambda path, argv, env: seen.update(argv=argv, env=env))
    serve.main(["target", "--draft", str(store.root / "checked"), "--port", "8123",
                "--draftkit-draft-root", "/data/a", "--draftkit-draft-root", "/data/b",
                "--max-num-seqs", "4"])
    assert seen["env"]["DRAFTKIT_DRAFT_ROOTS"] == os.pathsep.join(["/data/a", "/data/b"])
    assert seen["argv"][seen["argv"].index("--port") + 1] == "8123"
    assert seen["argv"][-2:] == ["--max-num-seqs", "4"] and seen["env"]["VLLM_PLUGINS"]


def test_an_engine_on_fcfs_is_an_event_once(run, monkeypatch):
    # N1/N7: an engine whose probes queue behind rollouts was never named
    store = DraftStore(run)
    monkeypatch.setattr(rollout_client, "swap_engine", lambda url, *a, **k: {
        "al": 2.0, "swap_s": 0.1, "pause_s": 0.2, "probe_s": 0.3, "loaded": True,
        "path": "native", "scheduling": "fcfs"})
    for v in ("v0001", "v0002", "v0001"):
        engines.push(run, [A], store.root / v)
    said = [e for e in store.events() if e["event"] == "engine_probe_queues"]
    assert len(said) == 1 and "--scheduling-policy priority" in said[0]["detail"]


def _crash_a_push_then_tick(run, monkeypatch, n: int, passes) -> DraftStore:
    """current = v0002; a push to A and B whose engines pass a version where `passes(url,
    version)`, crashed after write `n`; then two ticks of the restarted watch."""
    store = DraftStore(run)
    store.set_current("v0002")

    def swap_engine(url, directory, *a, **k):
        if passes(url, os.path.basename(directory)):
            return {"al": 2.0, "swap_s": 0.1, "pause_s": 0.2, "probe_s": 0.3, "loaded": True,
                    "path": "native"}
        raise rollout_client.EngineError(url, "probe AL 1.000 <= minimum 1.2", "failed", True,
                                         str(store.root / "v0001"), "v0001")
    monkeypatch.setattr(rollout_client, "swap_engine", swap_engine)
    with monkeypatch.context() as m:
        seen = _crash_after(m, n)
        try:
            _push(run, [A, B])
        except Crash:
            pass
    print(f"crashed after write {n}: {seen}")
    _tick(run, [A, B])  # the watch, restarted
    _tick(run, [A, B])
    return store
