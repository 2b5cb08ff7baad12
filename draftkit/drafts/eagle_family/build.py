"""Where an EAGLE-family head starts training (EAGLE-3's and P-EAGLE's build; DFlash takes the
vocab rule, the init_from dir and the lineage check): a new head whose draft vocabulary is the
top `draft.draft_vocab_size` assistant tokens of prepare's counts (ids ascending), or the head
of `train.init_from` (a run dir = its train/best, or a checkpoint dir), checked against this
run's draft settings and target lineage (shapes + tokenizer, not names: an RL checkpoint of the
same policy is the same lineage).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from draftkit.core import config
from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.core.prepared_data import load_token_counts
from draftkit.drafts.eagle_family import format as fmt
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.targets.lineage import same_lineage
from draftkit.targets.tokens import end_of_turn_ids


def load_vocab(cfg, data_runs: list[RunPaths], tokenizer):
    """Top-`draft_vocab_size` tokens of prepare's counts summed over the runs trained on."""
    counts = None
    for r in data_runs:
        c = load_token_counts(r.data)
        if c.numel() != cfg.target.vocab_size:
            raise DraftkitError(f"token counts of {r.root} cover {c.numel()} ids but the target "
                                f"vocab is {cfg.target.vocab_size}: rerun `draftkit prepare "
                                f"{r.root}`")
        counts = c if counts is None else counts + c
    return DraftVocab.build(counts, cfg.draft.draft_vocab_size,
                            must_include=end_of_turn_ids(tokenizer))


def init_from_dir(cfg) -> Path:
    """The checkpoint dir of `train.init_from`: a run dir stands for its best checkpoint."""
    given = RunPaths(config.run_dir_of(cfg.train.init_from))
    return given.train / "best" if given.config.is_file() else given.root


def lineage_diff(spec, cfg) -> list[str]:
    """Why the checkpoint's target (`spec.target_name`) is not of this run's target's lineage:
    shapes + tokenizer, not names (an RL checkpoint of the same policy is the same lineage);
    nothing where the checkpoint names no target or this one."""
    if not spec.target_name or spec.target_name == cfg.target.name:
        return []
    return [f"target {spec.target_name!r} there, {cfg.target.name!r} here: {p}"
            for p in same_lineage(spec.target_name, cfg.target.name)]


def warm_start(cfg, target_model, cls=Eagle3Draft):
    """The head in `train.init_from`, checked against this run's draft (shapes, norms, target,
    aux layer ids). Its draft vocab is kept: lm_head rows are indexed by draft id. `cls` loads
    it (drafts/peagle: a P-EAGLE head, or one warm-started from an EAGLE-3 head)."""
    src = init_from_dir(cfg)
    model = cls.from_pretrained(src, target_model, cfg.train.ttt_steps, cfg.train.ttt_decay)
    got = model.spec
    if cfg.draft.draft_vocab_size not in (0, got.draft_vocab_size):
        raise DraftkitError(f"train.init_from={src} has a draft vocab of {got.draft_vocab_size} "
                            f"but this run has draft.draft_vocab_size={cfg.draft.draft_vocab_size}"
                            f"; set draft.draft_vocab_size={got.draft_vocab_size} to warm-start")
    want = fmt.spec_from_run_config(cfg, got.draft_vocab_size, got.verifier_name_or_path)
    free = {"verifier_name_or_path", "target_name", "num_speculative_tokens"}
    diff = [f"{f.name}={getattr(got, f.name)!r} there, {getattr(want, f.name)!r} here"
            for f in dataclasses.fields(want)
            if f.name not in free and getattr(got, f.name) != getattr(want, f.name)]
    diff[:0] = lineage_diff(got, cfg)
    if diff:
        raise DraftkitError(f"train.init_from={src} does not fit this run's draft: "
                            f"{'; '.join(diff)}. Warm-start from a head of the same target and "
                            "draft settings, or set this run's draft.* to match it")
    model.spec = fmt.with_k(got, want.num_speculative_tokens)
    return model
