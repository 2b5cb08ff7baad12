"""Where an EAGLE-3 head starts training: `train.init_from`'s head, or a new one whose draft
vocabulary comes from prepare's counts (the family's rules, drafts/eagle_family/build.py).
"""

from __future__ import annotations

from draftkit.core.artifacts import RunPaths
from draftkit.drafts.eagle_family.build import load_vocab, warm_start
from draftkit.drafts.eagle_family.model import Eagle3Draft


def build(cfg, data_runs: list[RunPaths], target) -> Eagle3Draft:
    """The head training starts from: `train.init_from`'s, or a new one whose vocab comes from
    the counts of `data_runs` (this run, then train.extra_runs)."""
    if cfg.train.init_from:
        return warm_start(cfg, target.model)
    vocab = load_vocab(cfg, data_runs, target.tokenizer)
    return Eagle3Draft.from_run_config(cfg, vocab, target.model)
