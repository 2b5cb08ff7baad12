"""One swap into a served engine as one server-side transaction, which finishes (committed or
rolled back) whatever happens to the client that started it.

    POST /draftkit/swap {directory, kind, version, candidates, reload_held, probes, min_al,
                         max_tokens, probe_timeout_s, pause_wait_s, txn, wait_s}

Inside one task of the API server (rollout_routes.py starts it; the request handler only
waits for it, up to `wait_s`, and a handler that is cancelled or a client that disconnects
leaves it running):
  1. one swap at a time per engine: an asyncio lock, and a file lock beside the API server
     (`--api-server-count > 1` runs several API processes on one engine core);
  2. never a pause draftkit did not take: an engine paused or asleep (a policy sync in
     flight) is waited for up to `pause_wait_s`, then refused (nothing loaded);
  3. pause with requests kept, load, compare the workers' tensor hashes with the published
     files (a difference reloads the previous draft before anyone is served), resume;
  4. probe: greedy completions of the probe prompts, submitted by this task, whose acceptance
     is read per request (vLLM's `--per-request-spec-decode-metrics`): other clients' traffic
     during the probe moves nothing. AL <= min_al, a probe that raised (a prompt that does
     not fit) or did not finish within `probe_timeout_s` puts the previous draft back
     (paused, hash-checked; an engine someone else paused meanwhile, which stalls the probe,
     is rolled back inside that pause and left paused) before the transaction ends.
Verdicts: `passed` (committed), `failed` (measured: hashes differ or AL <= min_al; the only
verdict that judges the draft), `error` (the swap or the probe raised; rolled back, nothing
decided), `refused` (nothing loaded: busy, paused by someone else, a probe that cannot draft
or does not fit --max-model-len, files that differ from their published digests, an engine the
probe cannot measure). A probe that measured fewer than `min_drafts` draft steps is `error`,
never `failed`. Each transaction's record (`txn`, `state`, `verdict`, ...) is kept in memory
and in a state file in a private directory (`state_dir`), one per port and engine boot, written
under its own lock, so `GET /draftkit/state?txn=ID` answers a client that lost the reply, from
any API process; a restart ends the records it left (`end_stale`). Engine calls (is_paused,
pause, resume) answer within ENGINE_CALL_S or end the transaction.

Limits: the load and the hash check run in a thread that cannot be cancelled; a transaction
cancelled by a server shutdown waits for it before it resumes the engine or releases the lock
(`uncancellable`). vLLM keeps one pause flag, not a count: a framework that pauses *while* a
draftkit swap holds its pause is resumed by draftkit's resume (docs/refresh.md says how to
order the calls: policy sync, then the swap, never both at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path

from draftkit.serving import draft_info
from draftkit.serving import drafter_swap as ds
from draftkit.serving.counters import SpecCounters
from draftkit.serving.drafter_swap import DraftSwapError

log = logging.getLogger("draftkit.serving.swap_txn")
DONE = ("committed", "rolled_back", "refused", "error")
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics summary"
ENGINE_CALL_S = 120.0  # is_paused / is_sleeping / pause / resume: each answers within this
PROBE_PRIORITY = -(1 << 30)  # `--scheduling-policy priority`: lower runs first, ahead of rollouts


def state_dir() -> Path:
    """Where the swap lock and state file live: DRAFTKIT_STATE_DIR, else a directory of this
    user's in the temp dir (mode 0700; refused if another user owns it or others can write it:
    a shared /tmp lets anyone pre-create or read the state)."""
    if os.environ.get("DRAFTKIT_STATE_DIR"):
        return Path(os.environ["DRAFTKIT_STATE_DIR"])
    path = Path(tempfile.gettempdir()) / f"draftkit-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise DraftSwapError(f"{path} is not a private directory of this user (owner uid "
                             f"{st.st_uid}, mode {oct(st.st_mode & 0o777)}): remove it, or set "
                             "DRAFTKIT_STATE_DIR to a directory only this user can write")
    return path


async def uncancellable(fut):
    """Await `fut` (a thread's future) to its end even if the awaiting task is cancelled; the
    cancellation is raised after it finished (the lock and the pause are never given up while
    a load runs)."""
    fut = asyncio.ensure_future(fut)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(fut)
            break
        except asyncio.CancelledError:
            if fut.done():
                if fut.cancelled():
                    raise
                result = fut.result()
                cancelled = True
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


class Transactions:
    """The swap transactions of one engine (one per API process; the file lock and the state
    file are shared by the API processes of one server, keyed by its port)."""

    def __init__(self, key: str = "default"):
        self.lock = asyncio.Lock()
        self.tasks: dict[str, asyncio.Task] = {}
        self.records: dict[str, dict] = {}
        self.lock_path = state_dir() / f"draftkit-swap-{key}.lock"
        self.state_path = state_dir() / f"draftkit-swap-{key}.json"

    # --------------------------------------------------------------------------- records

    @contextlib.contextmanager
    def _state_lock(self):
        """The state file's own lock (short: one read-modify-write; the swap lock is held by a
        whole transaction)."""
        fd = os.open(self.state_path.with_suffix(".state-lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _save(self, rec: dict) -> dict:
        rec["updated"] = time.time()
        self.records[rec["txn"]] = rec
        with contextlib.suppress(OSError), self._state_lock():
            saved = self._load()
            saved[rec["txn"]] = rec
            keep = dict(sorted(saved.items(), key=lambda kv: kv[1].get("started", 0))[-20:])
            keep["last"] = rec["txn"]
            tmp = self.state_path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps({"txns": keep}, default=str))
            os.replace(tmp, self.state_path)
        return rec

    def end_stale(self) -> list[str]:
        """At start: a record left unfinished by an earlier boot (its task died with it) is
        ended as `error` (nothing decided; the engine reports what it serves). Returns them."""
        ended = []
        for txn, rec in self._load().items():
            if rec.get("state") not in DONE and txn not in self.tasks:
                self._save({**rec, "state": "error", "verdict": "error", "finished": time.time(),
                            "error": "the server restarted before this transaction ended; "
                                     "nothing was decided"})
                ended.append(txn)
        return ended

    def _load(self) -> dict:
        try:
            return {k: v for k, v in json.loads(self.state_path.read_text())["txns"].items()
                    if k != "last"}
        except (OSError, ValueError, KeyError):
            return {}

    def get(self, txn: str | None = None) -> dict | None:
        """A transaction's record (None: the latest), from this process or the state file."""
        saved = self._load()
        if txn is None:
            both = [*self.records.values(), *saved.values()]
            return max(both, key=lambda r: r.get("started", 0), default=None)
        return self.records.get(txn) or saved.get(txn)

    # ------------------------------------------------------------------------- the task

    def start(self, adapter, args: dict) -> tuple[dict, asyncio.Task]:
        txn = args.get("txn") or uuid.uuid4().hex
        if txn in self.tasks or (old := self.get(txn)) is not None:
            rec = self.records.get(txn) or old
            return rec, self.tasks.get(txn)
        rec = self._save({"txn": txn, "state": "queued", "verdict": None, "started": time.time(),
                          "directory": args["directory"], "version": args["version"]})
        task = asyncio.get_running_loop().create_task(self._run(adapter, args, rec))
        self.tasks[txn] = task
        task.add_done_callback(lambda _: self.tasks.pop(txn, None))
        return rec, task

    async def _run(self, adapter, args: dict, rec: dict) -> dict:
        try:
            async with self.lock, self._file_lock(rec):
                return await self._transact(adapter, args, rec)
        except Exception as e:  # noqa: BLE001 - the record says what broke
            rec = self.records.get(rec["txn"], rec)  # the latest: `previous` kept after a load
            return self._save({**rec, "state": "error", "verdict": "error",
                               "error": f"{type(e).__name__}: {str(e)[:500]}",
                               "finished": time.time()})

    @contextlib.asynccontextmanager
    async def _file_lock(self, rec: dict):
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.05)  # still `queued`, as saved by start()
            yield
        finally:
            os.close(fd)

    async def _transact(self, adapter, args: dict, rec: dict) -> dict:
        engine = adapter.engine
        if not per_request_metrics(engine):
            return self._end(rec, "refused", "refused", error=(
                "this server cannot measure its own probe: it was started without per-request "
                "spec-decode metrics. Restart it with " + PER_REQUEST_FLAG +
                " (draftkit.serving.serve.command adds it)"))
        if (unfit := probe_misfit(engine, args)) is not None:
            return self._end(rec, "refused", "refused", error=unfit)
        if bad := await asyncio.to_thread(ds.file_problems, args["directory"], args["weights"]):
            return self._end(rec, "refused", "refused", error=(
                f"{args['directory']}: {'; '.join(bad[:3])} (its lineage.json's digests): "
                "nothing was loaded. Publish a new version instead of editing one"))
        if (busy := await self._wait_unpaused(engine, args["pause_wait_s"])) is not None:
            return self._end(rec, "refused", "refused", error=busy)
        digest = draft_info.weights_hash(args["weights"]) or \
            await asyncio.to_thread(draft_info.dir_hash, args["directory"])
        rec = self._save({**rec, "state": "loading", "draft_hash": digest})
        t0, paused_at = time.perf_counter(), time.time()
        await _bounded(engine.pause_generation(mode="keep", clear_cache=False), "pause")
        try:
            report = await uncancellable(asyncio.to_thread(
                ds.load_checked, adapter, args["kind"], args["directory"], args["candidates"],
                args["version"], args["reload_held"]))
        except DraftSwapError as e:
            return self._end(rec, "rolled_back" if e.verdict != "refused" else "refused",
                             e.verdict, error=str(e), previous=e.previous, restored=e.restored)
        finally:
            await _bounded(engine.resume_generation(), "resume")
        held = report.pop("held")
        rec = self._save({**rec, **report, "state": "probing", "pause_s": time.perf_counter() - t0,
                          "paused_at": paused_at, "scheduling": queue_policy(engine)})
        t1 = time.perf_counter()
        try:
            spec = await probe(engine, args["probes"], args["max_tokens"],
                               args["probe_timeout_s"], rec["txn"])
        except Exception as e:  # noqa: BLE001 - unjudged: the previous draft goes back
            why = _probe_problem(e, args, rec.get("scheduling"))
            return await self._roll_back(adapter, args, rec, held, "error", why)
        if (why := ds.unmeasured(spec.as_dict(), args["min_drafts"])) is not None:
            rec = {**rec, "probe": {"drafts": spec.drafts, "draft_tokens": spec.draft_tokens},
                   "probe_s": time.perf_counter() - t1}
            return await self._roll_back(adapter, args, rec, held, "error", why)
        al = spec.acceptance_length
        rec = {**rec, "al": al, "probe": spec.as_dict(), "probe_s": time.perf_counter() - t1,
               "min_al": args["min_al"]}
        if al > args["min_al"]:
            return self._end(rec, "committed", "passed")
        return await self._roll_back(adapter, args, rec, held, "failed", (
            f"probe AL {al:.3f} <= minimum {args['min_al']} over {spec.drafts} drafts of its "
            "own requests (the draft is in but not accepted)"))

    async def _wait_unpaused(self, engine, wait_s: float) -> str | None:
        """None once the engine is neither paused nor asleep; else why it stays refused."""
        deadline = time.monotonic() + wait_s
        while True:
            paused = await _ask(engine, "is_paused")
            sleeping = await _ask(engine, "is_sleeping")
            if not paused and not sleeping:
                return None
            if time.monotonic() >= deadline:
                what = "paused" + (" and asleep" if sleeping else "") if paused else "asleep"
                return (f"the engine is {what} and draftkit did not pause it (a policy sync or "
                        f"another client's pause); draftkit never resumes a pause it did not "
                        f"take. Waited {wait_s:g}s; nothing was loaded. Swap again after it "
                        "resumes (docs/refresh.md: how to order a policy sync and a swap)")
            await asyncio.sleep(0.1)

    async def _roll_back(self, adapter, args, rec, held, verdict: str, why: str) -> dict:
        rec = self._save({**rec, "state": "rolling_back", "why": why})
        engine = adapter.engine
        foreign = await _ask(engine, "is_paused")  # paused by someone else meanwhile: keep it
        if not foreign:
            await _bounded(engine.pause_generation(mode="keep", clear_cache=False), "pause")
        try:
            state, restored = await uncancellable(asyncio.to_thread(
                ds.roll_back, adapter, args["kind"], rec["previous"], held,
                rec["previous_version"]))
        finally:
            if not foreign:
                await _bounded(engine.resume_generation(), "resume")
        return self._end(rec, "rolled_back", verdict, restored=restored, error=(
            f"swap to {rec['directory']} failed its check: {why}; the previous draft "
            f"{rec['previous']} is {state}. Outputs were never wrong (verification is "
            "lossless), only slower"))

    def _end(self, rec: dict, state: str, verdict: str, **fields) -> dict:
        return self._save({**rec, **fields, "state": state, "verdict": verdict,
                           "finished": time.time()})


