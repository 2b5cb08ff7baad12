"""Swap the drafter of a running vLLM engine in place, and prove the swap worked.

vLLM gets a worker extension (`worker_extension_cls`, methods called through
`collective_rpc` by name: no pickled functions) whose methods run inside every worker:
  draftkit_load_drafter(dir)   vLLM's in-place `reload_weights` on `model_runner.drafter.model`
                               from the dir's safetensors (a path crosses the RPC; tensors
                               would arrive as lists). vLLM-CPU repacks linear weights, so a
                               plain `load_weights` into the live model does not work there.
  draftkit_drafter_hashes()    sha256 of every drafter tensor as the worker holds it; repacked
                               linears are read back as their output on an identity matrix
  draftkit_drafter_path()      the resolved dir the drafter was last loaded from (the start
                               path is resolved on the first call: see the limit below)
The health check compares those hashes with the published tensors (`kind.engine_view`, cast
to the worker's dtype) and runs probe prompts at T=0: the engine's own AL must exceed
`min_al` (> 1.0). It cannot be skipped: no probes, or `min_al <= 1.0`, is refused before
anything loads. Outputs stay correct either way (verification is lossless): only this check
sees a draft that did not arrive (AL ~1).

`swap_into` records what the engine holds before it loads: the workers' tensor hashes and
the directory whose files hash to them (the worker's path resolved, else one of
`candidates`: an engine started on `drafts/current` reports that link, which a refresh may
have moved already). A failed check, or any exception while loading or checking, reloads
that directory, compares the workers' hashes with the recorded ones, and raises
`DraftSwapError` (the cause chained) saying whether the old weights are back.

    llm = LLM(model=..., speculative_config=..., **drafter_swap.engine_kwargs())
    drafter_swap.swap_into(llm, "runs/rl/drafts/v0003", kinds.get("eagle3"), probes, 1.2)
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError

EXTENSION = "draftkit.serving.drafter_swap.DrafterSwap"


class DraftSwapError(DraftkitError):
    """A swap was refused (verdict "refused": nothing loaded), or the new weights failed the
    check ("failed") or raised ("error"); then the previous weights were reloaded, and
    `restored` says whether the workers' hashes equal those held before the swap."""

    def __init__(self, message: str, verdict: str = "refused", directory: str | None = None,
                 previous: str | None = None, restored: bool | None = None):
        super().__init__(message)
        self.verdict, self.directory = verdict, directory
        self.previous, self.restored = previous, restored


def engine_kwargs() -> dict:
    """LLM(...) keywords that make an engine swappable."""
    return {"worker_extension_cls": EXTENSION}


def tensor_digest(t: torch.Tensor) -> str:
    flat = t.detach().cpu().contiguous().reshape(-1)  # 0-dim tensors cannot be viewed as bytes
    return hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest()


