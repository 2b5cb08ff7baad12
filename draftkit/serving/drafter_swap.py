"""Swap the drafter of a running vLLM engine in place, and prove the swap worked.

vLLM gets a worker extension (`worker_extension_cls`, methods called through
`collective_rpc` by name: no pickled functions) whose methods run inside every worker:
  draftkit_load_drafter(dir)   vLLM's in-place `reload_weights` on `model_runner.drafter.model`
                               from the dir's safetensors (a path crosses the RPC; tensors
                               would arrive as lists). vLLM-CPU repacks linear weights, so a
                               plain `load_weights` into the live model does not work there.
  draftkit_drafter_hashes()    sha256 of every drafter tensor as the worker holds it; repacked
                               linears are read back as their output on an identity matrix
  draftkit_drafter_path()      the dir the drafter was last loaded from
The health check compares those hashes with the published tensors (`kind.engine_view`, cast
to the worker's dtype) and runs a few probe prompts at T=0: the engine's own AL must exceed a
threshold. A swap that fails either is rolled back to the previous weights and raises
`DraftSwapError`. Outputs stay correct either way (verification is lossless): only this check
sees a draft that did not arrive (AL ~1).

    llm = LLM(model=..., speculative_config=..., **drafter_swap.engine_kwargs())
    drafter_swap.swap_into(llm, "runs/rl/drafts/v0003", kinds.get("eagle3"), probes)
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError

EXTENSION = "draftkit.serving.drafter_swap.DrafterSwap"


class DraftSwapError(DraftkitError):
    """The drafter weights did not arrive (or do not accept); the previous ones are back."""


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
            self._draftkit_path = str(self.vllm_config.speculative_config.model)
        return self._draftkit_path

    def draftkit_load_drafter(self, directory: str) -> float:
        from safetensors.torch import load_file
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        self.draftkit_drafter_path()  # remember the start path before the first swap
        t0 = time.perf_counter()
        tensors = {}
        for f in sorted(Path(directory).glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        reload_weights(self.vllm_config, self._draftkit_drafter(), iter(tensors.items()),
                       None, True)
        self._draftkit_path = str(directory)
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
                eye = torch.eye(mod.input_size, dtype=dtype)
                view[f"{name}.weight"] = mod.quant_method.apply(mod, eye, None).t()
        return {n: [str(t.dtype).removeprefix("torch."), tensor_digest(t)]
                for n, t in view.items()}


# ----------------------------------------------------------------------------- driver side


def drafter_path(llm) -> str:
    return llm.collective_rpc("draftkit_drafter_path")[0]


def load(llm, directory: str | Path) -> float:
    """Reload the drafter in every worker; returns the slowest worker's seconds."""
    return max(llm.collective_rpc("draftkit_load_drafter", args=(str(directory),)))


def hash_problems(llm, kind, directory: str | Path) -> list[str]:
    """Names whose hash differs from the published tensors in any worker ([] = all equal)."""
    want = kind.engine_view(Path(directory))
    problems = []
    for rank, got in enumerate(llm.collective_rpc("draftkit_drafter_hashes")):
        for name, tensor in want.items():
            if name not in got:
                problems.append(f"worker {rank}: no tensor {name}")
                continue
            dtype, digest = got[name]
            if tensor_digest(tensor.to(getattr(torch, dtype))) != digest:
                problems.append(f"worker {rank}: {name} differs")
    return problems


def probe_al(llm, probes: list[list[int]], max_tokens: int) -> dict | None:
    from draftkit.serving import vllm_engine

    run = vllm_engine.measure(llm, probes, vllm_engine.sampling(0.0, max_tokens),
                              batch_size=len(probes))
    return run["spec"]


def health_check(llm, kind, directory: str | Path, probes: list[list[int]], min_al: float,
                 max_tokens: int = 64) -> dict:
    """{"ok", "hash_problems", "al", "spec"}: hashes equal in every worker and AL > min_al."""
    problems = hash_problems(llm, kind, directory)
    spec = probe_al(llm, probes, max_tokens) if probes else None
    al = spec["acceptance_length"] if spec else 1.0
    return {"ok": not problems and (not probes or al > min_al), "hash_problems": problems[:10],
            "al": al, "min_al": min_al, "spec": spec}


def swap_into(llm, directory: str | Path, kind, probes: list[list[int]], min_al: float,
              max_tokens: int = 64) -> dict:
    """Load `directory` into the live drafter, check it, roll back on failure (and raise)."""
    previous = drafter_path(llm)
    seconds = load(llm, directory)
    report = health_check(llm, kind, directory, probes, min_al, max_tokens)
    report.update({"swap_s": seconds, "directory": str(directory), "previous": previous})
    if report["ok"]:
        return report
    load(llm, previous)
    back = hash_problems(llm, kind, previous)
    state = "restored" if not back else f"NOT restored ({'; '.join(back[:3])})"
    raise DraftSwapError(
        f"drafter swap to {directory} failed its health check (hash problems: "
        f"{report['hash_problems'][:3] or 'none'}; probe AL {report['al']:.3f} vs minimum "
        f"{min_al}); the previous weights from {previous} are {state}. Outputs were never "
        "wrong (verification is lossless), only slower. Check the draft with `draftkit drift`.")


def sleep_wake_check(llm, kind, directory: str | Path, probes: list[list[int]],
                     min_al: float, max_tokens: int = 64) -> dict:
    """Sleep and wake the engine, then run the health check again (a refit or wake can drop
    drafter weights). Engines without sleep mode report {"supported": False, "reason"}."""
    try:
        llm.sleep(level=1)
        llm.wake_up()
    except Exception as e:  # noqa: BLE001 - unsupported sleep raises many types
        return {"supported": False, "reason": f"{type(e).__name__}: {e}"}
    return {"supported": True, **health_check(llm, kind, directory, probes, min_al, max_tokens)}
