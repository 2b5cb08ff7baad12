"""draftkit's routes on a `vllm serve` rollout server: a vLLM endpoint plugin (entry point
`vllm.endpoint_plugins`, loaded only when VLLM_PLUGINS names it: VLLM_PLUGINS=draftkit), so
that a trainer swaps drafts into running servers with no dev mode and behind a secret.

    DRAFTKIT_SWAP_SECRET=... VLLM_PLUGINS=draftkit vllm serve TARGET --host 10.0.0.5 \
        --speculative-config "$(cat runs/rl/drafts/current/speculative_config.json)" \
        --worker-extension-cls draftkit.serving.drafter_swap.DrafterSwap \
        --weight-transfer-config '{"backend": "draftkit"}'

Every route needs the header `X-Draftkit-Secret` equal to the server's DRAFTKIT_SWAP_SECRET
(401 otherwise; 403 on a server started without one). vLLM's own RL routes (`/pause`,
`/update_weights`, `/collective_rpc`, ...) exist only with VLLM_SERVER_DEV_MODE=1 and are not
authenticated even with `--api-key` (its middleware guards /v1, /v2, /inference, /cohere):
these routes need neither, and the weight-transfer engine refuses updates without the secret
whichever route sent them.

  GET  /draftkit/state   {"weight_version", "drafter_path", "transfer", "txn": the latest
       transaction's record (state, verdict, al, error, ...)}; with ?txn=ID (or ?txn=last)
       only {"txn": that record}, asking the engine nothing
  POST /draftkit/check   {"directory", "kind"} -> {"hash_problems", "weight_version"}
  POST /draftkit/swap    {"directory", "kind", "candidates", "version", "reload_held", "probes",
                          "min_al", "max_tokens", "probe_timeout_s", "pause_wait_s", "txn",
                          "wait_s"}
       one transaction on the server (swap_txn.py): wait out a pause draftkit did not take
       (else refused) -> pause (mode keep: requests wait, none is dropped) -> load (vLLM's
       native draft update) -> tensor hashes against the dir's published tensors -> resume
       -> probe completions whose acceptance is read per request -> commit, or the previous
       draft back (hash-checked). The handler waits up to `wait_s` for the verdict: 200
       committed, 202 still running (ask /draftkit/state?txn=ID), 409 refused or failed, 500
       error. A client that goes away, or a handler that is cancelled, leaves it running.

One transaction at a time per server (an asyncio lock and a file lock shared by the API
processes of one port); the load, the hash check and the rollback run in a thread on
`drafter_swap`'s synchronous functions through `EngineAdapter`, and the engine is resumed only
after that thread has ended. On a vLLM release other than the tested one the plugin refuses to
load (serving/vllm_version.py): vLLM logs the one line and mounts no route.
"""

import asyncio
import logging
import os
import re
from pathlib import Path

from draftkit.core.config import DEFAULT_KIND
from draftkit.drafts import kind as kinds
from draftkit.serving import drafter_swap as ds
from draftkit.serving import swap_txn, vllm_version
from draftkit.serving.drafter_swap import SECRET_ENV, DraftSwapError, secret_matches

log = logging.getLogger("draftkit.serving.rollout_routes")
HEADER = "X-Draftkit-Secret"
PREFIX = "/draftkit"
RPC_TIMEOUT_S = 300.0