class DrafterSwap:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def _draftkit_drafter(self):
        drafter = getattr(self.model_runner, "drafter", None)
        if drafter is None or not hasattr(drafter, "model"):
            raise RuntimeError("this engine has no model-based drafter (speculative_config "
                               "with method eagle3 or draft_model)")
        return drafter.model

    def draftkit_drafter_path(self) -> str:
        if not hasattr(self, "_draftkit_path"):
            self._draftkit_path = os.path.realpath(str(self.vllm_config.speculative_config.model))
        return self._draftkit_path

    def draftkit_load_drafter(self, directory: str) -> float:
        from safetensors.torch import load_file
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        self.draftkit_drafter_path()  # remember the start path before the first swap
        t0 = time.perf_counter()
        files = sorted(Path(directory).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {directory}: nothing to load")
        tensors = {}
        for f in files:
            tensors.update(load_file(str(f)))
        reload_weights(self.vllm_config, self._draftkit_drafter(), iter(tensors.items()),
                       None, True)
        self._draftkit_path = os.path.realpath(directory)
        return time.perf_counter() - t0

    @torch.no_grad()
    def draftkit_drafter_hashes(self) -> dict[str, list[str]]:
        from vllm.model_executor.layers.linear import LinearBase

        model = self._draftkit_drafter()
        view = {n: p for n, p in model.named_parameters() if p.numel()}
        view.update({n: b for n, b in model.named_buffers() if b.numel()})
        dtype = self.vllm_config.model_config.dtype
        for name, mod in model.named_modules():
            if isinstance(mod, LinearBase):  # repacked on CPU: W^T = apply(I)
                device = next(iter(mod.parameters()), torch.empty(0)).device
                n_in = getattr(mod, "input_size_per_partition", mod.input_size)  # TP shard
                eye = torch.eye(n_in, dtype=dtype, device=device)  # [in, in]
                view[f"{name}.weight"] = mod.quant_method.apply(mod, eye, None).t()  # [out, in]
        return {n: [str(t.dtype).removeprefix("torch."), tensor_digest(t)]
                for n, t in view.items()}


# ----------------------------------------------------------------------------- driver side


def drafter_path(llm) -> str:
    return llm.collective_rpc("draftkit_drafter_path")[0]


def load(llm, directory: str | Path) -> float:
    """Reload the drafter in every worker; returns the slowest worker's seconds."""
    return max(llm.collective_rpc("draftkit_load_drafter", args=(str(directory),)))


def engine_hashes(llm) -> list[dict[str, list[str]]]:
    """Per worker: {tensor name: [dtype, sha256]} of the drafter as the worker holds it."""
    return llm.collective_rpc("draftkit_drafter_hashes")


def diff(want: dict[str, torch.Tensor], held: list[dict[str, list[str]]]) -> list[str]:
    """Names whose hash in any worker differs from `want` (published tensors; [] = equal)."""
    problems = []
    for rank, got in enumerate(held):
        for name, tensor in want.items():
            if name not in got:
                problems.append(f"worker {rank}: no tensor {name}")
                continue
            dtype, digest = got[name]
            if tensor_digest(tensor.to(getattr(torch, dtype))) != digest:
                problems.append(f"worker {rank}: {name} differs")
    return problems


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
            "run's eval prompts (draftkit.prepare.dataset.load_prompts(run / 'data', 8))")
    if not min_al > 1.0:
        raise DraftSwapError(
            f"min_al={min_al} cannot fail: AL >= 1.0 always (a draft nobody accepts scores "
            "1.0). Use a threshold above 1.0, e.g. refresh.min_probe_al=1.2")


def probe_al(llm, probes: list[list[int]], max_tokens: int) -> dict | None:
    from draftkit.serving import vllm_engine

    run = vllm_engine.measure(llm, probes, vllm_engine.sampling(0.0, max_tokens),
                              batch_size=len(probes))
    return run["spec"]


def health_check(llm, kind, directory: str | Path, probes: list[list[int]] | None,
                 min_al: float, max_tokens: int = 64) -> dict:
    """{"ok", "hash_problems", "al", "spec"}: hashes equal in every worker and AL > min_al.
    Refuses (DraftSwapError) without probes or with min_al <= 1.0."""
    require_check(probes, min_al)
    problems = hash_problems(llm, kind, directory)
    spec = probe_al(llm, probes, max_tokens)
    al = spec["acceptance_length"] if spec else 1.0
    return {"ok": not problems and al > min_al, "hash_problems": problems[:10], "al": al,
            "min_al": min_al, "spec": spec}


