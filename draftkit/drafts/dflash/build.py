"""Where a DFlash draft starts training: `train.init_from` (a DFlash run dir = its train/best, or
a DFlash dir), or a new draft: the EAGLE-3 draft vocabulary rule (top assistant tokens of
prepare's counts, drafts/eagle_family/build.py), lm_head = the target's rows of it, final norm = the
target's, mask embedding = the mask token's row, and with `draft.init_layer_from` = n the
layers start as the target's layers n, n+1, ... (a truncated target: q/k/v/o, MLP and both
norms copied; a Llama target has no q/k norms, those stay ones), else random.

The mask token is an existing id (`mask_token_for`): the tokenizer's unk token, else pad, else
eos. vLLM replaces its embedding by the learned one in every query slot where it appears, slot
0 included, so an id the target rarely writes loses the least.
"""

from __future__ import annotations

import torch

from draftkit.core import registry
from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.drafts.dflash import format as fmt
from draftkit.drafts.dflash.model import DFlashDraft
from draftkit.drafts.eagle_family.build import init_from_dir, lineage_diff, load_vocab
from draftkit.drafts.eagle_family.init_layer import resolve_layer
from draftkit.drafts.eagle_family.target_tensors import module_tensors


def mask_token_for(tokenizer) -> int:
    for attr in ("unk_token_id", "pad_token_id", "eos_token_id"):
        tid = getattr(tokenizer, attr, None)
        if isinstance(tid, list):
            tid = tid[0] if tid else None
        if tid is not None:
            return int(tid)
    return 0


def build(cfg, data_runs: list[RunPaths], target) -> DFlashDraft:
    """The draft training starts from (module docstring); its block is k+1 slots."""
    if cfg.train.init_from:
        return warm_start(cfg, target.model)
    vocab = load_vocab(cfg, data_runs, target.tokenizer)
    spec = fmt.spec_from_run_config(cfg, vocab.draft_size, mask_token_for(target.tokenizer),
                                    cfg.target.hub_id or cfg.target.name)
    model = DFlashDraft(spec, vocab, cfg.train.ttt_decay)
    model.load_target_tensors(*module_tensors(target.model), init_lm_head=True)
    if cfg.draft.init_layer_from is not None:
        init_layers_from_target(model, target.model, cfg.draft.init_layer_from)
    return model


@torch.no_grad()
def init_layers_from_target(model: DFlashDraft, target_model, start: int) -> None:
    """Draft layer i <- target layer start+i (negative start counts from the end)."""
    layers = getattr(target_model, "model", target_model).layers
    first = resolve_layer(start, len(layers))
    if first + len(model.layers) > len(layers):
        raise DraftkitError(f"draft.init_layer_from={start} with {len(model.layers)} draft "
                            f"layers needs target layers {first}..{first + len(model.layers) - 1}"
                            f", the target has {len(layers)}")
    for i, layer in enumerate(model.layers):
        src = layers[first + i].state_dict()
        own = layer.state_dict()
        for name, value in src.items():
            if name in own and own[name].shape == value.shape:
                own[name].copy_(value)


def warm_start(cfg, target_model) -> DFlashDraft:
    """The DFlash draft of `train.init_from`, checked against this run (taps, layers, k,
    target lineage: shapes + tokenizer, not names)."""
    src = init_from_dir(cfg)
    model = DFlashDraft.from_pretrained(src, target_model, cfg.train.ttt_decay)
    got, d = model.spec, cfg.draft
    want = {"taps (draft.aux_layer_ids)": registry.aux_layer_ids(cfg),
            "draft.num_layers": d.num_layers or fmt.DEFAULT_LAYERS,
            "hidden size": cfg.target.hidden_size}
    have = {"taps (draft.aux_layer_ids)": got.aux_layer_ids, "draft.num_layers": got.num_layers,
            "hidden size": got.hidden_size}
    diff = [f"{k} {have[k]} there, {v} here" for k, v in want.items() if have[k] != v]
    if d.draft_vocab_size not in (0, got.draft_vocab_size):
        diff.append(f"draft vocab {got.draft_vocab_size} there, {d.draft_vocab_size} here")
    diff += lineage_diff(got, cfg)
    if diff:
        raise DraftkitError(f"train.init_from={src} does not fit this run's DFlash draft: "
                            f"{'; '.join(diff)}. Warm-start from a draft of the same target and "
                            "settings, or set this run's draft.* to match it")
    model.spec = fmt.with_k(got, d.num_speculative_tokens)
    return model