class EngineAdapter:
    """The `LLM` calls drafter_swap uses, on a served engine (vLLM's async EngineClient),
    callable from a thread while the event loop runs."""

    def __init__(self, engine_client, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine_client, loop

    def _wait(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(RPC_TIMEOUT_S)

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None):
        return self._wait(self.engine.collective_rpc(method, args=args, kwargs=kwargs))

    def start_draft_weight_update(self) -> None:
        self._wait(self.engine.start_draft_weight_update())

    def update_weights(self, request: dict) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._wait(self.engine.update_weights(
            WeightTransferUpdateRequest(update_info=request["update_info"])))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._wait(self.engine.finish_weight_update(weight_version))

    def get_weight_version(self) -> str | None:
        return self._wait(self.engine.get_weight_version())

    def update_weight_version(self, version: str) -> None:
        self._wait(self.engine.update_weight_version(version))


def refusal(secret: str | None) -> tuple[int, str] | None:
    """(status, why) when a request's secret does not open the routes, else None."""
    expected = os.environ.get(SECRET_ENV, "")
    if not expected:
        return 403, (f"this server was started without {SECRET_ENV}: draftkit's routes are "
                     f"closed. Restart it with {SECRET_ENV} set in its environment")
    if not secret_matches(secret, expected):
        return 401, f"wrong or missing {HEADER} header (the server's {SECRET_ENV})"
    return None


class DraftkitEndpoints:
    """The EndpointPlugin vLLM instantiates (vllm/plugins/endpoint_plugins/interface.py)."""

    name = "draftkit"
    required_tasks = ("generate",)

    def __init__(self):
        vllm_version.check()  # vLLM logs it and mounts no /draftkit route
        self.txns = swap_txn.Transactions()

    def attach_router(self, app) -> None:
        from fastapi import APIRouter, Request
        from fastapi.responses import JSONResponse

        router = APIRouter()

        async def guarded(request: Request, work):
            denied = refusal(request.headers.get(HEADER))
            if denied:
                return JSONResponse({"ok": False, "error": denied[1]}, status_code=denied[0])
            try:
                body = await request.json() if request.method == "POST" else \
                    dict(request.query_params)
            except ValueError:
                return JSONResponse({"ok": False, "error": "body is not JSON"}, status_code=400)
            adapter = EngineAdapter(request.app.state.engine_client, asyncio.get_running_loop())
            status, content = await work(adapter, body)
            return JSONResponse(content, status_code=status)

        @router.get(f"{PREFIX}/state")
        async def state(request: Request):
            return await guarded(request, self._state)

        @router.post(f"{PREFIX}/check")
        async def check(request: Request):
            return await guarded(request, self._check)

        @router.post(f"{PREFIX}/swap")
        async def swap(request: Request):
            return await guarded(request, self._swap)

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        port = getattr(args, "port", None)
        if port is not None and not self.txns.tasks:  # API processes of one server share it
            self.txns = swap_txn.Transactions(str(port))
        if not os.environ.get(SECRET_ENV):
            log.warning("draftkit: %s is not set: the /draftkit routes refuse every request",
                        SECRET_ENV)

    # ------------------------------------------------------------------------- handlers

    async def _state(self, adapter: EngineAdapter, body: dict) -> tuple[int, dict]:
        if body.get("txn"):  # a transaction's outcome ("last": the latest): no engine call
            return 200, {"ok": True, "txn": self.txns.get(None if body["txn"] == "last"
                                                          else body["txn"])}

        def work():
            return {"ok": True, "weight_version": ds.weight_version(adapter),
                    "drafter_path": ds.drafter_path(adapter),
                    "transfer": ds.transfer_path(adapter)}
        status, out = await _in_thread(work)
        return status, {**out, "txn": self.txns.get()}

    async def _check(self, adapter: EngineAdapter, body: dict) -> tuple[int, dict]:
        args = _swap_args(body)
        if isinstance(args, str):
            return 400, {"ok": False, "error": args}

        def work():
            problems = ds.hash_problems(adapter, args["kind"], args["directory"])
            return {"ok": not problems, "hash_problems": problems[:10],
                    "weight_version": ds.weight_version(adapter),
                    "drafter_path": ds.drafter_path(adapter)}
        return await _in_thread(work)

    async def _swap(self, adapter: EngineAdapter, body: dict) -> tuple[int, dict]:
        """Start (or find, by `txn`) the swap transaction and wait up to `wait_s` for it; a
        cancelled handler leaves it running (asyncio.wait never cancels what it waits for)."""
        args = _swap_args(body, probe=True)
        if isinstance(args, str):
            return 400, {"ok": False, "error": args, "verdict": "refused"}
        rec, task = self.txns.start(adapter, args)
        if task is not None:
            await asyncio.wait({task}, timeout=args["wait_s"])
        rec = self.txns.get(rec["txn"]) or rec
        status = {"committed": 200, "refused": 409, "error": 500}.get(rec["state"], 202)
        if rec["state"] == "rolled_back":
            status = 409 if rec.get("verdict") == "failed" else 500
        return status, {"ok": rec["state"] == "committed", **rec}


def _swap_args(body: dict, probe: bool = False) -> dict | str:
    """Validated arguments of /check and /swap (`probe`: with the probe's), or what is wrong
    with them."""
    directory = body.get("directory")
    if not isinstance(directory, str) or not Path(directory, "config.json").is_file():
        return (f"directory={directory!r} is not a draft dir this server can read (no "
                "config.json there): the trainer and the server must share the filesystem")
    try:
        kind = kinds.get(body.get("kind") or DEFAULT_KIND)
    except Exception as e:  # noqa: BLE001 - an unknown kind name
        return f"kind: {e}"
    candidates = [c for c in body.get("candidates") or [] if isinstance(c, str)]
    args = {"directory": directory, "kind": kind, "candidates": candidates,
            "version": body.get("version"), "reload_held": bool(body.get("reload_held", True))}
    return _probe_args(body, args) if probe else args


def _probe_args(body: dict, args: dict) -> dict | str:
    """The probe's arguments: token-id prompts and a threshold the check can fail."""
    probes = body.get("probes")
    if not isinstance(probes, list) or not all(
            isinstance(p, list) and all(isinstance(t, int) for t in p) for p in probes):
        return "probes must be a list of token-id lists (the swap's check needs them)"
    try:
        ds.require_check(probes, float(body.get("min_al", 0)))
        nums = {k: float(body.get(k, d)) for k, d in (
            ("max_tokens", 64), ("probe_timeout_s", 60), ("pause_wait_s", 30), ("wait_s", 60))}
    except (DraftSwapError, TypeError, ValueError) as e:
        return str(e)
    txn = body.get("txn")
    if txn is not None and not (isinstance(txn, str) and re.fullmatch(r"[\w-]{1,64}", txn)):
        return "txn must be 1-64 letters, digits, _ or -"
    return {**args, **nums, "max_tokens": int(nums["max_tokens"]), "probes": probes,
            "min_al": float(body["min_al"]), "txn": txn}


async def _in_thread(work) -> tuple[int, dict]:
    """Run `work` in a thread: (200, its report), or the DraftSwapError / exception as JSON."""
    try:
        return 200, {"ok": True, **await asyncio.to_thread(work)}
    except DraftSwapError as e:
        return (500 if e.verdict == "error" else 409), {
            "ok": False, "error": str(e), "verdict": e.verdict, "directory": e.directory,
            "previous": e.previous, "restored": e.restored}
    except Exception as e:  # noqa: BLE001 - reported to the client, which names the engine
        log.exception("draftkit route failed")
        return 500, {"ok": False, "error": f"{type(e).__name__}: {e}", "verdict": "error",
                     "hint": "was the server started with --worker-extension-cls "
                             "draftkit.serving.drafter_swap.DrafterSwap and "
                             "--weight-transfer-config '{\"backend\": \"draftkit\"}'?"}
