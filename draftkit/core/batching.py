"""Batch planning and padding: the one home for how sequences of different lengths become
[B, T] batches, shared by harvest (target forwards) and train (draft micro-batches).

A plan is a list of batches, each a list of positions into `lengths`. Sequences are sorted by
(length, position), so padding stays small, and cut greedily into batches of at most
`batch_tokens` padded tokens (B * T_max). `equal_lengths=True` also cuts at every length change,
so a batch never pads (harvest's bit-exact default). Training shuffles the batch order per epoch
(`shuffled`), a pure function of (seed, epoch): what makes resume exact.

`pad_multiple` m > 1 buckets lengths: a batch's T is its longest length rounded up to a multiple
of m, and a batch holds one bucket only. An epoch then has at most two batch shapes per bucket
(full batches, one remainder) however many sequences it holds, so the per-shape caches of the
CPU kernels (oneDNN primitives, allocator pools) stop growing with the data
(train.pad_multiple; scripts/bench_stream.py measured it).
"""

from __future__ import annotations

import random

import torch


def padded_length(n: int, pad_multiple: int = 1) -> int:
    """n rounded up to a multiple of pad_multiple (1 = n)."""
    return -(-n // pad_multiple) * pad_multiple


def plan_batches(lengths: list[int], batch_tokens: int, equal_lengths: bool = False,
                 pad_multiple: int = 1) -> list[list[int]]:
    """Positions into `lengths` grouped into batches of <= batch_tokens padded tokens.

    lengths [4, 3, 4, 3, 5], batch_tokens 8 -> [[1, 3], [0, 2], [4]] (either mode); with
    batch_tokens 12 -> [[1, 3, 0], [2, 4]], or [[1, 3], [0, 2], [4]] with equal_lengths. A
    sequence longer than batch_tokens gets a batch of its own. pad_multiple 4, batch_tokens 16:
    padded lengths [4, 4, 4, 4, 8] -> [[1, 3, 0, 2], [4]] (one bucket per batch).
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    cut_on_change = equal_lengths or pad_multiple > 1
    plan: list[list[int]] = []
    cur: list[int] = []
    t_cur = 0
    for i in order:
        t = padded_length(lengths[i], pad_multiple)  # ascending: t is the batch's new T
        if cur and ((cut_on_change and t != t_cur) or (len(cur) + 1) * t > batch_tokens):
            plan.append(cur)
            cur = []
        cur.append(i)
        t_cur = t
    if cur:
        plan.append(cur)
    return plan


def pad_rows(x: torch.Tensor, pad_multiple: int) -> torch.Tensor:
    """x [N, ...] with zero rows appended up to a multiple of pad_multiple rows: [N', ...]. A
    matmul over rows picked by a mask then sees a few row counts, not one per batch (callers
    slice [:N] back; zero rows add exact zeros to a weight gradient)."""
    extra = padded_length(x.shape[0], pad_multiple) - x.shape[0]
    return torch.cat([x, x.new_zeros(extra, *x.shape[1:])]) if extra else x


def shuffled(plan: list[list[int]], seed: int, epoch: int) -> list[list[int]]:
    """The plan's batches in the order of (seed, epoch): same epoch, same order."""
    out = list(plan)
    random.Random(seed * 1000 + epoch).shuffle(out)
    return out


def pad_right(seqs: list[torch.Tensor], dtype: torch.dtype | None = None,
              pad_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad [T_i, ...] tensors with zeros into [B, T, ...] (cast to `dtype` if given), T =
    the longest T_i rounded up to `pad_multiple`, plus the [B, T] attention mask (1 = real)."""
    b = len(seqs)
    t = padded_length(max(int(s.shape[0]) for s in seqs), pad_multiple)
    out = torch.zeros(b, t, *seqs[0].shape[1:], dtype=dtype or seqs[0].dtype)  # [B, T, ...]
    mask = torch.zeros(b, t, dtype=torch.long)  # [B, T]
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return out, mask


def collate(seqs: list[dict[str, torch.Tensor]], dtype: torch.dtype,
            pad_multiple: int = 1) -> dict[str, torch.Tensor]:
    """Sequences (dicts of [T_i, ...] tensors) -> one right-padded batch: float tensors in
    `dtype`, the rest int64, plus `attention_mask` [B, T] (T rounded up to `pad_multiple`)."""
    out: dict[str, torch.Tensor] = {}
    for key, ref in seqs[0].items():
        out[key], mask = pad_right([s[key] for s in seqs],
                                   dtype if ref.is_floating_point() else torch.long, pad_multiple)
    out["attention_mask"] = mask
    return out


def to_device(batch: dict, device: torch.device | str) -> dict:
    """Every tensor of a batch on `device`: batches are built on the CPU (DataLoader workers,
    harvest shards, padded rollouts) and moved where the model is just before its forward."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}
