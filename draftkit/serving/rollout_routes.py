"""draftkit's routes on a `vllm serve` rollout server: a vLLM endpoint plugin (entry point
`vllm.endpoint_plugins`, loaded only when VLLM_PLUGINS names it: VLLM_PLUGINS=draftkit), so
that a trainer swaps drafts into running servers with no dev mode and behind a secret.

    DRAFTKIT_SWAP_SECRET=... VLLM_PLUGINS=draftkit vllm serve TARGET --host 10.0.0.5 \
        --speculative-config "$(cat runs/rl/drafts/checked/speculative_config.json)" \
        --worker-extension-cls draftkit.serving.drafter_swap.DrafterSwap \
        --weight-transfer-config '{"backend": "draftkit"}'

Every route needs the header `X-Draftkit-Secret` equal to the server's DRAFTKIT_SWAP_SECRET
(401 otherwise; 403 on a server started without one). vLLM's own RL routes (`/pause`,
`/update_weights`, `/collective_rpc`, ...) exist only with VLLM_SERVER_DEV_MODE=1 and are not
authenticated even with `--api-key` (its middleware guards /v1, /v2, /inference, /cohere):
these routes need neither, and the weight-transfer engine refuses updates without the secret
whichever route sent them.

  GET  /draftkit/state   {"draft_version" (the name of the dir the drafter came from),
       "drafter_path", "draft_hash" (the sha256 of its weight files, as lineage.json records
       them: serving/draft_info.py; also the `draftkit_draft_info` metric on /metrics),
       "boot_id" (drawn once per engine boot), "transfer", "weight_version"
       (vLLM's: the policy's, never set by draftkit), "txn": the latest transaction's record
       (state, verdict, al, error, ...)}; with ?txn=ID (or ?txn=last) only {"txn": that
       record}, asking the engine nothing
  POST /draftkit/check   {"directory", "kind"} -> {"hash_problems", "draft_version"}
  POST /draftkit/swap    {"directory", "kind", "candidates", "version", "reload_held", "probes",
                          "min_al", "max_tokens", "min_drafts", "probe_timeout_s",
                          "pause_wait_s", "txn", "wait_s", "weights" (file -> sha256 at
                          publish: files that differ are refused before anything loads)}
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
import math
import os
import re
from pathlib import Path

from draftkit.core.config import DEFAULT_KIND
from draftkit.drafts import kind as kinds
from draftkit.serving import draft_info, swap_txn, vllm_version
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
        """The call's result within RPC_TIMEOUT_S; past it the call is cancelled (not left
        running on the loop) and TimeoutError raised."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(RPC_TIMEOUT_S)
        except TimeoutError:
            fut.cancel()
            raise TimeoutError(f"an engine call did not answer within {RPC_TIMEOUT_S:g}s; it "
                               "was cancelled") from None

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
            boot = await _boot_id(engine_client)  # a restarted engine gets a fresh file
            self.txns = swap_txn.Transactions(f"{port}-{boot}" if boot else str(port))
            if ended := self.txns.end_stale():
                log.warning("draftkit: ended %d swap transactions a restart left", len(ended))
        await self.show_served(EngineAdapter(engine_client, asyncio.get_running_loop()), 30)
        if not os.environ.get(SECRET_ENV):
            log.warning("draftkit: %s is not set: the /draftkit routes refuse every request",
                        SECRET_ENV)
        if not os.environ.get(ROOTS_ENV):
            log.warning("draftkit: %s is not set: a swap may load a draft from any directory "
                        "this server can read (set it to the runs' directories)", ROOTS_ENV)

    # ------------------------------------------------------------------------- handlers

    async def _state(self, adapter: EngineAdapter, body: dict) -> tuple[int, dict]:
        if body.get("txn"):  # a transaction's outcome ("last": the latest): no engine call
            return 200, {"ok": True, "txn": _signed(self.txns.get(
                None if body["txn"] == "last" else body["txn"]))}

        def work():
            return {"ok": True, **self.served(adapter), "boot_id": ds.boot_id(adapter),
                    "transfer": ds.transfer_path(adapter),
                    "weight_version": ds.weight_version(adapter)}  # the policy's, not the draft's
        status, out = await _in_thread(work)
        return status, {**out, "txn": self.txns.get()}

    def served(self, adapter) -> dict:
        """What the engine serves: the drafter's dir, its version and `draft_hash` (the hash of
        its weight files: serving/draft_info.py), also shown as `draftkit_draft_info` on
        /metrics. The hash of a committed swap is the one its files were checked against
        before the load (lineage.json's digests); else the files' own, hashed once."""
        path = ds.drafter_path(adapter)
        rec = self.txns.get() or {}
        digest = rec.get("draft_hash") if rec.get("state") == "committed" and \
            rec.get("directory") == path else None
        out = {"draft_version": ds.version_name(path), "drafter_path": path,
               "draft_hash": digest or draft_info.dir_hash(path)}
        draft_info.show(out["draft_version"], out["draft_hash"])
        return out

    async def show_served(self, adapter, timeout: float = RPC_TIMEOUT_S) -> None:
        """Refresh the metric after a transaction or at start (a failure only logs)."""
        try:
            await asyncio.wait_for(asyncio.to_thread(self.served, adapter), timeout)
        except Exception:  # noqa: BLE001 - the metric is a report; the routes go on
            log.warning("draftkit: could not read the served draft for %s", draft_info.METRIC,
                        exc_info=True)

    async def _check(self, adapter: EngineAdapter, body: dict) -> tuple[int, dict]:
        args = _swap_args(body)
        if isinstance(args, str):
            return 400, {"ok": False, "error": args}

        def work():
            problems = ds.hash_problems(adapter, args["kind"], args["directory"])
            return {"ok": not problems, "hash_problems": problems[:10],
                    "draft_version": ds.draft_version(adapter),
                    "drafter_path": ds.drafter_path(adapter)}
        return await _in_thread(work)

    async def _swap(self, adapter: EngineAdapter, body: dict) -> tuple[int, dict]:
        """Start (or find, by `txn`) the swap transaction and wait up to `wait_s` for it; a
        cancelled handler leaves it running (asyncio.wait never cancels what it waits for)."""
        args = _swap_args(body, probe=True)
        if isinstance(args, str):
            return 400, {"ok": False, "error": args, "verdict": "refused"}
        rec, task = self.txns.start(adapter, args)
        if task is not None and rec["state"] == "queued":  # a new one: the metric after it
            task.add_done_callback(lambda _: asyncio.ensure_future(self.show_served(adapter)))
        if task is not None:
            await asyncio.wait({task}, timeout=args["wait_s"])
        rec = self.txns.get(rec["txn"]) or rec
        status = {"committed": 200, "refused": 409, "error": 500}.get(rec["state"], 202)
        if rec["state"] == "rolled_back":
            status = 409 if rec.get("verdict") == "failed" else 500
        return status, {"ok": rec["state"] == "committed", **_signed(rec)}


