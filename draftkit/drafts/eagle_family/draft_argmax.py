"""The EAGLE-3 draft's greedy token in vLLM-CPU: argmax over the draft vocabulary, then d2t.

vLLM 0.32's `Eagle3LlamaForCausalLM.compute_logits` (and `Eagle3Qwen3ForCausalLM`'s) widens the
draft's logits [N, Vd] to the target vocabulary [N, V] (-inf outside the draft vocab, d2t
scattered in) and the proposer's `_greedy_sample` takes the argmax over V. On a CPU that is the
draft's dearest op at batch 8: `new_full` + `index_put_` + `argmax` over [8, 49152] cost ~8.6 ms
of a propose for a 4096-token draft vocab (results/bench_step.md). Here the argmax runs over Vd
and the winner is mapped: target_id = i + d2t[i].

Lossless: the same ids as the widened argmax, ties included (`target_ids`, asserted bit-exact
in tests/test_draft_argmax.py). torch's argmax returns the *first* maximal index (NaN counts as
the maximum). d2t from draftkit (drafts/eagle_family/vocab.py) maps draft id i to the i-th selected
target id in ascending order, so the first maximum in draft order is the first in target order.
The one row where the two differ is all -inf: the widened row is -inf everywhere and its argmax
is target id 0, so that row gets 0. A d2t that is not ascending (another tool's export) takes
vLLM's own widened path, checked on every call (~10 us: a drafter swap may load a new d2t).

How it is wired, with vLLM's own hook rather than a rewritten function: the proposer's
`_greedy_sample` calls `self.model.get_top_tokens(hidden)` when `use_local_argmax_reduction`
is set. Exports cannot set that flag (`Eagle3LlamaForCausalLM` has no `get_top_tokens`, so a
user serving an export without draftkit would get a ValueError), so the plugin
(serving/vllm_plugin.py) wraps `EagleProposer.load_model`: after vLLM loads the draft it binds
`top_tokens` to that model instance as `get_top_tokens` and sets the flag on that proposer only.
Then it probes the live path: `_greedy_sample` on a zero row (all draft logits tie) and random
rows must equal `compute_logits(...).argmax(-1)` and must have called `top_tokens`; otherwise
everything is undone and logged. Anything unexpected (no EagleProposer, another model class, no
d2t, a flag the user set, heterogeneous vocab, adaptive verification) leaves vLLM alone.
Probabilistic drafting (draft_sample_method "probabilistic" at T > 0) never reaches
`_greedy_sample`: vLLM samples from the widened logits as before.

Where: the CPU platform only. On CUDA the widening is a memory-bound scatter and argmax of a few
MB (microseconds), vLLM's GPU model runner V2 drafts through its own speculator, and no GPU
here verifies parity; GPU platforms are left to vLLM (which has `use_local_argmax_reduction`
and `LocalArgmaxMixin` for tensor-parallel heads). Tensor parallel on CPU is unverified: the
probe runs on every rank and any failure keeps vLLM's path on that rank (both paths give the
same ids).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import sys
import types

import torch

log = logging.getLogger("draftkit.drafts.eagle_family.draft_argmax")

MARK = "_draftkit_draft_argmax"  # set on the wrapped EagleProposer.load_model
CALLS = "draftkit_argmax_calls"  # counter on the draft model: how often `top_tokens` ran


def target_ids(logits: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Draft logits [N, Vd] and an ascending d2t int64 [Vd] -> target ids int64 [N], exactly
    vLLM's widened logits' argmax (module docstring: ties and NaN by first-index order)."""
    ids = logits.argmax(dim=-1)  # [N] first maximal draft id
    best = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # [N] its logit
    mapped = ids + d2t[ids]  # [N] target ids
    # an all -inf row: the widened row is -inf everywhere, whose argmax is target id 0
    return torch.where(best == float("-inf"), torch.zeros_like(mapped), mapped)


def ascending(d2t: torch.Tensor) -> bool:
    """target id i + d2t[i] strictly increasing <=> d2t non-decreasing (integers)."""
    return bool((d2t[1:] >= d2t[:-1]).all())