def swap_into(llm, directory: str | Path, kind, probes: list[list[int]] | None, min_al: float,
              max_tokens: int = 64, candidates: list[str | Path] = ()) -> dict:
    """Load `directory` into the live drafter, check it, roll back on failure or on any
    exception (and raise DraftSwapError). `candidates`: dirs the engine's current drafter may
    have come from, tried when the worker's own path no longer holds its weights."""
    require_check(probes, min_al)
    directory = os.path.realpath(directory)
    held = engine_hashes(llm)
    started_on = drafter_path(llm)
    previous = locate(kind, held, [started_on, *candidates])
    if previous is None:
        raise DraftSwapError(
            f"refusing to swap {directory} in: no directory holds the weights the engine "
            f"serves now (its drafter came from {started_on}), so a failed check could not "
            "roll back. Pass the dir the engine was started on in `candidates`, or restart "
            "the engine on a draft dir that exists", directory=directory)
    try:
        seconds = load(llm, directory)
        report = health_check(llm, kind, directory, probes, min_al, max_tokens)
    except Exception as e:  # noqa: BLE001 - whatever broke, the old weights go back
        state, restored = roll_back(llm, previous, held)
        raise DraftSwapError(
            f"drafter swap to {directory} raised {type(e).__name__}: {str(e)[:300]}; the "
            f"previous weights from {previous} are {state}. Fix the cause and swap again",
            "error", directory, previous, restored) from e
    report.update({"swap_s": seconds, "directory": directory, "previous": previous})
    if report["ok"]:
        return report
    state, restored = roll_back(llm, previous, held)
    raise DraftSwapError(
        f"drafter swap to {directory} failed its health check (hash problems: "
        f"{report['hash_problems'][:3] or 'none'}; probe AL {report['al']:.3f} vs minimum "
        f"{min_al}); the previous weights from {previous} are {state}. Outputs were never "
        "wrong (verification is lossless), only slower. Check the draft with `draftkit drift`.",
        "failed", directory, previous, restored)


def roll_back(llm, previous: str, held: list[dict]) -> tuple[str, bool]:
    """Reload `previous`; ("restored", True) when every worker's hashes equal `held` again."""
    try:
        load(llm, previous)
        now = engine_hashes(llm)
    except Exception as e:  # noqa: BLE001 - reported in the caller's error
        return f"NOT restored (the rollback raised {type(e).__name__}: {str(e)[:200]})", False
    if now == held:
        return "restored (worker hashes equal those before the swap)", True
    bad = sorted({n for h, g in zip(held, now, strict=False) for n in h if g.get(n) != h[n]})
    return f"NOT restored ({len(bad)} tensors differ, e.g. {bad[:3]}): restart the engine", False


def sleep_wake_check(llm, kind, directory: str | Path, probes: list[list[int]] | None,
                     min_al: float, max_tokens: int = 64) -> dict:
    """Sleep and wake the engine, then run the health check again (a refit or wake can drop
    drafter weights). A sleep that raises "not supported" -> {"supported": False, "reason"};
    any other failure of sleep or wake raises DraftSwapError (the engine may be asleep)."""
    require_check(probes, min_al)
    try:
        llm.sleep(level=1)
    except Exception as e:  # noqa: BLE001 - unsupported sleep raises many types
        if isinstance(e, NotImplementedError) or "not supported" in str(e).lower():
            return {"supported": False, "reason": f"{type(e).__name__}: {e}"}
        _wake_quietly(llm)
        raise DraftSwapError(f"engine sleep failed ({type(e).__name__}: {e}); a wake_up was "
                             "tried. Check the engine before serving from it", "error") from e
    try:
        awake = llm.wake_up()
    except Exception as e:  # noqa: BLE001
        raise DraftSwapError(f"the engine slept but wake_up raised {type(e).__name__}: {e}; "
                             "it may still be asleep: restart it", "error") from e
    if awake is False:
        raise DraftSwapError("the engine slept but wake_up() says it is not fully awake; "
                             "call wake_up() with every tag, or restart it", "error")
    report = health_check(llm, kind, directory, probes, min_al, max_tokens)
    return {"supported": True, "note": _sleep_note(), **report}


def _wake_quietly(llm) -> None:
    try:
        llm.wake_up()
    except Exception:  # noqa: BLE001, S110 - best effort after a failed sleep
        pass


def _sleep_note() -> str:
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_sleep_mode_available():
            return "this platform's worker ignores sleep (vllm-cpu): nothing was offloaded"
    except ImportError:
        pass
    return ""
