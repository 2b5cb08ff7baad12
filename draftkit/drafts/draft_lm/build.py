"""Where a draft-lm run's trainable `DraftLM` starts: the LM family's `build_lm` (draft.init
sibling | truncate | scratch, or train.init_from; drafts/lm_family/build.py) wrapped with the
target's final norm and lm_head.
"""

from __future__ import annotations

from draftkit.drafts.lm_family.build import build_lm
from draftkit.drafts.lm_family.model import DraftLM


def build_draft_lm(cfg, target):
    """The trainable `DraftLM` of a run: `build_lm` wrapped with the target's norm/lm_head."""
    return DraftLM.for_target(build_lm(cfg, target), target.model, cfg)
