"""PARD's parallel positions as one packed sequence: what the draft LM sees for every anchor and
every draft slot at once, teacher-forced, in a single forward (pure functions; tests call them).

At serving time (vLLM 0.32 `draft_model` + `parallel_drafting`, v1/spec_decode/utils.py
`copy_and_expand_eagle_inputs_kernel` with shift_input_ids=False) a request whose verified
tokens end at x_n (the target's bonus token) is fed
    ids        x_0 .. x_n  m  m .. m          (k-1 copies of the mask token m = `pard_token`)
    positions  0   .. n    n+1 .. n+k-1
with plain causal attention inside the request (the KV cache holds x_0..x_{n-1}, always real
tokens: every step re-feeds the verified tokens over the previous step's mask slots), and the
k drafts are the argmaxes at x_n and at the k-1 mask slots: slot j (0 = x_n) predicts x_{n+1+j}.

Training does the same for every anchor n of a sequence in one forward. The real tokens come
first (a plain causal LM: slot 0 of every anchor); then block j = 1..k-1 holds one mask token per
anchor a, at position a+j, which sees the real tokens x_0..x_a and the masks of blocks 1..j of
the same anchor, itself included. Worked example, T=5 real tokens, anchors {1, 2}, k=3:
    index     0  1  2  3  4 | 5  6 | 7  8
    token     x0 x1 x2 x3 x4| m  m | m  m
    position  0  1  2  3  4 | 2  3 | 3  4
    anchor    0  1  2  3  4 | 1  2 | 1  2
    block     0  0  0  0  0 | 1  1 | 2  2
index 5 (anchor 1, j=1) sees {0, 1, 5} and predicts x3; index 7 (anchor 1, j=2) sees
{0, 1, 5, 7} and predicts x4: exactly vLLM's [x0 x1 m m] at positions [0 1 2 3]. Real tokens
never see a mask. PARD's paper packs the same way; it also drops a share of the anchors of later
blocks to save compute ("conditional drop"), which draftkit does not: every anchor whose next
token is learned gets all k-1 slots, so the packed length is T + (k-1) * anchors <= k * T.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packed:
    input_ids: torch.Tensor  # [B, L] real ids, then pard_token in every slot
    position_ids: torch.Tensor  # [B, L] anchor + block (padding slots: 0)
    allowed: torch.Tensor  # [B, L, L] bool: query row may attend key column
    anchors: torch.Tensor  # [B, M] real index of each slot's anchor, -1 = padding slot
    num_real: int  # T: index e < T is real token e; slot (j, m) is at T + (j-1) * M + m


def pack(input_ids: torch.Tensor, valid: torch.Tensor, anchors: torch.Tensor, k: int,
         pard_token: int) -> Packed:
    """input_ids [B, T], valid [B, T] bool (attention mask), anchors [B, T] bool (where drafts
    start; a subset of valid) -> the packed sequence of the module docstring."""
    b, t = input_ids.shape
    dev = input_ids.device
    counts = anchors.sum(1)  # [B]
    m = int(counts.max()) if b else 0
    order = torch.arange(t, device=dev).expand(b, t)  # [B, T]
    # the anchors of each row first, in order; -1 fills rows with fewer than M
    ranked = torch.where(anchors, order, t + order).sort(1).values[:, :m]  # [B, M]
    slot_anchor = torch.where(torch.arange(m, device=dev) < counts[:, None], ranked, -1)  # [B, M]
    nb = k - 1
    block = torch.cat([torch.zeros(t, dtype=torch.long, device=dev),
                       torch.arange(1, k, device=dev).repeat_interleave(m)])  # [L]
    anchor = torch.cat([order, slot_anchor.repeat(1, nb)], 1)  # [B, L]
    key_ok = torch.cat([valid.bool(), (slot_anchor >= 0).repeat(1, nb)], 1)  # [B, L]
    ids = torch.cat([input_ids, input_ids.new_full((b, nb * m), pard_token)], 1)  # [B, L]
    pos = torch.where(anchor >= 0, anchor + block, 0)  # [B, L]
    bq, bk = block[None, :, None], block[None, None, :]  # [1, L, 1], [1, 1, L]
    aq, ak = anchor[:, :, None], anchor[:, None, :]  # [B, L, 1], [B, 1, L]
    allowed = ((bk == 0) & (ak <= aq)) | ((bk >= 1) & (bk <= bq) & (ak == aq))  # [B, L, L]
    allowed = allowed & key_ok[:, None, :]
    allowed |= torch.eye(allowed.shape[1], dtype=torch.bool, device=dev)  # no empty row
    return Packed(ids, pos, allowed, slot_anchor, t)


def slot_index(p: Packed, j: int) -> torch.Tensor:
    """[B, M] packed index of block j's slots (j >= 1)."""
    m = p.anchors.shape[1]
    start = p.num_real + (j - 1) * m
    return torch.arange(start, start + m, device=p.anchors.device).expand_as(p.anchors)


def attention_mask(allowed: torch.Tensor, lm: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """[B, L, L] bool -> the 4D mask an HF decoder takes as it is: bool for sdpa/flex
    (True = attend), additive float (0 / dtype min) for eager attention."""
    impl = getattr(lm.config, "_attn_implementation", None) or "eager"
    mask = allowed[:, None]  # [B, 1, L, L]
    if impl in ("sdpa", "flex_attention"):
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min)


def step_targets(input_ids: torch.Tensor, learn: torch.Tensor, anchors_at: torch.Tensor,
                 j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where slot j of anchor a is scored, for slot anchors `anchors_at` [B, M] (-1 = none):
    (label position a+1+j, target-state position a+j, scored [B, M] bool). A slot is scored
    where its label x_{a+1+j} exists and is learned (`learn` [B, T] = valid & loss_mask)."""
    t = input_ids.shape[1]
    label_at = anchors_at + 1 + j  # [B, M]
    inside = (anchors_at >= 0) & (label_at < t)
    label_at = torch.where(inside, label_at, 0)
    scored = inside & learn.gather(1, label_at)  # [B, M]
    return label_at, (label_at - 1).clamp_min(0), scored
