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

  GET  /draftkit/state   {"weight_version", "drafter_path", "transfer": "native"|"worker extension"}
  POST /draftkit/check   {"directory", "kind"} -> {"hash_problems", "weight_version"}
  POST /draftkit/swap    {"directory", "kind", "candidates", "version", "reload_held"}
       pause (mode keep: requests wait, none is dropped) -> load (vLLM's native draft update)
       -> compare the workers' tensor hashes with the dir's published tensors -> on a
       difference or an error, reload the previous draft and check it -> resume. 200: the
       report (swap_s, pause_s, previous, ...); 409: check failed or swap refused; 500: the
       swap raised. The probe AL check runs from the client (rollout.py), after the resume.

One swap at a time per server (a lock); the engine resumes whatever happened. The drafter
calls run in a thread on `drafter_swap`'s synchronous functions through `EngineAdapter`.
"""

import asyncio
import logging
import os
import time
from pathlib import Path

from draftkit.core.config import DEFAULT_KIND
from draftkit.drafts import kind as kinds
from draftkit.serving import drafter_swap as ds
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
        self.lock = asyncio.Lock()

    def attach_router(self, app) -> None:
        from fastapi import APIRouter, Request
        from fastapi.responses import JSONResponse

        router = APIRouter()

        async def guarded(request: Request, work):
            denied = refusal(request.headers.get(HEADER))
            if denied:
                return JSONResponse({"ok": False, "error": denied[1]}, status_code=denied[0])
            try:
                body = await request.json() if request.method == "POST" else {}
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
        if not os.environ.get(SECRET_ENV):
            log.warning("draftkit: %s is not set: the /draftkit routes refuse every request",
                        SECRET_ENV)

    # ------------------------------------------------------------------------- handlers

    async def _state(self, adapter: EngineAdapter, body: dict) -> tuple[int, dict]:
        def work():
            return {"ok": True, "weight_version": ds.weight_version(adapter),
                    "drafter_path": ds.drafter_path(adapter),
                    "transfer": ds.transfer_path(adapter)}
        return await _in_thread(work)

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
        args = _swap_args(body)
        if isinstance(args, str):
            return 400, {"ok": False, "error": args}
        async with self.lock:
            t0, paused_at = time.perf_counter(), time.time()
            await adapter.engine.pause_generation(mode="keep", clear_cache=False)
            try:
                status, report = await _in_thread(lambda: ds.load_checked(
                    adapter, args["kind"], args["directory"], args["candidates"],
                    args["version"], args["reload_held"]))
            finally:
                await adapter.engine.resume_generation()
            report.update(pause_s=time.perf_counter() - t0, paused_at=paused_at)
        report.pop("held", None)
        return status, report


def _swap_args(body: dict) -> dict | str:
    """Validated arguments of /check and /swap, or what is wrong with them."""
    directory = body.get("directory")
    if not isinstance(directory, str) or not Path(directory, "config.json").is_file():
        return (f"directory={directory!r} is not a draft dir this server can read (no "
                "config.json there): the trainer and the server must share the filesystem")
    try:
        kind = kinds.get(body.get("kind") or DEFAULT_KIND)
    except Exception as e:  # noqa: BLE001 - an unknown kind name
        return f"kind: {e}"
    candidates = [c for c in body.get("candidates") or [] if isinstance(c, str)]
    return {"directory": directory, "kind": kind, "candidates": candidates,
            "version": body.get("version"), "reload_held": bool(body.get("reload_held", True))}


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