def _signed(rec: dict | None) -> dict | None:
    """The record with its `sig` (drafter_swap.record_sig): the client accepts no other."""
    return None if rec is None else {**rec, "sig": ds.record_sig(rec, os.environ[SECRET_ENV])}


async def _boot_id(engine_client) -> str | None:
    """The engine's boot id (drafter_swap.DrafterSwap.draftkit_boot_id), None if it cannot
    say within 30 s."""
    try:
        ids = await asyncio.wait_for(engine_client.collective_rpc("draftkit_boot_id"), 30)
        return str(ids[0]) if ids and re.fullmatch(r"[0-9a-f]{1,32}", str(ids[0])) else None
    except Exception:  # noqa: BLE001 - no extension, an older engine: keyed by port only
        return None


ROOTS_ENV = "DRAFTKIT_DRAFT_ROOTS"  # the server's allow-list: draft roots, os.pathsep-separated


def allowed(directory: str) -> bool:
    """`directory` (resolved) lies under one of DRAFTKIT_DRAFT_ROOTS (resolved); any when the
    variable is unset (init_state warns)."""
    roots = [r for r in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if r]
    path = Path(os.path.realpath(directory))
    return not roots or any(path.is_relative_to(os.path.realpath(r)) for r in roots)


def _swap_args(body: dict, probe: bool = False) -> dict | str:
    """Validated arguments of /check and /swap (`probe`: with the probe's), or what is wrong
    with them."""
    directory = body.get("directory")
    if not isinstance(directory, str) or not Path(directory, "config.json").is_file():
        return (f"directory={directory!r} is not a draft dir this server can read (no "
                "config.json there): the trainer and the server must share the filesystem")
    if not allowed(directory):
        return (f"directory={directory!r} is outside this server's draft roots ({ROOTS_ENV}="
                f"{os.environ.get(ROOTS_ENV)!r}): add the run's directory to it and restart")
    try:
        kind = kinds.get(body.get("kind") or DEFAULT_KIND)
    except Exception as e:  # noqa: BLE001 - an unknown kind name
        return f"kind: {e}"
    candidates = [c for c in body.get("candidates") or [] if isinstance(c, str) and allowed(c)]
    args = {"directory": directory, "kind": kind, "candidates": candidates,
            "version": body.get("version"), "reload_held": bool(body.get("reload_held", True))}
    return _probe_args(body, args) if probe else args


