"""The capture step of a refresh: the new policy's features on the rows it trains on (train
rows + replay), what `kind.features` returns (EAGLE-3: aux + last; the draft LM: last only).

    refresh.capture=online    every padded batch's features held in RAM (finetune.feature_batches)
    refresh.capture=harvest   written once as harvest shards (harvest/shards.py format, stored in
                              harvest.dtype, ~harvest.shard_tokens tokens a shard) under
                              drafts/.capture/<job>/, and streamed back batch by batch during the
                              fine-tune (train/data.py), so RAM holds one batch, not the rollout set

Harvest layout. Sequences are stored in the order of the fine-tune's batch plan (length-sorted
groups of <= refresh.batch_tokens padded tokens, core/batching.py), `sample_idx` = the row's
index, and a shard holds whole batches. Each shard is thus computed by exactly the padded
forwards online capture runs; the fine-tune reads back the same batches with the padding zeroed
(the losses never read padded positions). E.g. rows of lengths [5, 3, 4], batch_tokens 8 ->
plan [[1], [2], [0]] -> stored rows 1, 2, 0 (sample_idx [1, 2, 0]); fine-tune batch b = stored
sequence b. With harvest.dtype=float32 both modes train the same draft bit for bit; bfloat16
(the default) rounds the features as an offline harvest does.

Resume. A shard counts as done only if its sidecar carries this capture's fingerprint (the job
key, draft kind, aux layer ids, storage dtype, shard and batch sizes, every row's ids and mask)
and its sha256 still matches: a rerun after a crash keeps those shards (a complete capture is
reused whole) and recomputes the rest (a truncated shard fails its sha256). The dir is removed
once the job is published or rejected; a new job removes the captures other jobs left behind.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from draftkit.core import artifacts
from draftkit.core.batching import plan_batches
from draftkit.core.errors import DraftkitError
from draftkit.harvest import shards
from draftkit.rl import finetune
from draftkit.rl.drift import pad_rows
from draftkit.rl.rollouts import Rollout
from draftkit.train.data import BatchBuilder, HarvestSource, PlannedBatches

MODES = ("online", "harvest")
ROOT = ".capture"  # drafts/.capture/<job>/
FEATURES = ("aux", "last")


@dataclass
class Captured:
    batches: Sequence[dict]  # the fine-tune's batches, by index (a list, or read on demand)
    info: dict  # lineage "capture": mode, tokens, bytes (features in RAM / shards on disk),
    #             seconds (+ harvest: shards, reused_shards, dtype, dir, removed)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise DraftkitError(f"refresh.capture={mode!r} is not a capture mode; choose online "
                            "(features in RAM) or harvest (shards on disk, resumable)")
    return mode


def capture_dir(store, job: str) -> Path:
    return store.root / ROOT / job


def remove(store, job: str) -> None:
    """Drop the job's capture dir (the job is published or rejected), and `.capture` if empty."""
    shutil.rmtree(capture_dir(store, job), ignore_errors=True)
    root = store.root / ROOT
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()


def capture(kind, model, policy, rows: list[Rollout], cfg, store, job: str,
            should_stop=lambda: False) -> Captured:
    """The rows' batches with the policy's features, as `refresh.capture` says."""
    rc, t0 = cfg.refresh, time.perf_counter()
    if check_mode(rc.capture) == "online":
        batches = finetune.feature_batches(kind, model, policy.model, rows, rc.batch_tokens)
        held = sum(b[n].nbytes for b in batches for n in FEATURES if n in b)  # in RAM
        out = Captured(batches, {"mode": "online", "tokens": sum(len(r.input_ids) for r in rows),
                                 "bytes": held})
    else:
        out = harvest(kind, model, policy, rows, cfg, store, job, should_stop)
    out.info["seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- harvest mode


def _fingerprint(kind, cfg, job: str, rows: list[Rollout]) -> str:
    settings = {"job": job, "kind": kind.name, "aux_layer_ids": list(cfg.draft.aux_layer_ids),
                "dtype": cfg.harvest.dtype, "shard_tokens": cfg.harvest.shard_tokens,
                "batch_tokens": cfg.refresh.batch_tokens, "format": shards.FORMAT_VERSION}
    chunks = (np.asarray([len(r.input_ids), *r.input_ids, *r.loss_mask], dtype=np.int64)
              for r in rows)
    return artifacts.fingerprint(settings, chunks)


def capture_shard(kind, model, policy_model, rows: list[Rollout], groups: list[list[int]],
                  directory: Path, index: int, dtype: torch.dtype, fingerprint: str) -> dict:
    """Compute shard `index` (whole batches `groups` of row indices, stored in that order) with
    the forwards online capture runs, and write it; returns its manifest entry."""
    order = [i for g in groups for i in g]
    lens = [len(rows[i].input_ids) for i in order]
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in FEATURES}
    for g in groups:
        batch = pad_rows([rows[i] for i in g])  # [B, T] ids, masks
        with torch.no_grad():
            feats = kind.features(model, policy_model, batch["input_ids"],
                                  batch["attention_mask"])  # aux [B, T, A*H], last [B, T, H]
        for b, i in enumerate(g):
            n = len(rows[i].input_ids)
            for name in FEATURES:
                if name in feats:
                    parts[name].append(feats[name][b, :n].to("cpu", dtype))  # padding stripped
            if not bool(torch.isfinite(feats["last"][b, :n]).all()):
                raise DraftkitError(f"the policy produced NaN/Inf hidden states for rollout "
                                    f"{rows[i].source}; check that row and target.dtype")
    last = torch.cat(parts["last"])  # [T_shard, H]
    # [T_shard, A*H]; A = 0 for kinds that need `last` only
    aux = torch.cat(parts["aux"]) if parts["aux"] else last.new_empty(len(last), 0)
    tensors = {
        "aux": aux, "last": last,
        "input_ids": torch.tensor([t for i in order for t in rows[i].input_ids]),  # [T_shard]
        "loss_mask": torch.tensor([m for i in order for m in rows[i].loss_mask]),  # [T_shard]
        "seq_lens": torch.tensor(lens, dtype=torch.long),  # [S]
        "sample_idx": torch.tensor(order, dtype=torch.long),  # [S] row of each sequence
    }
    return shards.write_shard(directory, index, tensors, fingerprint)


