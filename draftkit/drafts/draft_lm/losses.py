"""Draft-LM distillation loss and acceptance metrics as pure functions (the model and tests
call them).

At a position p whose next token x_{p+1} is an assistant token, with p = softmax(target
logits at p) and q = softmax(draft logits at p), both over the FULL vocabulary:
    kl(p)  = KL(p || q) = sum_v p_v (log p_v - log q_v)     (forward KL, as DistillSpec's FKL)
    ce(p)  = -log q_{x_{p+1}}                               (hard label: the data's next token)
    loss   = (1 - w) * mean kl + w * mean ce                 (w = train.ce_weight, default 0)
Greedy acceptance is simulated like EAGLE-3's (drafts/eagle3/losses.py, whose count keys and
`aggregate` these metrics share): correct(p) = draft argmax == target argmax at p. A chain of k
drafts from position t is teacher-forced, so draft j of the chain is the draft's prediction at
t+j: correct_j(t) = correct(t+j), counted in cond_acc_j only where drafts 0..j-1 were correct,
and sim_al = 1 + sum_k prod_{i<=k} cond_acc_i. Teacher forcing feeds the data's tokens, which
equal the draft's own only where the target's argmax is the data token (greedy-regenerated data).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftkit.drafts.eagle3.losses import metrics_from_counts


def kl_full_vocab(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(draft)) per row: [N, V] x2 -> [N] (float32)."""
    log_p = F.log_softmax(target_logits.float(), dim=-1)  # [N, V]
    log_q = F.log_softmax(draft_logits.float(), dim=-1)  # [N, V]
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def distill_terms(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                  ce_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor]:
    """Sums over N positions: draft_logits [N, V] (with grad), target_logits [N, V], labels [N]
    (the data's next token). Returns (loss_sum, kl_sum, ce_sum, correct [N] bool)."""
    kl = kl_full_vocab(draft_logits, target_logits)  # [N]
    loss = (1.0 - ce_weight) * kl.sum()
    ce = draft_logits.new_zeros(())
    if ce_weight > 0:
        ce = F.cross_entropy(draft_logits.float(), labels, reduction="sum")
        loss = loss + ce_weight * ce
    correct = draft_logits.detach().argmax(-1) == target_logits.argmax(-1)  # [N]
    return loss, kl.sum().detach(), ce.detach(), correct


def chain_counts(correct: torch.Tensor, valid: torch.Tensor, k: int,
                 kl_sum: float) -> dict[str, float]:
    """Counts of the teacher-forced k-draft chains (keys of eagle3.losses, so `aggregate` sums
    them exactly). correct [B, T] bool (False where not valid), valid [B, T] bool."""
    out: dict[str, float] = {}
    chain_ok = torch.ones_like(valid)  # drafts < j all correct, for a chain starting at t
    for j in range(k):
        valid_j, correct_j = _shift(valid, j), _shift(correct, j)  # [B, T] at position t+j
        cond = valid_j & chain_ok
        out.update({f"n_{j}": float(valid_j.sum()), f"correct_{j}": float(correct_j.sum()),
                    f"cond_n_{j}": float(cond.sum()), f"cond_correct_{j}": float((cond &
                                                                                 correct_j).sum()),
                    f"kl_sum_{j}": kl_sum if j == 0 else 0.0, f"w_{j}": 1.0 if j == 0 else 0.0})
        chain_ok = chain_ok & correct_j
    return out


def metrics(correct: torch.Tensor, valid: torch.Tensor, k: int, kl_sum: float,
            ce_sum: float) -> dict[str, float]:
    """Counts plus derived metrics (loss = mean KL, acc_j, cond_acc_j, sim_al, ce)."""
    out = metrics_from_counts(chain_counts(correct, valid, k, kl_sum))
    out["ce"] = ce_sum / max(1.0, out["n_0"])
    return out


def _shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, t] <- x[:, t+s], False-filled at the end: [B, T] -> [B, T]."""
    if s == 0:
        return x
    return torch.cat([x[:, s:], torch.zeros_like(x[:, :s])], dim=1)