MAX_PROBES, MAX_PROBE_TOKENS = 64, 8192  # caps on one swap's probe: prompts, ids per prompt
NUMBERS = {  # the swap's numbers: (default, lowest allowed, highest allowed)
    "max_tokens": (64, 1, MAX_PROBE_TOKENS), "min_drafts": (ds.MIN_DRAFTS, 1, 1 << 20),
    "probe_timeout_s": (60, 0.001, 3600), "pause_wait_s": (30, 0, 3600), "wait_s": (60, 0, 3600)}


def _probe_args(body: dict, args: dict) -> dict | str:
    """The probe's arguments: token-id prompts (at most MAX_PROBES of at most MAX_PROBE_TOKENS
    ids) and a threshold the check can fail; every number finite and within NUMBERS."""
    probes = body.get("probes")
    if not isinstance(probes, list) or not all(
            isinstance(p, list) and all(isinstance(t, int) for t in p) for p in probes):
        return "probes must be a list of token-id lists (the swap's check needs them)"
    if len(probes) > MAX_PROBES or any(len(p) > MAX_PROBE_TOKENS for p in probes):
        return (f"at most {MAX_PROBES} probe prompts of at most {MAX_PROBE_TOKENS} token ids "
                "each (refresh.probe_prompts)")
    try:
        ds.require_check(probes, float(body.get("min_al", 0)))
        nums = {k: float(body.get(k, d)) for k, (d, _, _) in NUMBERS.items()}
    except (DraftSwapError, TypeError, ValueError) as e:
        return str(e)
    for key, (_, low, high) in NUMBERS.items():
        if not (math.isfinite(nums[key]) and low <= nums[key] <= high):  # NaN fails too
            return f"{key}={nums[key]} must be a finite number in [{low:g}, {high:g}]"
    if not math.isfinite(float(body["min_al"])):
        return f"min_al={body['min_al']} must be finite"
    weights = body.get("weights") or {}
    if not isinstance(weights, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weights.items()):
        return "weights must map file names to sha256 digests (the version's lineage.json)"
    txn = body.get("txn")
    if txn is not None and not (isinstance(txn, str) and re.fullmatch(r"[\w-]{1,64}", txn)):
        return "txn must be 1-64 letters, digits, _ or -"
    return {**args, **nums, "max_tokens": int(nums["max_tokens"]),
            "min_drafts": int(nums["min_drafts"]), "probes": probes, "weights": weights,
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
