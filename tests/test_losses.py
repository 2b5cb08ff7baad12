"""Loss and acceptance metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from draftkit.drafts import acceptance
from draftkit.drafts.eagle_family import losses


def _softmax(xs):
    z = sum(math.exp(x) for x in xs)
    return [math.exp(x) / z for x in xs]


def _kl(p_logits, q_logits):
    p, q = _softmax(p_logits), _softmax(q_logits)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def test_kl_per_position_is_forward_kl():
    d, t = [0.0, 1.0, -2.0], [2.0, 0.5, 0.0]
    got = losses.kl_per_position(torch.tensor([d]), torch.tensor([t]))
    assert got.item() == pytest.approx(_kl(t, d), rel=1e-6)
    assert _kl(t, d) != pytest.approx(_kl(d, t), rel=1e-3)  # direction matters
    assert losses.kl_per_position(torch.tensor([t]), torch.tensor([t])).item() == pytest.approx(0)


def test_two_steps_by_hand():
    """Draft ids 0,1 map to target ids 1,5. Step 0: guesses 5,1,1 vs verifier 5,1,7 (2/3);
    step 1: guesses 1,5,5 vs 1,1,5 (2/3), but only index 0 follows a correct step 0 among
    chain positions {0, 1}: cond_acc_1 = 1/2. sim_al = 1 + 2/3 + 2/3 * 1/2 = 2."""
    to_target = torch.tensor([1, 5])
    d0, t0 = [[0.0, 1.0], [2.0, 0.0], [0.0, -0.5]], [[0.0, 0.0], [1.0, 0.0], [0.0, 3.0]]
    d1, t1 = [[5.0, 0.0], [0.0, 5.0], [0.0, 5.0]], [[1.0, -1.0], [0.5, 0.0], [-1.0, 2.0]]
    valid = torch.ones(1, 3, dtype=torch.bool)
    chain = torch.ones(1, 3, dtype=torch.bool)
    eye, rows = torch.eye(2), torch.arange(3)  # lm_head = identity: the rows are the logits
    kl0, c0, correct0 = losses.step_terms(torch.tensor(d0), eye, torch.tensor(t0),
                                          torch.tensor([5, 1, 7]), rows, to_target, valid, chain)
    assert correct0.tolist() == [[True, True, False]]
    kl1, c1, _ = losses.step_terms(torch.tensor(d1), eye, torch.tensor(t1),
                                   torch.tensor([1, 1, 5]), rows, to_target, valid, correct0)
    loss, m = losses.combine([kl0, kl1], [c0, c1], decay=0.8)
    mean0 = sum(_kl(t, d) for t, d in zip(t0, d0, strict=True)) / 3
    mean1 = sum(_kl(t, d) for t, d in zip(t1, d1, strict=True)) / 3
    assert loss.item() == pytest.approx(mean0 + 0.8 * mean1, rel=1e-6)
    assert m["loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert (m["n_0"], m["correct_0"], m["cond_n_0"], m["cond_correct_0"]) == (3, 2, 3, 2)
    assert (m["n_1"], m["correct_1"], m["cond_n_1"], m["cond_correct_1"]) == (3, 2, 2, 1)
    assert m["acc_0"] == pytest.approx(2 / 3) and m["cond_acc_0"] == pytest.approx(2 / 3)
    assert m["acc_1"] == pytest.approx(2 / 3) and m["cond_acc_1"] == pytest.approx(1 / 2)
    assert m["sim_al"] == pytest.approx(2.0)
    assert all(isinstance(v, float) for v in m.values())


def test_only_the_valid_rows_are_scored_and_each_meets_its_verifier_row():
    """Two valid positions of four; their rows read verifier rows 2 and 0 (`at`)."""
    rows = torch.randn(2, 6, requires_grad=True)
    tgt = torch.randn(3, 6)
    valid = torch.tensor([[True, False, True, False]])
    kl, c, _ = losses.step_terms(rows, torch.eye(6), tgt, torch.zeros(3, dtype=torch.long),
                                 torch.tensor([2, 0]), torch.arange(6), valid,
                                 torch.ones_like(valid))
    kl.backward()
    assert c["n"].item() == 2
    want = losses.kl_per_position(rows.detach(), tgt[[2, 0]]).sum()
    assert kl.item() == pytest.approx(want.item(), rel=1e-6)
    q, p = torch.softmax(rows.detach(), -1), torch.softmax(tgt[[2, 0]], -1)
    torch.testing.assert_close(rows.grad, q - p)  # d KL / d logits


def test_empty_steps_give_zero_not_nan():
    m = acceptance.metrics_from_counts({"n_0": 0.0, "correct_0": 0.0, "cond_n_0": 0.0,
                                    "cond_correct_0": 0.0, "kl_sum_0": 0.0, "w_0": 1.0})
    assert m["loss"] == 0.0 and m["acc_0"] == 0.0 and m["sim_al"] == 1.0


def test_aggregate_sums_counts_then_recomputes():
    a = acceptance.metrics_from_counts({"n_0": 4.0, "correct_0": 4.0, "cond_n_0": 4.0,
                                    "cond_correct_0": 4.0, "kl_sum_0": 2.0, "w_0": 1.0})
    b = acceptance.metrics_from_counts({"n_0": 12.0, "correct_0": 0.0, "cond_n_0": 12.0,
                                    "cond_correct_0": 0.0, "kl_sum_0": 2.0, "w_0": 1.0})
    agg = acceptance.aggregate([a, b])
    assert agg["acc_0"] == pytest.approx(0.25)  # not the mean of batch means (0.5)
    assert agg["loss"] == pytest.approx(4.0 / 16)
    assert agg["sim_al"] == pytest.approx(1.25)
    assert acceptance.aggregate([]) == {}
