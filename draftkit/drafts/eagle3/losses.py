"""EAGLE-3 loss and acceptance metrics as pure functions (the model calls them; tests too).

Per TTT step j and draft position t (see models/eagle3.py for the index alignment):
    kl_j(t)  = KL(p || q) over the draft vocab, p = softmax(verifier logits restricted to the
               draft vocab), q = softmax(draft logits)              (forward KL, as EAGLE-3)
    loss     = sum_j decay**j * mean_{valid t} kl_j(t)
    acc_j    = P(draft argmax, mapped to a target id == the verifier's full-vocab argmax)
    cond_acc_j = acc_j among positions whose steps 0..j-1 were all correct
    sim_al   = 1 + sum_k prod_{i<=k} cond_acc_i     (expected greedy acceptance length at k steps)
Departure from speculators: accuracy is against the verifier's argmax over the *full* target
vocab (a token outside the draft vocab is a miss, as in vLLM), not over the draft vocab only.

Metrics come with their counts (`n_j`, `correct_j`, `cond_n_j`, `cond_correct_j`, `kl_sum_j`,
`w_j`) so `aggregate` over an eval set is exact, not a mean of batch means.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_COUNT_KEYS = ("n", "correct", "cond_n", "cond_correct", "kl_sum")


def shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, t] <- x[:, t+s] along dim 1, zero/False-filled at the end: [B, T, ...] -> same.
    What position t sees of the token (state, mask) s steps ahead; both draft kinds use it."""
    if s == 0:
        return x
    if s >= x.shape[1]:
        return torch.zeros_like(x)
    return torch.cat([x[:, s:], torch.zeros_like(x[:, :s])], dim=1)


def kl_per_position(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(draft)) over the last dim: [..., Vd] x2 -> [...] (float32)."""
    log_p = F.log_softmax(target_logits.float(), dim=-1)  # [..., Vd]
    log_q = F.log_softmax(draft_logits.float(), dim=-1)  # [..., Vd]
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def step_terms(draft_logits: torch.Tensor, target_logits: torch.Tensor,
               target_ids: torch.Tensor, draft_to_target: torch.Tensor, valid: torch.Tensor,
               chain_ok: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Loss sum and counts of one TTT step.

    draft_logits [B, T, Vd] (with grad), target_logits [B, T, Vd] (verifier, draft vocab),
    target_ids [B, T] (verifier argmax over the full vocab, target ids), draft_to_target [Vd]
    (target id of each draft id), valid [B, T] bool (positions that count), chain_ok [B, T]
    bool (steps < j all correct at this position).
    Returns (kl_sum: scalar with grad, counts: scalar tensors, correct [B, T] bool).
    """
    kl_sum = kl_per_position(draft_logits[valid], target_logits[valid]).sum()  # over [N] valid
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
        flat.update({f"{k}_{j}": float(c[k].item()) for k in _COUNT_KEYS})
        flat[f"w_{j}"] = float(w)
    return loss, metrics_from_counts(flat)


def num_steps(metrics: dict) -> int:
    j = 0
    while f"n_{j}" in metrics:
        j += 1
    return j


def metrics_from_counts(counts: dict[str, float]) -> dict[str, float]:
    """Derived metrics (loss, loss_j, acc_j, cond_acc_j, sim_al) plus the counts themselves."""
    out = {k: float(v) for k, v in counts.items()}
    loss, steps = 0.0, num_steps(counts)
    for j in range(steps):
        n, cond_n = counts[f"n_{j}"], counts[f"cond_n_{j}"]
        out[f"loss_{j}"] = counts[f"kl_sum_{j}"] / n if n else 0.0
        out[f"acc_{j}"] = counts[f"correct_{j}"] / n if n else 0.0
        out[f"cond_acc_{j}"] = counts[f"cond_correct_{j}"] / cond_n if cond_n else 0.0
        loss += counts[f"w_{j}"] * out[f"loss_{j}"]
    out["loss"] = loss
    out["sim_al"] = simulated_al(out, steps)
    return out


def simulated_al(metrics: dict, k: int) -> float | None:
    """Expected greedy AL with k drafts: 1 + sum_{k'<k} prod_{i<=k'} cond_acc_i, from metrics
    holding cond_acc_0..k-1. Metrics of fewer TTT steps than k give their own `sim_al` (None if
    they have none): the draft was never trained that deep."""
    if k > 0 and f"cond_acc_{k - 1}" not in metrics:
        return metrics.get("sim_al")
    al, accepted_prob = 1.0, 1.0
    for j in range(k):
        accepted_prob *= float(metrics[f"cond_acc_{j}"])  # P(drafts 0..j all accepted)
        al += accepted_prob
    return al


def aggregate(metrics_list: list[dict]) -> dict[str, float]:
    """Exact metrics over many batches: sum the counts, then recompute the derived values."""
    if not metrics_list:
        return {}
    steps = num_steps(metrics_list[0])
    counts: dict[str, float] = {}
    for j in range(steps):
        for k in _COUNT_KEYS:
            counts[f"{k}_{j}"] = sum(float(m[f"{k}_{j}"]) for m in metrics_list)
        counts[f"w_{j}"] = float(metrics_list[0][f"w_{j}"])
    return metrics_from_counts(counts)
