"""Where a P-EAGLE head starts training: a new head (the EAGLE-3 head's vocab and init rules,
drafts/eagle_family/build.py, plus a random `mask_hidden`), or `train.init_from` (a run dir = its
train/best, or a checkpoint dir) holding a P-EAGLE head or an EAGLE-3 head. From an EAGLE-3
head the layer, fc, norm and lm_head carry over (its step 0 is P-EAGLE's slot 0), and only the
parallel slots start fresh: the cheapest way to a P-EAGLE head is a few epochs on an EAGLE-3
run's harvest from its trained head.
"""

from __future__ import annotations

from draftkit.core.artifacts import RunPaths
from draftkit.drafts.eagle_family import build as family_build
from draftkit.drafts.peagle.model import PEagleDraft, mask_token_for


def build(cfg, data_runs: list[RunPaths], target) -> PEagleDraft:
    """The head training starts from; its mask token is the target tokenizer's
    (mask_token_for) unless a P-EAGLE checkpoint brought its own."""
    if cfg.train.init_from:
        model = family_build.warm_start(cfg, target.model, cls=PEagleDraft)
    else:
        vocab = family_build.load_vocab(cfg, data_runs, target.tokenizer)
        model = PEagleDraft.from_run_config(cfg, vocab, target.model)
    if model.mask_token_id is None:
        model.mask_token_id = mask_token_for(target.tokenizer)
    return model
