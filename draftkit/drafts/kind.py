"""The one interface every draft kind implements, and the registry the stages ask.

A kind is a folder under `drafts/` (eagle3/, draft_lm/) whose `kind.py` defines one object with
the methods below; the stages never branch on a kind's name. Adding a kind is a folder plus one
line in `BUILTIN` (or a `register(...)` call from code outside draftkit).

    name, method                     draft.kind in the run config; vLLM's speculative method
    likely_causes                    what export's parity check names when vLLM's AL is far
                                     from the simulated one
  init
    resolve(cfg, info)               fill and check the kind's draft.* fields for target `info`
                                     (its harvest needs: draft.aux_layer_ids, which states)
    describe(cfg) -> str | None      init's line on where this draft starts, if any
  train
    check_train(cfg)                 refuse train.* settings the kind has no use for
    build(cfg, data_runs, target)    the module training starts from (new or train.init_from);
                                     its forward(batch) -> (loss, metrics) is what the loop calls
  export and eval
    export_run(run) -> Path          write <run>/export (or export.out) from train/best; the
                                     stage runs the vLLM parity check after it
    speculative_config(dir, k, sample)   vLLM's speculative_config that serves the draft in
                                     `dir` ("." in an export's own file) drafting k tokens;
                                     `sample` = draft.draft_sample_method (`draft_sampling`)
    export_shapes(conf, cfg)         {field: (found, wanted)} of an export's config.json against
                                     the run's target: what eval checks before serving it
    load_export(dir, target_model)   the exported draft as a torch module (reference decoder)
    draft_step_call(draft, b, pos)   one draft step of b sequences at `pos` for eval's cost model
                                     (eval/costs.py); None: a causal LM, timed as a cached forward
    reference_drafter(draft, target) the reference decoder's drafter (drafts/<kind>/drafter.py,
                                     the begin/extend pair of eval/spec_decode.py);
                                     `aux_layer_ids(draft)`: what the HFTarget must capture
  refresh (rl/)
    load(dir, policy_model, k)       a published draft with its frozen target parts from the
                                     policy, fp32 on the policy's device
    features(model, policy_model, ids, mask)   the policy's tensors a batch needs (always
                                     "last" [B, T, H], the pre-norm state), on the policy's device
    step_logits(model, batch)        k x [B, T, Vd]: step j at index t drafts x_{t+2+j}
                                     (teacher-forced), plus vocab_ids [Vd] -> target ids
    export(model, tmp, final, cfg)   a refreshed model as a dir vLLM loads as it is
    engine_view(dir)                 the published tensors as vLLM's drafter holds them (names,
                                     fused qkv/gate_up): what a swap's hash check compares
  inside vLLM (serving/)
    vllm_patches() -> [install]      functions the vLLM plugin (serving/vllm_plugin.py) calls in
                                     every vLLM process: the kind's fixes to vLLM (idempotent)
    after_load(drafter) -> bool      runs in a vLLM worker after an in-place drafter reload
                                     (serving/drafter_swap.py): state vLLM derived from the
                                     weights once, at load; False when there is none

`KindDefaults` holds the hooks most kinds leave alone (no patches, nothing after a load, no
draft step of its own).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from draftkit.core.config import ConfigError
from draftkit.core.errors import DraftkitError


class DraftKind(Protocol):
    name: str
    method: str
    likely_causes: tuple[str, ...]

    def resolve(self, cfg, info) -> None: ...

    def describe(self, cfg) -> str | None: ...

    def check_train(self, cfg) -> None: ...

    def build(self, cfg, data_runs: list, target) -> torch.nn.Module: ...

    def export_run(self, run) -> Path: ...

    def export_shapes(self, conf: dict, cfg) -> dict[str, tuple]: ...

    def load_export(self, directory: Path, target_model) -> torch.nn.Module: ...

    def reference_drafter(self, draft, target): ...

    def aux_layer_ids(self, draft) -> list[int] | None: ...

    def load(self, directory: Path, policy_model, k: int) -> torch.nn.Module: ...

    def features(self, model, policy_model, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def step_logits(self, model, batch: dict) -> tuple[list[torch.Tensor], torch.Tensor]: ...

    def export(self, model, tmp: Path, final: Path, cfg) -> None: ...

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]: ...

    def speculative_config(self, directory: str | Path, k: int | None,
                           sample: str = "greedy") -> dict: ...

    def vllm_patches(self) -> list[Callable[[], None]]: ...

    def after_load(self, drafter) -> bool: ...

    def draft_step_call(self, draft, batch: int, position: int) -> Callable[[], object] | None: ...


SERVED_TARGET_DIFFERS = "the served target differs from the trained one (dtype, revision, quantization)"


class KindDefaults:
    """The hooks most kinds leave alone: no vLLM patches, nothing after a load, a draft step
    timed as a cached forward of a causal LM."""

    likely_causes = (SERVED_TARGET_DIFFERS,)

    def draft_step_call(self, draft, batch: int, position: int) -> Callable[[], object] | None:
        return None

    def vllm_patches(self) -> list[Callable[[], None]]:
        return []

    def after_load(self, drafter) -> bool:
        return False


DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


def draft_sampling(sample: str) -> dict:
    """vLLM's `draft_sample_method` (draft.draft_sample_method): greedy (vLLM's default, left
    out) drafts the argmax and verifies it as one-hot, accepting with the target's p(x);
    probabilistic samples from the draft at the request's temperature and verifies against its
    probabilities, accepting with sum min(p, q). Both lossless; at T = 0 both draft the argmax."""
    if sample not in DRAFT_SAMPLE_METHODS:
        raise ConfigError(f"draft.draft_sample_method={sample!r}; choose one of "
                          f"{', '.join(DRAFT_SAMPLE_METHODS)}")
    return {} if sample == "greedy" else {"draft_sample_method": sample}


# name -> module whose import registers the kind (kept lazy: a kind pulls in its model code)
BUILTIN = {
    "eagle3": "draftkit.drafts.eagle3.kind",
    "draft-lm": "draftkit.drafts.draft_lm.kind",
    "peagle": "draftkit.drafts.peagle.kind",
    "pard": "draftkit.drafts.pard.kind",
    "dflash": "draftkit.drafts.dflash.kind",
}
_KINDS: dict[str, DraftKind] = {}


def register(kind: DraftKind) -> DraftKind:
    _KINDS[kind.name] = kind
    return kind


def names() -> list[str]:
    return sorted({*BUILTIN, *_KINDS})


def get(name: str) -> DraftKind:
    if name not in _KINDS and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in _KINDS:
        raise DraftkitError(f"unknown draft kind {name!r}; choose one of {', '.join(names())} "
                            "(draft.kind, or --draft at init)")
    return _KINDS[name]


def of(cfg) -> DraftKind:
    """The kind of a run config."""
    return get(cfg.draft.kind)


def device_of(model: torch.nn.Module) -> torch.device:
    """Where a model's weights are (the policy's: where refresh runs the draft too)."""
    return next(model.parameters()).device


def fuse_projections(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """q/k/v_proj -> qkv_proj and gate/up_proj -> gate_up_proj, as vLLM stores them."""
    out = dict(t)
    for parts, fused in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"),
                         (("gate_proj", "up_proj"), "gate_up_proj")):
        for name in [n for n in t if f".{parts[0]}." in n]:
            names_ = [name.replace(f".{parts[0]}.", f".{p}.") for p in parts]
            if all(n in t for n in names_):
                out[name.replace(f".{parts[0]}.", f".{fused}.")] = torch.cat([t[n] for n in names_])
                for n in names_:
                    out.pop(n)
    return out
