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
from draftkit.drafts.acceptance import metrics_from_counts, shift
from draftkit.drafts.divergence import KL, Divergence


def kl_full_vocab(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(draft)) per row: [N, V] x2 -> [N] (float32)."""
    return divergence.rows(draft_logits, target_logits, KL)


def distill_terms(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                  ce_weight: float, div: Divergence = KL) -> tuple[torch.Tensor, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor]:
    """Sums over N positions: draft_logits [N, V] (with grad), target_logits [N, V], labels [N]
    (the data's next token). Returns (loss_sum, div_sum, ce_sum, correct [N] bool); the
    reference `LinearDistill` is checked against."""
    kl = divergence.rows(draft_logits, target_logits, div)  # [N]
    loss = (1.0 - ce_weight) * kl.sum()
    ce = draft_logits.new_zeros(())
    if ce_weight > 0:
        ce = F.cross_entropy(draft_logits.float(), labels, reduction="sum")
        loss = loss + ce_weight * ce
    correct = draft_logits.detach().argmax(-1) == target_logits.argmax(-1)  # [N]
    return loss, kl.sum().detach(), ce.detach(), correct


def chain_counts(correct: torch.Tensor, valid: torch.Tensor, k: int,
                 kl_sum: float) -> dict[str, float]:
    """Counts of the teacher-forced k-draft chains (keys of eagle_family.losses, so `aggregate` sums
    them exactly). correct [B, T] bool (False where not valid), valid [B, T] bool."""
    out: dict[str, float] = {}
    chain_ok = torch.ones_like(valid)  # drafts < j all correct, for a chain starting at t
    for j in range(k):
        valid_j, correct_j = shift(valid, j), shift(correct, j)  # [B, T] at position t+j
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


# ----------------------------------------------------------------------------- fused head + loss


def target_logits_from_last(last: torch.Tensor, norm_weight: torch.Tensor,
                            lm_head: torch.Tensor, eps: float,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The target's logits from its pre-norm last state: lm_head(RMSNorm(last)).
    last [N, H], norm_weight [H], lm_head [V, H] -> [N, V] (matmul in `dtype`, result fp32)."""
    x = last.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()  # [N, H]
    return F.linear(x.to(dtype), lm_head.to(dtype)).float()


class LinearDistill(torch.autograd.Function):
    """lm_head + distillation loss over N rows in chunks, with the gradient computed in the
    forward pass (the loss is a sum, so d loss_sum / d logits = (1-w)(q - p) + w(q - onehot)
    needs no second pass): 4 [n, V] matmuls per chunk instead of 6 for checkpointed autograd,
    and one chunk's [n, V] logits alive at a time.

    forward(hidden [N, Hd], weight [V, Hd], last [N, H], labels [N], target_norm [H],
            target_head [V, H], eps, ce_weight, div (a Divergence), chunk, dtype)
      -> (loss_sum, div_sum, ce_sum, correct [N] bool); only loss_sum has a gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, last, labels, target_norm, target_head, eps, ce_weight,
                div, chunk, dtype):
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        w = weight.to(dtype)  # [V, Hd]
        grad_h = torch.zeros_like(hidden, dtype=torch.float32) if want_grad else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_grad else None
        loss_sum = kl_sum = ce_sum = hidden.new_zeros((), dtype=torch.float32)
        correct = torch.zeros(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            h, lab = hidden[s:s + chunk].to(dtype), labels[s:s + chunk]  # [n, Hd], [n]
            logits = F.linear(h, w).float()  # [n, V]
            tgt = target_logits_from_last(last[s:s + chunk], target_norm, target_head, eps, dtype)
            correct[s:s + chunk] = logits.argmax(-1) == tgt.argmax(-1)
            # a few [n, V] buffers at a time, updated in place (divergence.sum_and_grad)
            log_q, log_p = F.log_softmax(logits, -1), F.log_softmax(tgt, -1)
            del logits, tgt
            ce = -log_q.gather(1, lab[:, None]).sum()
            q = log_q.exp() if want_grad and ce_weight else None  # [n, V]
            d, g = divergence.sum_and_grad(log_p, log_q, div, want_grad)  # g = d d / d logits
            del log_p, log_q
            kl_sum, ce_sum = kl_sum + d, ce_sum + ce
            loss_sum = loss_sum + (1.0 - ce_weight) * d + ce_weight * ce
            if want_grad:
                if ce_weight:  # (1-w) g + w (q - onehot)
                    g = g.mul_(1.0 - ce_weight).add_(q, alpha=ce_weight)
                    g[torch.arange(g.shape[0], device=g.device), lab] -= ce_weight
                g = g.to(dtype)  # [n, V]
                grad_h[s:s + chunk] = (g @ w).float()  # [n, Hd]
                grad_w += (g.t() @ h).float()  # [V, Hd]
            del g, q
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(kl_sum, ce_sum, correct)
        return loss_sum, kl_sum, ce_sum, correct

    @staticmethod
    def backward(ctx, g_loss, _g_kl, _g_ce, _g_correct):
        grad_h, grad_w = ctx.saved_tensors
        dh, dw = ctx.dtypes
        return ((grad_h * g_loss).to(dh), (grad_w * g_loss).to(dw), None, None, None, None, None,
                None, None, None, None)