def top_tokens(model, hidden_states: torch.Tensor) -> torch.Tensor:
    """Bound to the draft model as `get_top_tokens`: hidden [N, H] -> target ids int64 [N]."""
    setattr(model, CALLS, getattr(model, CALLS, 0) + 1)
    d2t = model.draft_id_to_target_id
    if not ascending(d2t):
        return model.compute_logits(hidden_states).argmax(dim=-1)  # vLLM's widened path
    logits = model.logits_processor(model.lm_head, hidden_states)  # [N, Vd], as compute_logits
    return target_ids(logits, d2t)


def draft_classes() -> tuple[type, ...]:
    """vLLM's EAGLE-3 heads whose compute_logits widens with d2t (the ones this replaces)."""
    out = []
    for module, name in (("llama_eagle3", "Eagle3LlamaForCausalLM"),
                         ("qwen3_eagle3", "Eagle3Qwen3ForCausalLM")):
        try:
            mod = __import__(f"vllm.model_executor.models.{module}", fromlist=[name])
            out.append(getattr(mod, name))
        except Exception:  # noqa: BLE001 - a vLLM without that head: nothing to replace there
            continue
    return tuple(out)


def why_not(proposer) -> str | None:
    """None if `proposer` is one this module may switch, else the reason it is left alone."""
    model, classes = getattr(proposer, "model", None), draft_classes()
    if model is None or not classes or not isinstance(model, classes):
        return f"draft model {type(model).__name__} is not a vLLM EAGLE-3 head"
    if getattr(model, "draft_id_to_target_id", None) is None:
        return "the draft vocab is the target's (no d2t): nothing is widened"
    if not all(hasattr(model, a) for a in ("logits_processor", "lm_head", "compute_logits")):
        return "the draft model lacks logits_processor/lm_head/compute_logits"
    if not hasattr(proposer, "use_local_argmax_reduction") or not hasattr(proposer,
                                                                         "_greedy_sample"):
        return "this vLLM's proposer has no use_local_argmax_reduction hook"
    if proposer.use_local_argmax_reduction:
        return "use_local_argmax_reduction is already set by the user"
    if getattr(proposer, "use_heterogeneous_vocab", False):
        return "use_heterogeneous_vocab takes another path"
    spec = getattr(getattr(proposer, "vllm_config", None), "speculative_config", None)
    if getattr(spec, "enable_adaptive_verification", False):
        return "adaptive verification reads the draft logits"
    return None


def enable(proposer) -> str | None:
    """Switch `proposer` (a loaded EagleProposer) to `top_tokens` and prove the switch on the
    live path; returns None when enabled, else why not (and leaves vLLM as it was)."""
    reason = why_not(proposer)
    if reason is not None:
        return reason
    model = proposer.model
    model.get_top_tokens = types.MethodType(top_tokens, model)  # this instance only
    setattr(model, CALLS, 0)
    proposer.use_local_argmax_reduction = True
    try:
        reason = probe(proposer)
    except Exception as e:  # noqa: BLE001 - any surprise keeps vLLM's own path
        reason = f"probe failed: {type(e).__name__}: {e}"
    if reason is not None:
        disable(proposer)
    setattr(model, CALLS, 0)
    return reason


def probe(proposer) -> str | None:
    """The proposer's own `_greedy_sample` through the hook equals vLLM's widened argmax on a
    zero row (every draft logit ties) and random rows, and really called `top_tokens`."""
    model = proposer.model
    dtype = getattr(proposer, "dtype", None) or proposer.vllm_config.model_config.dtype
    device = getattr(proposer, "device", None) or model.draft_id_to_target_id.device
    gen = torch.Generator().manual_seed(0)  # leaves the worker's global RNG alone
    hidden = torch.randn(4, model.config.hidden_size, generator=gen)  # [4, H]
    hidden = torch.cat([torch.zeros_like(hidden[:1]), hidden]).to(device=device, dtype=dtype)
    with torch.inference_mode():
        want = model.compute_logits(hidden).argmax(dim=-1)  # [5] vLLM's widened argmax
        got = proposer._greedy_sample(hidden)  # [5] through the hook
    if getattr(model, CALLS, 0) < 1:
        return "_greedy_sample did not call get_top_tokens (this vLLM's hook differs)"
    if not torch.equal(got.long(), want.long()):
        return f"probe mismatch: {got.tolist()} != vLLM's {want.tolist()}"
    return None


