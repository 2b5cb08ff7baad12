"""The EAGLE-3 draft vocabulary: which target tokens the draft head can propose.

The draft's lm_head covers `draft_vocab_size` target tokens: the most frequent ones over the
assistant (loss-masked) tokens of the training data, ties broken by the lower id, plus the ids
that must never be missing (the end-of-turn tokens: a draft that cannot propose `<|im_end|>`
loses a token at the end of every answer). Selected ids are sorted ascending, so draft id `i`
maps to target id `selected[i]` and `selected` is increasing.

Two tensors describe the map, exactly as EAGLE-3/speculators/vLLM store them (docs/design.md):
    d2t  int64 [Vd]  offset: target_id = draft_id + d2t[draft_id]   (vLLM reads only this)
    t2d  bool  [V]   t2d[target_id] is True iff the target token is in the draft vocab
Worked example (V=8, Vd=3, selected=[1, 4, 5]): d2t=[1, 3, 3], t2d=[F,T,F,F,T,T,F,F].
A full vocabulary (Vd == V) is the identity: d2t is all zeros and t2d all True.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from draftkit.core.errors import DraftkitError


@dataclass(frozen=True)
class DraftVocab:
    d2t: torch.Tensor  # int64 [Vd] offsets
    t2d: torch.Tensor  # bool [V]

    def __post_init__(self):
        validate(self.d2t, self.t2d)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def build(cls, counts: torch.Tensor, draft_vocab_size: int,
              must_include: Iterable[int] = ()) -> DraftVocab:
        """Top-`draft_vocab_size` ids of `counts` [V] (ties: lower id first) plus `must_include`."""
        counts = torch.as_tensor(counts)
        if counts.dim() != 1 or counts.dtype.is_floating_point:
            raise DraftkitError(f"token counts must be a 1-D integer tensor [target_vocab], got "
                                f"{counts.dtype} {tuple(counts.shape)}; recompute them with "
                                "`draftkit prepare RUN`")
        vocab = counts.numel()
        check_size(draft_vocab_size, vocab)
        must = sorted({int(i) for i in must_include})
        bad = [i for i in must if not 0 <= i < vocab]
        if bad:
            raise DraftkitError(f"must-include token ids {bad} are outside the target vocab "
                                f"[0, {vocab}); pass ids of the target's tokenizer")
        if len(must) > draft_vocab_size:
            raise DraftkitError(f"{len(must)} must-include tokens do not fit a draft vocab of "
                                f"{draft_vocab_size}; raise draft.draft_vocab_size")
        # Stable sort on -count keeps equal counts in ascending id order (ties -> lower id).
        order = torch.sort(-counts.to(torch.int64), stable=True).indices  # [V]
        chosen = torch.zeros(vocab, dtype=torch.bool)
        chosen[must] = True
        free = order[~chosen[order]][: draft_vocab_size - len(must)]  # best ids not yet chosen
        chosen[free] = True
        return cls.from_mask(chosen)

    @classmethod
    def from_mask(cls, t2d: torch.Tensor) -> DraftVocab:
        t2d = torch.as_tensor(t2d, dtype=torch.bool)
        selected = torch.nonzero(t2d).flatten()  # [Vd], ascending
        d2t = selected - torch.arange(selected.numel())  # [Vd] offsets
        return cls(d2t.to(torch.int64), t2d)

    @classmethod
    def full(cls, vocab_size: int) -> DraftVocab:
        return cls.from_mask(torch.ones(vocab_size, dtype=torch.bool))

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, vocab_size: int) -> DraftVocab:
        """Rebuild t2d from d2t (what a vLLM-only checkpoint carries)."""
        d2t = torch.as_tensor(d2t, dtype=torch.int64)
        selected = torch.arange(d2t.numel()) + d2t  # [Vd]
        if selected.numel() and (selected.min() < 0 or selected.max() >= vocab_size):
            raise DraftkitError(f"d2t maps draft ids outside the target vocab [0, {vocab_size}); "
                                "the checkpoint belongs to another target")
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[selected] = True
        return cls(d2t, t2d)

    # ------------------------------------------------------------------ properties / maps

    @property
    def draft_size(self) -> int:
        return self.d2t.numel()

    @property
    def target_size(self) -> int:
        return self.t2d.numel()

    @property
    def is_full(self) -> bool:
        return self.draft_size == self.target_size

    @property
    def selected(self) -> torch.Tensor:
        """Target id of each draft id, ascending: int64 [Vd]."""
        return torch.arange(self.draft_size) + self.d2t

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids -> target ids (same shape)."""
        return draft_ids + self.d2t.to(draft_ids.device)[draft_ids]

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 where the token is outside the draft vocab."""
        lookup = torch.full((self.target_size,), -1, dtype=torch.int64)
        lookup[self.selected] = torch.arange(self.draft_size)
        return lookup.to(target_ids.device)[target_ids]

    def coverage(self, counts: torch.Tensor) -> float:
        """Fraction of the counted (assistant) tokens the draft vocab can propose."""
        counts = torch.as_tensor(counts, dtype=torch.float64)
        total = counts.sum().item()
        return float(counts[self.t2d].sum().item() / total) if total else 1.0


def check_size(draft_vocab_size: int, target_vocab_size: int) -> None:
    if draft_vocab_size > target_vocab_size:
        raise DraftkitError(
            f"draft vocab {draft_vocab_size} is larger than the target vocab "
            f"({target_vocab_size}); set draft.draft_vocab_size <= {target_vocab_size} "
            "(equal = the full vocabulary, no mapping)")
    if draft_vocab_size <= 0:
        raise DraftkitError(f"draft vocab size must be positive, got {draft_vocab_size}; set "
                            f"draft.draft_vocab_size (<= {target_vocab_size})")


def validate(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """d2t/t2d must describe the same ascending id set; raise naming what is inconsistent."""
    if d2t.dtype != torch.int64 or d2t.dim() != 1:
        raise DraftkitError(f"d2t must be int64 [draft_vocab], got {d2t.dtype} {tuple(d2t.shape)}")
    if t2d.dtype != torch.bool or t2d.dim() != 1:
        raise DraftkitError(f"t2d must be bool [target_vocab], got {t2d.dtype} {tuple(t2d.shape)}")
    check_size(d2t.numel(), t2d.numel())
    selected = torch.arange(d2t.numel()) + d2t.cpu()
    expected = torch.nonzero(t2d.cpu()).flatten()
    if selected.numel() != expected.numel() or not torch.equal(selected, expected):
        raise DraftkitError("d2t and t2d disagree (d2t must map draft id i to the i-th target id "
                            "set in t2d, ascending); rebuild the vocab with DraftVocab.build")

