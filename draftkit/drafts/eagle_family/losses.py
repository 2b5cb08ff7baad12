"""EAGLE-3's loss as pure functions (the model calls them; tests too); the acceptance metrics
derived from its counts are every kind's (drafts/acceptance.py).

Per TTT step j and draft position t (see models/eagle3.py for the index alignment):
    d_j(t)   = the run's divergence of q from p over the draft vocab (train.loss:
               drafts/divergence.py; kl = forward KL(p || q), as EAGLE-3, the default),
               p = softmax(verifier logits restricted to the draft vocab), q = softmax(draft logits)
    loss     = sum_j decay**j * mean_{valid t} d_j(t)
    acc_j    = P(draft argmax, mapped to a target id == the verifier's full-vocab argmax)
    cond_acc_j = acc_j among positions whose steps 0..j-1 were all correct
    sim_al   = 1 + sum_k prod_{i<=k} cond_acc_i     (expected greedy acceptance length at k steps)
Departure from speculators: accuracy is against the verifier's argmax over the *full* target
vocab (a token outside the draft vocab is a miss, as in vLLM), not over the draft vocab only.

Metrics come with their counts (`n_j`, `correct_j`, `cond_n_j`, `cond_correct_j`, `kl_sum_j` =
the sum of d_j whatever the divergence, `w_j`) so `acceptance.aggregate` over an eval set is exact, not a mean of batch means.
"""

from __future__ import annotations

import torch

from draftkit.drafts import divergence
from draftkit.drafts.acceptance import (
    COUNT_KEYS,
    metrics_from_counts,
    shift,  # noqa: F401 - drafts/dflash reads losses.shift
)
from draftkit.drafts.divergence import KL, Divergence


def kl_per_position(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(draft)) over the last dim: [..., Vd] x2 -> [...] (float32)."""
    return divergence.rows(draft_logits, target_logits, KL)


def step_terms(draft_logits: torch.Tensor, target_logits: torch.Tensor,
               target_ids: torch.Tensor, draft_to_target: torch.Tensor, valid: torch.Tensor,
               chain_ok: torch.Tensor, div: Divergence = KL
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Loss sum and counts of one TTT step.

    draft_logits [B, T, Vd] (with grad), target_logits [B, T, Vd] (verifier, draft vocab),
    target_ids [B, T] (verifier argmax over the full vocab, target ids), draft_to_target [Vd]
    (target id of each draft id), valid [B, T] bool (positions that count), chain_ok [B, T]
    bool (steps < j all correct at this position), div the divergence (train.loss).
    Returns (div_sum: scalar with grad, counts: scalar tensors, correct [B, T] bool).
    """
    kl_sum = divergence.rows(draft_logits[valid], target_logits[valid], div).sum()  # [N] valid
    pred = draft_to_target[draft_logits.detach().argmax(-1)]  # [B, T] target ids
    correct = (pred == target_ids) & valid  # [B, T]
    cond = valid & chain_ok  # [B, T]
    counts = {"n": valid.sum(), "correct": correct.sum(), "cond_n": cond.sum(),
              "cond_correct": (cond & correct).sum(), "kl_sum": kl_sum.detach()}
    return kl_sum, counts, correct


def combine(kl_sums: list[torch.Tensor], counts: list[dict[str, torch.Tensor]],
            decay: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted per-step masked means -> (loss with grad, metrics with counts as floats)."""
    loss = kl_sums[0].new_zeros(())
    flat: dict[str, float] = {}
    for j, (kl_sum, c) in enumerate(zip(kl_sums, counts, strict=True)):
        w = decay ** j
        loss = loss + w * kl_sum / c["n"].clamp(min=1)
        flat.update({f"{k}_{j}": float(c[k].item()) for k in COUNT_KEYS})
        flat[f"w_{j}"] = float(w)
    return loss, metrics_from_counts(flat)

