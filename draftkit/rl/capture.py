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
(the default) rounds the features as a stored harvest does.

Taps. A refresh can be handed features another forward already computed over the rollouts
(`Taps`: an RL trainer's own loss forward, integrations/trl.py), keyed by each row's token ids;
`capture(..., taps=)` reads the rows they cover and runs the policy only over the rest (no
forward at all when they cover every row), and the lineage's `capture.taps` counts both. The
held-out AL gate (drift.estimate) still runs its own pass: it judges against the policy now.

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
from dataclasses import dataclass, field
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
from draftkit.targets.capture import decoder_layers
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
            should_stop=lambda: False, taps: Taps | None = None) -> Captured:
    """The rows' batches with the policy's features, as `refresh.capture` says; rows `taps`
    covers are read from it, not computed."""
    rc, t0 = cfg.refresh, time.perf_counter()
    if taps is not None:
        kind = TappedKind(kind, taps)
    if check_mode(rc.capture) == "online":
        batches = finetune.feature_batches(kind, model, policy.model, rows, rc.batch_tokens)
        held = sum(b[n].nbytes for b in batches for n in FEATURES if n in b)  # in RAM
        out = Captured(batches, {"mode": "online", "tokens": sum(len(r.input_ids) for r in rows),
                                 "bytes": held})
    else:
        out = harvest(kind, model, policy, rows, cfg, store, job, should_stop)
    out.info["seconds"] = time.perf_counter() - t0
    if taps is not None:
        out.info["taps"] = dict(kind.stats)
    return out


# ----------------------------------------------------------------------------- taps


@dataclass
class Taps:
    """Policy hidden states another forward computed over whole rollouts, detached, on the CPU.

    rows: a rollout's token ids (prompt + response, as read_rollouts builds them) -> {layer id:
    [T, H]} in the aux-layer convention of targets/capture.py (id k = the state entering decoder
    layer k, id N = the last decoder output before the final norm). A row serves a refresh when
    it holds the draft's aux ids and N (`kind.aux_layer_ids(draft)`; None = N only)."""

    rows: dict[tuple[int, ...], dict[int, torch.Tensor]] = field(default_factory=dict)


class TappedKind:
    """`kind` whose `features` reads the rows of a padded batch that `taps` covers and runs the
    policy only over the others (one forward of those rows; none when every row is covered).
    Features as targets/capture.capture gives them: "aux" = the aux ids' states concatenated,
    "last" = id N, float32 on the policy's device, zeros past each row's length."""

    def __init__(self, kind, taps: Taps):
        self.kind, self.taps = kind, taps
        # rows/tokens read from the taps; rows computed and policy forwards run for the rest
        self.stats = {"rows": 0, "tokens": 0, "computed_rows": 0, "forwards": 0}

    def __getattr__(self, name: str):  # every other hook is the kind's
        return getattr(self.kind, name)

    def features(self, model, policy_model, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        last_id = len(decoder_layers(policy_model))
        aux_ids = self.kind.aux_layer_ids(model) or []  # [] = the kind reads `last` only
        lens = [int(n) for n in attention_mask.sum(-1).tolist()]  # right-padded: ids[b, :n]
        found = [self.taps.rows.get(tuple(input_ids[b, :n].tolist())) for b, n in enumerate(lens)]
        found = [s if s is not None and all(i in s for i in [*aux_ids, last_id]) else None
                 for s in found]
        missing = [b for b, s in enumerate(found) if s is None]
        if missing:  # the policy's own pass over the rows the taps do not cover
            self.stats["computed_rows"] += len(missing)
            self.stats["forwards"] += 1
            sub = self.kind.features(model, policy_model, input_ids[missing],
                                     attention_mask[missing])  # [M, T, *] each
            if len(missing) == len(lens):
                return sub
        device, (b_size, t) = next(policy_model.parameters()).device, input_ids.shape
        out = {}
        for b, states in enumerate(found):
            if states is None:
                continue
            n = lens[b]
            row = {"last": states[last_id]}  # [n, H]
            if aux_ids:
                row["aux"] = torch.cat([states[i] for i in aux_ids], dim=-1)  # [n, A*H]
            for name, f in row.items():
                if name not in out:
                    out[name] = torch.zeros(b_size, t, f.shape[-1], device=device)  # [B, T, *]
                out[name][b, :n] = f.to(device, torch.float32)
            self.stats["rows"] += 1
            self.stats["tokens"] += n
        if missing:
            for name, f in sub.items():
                out.setdefault(name, f.new_zeros(b_size, t, f.shape[-1]))[missing] = f
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