def disable(proposer) -> None:
    """Back to vLLM's widened argmax (the instance's bound method removed, the flag off)."""
    proposer.use_local_argmax_reduction = False
    bound = proposer.model.__dict__.get("get_top_tokens")
    if getattr(bound, "__func__", None) is top_tokens:
        del proposer.model.__dict__["get_top_tokens"]


EAGLE_MODULE = "vllm.v1.spec_decode.eagle"


def install() -> bool:
    """Wrap vLLM-CPU's `EagleProposer.load_model` so each loaded EAGLE-3 draft gets `enable`
    (idempotent; a GPU platform or an unexpected vLLM is left alone). The plugin runs in every
    vLLM process, and importing the proposer costs seconds, so where vLLM has not imported it
    yet the patch waits for vLLM's own import (`_AfterImport`): only a process that drafts pays.
    True if installed or waiting."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
    except Exception:  # noqa: BLE001 - no vLLM
        return False
    if EAGLE_MODULE not in sys.modules:
        if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(EAGLE_MODULE, _install_now))
        return True
    return _install_now()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then()` right after module `name` is first executed (by whoever imports it)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders locate it; this hook fires once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, then = spec.loader.exec_module, self.then

        def run(module):
            exec_module(module)
            try:
                then()
            except Exception:  # noqa: BLE001 - never break vLLM's own import
                log.warning("draftkit: draft argmax not installed", exc_info=True)

        spec.loader.exec_module = run
        return spec


def _install_now() -> bool:
    try:
        from vllm.v1.spec_decode.eagle import EagleProposer
    except Exception:  # noqa: BLE001 - a vLLM without EAGLE proposers
        return False
    original = getattr(EagleProposer, "load_model", None)
    if original is None or not callable(getattr(EagleProposer, "_greedy_sample", None)):
        log.warning("draftkit: vLLM's EagleProposer looks different; draft argmax left to vLLM")
        return False
    if getattr(original, MARK, False):
        return True

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        reason = enable(self)
        if reason is None:
            log.info("draftkit: EAGLE-3 greedy drafts take the argmax over the draft vocab")
        else:
            log.info("draftkit: draft argmax left to vLLM (%s)", reason)
        return out

    setattr(load_model, MARK, True)
    EagleProposer.load_model = load_model  # on EagleProposer only, not its base class
    return True


# ---------------------------------------------------------------------- worker side (tests, bench)


def worker_state(worker) -> dict:
    """Runs in a vLLM worker (`llm.collective_rpc(worker_state)`): is the drafter switched, and
    how often has `top_tokens` run since it was."""
    drafter = getattr(worker.model_runner, "drafter", None)
    model = getattr(drafter, "model", None)
    bound = getattr(model, "__dict__", {}).get("get_top_tokens")
    return {"enabled": bool(getattr(drafter, "use_local_argmax_reduction", False))
            and getattr(bound, "__func__", None) is top_tokens,
            "calls": int(getattr(model, CALLS, 0)),
            "installed": bool(getattr(getattr(type(drafter), "load_model", None), MARK, False))}


def worker_switch(worker, on: bool) -> dict:
    """Runs in a vLLM worker: switch the drafter to (`on`) or from the draft-vocab argmax;
    returns `worker_state` (with "reason" when switching on was refused)."""
    drafter = worker.model_runner.drafter
    reason = None
    if on and not worker_state(worker)["enabled"]:
        reason = enable(drafter)
    elif not on:
        disable(drafter)
    return {**worker_state(worker), "reason": reason}