def _header(cfg, policy, kind, directory: Path, fingerprint: str, job: str) -> dict:
    """Manifest fields; the aux layout is read from shard 0 (what the kind's features hold)."""
    from safetensors import safe_open

    hidden = cfg.target.hidden_size
    with safe_open(directory / shards.shard_name(0), framework="pt") as f:
        width = f.get_slice("aux").get_shape()[1]
    ids = list(cfg.draft.aux_layer_ids) if width else []
    if width != len(ids) * hidden:
        raise DraftkitError(f"the {kind.name} draft's aux features are {width} wide, not "
                            f"{len(ids)} x {hidden} (draft.aux_layer_ids={ids}); the current "
                            "draft was made for other aux layer ids than the run config")
    t = cfg.target
    return {"split": "refresh", "job": job, "draft_kind": kind.name,
            "target": {"name": t.name, "policy": policy.source, "policy_sha256": policy.digest,
                       "num_hidden_layers": t.num_hidden_layers, "hidden_size": hidden,
                       "vocab_size": t.vocab_size},
            "aux_layer_ids": ids, "dtype": cfg.harvest.dtype,
            "shard_tokens": cfg.harvest.shard_tokens, "batch_tokens": cfg.refresh.batch_tokens,
            "padding": True, "bytes_per_token": (len(ids) + 1) * hidden *
            shards.store_dtype(cfg.harvest.dtype).itemsize, "data_fingerprint": fingerprint}


def _remove_others(store, job: str) -> None:
    root = store.root / ROOT
    for other in [p for p in root.iterdir() if p.name != job] if root.is_dir() else []:
        print(f"refresh: removing the capture {other} of another job", file=sys.stderr)
        shutil.rmtree(other, ignore_errors=True)


def harvest(kind, model, policy, rows: list[Rollout], cfg, store, job: str,
            should_stop=lambda: False) -> Captured:
    """Capture to (or reuse) drafts/.capture/<job>/; batches stream from its shards."""
    dtype = shards.store_dtype(cfg.harvest.dtype)
    if cfg.harvest.shard_tokens < 1:
        raise DraftkitError("harvest.shard_tokens must be >= 1 (tokens per capture shard)")
    directory = capture_dir(store, job)
    _remove_others(store, job)
    plan = plan_batches([len(r.input_ids) for r in rows], cfg.refresh.batch_tokens)
    sizes = [sum(len(rows[i].input_ids) for i in g) for g in plan]
    layout = shards.plan_shards(sizes, cfg.harvest.shard_tokens)  # batches of each shard
    fp = _fingerprint(kind, cfg, job, rows)
    shards.clean_dir(directory, len(layout), fp)
    entries = [shards.verified_entry(directory, s, fp) for s in range(len(layout))]
    todo = [s for s, entry in enumerate(entries) if entry is None]  # missing, stale or damaged
    if todo:  # the dir claims complete only once every shard is good again
        (directory / shards.MANIFEST).unlink(missing_ok=True)
    bar = tqdm(total=sum(sizes[b] for s in todo for b in layout[s]), unit="tok",
               desc="capture", leave=False)
    for s in todo:
        if should_stop():
            bar.close()
            raise finetune.Stopped(f"stopped during capture ({s} of {len(layout)} shards in "
                                   f"{directory}; a rerun keeps them)")
        entries[s] = capture_shard(kind, model, policy.model, rows,
                                   [plan[b] for b in layout[s]], directory, s, dtype, fp)
        bar.update(entries[s]["tokens"])
    bar.close()
    manifest = shards.write_manifest(directory, _header(cfg, policy, kind, directory, fp, job),
                                     entries)
    try:
        hs = shards.open_harvest(directory, data_fingerprint=fp, lazy=True)
    except shards.HarvestError as e:
        raise DraftkitError(f"refresh capture {directory} cannot be read ({e}); delete it and "
                            "rerun the refresh") from e
    where = {row: stored for stored, row in enumerate(hs.sample_indices())}
    # fine-tune batch i = the stored sequences of online batch i, read when it is asked for
    batches = PlannedBatches([[where[i] for i in g] for g in plan],
                             _Builder(HarvestSource([hs]), torch.float32))
    info = {"mode": "harvest", "tokens": manifest["total_tokens"],
            "bytes": sum((directory / e["file"]).stat().st_size for e in entries),
            "shards": len(entries), "reused_shards": len(entries) - len(todo),
            "dtype": cfg.harvest.dtype, "dir": str(directory), "removed": True}
    if not todo:
        print(f"refresh: reusing the complete capture {directory}", file=sys.stderr)
    return Captured(batches, info)


class _Builder(BatchBuilder):
    """train/data.py's batch builder (memory-mapped slices, padded, features in float32); a
    kind that needs `last` only stores aux [T, 0], which is dropped."""

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        batch = super().__call__(indices)  # aux [B, T, A*H], last [B, T, H], ids/masks [B, T]
        if batch["aux"].shape[-1] == 0:
            del batch["aux"]
        return batch
