"""lm_head + divergence (+ hard-label cross-entropy) over N rows in chunks, the gradient computed
in the forward pass: the training loss of every kind runs through `LinearLoss` (the EAGLE
family's draft-vocab head against the verifier's logits, eagle_family/losses.py; the LM
family's full-vocab head against the target's, lm_family/losses.py).

Per chunk of n rows: logits = hidden @ weight.T [n, V], the teacher's logits [n, V] (a callable,
so a kind computes them per chunk or picks them from rows it computed once), the divergence and
its gradient with respect to the logits written out (drafts/divergence.py), then
grad_hidden = g @ weight and grad_weight += g.T @ hidden. The loss is a sum, so its gradient
needs no second pass over [n, V]: 4 [n, V] matmuls per chunk instead of 6 for checkpointed
autograd, one chunk's logits alive at a time, and no [B, T, V] tensor at all. Chunks hold
`chunk` rows (pick ~2^26 / V); each chunk's rows are padded with zero rows to a multiple of
`row_multiple` (bf16 CPU matmuls cache memory per row count; zero rows add exact zeros).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from draftkit.core.batching import pad_rows
from draftkit.drafts import divergence

Teacher = Callable[[int, int], torch.Tensor]  # rows [s, e) -> the teacher's logits [e - s, V]


def chunk_rows(vocab: int, row_multiple: int = 1) -> int:
    """Rows per chunk: ~2^26 logits, at least 128, a multiple of `row_multiple`."""
    rows = max(128, (1 << 26) // vocab)
    return max(row_multiple, rows // row_multiple * row_multiple)


class LinearLoss(torch.autograd.Function):
    """forward(hidden [N, Hd], weight [V, Hd], teacher (Teacher), labels [N] or None,
               ce_weight, div (a Divergence), chunk, dtype (of the matmuls), row_multiple)
      -> (loss_sum, div_sum, ce_sum, draft_ids [N], teacher_ids [N]); only loss_sum has a
    gradient. loss_sum = (1 - ce_weight) * div_sum + ce_weight * ce_sum; ce_sum = the summed
    -log q(label) (0 without labels); *_ids = the argmax of each side's logits."""

    @staticmethod
    def forward(ctx, hidden, weight, teacher, labels, ce_weight, div, chunk, dtype,
                row_multiple):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_grad = need_h or need_w
        w = weight.to(dtype)  # [V, Hd]
        n_all = hidden.shape[0]
        grad_h = torch.zeros_like(hidden, dtype=torch.float32) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        loss_sum = div_sum = ce_sum = hidden.new_zeros((), dtype=torch.float32)
        draft_ids = torch.zeros(n_all, dtype=torch.long, device=hidden.device)
        teacher_ids = torch.zeros_like(draft_ids)
        for s in range(0, n_all, chunk):
            e = min(s + chunk, n_all)
            h = pad_rows(hidden[s:e].to(dtype), row_multiple)  # [n', Hd], zero rows appended
            logits = F.linear(h, w)[: e - s].float()  # [n, V]
            tgt = teacher(s, e).float()  # [n, V]
            draft_ids[s:e], teacher_ids[s:e] = logits.argmax(-1), tgt.argmax(-1)
            log_q, log_p = F.log_softmax(logits, -1), F.log_softmax(tgt, -1)
            del logits, tgt
            ce = -log_q.gather(1, labels[s:e, None]).sum() if labels is not None else 0.0
            q = log_q.exp() if want_grad and ce_weight else None  # [n, V]
            d, g = divergence.sum_and_grad(log_p, log_q, div, want_grad)  # g = d d / d logits
            del log_p, log_q
            div_sum, ce_sum = div_sum + d, ce_sum + ce
            loss_sum = loss_sum + (1.0 - ce_weight) * d + ce_weight * ce
            if want_grad:
                if ce_weight:  # (1 - w) g + w (q - onehot(label))
                    g = g.mul_(1.0 - ce_weight).add_(q, alpha=ce_weight)
                    g[torch.arange(g.shape[0], device=g.device), labels[s:e]] -= ce_weight
                g = pad_rows(g.to(dtype), row_multiple)  # [n', V]
                if need_h:
                    grad_h[s:e] = (g @ w)[: e - s].float()  # [n, Hd]
                if need_w:
                    grad_w += (g.t() @ h).float()  # [V, Hd]
            del g, q
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(div_sum, ce_sum, draft_ids, teacher_ids)
        return loss_sum, div_sum, ce_sum, draft_ids, teacher_ids

    @staticmethod
    def backward(ctx, g_loss, *_):
        grad_h, grad_w = ctx.saved_tensors
        dh, dw = ctx.dtypes
        return (None if grad_h is None else (grad_h * g_loss).to(dh),
                None if grad_w is None else (grad_w * g_loss).to(dw), *([None] * 7))
