"""Draft-LM distillation loss and acceptance metrics as pure functions (the model and tests
call them).

At a position p whose next token x_{p+1} is an assistant token, with p = softmax(target
logits at p) and q = softmax(draft logits at p), both over the FULL vocabulary:
    d(p)   = the run's divergence of q from p (train.loss: kl, as DistillSpec's FKL, tv or
             their mix; drafts/divergence.py)
    ce(p)  = -log q_{x_{p+1}}                               (hard label: the data's next token)
    loss   = (1 - w) * mean d + w * mean ce                  (w = train.ce_weight, default 0)
The metrics' `kl_sum_j` count is the sum of d (the divergence trained, whatever its name).
Greedy acceptance is simulated like EAGLE-3's (drafts/acceptance.py, whose count keys and
`aggregate` these metrics share): correct(p) = draft argmax == target argmax at p. A chain of k
drafts from position t is teacher-forced, so draft j of the chain is the draft's prediction at
t+j: correct_j(t) = correct(t+j), counted in cond_acc_j only where drafts 0..j-1 were correct,
and sim_al = 1 + sum_k prod_{i<=k} cond_acc_i. Teacher forcing feeds the data's tokens, which
equal the draft's own only where the target's argmax is the data token (greedy-regenerated data).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftkit.drafts import divergence
from draftkit.drafts.acceptance import DeviceMetrics, metrics_from_counts, num_steps, shift
from draftkit.drafts.divergence import KL, Divergence
from draftkit.drafts.fused_loss import LinearLoss


def kl_full_vocab(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(draft)) per row: [N, V] x2 -> [N] (float32)."""
    return divergence.rows(draft_logits, target_logits, KL)


def distill_terms(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                  ce_weight: float, div: Divergence = KL) -> tuple[torch.Tensor, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor]:
    """Sums over N positions: draft_logits [N, V] (with grad), target_logits [N, V], labels [N]
    (the data's next token). Returns (loss_sum, div_sum, ce_sum, correct [N] bool); the
    reference `linear_distill` is checked against."""
    kl = divergence.rows(draft_logits, target_logits, div)  # [N]
    loss = (1.0 - ce_weight) * kl.sum()
    ce = draft_logits.new_zeros(())
    if ce_weight > 0:
        ce = F.cross_entropy(draft_logits.float(), labels, reduction="sum")
        loss = loss + ce_weight * ce
    correct = draft_logits.detach().argmax(-1) == target_logits.argmax(-1)  # [N]
    return loss, kl.sum().detach(), ce.detach(), correct


def chain_counts(correct: torch.Tensor, valid: torch.Tensor, k: int,
                 kl_sum: torch.Tensor | float) -> dict[str, torch.Tensor | float]:
    """Counts of the teacher-forced k-draft chains (keys of eagle_family.losses, so `aggregate`
    sums them exactly), as 0-dim tensors on the batch's device. correct [B, T] bool (False
    where not valid), valid [B, T] bool."""
    out: dict[str, torch.Tensor | float] = {}
    chain_ok = torch.ones_like(valid)  # drafts < j all correct, for a chain starting at t
    for j in range(k):
        valid_j, correct_j = shift(valid, j), shift(correct, j)  # [B, T] at position t+j
        cond = valid_j & chain_ok
        out.update({f"n_{j}": valid_j.sum(), f"correct_{j}": correct_j.sum(),
                    f"cond_n_{j}": cond.sum(), f"cond_correct_{j}": (cond & correct_j).sum(),
                    f"kl_sum_{j}": kl_sum if j == 0 else 0.0, f"w_{j}": 1.0 if j == 0 else 0.0})
        chain_ok = chain_ok & correct_j
    return out


def with_ce(counts: dict[str, float]) -> dict[str, float]:
    """metrics_from_counts plus `ce` = ce_sum / (positions of every step), from a `ce_sum`."""
    counts = dict(counts)
    ce_sum = counts.pop("ce_sum")
    out = metrics_from_counts(counts)
    out["ce"] = ce_sum / max(1.0, sum(out[f"n_{j}"] for j in range(num_steps(out))
                                      if out[f"w_{j}"]))
    return out


def metrics(correct: torch.Tensor, valid: torch.Tensor, k: int, kl_sum: torch.Tensor | float,
            ce_sum: torch.Tensor | float) -> DeviceMetrics:
    """Counts plus derived metrics (loss = mean divergence, acc_j, cond_acc_j, sim_al, ce), read
    from the device when first accessed (acceptance.DeviceMetrics)."""
    return DeviceMetrics({**chain_counts(correct, valid, k, kl_sum), "ce_sum": ce_sum}, with_ce)


# ----------------------------------------------------------------------------- fused head + loss


def target_logits_from_last(last: torch.Tensor, norm_weight: torch.Tensor,
                            lm_head: torch.Tensor, eps: float,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The target's logits from its pre-norm last state: lm_head(RMSNorm(last)).
    last [N, H], norm_weight [H], lm_head [V, H] -> [N, V] (matmul in `dtype`, result fp32)."""
    x = last.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()  # [N, H]
    return F.linear(x.to(dtype), lm_head.to(dtype)).float()


def linear_distill(hidden: torch.Tensor, weight: torch.Tensor, last: torch.Tensor,
                   labels: torch.Tensor, target_norm: torch.Tensor, target_head: torch.Tensor,
                   eps: float, ce_weight: float, div: Divergence, chunk: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                torch.Tensor]:
    """lm_head + distillation loss over N rows in chunks, the gradient computed in the forward
    (drafts/fused_loss.py), the target's logits computed per chunk from its pre-norm state.
    hidden [N, Hd], weight [V, Hd], last [N, H], labels [N], target_norm [H], target_head
    [V, H] -> (loss_sum, div_sum, ce_sum, correct [N] bool); only loss_sum has a gradient."""
    def teacher(s: int, e: int) -> torch.Tensor:
        return target_logits_from_last(last[s:e], target_norm, target_head, eps, dtype)

    loss_sum, div_sum, ce_sum, draft_ids, target_ids = LinearLoss.apply(
        hidden, weight, teacher, labels, ce_weight, div, chunk, dtype, 1)
    return loss_sum, div_sum, ce_sum, draft_ids == target_ids
