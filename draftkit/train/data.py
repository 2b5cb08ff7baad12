"""Training data that streams: an epoch is a plan of length-grouped batches (core/batching.py),
and a batch is read only when the loop asks for it.

Offline, sequences come from harvest shards as memory-mapped safetensors slices
(`HarvestSet.gather`: each shard opened per batch and closed after), through a
`torch.utils.data` Dataset whose item i is batch i of the epoch's plan, and a DataLoader with
`train.num_workers` worker processes prefetching the batches this rank takes next. Nothing holds
the harvest in memory, so peak RSS does not grow with it (scripts/bench_stream.py); batch T is
rounded up to `train.pad_multiple` (one length bucket per batch), so the number of batch shapes,
which bf16 CPU kernels cache memory for, stays bounded too. Online, the
prepared token ids are small and stay in memory; the target computes aux/last in the main
process when a batch is built (no workers: the target lives there).

The plan is a pure function of (lengths, batch_tokens, seed, epoch), and the loop asks for
batches by index, so a resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from draftkit.core import batching
from draftkit.core.errors import DraftkitError
from draftkit.harvest.shards import HarvestSet
from draftkit.train.loop import trim_heap

Seq = dict[str, torch.Tensor]  # one sequence: aux [T,A*H], last [T,H], input_ids [T], loss_mask [T]


def epoch_plan(lengths: list[int], batch_tokens: int, seed: int, epoch: int,
               pad_multiple: int = 1) -> list[list[int]]:
    """The epoch's batches: length-grouped (B * T <= batch_tokens, T = the longest length
    rounded up to pad_multiple, one bucket per batch), order shuffled by (seed, epoch)."""
    return batching.shuffled(batching.plan_batches(lengths, batch_tokens,
                                                   pad_multiple=pad_multiple), seed, epoch)


class HarvestSource:
    """The sequences of one or more verified harvests (this run's, then train.extra_runs'),
    numbered in that order; read on demand."""

    def __init__(self, sets: list[HarvestSet]):
        self.sets = sets
        self.where = [(k, i) for k, hs in enumerate(sets) for i in range(len(hs))]

    def lengths(self) -> list[int]:
        return [n for hs in self.sets for n in hs.lengths()]

    def gather(self, indices: list[int]) -> list[Seq]:
        out: list[Seq] = [{} for _ in indices]
        for k, hs in enumerate(self.sets):
            mine = [pos for pos, i in enumerate(indices) if self.where[i][0] == k]
            if mine:
                for pos, seq in zip(mine, hs.gather([self.where[indices[p]][1] for p in mine]),
                                    strict=True):
                    out[pos] = seq
        return out


class TokenSource:
    """Prepared token ids held in memory (online training: the target adds aux/last)."""

    def __init__(self, seqs: list[Seq]):
        self.seqs = seqs

    def lengths(self) -> list[int]:
        return [int(s["input_ids"].shape[0]) for s in self.seqs]

    def gather(self, indices: list[int]) -> list[Seq]:
        return [self.seqs[i] for i in indices]


LOSS_ON = ("assistant", "all")


class BatchBuilder:
    """Sequence indices -> one padded batch; float tensors in `dtype`. With `capture` (online)
    the target computes aux [B, T, A*H] and last [B, T, H] for the batch. `loss_on="all"`
    (train.loss_on) sets loss_mask to every real token, prompt included: the model then learns
    every position whose next tokens have harvested target states (eagle_family/model.py forward).
    T is rounded up to `pad_multiple` (train.pad_multiple): the padding is masked out."""

    def __init__(self, source, dtype: torch.dtype, capture=None, loss_on: str = "assistant",
                 pad_multiple: int = 1):
        if loss_on not in LOSS_ON:
            raise DraftkitError(f"train.loss_on={loss_on!r}; choose one of {', '.join(LOSS_ON)}")
        if pad_multiple < 1:
            raise DraftkitError(f"train.pad_multiple={pad_multiple}; use 1 (no rounding) or more")
        self.source, self.dtype, self.capture, self.loss_on = source, dtype, capture, loss_on
        self.pad_multiple = pad_multiple

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        batch = batching.collate(self.source.gather(indices), self.dtype, self.pad_multiple)
        if self.loss_on == "all":
            batch["loss_mask"] = batch["attention_mask"].clone()  # [B, T]
        if self.capture is not None:
            feats = self.capture(batch["input_ids"], batch["attention_mask"])
            batch["aux"], batch["last"] = feats["aux"].to(self.dtype), feats["last"].to(self.dtype)
        return batch


class _PlanItems(Dataset):
    def __init__(self, plan: list[list[int]], build: BatchBuilder):
        self.plan, self.build = plan, build

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        batch = self.build(self.plan[i])
        trim_heap()  # in the worker: its heap would keep each batch's freed temporaries
        return batch


class PlannedBatches(Sequence):
    """One epoch's batches, built when indexed; `stream(indices)` yields them in that order,
    read ahead by `workers` DataLoader processes (0 = in this process), and with `pin` (a CUDA
    device) placed in pinned memory by the DataLoader's pin thread, ready for an asynchronous
    copy (train/near_hardware.py)."""

    def __init__(self, plan: list[list[int]], build: BatchBuilder, workers: int = 0,
                 pin: bool = False):
        self.plan, self.build, self.workers, self.pin = plan, build, workers, pin

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i):
        return self.build(self.plan[i])

    def stream(self, indices: Iterable[int]) -> Iterator[dict[str, torch.Tensor]]:
        indices = list(indices)
        if self.workers <= 0 or self.build.capture is not None or len(indices) < 2:
            for i in indices:
                yield self[i]
            return
        # its own generator: a DataLoader draws its workers' seed from the global RNG otherwise,
        # and a run resumed mid-epoch (new loader) would draw the training's randomness
        # (train.feature_noise) from another point of the stream than the uninterrupted run
        loader = DataLoader(_PlanItems(self.plan, self.build), batch_size=None, sampler=indices,
                            num_workers=min(self.workers, len(indices)), prefetch_factor=2,
                            pin_memory=self.pin,
                            generator=torch.Generator().manual_seed(0))
        yield from loader
