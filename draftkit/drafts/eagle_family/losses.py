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
the sum of d_j whatever the divergence, `w_j`) so `acceptance.aggregate` over an eval set is
exact, not a mean of batch means. The lm_head runs fused with the loss, over the positions that
count only (`step_terms`, drafts/fused_loss.py).
"""

from __future__ import annotations

import torch

from draftkit.core.hardware import autocast_dtype
from draftkit.drafts import divergence, fused_loss
from draftkit.drafts.acceptance import (
    COUNT_KEYS,
    DeviceMetrics,
    shift,  # noqa: F401 - drafts/dflash reads losses.shift
)
from draftkit.drafts.divergence import KL, Divergence


def kl_per_position(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(draft)) over the last dim: [..., Vd] x2 -> [...] (float32)."""
    return divergence.rows(draft_logits, target_logits, KL)


def step_terms(rows: torch.Tensor, weight: torch.Tensor, tgt_logits: torch.Tensor,
               tgt_ids: torch.Tensor, at: torch.Tensor, draft_to_target: torch.Tensor,
               valid: torch.Tensor, chain_ok: torch.Tensor, div: Divergence = KL,
               chunk: int = 0, row_multiple: int = 1
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Loss sum and counts of one TTT step, the lm_head fused with the loss in chunks of rows
    (drafts/fused_loss.py: no [N, Vd] logits kept for the backward, no [B, T, Vd] at all).

    rows [N, H] (with grad): the step's normed states at the N positions `valid` [B, T] bool
    picks (row-major), weight [Vd, H] the lm_head, tgt_logits [M, Vd] the verifier's logits on
    the draft vocab at M positions, tgt_ids [M] its argmax over the full vocab (target ids),
    at [N] the verifier row of each of the N positions, draft_to_target [Vd] (target id of each
    draft id), chain_ok [B, T] bool (steps < j all correct at this position), div the divergence
    (train.loss), chunk rows per chunk (0: ~2^26 logits).
    Returns (div_sum: scalar with grad, counts: scalar tensors, correct [B, T] bool).
    """
    def teacher(s: int, e: int) -> torch.Tensor:
        return tgt_logits[at[s:e]]  # [n, Vd]

    chunk = chunk or fused_loss.chunk_rows(weight.shape[0], row_multiple)
    dtype = autocast_dtype(rows.device.type)  # the lm_head matmuls follow train.dtype
    div_sum, detached, _, draft_ids, _ = fused_loss.LinearLoss.apply(
        rows, weight, teacher, None, 0.0, div, chunk, dtype, row_multiple)
    correct = torch.zeros_like(valid)  # [B, T]
    correct[valid] = draft_to_target[draft_ids] == tgt_ids[at]
    cond = valid & chain_ok  # [B, T]
    counts = {"n": valid.sum(), "correct": correct.sum(), "cond_n": cond.sum(),
              "cond_correct": (cond & correct).sum(), "kl_sum": detached}
    return div_sum, counts, correct


def combine(kl_sums: list[torch.Tensor], counts: list[dict[str, torch.Tensor]],
            decay: float) -> tuple[torch.Tensor, DeviceMetrics]:
    """Weighted per-step masked means -> (loss with grad, metrics with counts, read from the
    device when first accessed: acceptance.DeviceMetrics)."""
    loss = kl_sums[0].new_zeros(())
    flat: dict[str, torch.Tensor | float] = {}
    for j, (kl_sum, c) in enumerate(zip(kl_sums, counts, strict=True)):
        w = decay ** j
        loss = loss + w * kl_sum / c["n"].clamp(min=1)
        flat.update({f"{k}_{j}": c[k] for k in COUNT_KEYS})
        flat[f"w_{j}"] = float(w)
    return loss, DeviceMetrics(flat)