async def _ask(engine, method: str) -> bool:
    call = getattr(engine, method, None)
    return bool(await _bounded(call(), method)) if call is not None else False


async def _bounded(coro, what: str):
    """An engine call that must answer within ENGINE_CALL_S (TimeoutError naming it): a hung
    engine never holds the swap lock for ever."""
    try:
        return await asyncio.wait_for(coro, ENGINE_CALL_S)
    except (asyncio.TimeoutError, TimeoutError):
        raise TimeoutError(f"the engine's {what} did not answer within {ENGINE_CALL_S:g}s") \
            from None


def per_request_metrics(engine) -> bool:
    """The engine reports spec-decode acceptance per request (vLLM's
    `--per-request-spec-decode-metrics summary|detailed`)."""
    cfg = getattr(getattr(engine, "vllm_config", None), "observability_config", None)
    return getattr(cfg, "per_request_spec_decode_metrics", "none") != "none"


def probe_misfit(engine, args: dict) -> str | None:
    """Why the probe cannot measure on this engine, found before anything is paused or loaded:
    max_tokens below k + 2 (nothing drafted), or a prompt plus max_tokens past the engine's
    --max-model-len (a probe that raises after a pause and a load decides nothing)."""
    cfg = getattr(engine, "vllm_config", None)
    k = getattr(getattr(cfg, "speculative_config", None), "num_speculative_tokens", None)
    limit = getattr(getattr(cfg, "model_config", None), "max_model_len", None)
    if isinstance(k, int) and args["max_tokens"] < k + 2:
        return (f"probe max_tokens={args['max_tokens']} < k + 2 = {k + 2}: the probe would "
                "draft nothing and decide nothing. Raise refresh.probe_max_tokens; nothing "
                "was loaded")
    longest = max(len(p) for p in args["probes"])
    if isinstance(limit, int) and longest + args["max_tokens"] > limit:
        return (f"a probe prompt of {longest} tokens plus max_tokens={args['max_tokens']} does "
                f"not fit the engine's --max-model-len {limit}: lower refresh.probe_max_tokens "
                "or use shorter probe prompts; nothing was loaded")
    return None


