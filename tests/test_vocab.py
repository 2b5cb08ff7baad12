"""Draft vocabulary: selection rule, d2t/t2d round trips, validation."""

from __future__ import annotations

import pytest
import torch

from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family.vocab import DraftVocab, validate
from draftkit.targets.tokens import end_of_turn_ids


def test_worked_example_from_the_docstring():
    vocab = DraftVocab.from_mask(torch.tensor([0, 1, 0, 0, 1, 1, 0, 0], dtype=torch.bool))
    assert vocab.d2t.tolist() == [1, 3, 3] and vocab.d2t.dtype == torch.int64
    assert vocab.selected.tolist() == [1, 4, 5]


def test_build_takes_top_counts_ties_to_lower_id_and_must_include():
    counts = torch.tensor([5, 9, 0, 7, 7, 1, 9, 3])
    vocab = DraftVocab.build(counts, 4)
    assert vocab.selected.tolist() == [1, 3, 4, 6]  # 9, 9, 7, 7 (3 before 4 on the tie)
    vocab = DraftVocab.build(counts, 4, must_include=[2])
    assert vocab.selected.tolist() == [1, 2, 3, 6]  # eos-like id 2 replaces the last pick (4)
    assert DraftVocab.build(counts, 3).selected.tolist() == [1, 3, 6]


def test_round_trips_between_draft_and_target_ids():
    g = torch.Generator().manual_seed(0)
    vocab = DraftVocab.build(torch.randint(0, 50, (300,), generator=g), 100)
    draft_ids = torch.arange(100)
    target_ids = vocab.to_target(draft_ids)
    assert torch.equal(target_ids, vocab.selected) and bool(vocab.t2d[target_ids].all())
    assert torch.equal(vocab.to_draft(target_ids), draft_ids)
    assert (vocab.to_draft(torch.nonzero(~vocab.t2d).flatten()) == -1).all()
    again = DraftVocab.from_d2t(vocab.d2t, 300)
    assert torch.equal(again.t2d, vocab.t2d) and torch.equal(again.d2t, vocab.d2t)
    assert bool((vocab.selected[1:] > vocab.selected[:-1]).all())  # ascending


def test_full_vocab_is_identity():
    vocab = DraftVocab.build(torch.randint(0, 9, (64,)), 64)
    assert vocab.is_full and not vocab.d2t.any() and bool(vocab.t2d.all())
    assert torch.equal(DraftVocab.full(64).d2t, vocab.d2t)


def test_coverage_counts_the_selected_mass():
    vocab = DraftVocab.build(torch.tensor([10, 0, 30, 60]), 2)
    assert vocab.coverage(torch.tensor([10, 0, 30, 60])) == pytest.approx(0.9)


@pytest.mark.parametrize("size, must, message", [
    (9, (), "larger than the target vocab .*draft_vocab_size <= 8"),
    (0, (), "must be positive"),
    (2, (1, 2, 3), "do not fit a draft vocab of 2"),
    (4, (8,), "outside the target vocab"),
])
def test_bad_sizes_raise_with_the_fix(size, must, message):
    with pytest.raises(DraftkitError, match=message):
        DraftVocab.build(torch.arange(8), size, must_include=must)


def test_inconsistent_maps_are_refused():
    vocab = DraftVocab.build(torch.arange(8), 3)
    with pytest.raises(DraftkitError, match="d2t and t2d disagree"):
        validate(vocab.d2t + 1, vocab.t2d)
    with pytest.raises(DraftkitError, match="int64"):
        validate(vocab.d2t.int(), vocab.t2d)
    with pytest.raises(DraftkitError, match="outside the target vocab"):
        DraftVocab.from_d2t(torch.tensor([0, 5, 9]), 8)


def test_end_of_turn_ids_of_the_tiny_tokenizer(tiny_target):
    tok = tiny_target.tokenizer
    ids = end_of_turn_ids(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids
    assert tok.eos_token_id in ids
