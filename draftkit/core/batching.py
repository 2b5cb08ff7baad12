"""Batch planning and padding: the one home for how sequences of different lengths become
[B, T] batches, shared by harvest (target forwards) and train (draft micro-batches).

A plan is a list of batches, each a list of positions into `lengths`. Sequences are sorted by
(length, position), so padding stays small, and cut greedily into batches of at most
`batch_tokens` padded tokens (B * T_max). `equal_lengths=True` also cuts at every length change,
so a batch never pads (harvest's bit-exact default). Training shuffles the batch order per epoch
(`shuffled`), a pure function of (seed, epoch): what makes resume exact.
"""

from __future__ import annotations

import random

import torch


def plan_batches(lengths: list[int], batch_tokens: int,
                 equal_lengths: bool = False) -> list[list[int]]:
    """Positions into `lengths` grouped into batches of <= batch_tokens padded tokens.

    lengths [4, 3, 4, 3, 5], batch_tokens 8 -> [[1, 3], [0, 2], [4]] (either mode); with
    batch_tokens 12 -> [[1, 3, 0], [2, 4]], or [[1, 3], [0, 2], [4]] with equal_lengths. A
    sequence longer than batch_tokens gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    plan: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        n = lengths[i]  # ascending: n is the batch's new T_max
        if cur and ((equal_lengths and n != lengths[cur[0]]) or (len(cur) + 1) * n > batch_tokens):
            plan.append(cur)
            cur = []
        cur.append(i)
    if cur:
        plan.append(cur)
    return plan


def shuffled(plan: list[list[int]], seed: int, epoch: int) -> list[list[int]]:
    """The plan's batches in the order of (seed, epoch): same epoch, same order."""
    out = list(plan)
    random.Random(seed * 1000 + epoch).shuffle(out)
    return out


def pad_right(seqs: list[torch.Tensor], dtype: torch.dtype | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad [T_i, ...] tensors with zeros into [B, T_max, ...] (cast to `dtype` if given),
    plus the [B, T_max] attention mask (1 = real token)."""
    b, t = len(seqs), max(int(s.shape[0]) for s in seqs)
    out = torch.zeros(b, t, *seqs[0].shape[1:], dtype=dtype or seqs[0].dtype)  # [B, T, ...]
    mask = torch.zeros(b, t, dtype=torch.long)  # [B, T]
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return out, mask


def collate(seqs: list[dict[str, torch.Tensor]], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Sequences (dicts of [T_i, ...] tensors) -> one right-padded batch: float tensors in
    `dtype`, the rest int64, plus `attention_mask` [B, T]."""
    out: dict[str, torch.Tensor] = {}
    for key, ref in seqs[0].items():
        out[key], mask = pad_right([s[key] for s in seqs],
                                   dtype if ref.is_floating_point() else torch.long)
    out["attention_mask"] = mask
    return out