FCFS_FIX = ("this engine schedules first come, first served: the swap's probe queues behind "
            "every waiting rollout (and may time out, deciding nothing). Start it with "
            "--scheduling-policy priority (serve.command and draftkit's launchers do) so the "
            "probe runs ahead of them")
_fcfs_warned: set[int] = set()


def queue_policy(engine) -> str | None:
    """The engine's `--scheduling-policy` ("fcfs", "priority"; None if it does not say). On
    anything but "priority" the server logs FCFS_FIX once per engine."""
    sched = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
    policy = getattr(sched, "policy", None)
    if policy is not None and policy != "priority" and id(engine) not in _fcfs_warned:
        _fcfs_warned.add(id(engine))
        log.warning("draftkit: %s", FCFS_FIX)
    return policy


async def probe(engine, probes: list[list[int]], max_tokens: int, timeout: float,
                tag: str) -> SpecCounters:
    """Greedy completions of `probes` on the served engine; the acceptance of these requests
    only (per-request metrics); aborted past `timeout` (TimeoutError)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    ids = [f"draftkit-probe-{tag}-{i}" for i in range(len(probes))]
    ahead = {"priority": PROBE_PRIORITY} if queue_policy(engine) == "priority" else {}

    async def one(rid: str, prompt: list[int]):
        final = None
        async for out in engine.generate({"prompt_token_ids": prompt}, params, rid, **ahead):
            final = out
        return final.outputs[0].spec_decode_metrics if final and final.outputs else None

    try:
        metrics = await asyncio.wait_for(
            asyncio.gather(*(one(r, p) for r, p in zip(ids, probes, strict=True))), timeout)
    except (asyncio.TimeoutError, TimeoutError):
        with contextlib.suppress(Exception):
            await engine.abort(ids)
        raise TimeoutError(f"the probe did not finish within {timeout:g}s") from None
    return SpecCounters.from_request_metrics(metrics)


def _probe_problem(e: Exception, args: dict, policy: str | None = None) -> str:
    """Why the probe decided nothing, and the fix."""
    text = f"{type(e).__name__}: {str(e)[:300]}"
    if isinstance(e, TimeoutError):
        fix = FCFS_FIX if policy not in (None, "priority") else \
            "raise refresh.engine_timeout_s or swap when the engine is quieter"
        return f"{text} (the engine is busy). Nothing was decided; {fix}"
    if "longer than" in str(e) or "max_model_len" in str(e) or "too long" in str(e):
        return (f"{text}. A probe prompt plus refresh.probe_max_tokens="
                f"{args['max_tokens']} does not fit the engine's --max-model-len; lower "
                "refresh.probe_max_tokens or use shorter probe prompts. Nothing was decided")
    return f"the probe raised {text}; nothing was decided about the draft"
