"""`draftkit harvest RUN`: run the target over the prepared sequences, store its hidden states.

    draftkit harvest runs/demo
    draftkit harvest runs/tiny harvest.shard_tokens=2048 harvest.dtype=float32   # tiny CPU run
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m draftkit.cli harvest runs/demo    # 2 processes, identical bytes

(accelerate 1.x starts a single process for `--cpu`; `--multi_gpu` spawns the ranks via
torchrun, and on a machine without CUDA they join a gloo group on the CPU.)

What is stored (vLLM convention, docs/design.md). For a 30-layer target with aux ids [2, 15, 27]:
`aux` [T, 3*H] = [entering layers[2] | entering layers[15] | entering layers[27]] = the outputs
of layers[1], layers[14], layers[26] (residual added); `last` [T, H] = output of layers[29]
(id 30) *before* the final norm, so lm_head(norm(last)) reproduces the target's logits. The
train split goes to `<run>/harvest`, the first `harvest.eval_sequences` eval sequences to
`<run>/harvest/eval` (same format, see shards.py).

Where this departs from SpecForge/speculators' offline hidden-state generation:
- Exactness over padding: a padded batch runs the attention reductions over the padded key
  length, which moves the last fp32 bits, so by default a forward batches only sequences of
  equal length; every stored tensor then equals the sequence's own unpadded forward bit for
  bit. `harvest.padding=true` packs length-sorted padded batches instead (for GPUs).
- Batches are planned per shard and shards go to ranks round-robin (shard j -> rank j % P), so
  one process or P processes write byte-identical shards and manifest.
- Changed data or settings (a different fingerprint of the prepared rows + target + layer ids +
  dtype + shard/batch sizes) trigger a clean redo, announced on stderr: the old manifest is
  removed first, so no reader ever sees a mix. Resume keeps every shard whose sidecar has the
  current fingerprint and whose sha256 still matches; the rest are recomputed.
- A writer thread serializes, hashes and writes shard i while the target computes shard i+1.
  Harvest refuses to start when the shards still to write exceed the free disk (`check_disk`;
  `draftkit plan RUN` shows the bytes), and a disk that fills anyway keeps every shard written
  before it: the rerun resumes after them.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from draftkit.core import artifacts, batching, config, hardware, prepared_data, provenance
from draftkit.core.config import Run, RunConfig
from draftkit.core.errors import DraftkitError
from draftkit.harvest import shards
from draftkit.harvest.shards import HarvestError, HarvestSet, open_harvest  # noqa: F401 - public API
from draftkit.targets import capture as capture_mod
from draftkit.targets import load as target_load

SPLITS = ("train", "eval")


def plan_batches(lengths: list[int], batch_tokens: int, padding: bool) -> list[list[int]]:
    """Forwards of <= batch_tokens tokens; without `padding` only equal lengths share one
    (core/batching.py: lengths [4, 3, 4, 3, 5], batch_tokens 8 -> [[1, 3], [0, 2], [4]])."""
    return batching.plan_batches(lengths, batch_tokens, equal_lengths=not padding)


def pad_right(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, T_max] input ids (right-padded with 0) and attention mask; mask None if no padding."""
    x, mask = batching.pad_right(seqs, torch.long)  # [B, T], [B, T]
    return x, (None if bool(mask.all()) else mask)


# ----------------------------------------------------------------------------- planning


@dataclass
class SplitJob:
    split: str
    directory: Path
    ds: object  # datasets.Dataset with id, input_ids, loss_mask, length
    lengths: list[int]  # tokens per row
    shards: list[list[int]]  # rows of each shard, in dataset order
    fingerprint: str
    header: dict  # manifest fields besides the shard list


def _header(cfg: RunConfig, split: str, device: str) -> dict:
    t, h = cfg.target, cfg.harvest
    shards.store_dtype(h.dtype)
    compute = hardware.resolve(t.dtype, device, key="target.dtype")
    return {
        "split": split,
        "target": {"name": t.name, "hub_id": t.hub_id, "revision": t.revision,
                   "num_hidden_layers": t.num_hidden_layers, "hidden_size": t.hidden_size,
                   "vocab_size": t.vocab_size},
        "aux_layer_ids": list(cfg.draft.aux_layer_ids),
        "dtype": h.dtype,
        "compute_dtype": compute,
        "shard_tokens": h.shard_tokens,
        "batch_tokens": h.batch_tokens,
        "padding": h.padding,
        "bytes_per_token": shards.bytes_per_token(len(cfg.draft.aux_layer_ids), t.hidden_size,
                                                  h.dtype),
    }


def _checked_lengths(ds, split: str) -> list[int]:
    """Tokens per row, from input_ids; the `length` column must agree (it plans the shards)."""
    import pyarrow.compute as pc

    table = ds.select_columns(["input_ids", "length"]).with_format("arrow")[:]
    lengths = pc.list_value_length(table.column("input_ids")).to_pylist()
    for row, (n, stated) in enumerate(zip(lengths, table.column("length").to_pylist(),
                                          strict=True)):
        if n != stated or n == 0:
            raise DraftkitError(f"sample id={ds[row]['id']!r} (row {row} of the prepared {split} "
                                f"split) has {n} input_ids but length={stated}; they must agree "
                                "and be > 0: rerun `draftkit prepare`")
    return lengths


def plan(run: Run, device: str = "cpu") -> list[SplitJob]:
    """The shard plan of every split (deterministic: same data + config -> same plan)."""
    cfg, paths = run.cfg, run.paths
    capture_mod.check_layer_ids(cfg.draft.aux_layer_ids, cfg.target.num_hidden_layers)
    if cfg.harvest.shard_tokens < 1 or cfg.harvest.batch_tokens < 1:
        raise DraftkitError("harvest.shard_tokens and harvest.batch_tokens must be >= 1")
    jobs = []
    for split in SPLITS:
        ds = prepared_data.load_rows(paths.data, split)
        if ds is None:
            continue
        if split == "train" and len(ds) == 0:
            raise DraftkitError(f"the prepared train split of {paths.root} is empty; check the "
                                f"data recipe and rerun `draftkit prepare {paths.root}`")
        if split == "eval" and 0 < cfg.harvest.eval_sequences < len(ds):
            ds = ds.select(range(cfg.harvest.eval_sequences))
        header = _header(cfg, split, device)
        fp = shards.fingerprint(ds, {k: v for k, v in header.items() if k != "bytes_per_token"})
        directory = paths.harvest / ("" if split == "train" else split)
        lengths = _checked_lengths(ds, split)
        jobs.append(SplitJob(split, directory, ds, lengths,
                             shards.plan_shards(lengths, cfg.harvest.shard_tokens), fp,
                             {**header, "data_fingerprint": fp}))
    return jobs


def current_fingerprint(run_dir: Path, split: str = "train",
                        overrides: list[str] | None = None) -> str:
    """The data fingerprint a harvest of the run's current prepared data + config would carry;
    pass it to `open_harvest(..., data_fingerprint=...)` to refuse a stale harvest."""
    run = config.open_run(run_dir, overrides)
    for job in plan(run, target_load.default_device()):
        if job.split == split:
            return job.fingerprint
    raise DraftkitError(f"{run.paths.root} has no prepared {split} split; run `draftkit prepare`")


# ----------------------------------------------------------------------------- one shard


def _where(job: SplitJob, row: int, sample_id: str) -> str:
    return f"sample id={sample_id!r} (row {row} of the prepared {job.split} split)"


def _sequence(job: SplitJob, row: int, sample_id: str, ids: list[int], mask: list[int],
              length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not ids or len(ids) != length or len(mask) != len(ids):
        raise DraftkitError(f"{_where(job, row, sample_id)}: input_ids has {len(ids)} tokens, "
                            f"loss_mask {len(mask)}, length column {length}; they must agree and "
                            "be > 0: rerun `draftkit prepare`")
    if min(ids) < 0 or max(ids) >= vocab:
        raise DraftkitError(f"{_where(job, row, sample_id)}: token ids outside the target vocab "
                            f"[0, {vocab}); the data was prepared for another tokenizer: rerun "
                            "`draftkit prepare`")
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def _check(feats: dict, x: torch.Tensor, width: int, hidden: int, job: SplitJob,
           rows: list[int], sample_ids: list[str]) -> None:
    b, t = x.shape
    if tuple(feats["aux"].shape) != (b, t, width) or tuple(feats["last"].shape) != (b, t, hidden):
        raise DraftkitError(
            f"target returned aux {tuple(feats['aux'].shape)} / last {tuple(feats['last'].shape)} "
            f"for {_where(job, rows[0], sample_ids[0])} (batch of {b}), expected "
            f"({b}, {t}, {width}) / ({b}, {t}, {hidden}): the loaded target does not match the "
            "run config's target shapes; rerun `draftkit init` for this target")


def harvest_shard(job: SplitJob, index: int, capture: capture_mod.OnlineCapture,
                  cfg: RunConfig) -> dict[str, torch.Tensor]:
    """Compute and check shard `index` of `job`: the tensors `shards.write_shard` stores."""
    rows = job.shards[index]
    data = job.ds[rows]  # columns -> lists, dataset order
    seqs = [_sequence(job, r, *fields, cfg.target.vocab_size) for r, *fields in zip(
        rows, data["id"], data["input_ids"], data["loss_mask"], data["length"], strict=True)]
    lens = [len(ids) for ids, _ in seqs]
    starts = [0, *itertools.accumulate(lens)]  # offset of each sequence in the shard
    hidden, width = cfg.target.hidden_size, len(capture.aux_layer_ids) * cfg.target.hidden_size
    store = shards.store_dtype(cfg.harvest.dtype)
    aux = torch.empty(sum(lens), width, dtype=store)  # [T_shard, A*H]
    last = torch.empty(sum(lens), hidden, dtype=store)  # [T_shard, H]
    for batch in plan_batches(lens, cfg.harvest.batch_tokens, cfg.harvest.padding):
        x, mask = pad_right([seqs[j][0] for j in batch])  # [B, T]
        feats = capture(x, mask)
        _check(feats, x, width, hidden, job, [rows[j] for j in batch],
               [data["id"][j] for j in batch])
        for b, j in enumerate(batch):
            s, e = starts[j], starts[j] + lens[j]
            aux[s:e] = feats["aux"][b, :lens[j]]  # padding stripped, cast to storage dtype
            last[s:e] = feats["last"][b, :lens[j]]
    if not (bool(torch.isfinite(aux).all()) and bool(torch.isfinite(last).all())):
        _name_nonfinite(job, rows, data["id"], starts, aux, last, cfg)  # one pass; names which
    return {
        "aux": aux, "last": last,
        "input_ids": torch.cat([ids for ids, _ in seqs]),  # [T_shard]
        "loss_mask": torch.cat([m for _, m in seqs]),  # [T_shard]
        "seq_lens": torch.tensor(lens, dtype=torch.long),  # [S]
        "sample_idx": torch.tensor(rows, dtype=torch.long),  # [S]
    }


def _name_nonfinite(job: SplitJob, rows: list[int], ids: list[str], starts: list[int],
                    aux: torch.Tensor, last: torch.Tensor, cfg: RunConfig) -> None:
    """Raise for the first sequence of the shard whose stored states hold NaN/Inf."""
    for j, row in enumerate(rows):
        s, e = starts[j], starts[j + 1]
        bad = [n for n, v in (("aux", aux[s:e]), ("last", last[s:e]))
               if not bool(torch.isfinite(v).all())]
        if bad:
            raise DraftkitError(
                f"the target produced NaN/Inf hidden states ({', '.join(bad)}) for "
                f"{_where(job, row, ids[j])}: check that sample and the target "
                f"(target.dtype={cfg.target.dtype}; float32 avoids fp16 overflow, "
                f"harvest.dtype={cfg.harvest.dtype}), or drop the sample and rerun prepare")


def check_disk(jobs: list[SplitJob], cfg: RunConfig) -> None:
    """Refuse to start when the shards still to write exceed the free disk (all splits share
    it): a full disk mid-harvest costs hours of target forwards before it fails."""
    need, where = 0, None
    for job in jobs:
        bpt = job.header["bytes_per_token"] + shards.ID_BYTES
        need += bpt * sum(job.lengths[r] for i, rows in enumerate(job.shards)
                          if not (job.directory / shards.shard_name(i)).is_file() for r in rows)
        where = where or job.directory
    if where is None or need == 0:
        return
    free, measured = artifacts.free_disk(where)
    if need > free:
        raise HarvestError(
            f"harvest needs about {need / 1e9:,.1f} GB for its shards ({cfg.draft.aux_layer_ids} "
            f"taps + last state x {cfg.target.hidden_size} x {cfg.harvest.dtype}), and the disk "
            f"at {measured} has {free / 1e9:,.1f} GB free; nothing was started. Instead: "
            f"{shards.DISK_FIXES}. `draftkit plan RUN` shows the arithmetic")


# ----------------------------------------------------------------------------- the stage


def _compute(cfg: RunConfig, todo: list[tuple[SplitJob, int]], state) -> dict:
    """Harvest this rank's unfinished shards (the target is loaded only if there are any)."""
    from tqdm.auto import tqdm

    stats = {"rank": state.process_index, "shards": 0, "tokens": 0, "load_s": 0.0,
             "compute_s": 0.0}
    if not todo:
        return stats
    t0 = time.perf_counter()
    tgt = target_load.load_target(cfg.target.name, device=str(state.device),
                                 dtype=cfg.target.dtype, revision=cfg.target.revision)
    capture = capture_mod.OnlineCapture(tgt.model, cfg.draft.aux_layer_ids)
    t1 = time.perf_counter()
    total = sum(job.lengths[r] for job, i in todo for r in job.shards[i])
    bar = tqdm(total=total, unit="tok", desc=f"harvest rank {state.process_index}",
               disable=not state.is_main_process)
    writer = shards.ShardWriter()  # writes shard i while shard i+1 is computed
    try:
        for job, i in todo:
            writer.put(job.directory, i, harvest_shard(job, i, capture, cfg), job.fingerprint)
            bar.update(sum(job.lengths[r] for r in job.shards[i]))
    finally:  # an error here still writes the shards computed before it
        entries = writer.close()
    bar.close()
    stats["shards"], stats["tokens"] = len(entries), sum(e["tokens"] for e in entries)
    stats["load_s"], stats["compute_s"] = t1 - t0, time.perf_counter() - t1
    return stats


def _finish(run: Run, jobs: list[SplitJob], stats: list[dict], seconds: float) -> None:
    """Rank 0, after every rank is done: verify all shards, write manifests and meta.json."""
    for job in jobs:
        entries = []
        for i in range(len(job.shards)):
            entry = shards.verified_entry(job.directory, i, job.fingerprint)
            if entry is None:
                raise HarvestError(f"shard {i} of {job.directory} is missing or failed its "
                                   f"checksum after harvest; rerun `draftkit harvest "
                                   f"{run.paths.root}`")
            entries.append(entry)
        shards.write_manifest(job.directory, job.header, entries)
    computed = sum(s["tokens"] for s in stats)
    compute_s = max([s["compute_s"] for s in stats] + [0.0])
    timings = {"seconds": seconds, "compute_s": compute_s,
               "load_s": max([s["load_s"] for s in stats] + [0.0]),
               "computed_tokens": computed, "computed_shards": sum(s["shards"] for s in stats),
               "tokens_per_s": computed / compute_s if compute_s else None}
    provenance.write_meta(run.paths.harvest, "harvest", run.cfg.to_dict(), timings,
                         processes=len(stats), per_rank=stats,
                         splits={j.split: {"shards": len(j.shards), "sequences": len(j.ds),
                                           "data_fingerprint": j.fingerprint} for j in jobs})


def harvest(run_dir: Path, overrides: list[str] | None = None) -> Path:
    """Harvest the run's prepared train (and eval) sequences; returns the harvest dir.

    Resumable: rerunning skips verified shards. Under `accelerate launch`, rank r harvests
    shards r, r+P, ...; rank 0 writes the manifests once all ranks are done.
    """
    from accelerate import PartialState
    from accelerate.utils import gather_object, parse_flag_from_env

    t0 = time.perf_counter()
    run = config.open_run(run_dir, overrides)
    cfg = run.cfg
    state = PartialState(cpu=not torch.cuda.is_available() or parse_flag_from_env(
        "ACCELERATE_USE_CPU"))
    jobs = plan(run, str(state.device))
    check_disk(jobs, cfg)  # every rank: the same answer, and none waits at a barrier alone
    if state.is_main_process:
        stale_eval = run.paths.harvest / "eval"
        if "eval" not in [j.split for j in jobs] and stale_eval.is_dir():
            shutil.rmtree(stale_eval)  # the prepared data has no eval split any more
        for job in jobs:
            if shards.clean_dir(job.directory, len(job.shards), job.fingerprint):
                print(f"harvest: {job.directory} was made from other data or settings; "
                      "redoing every shard", file=sys.stderr)
    state.wait_for_everyone()
    work = [(job, i) for job in jobs for i in range(len(job.shards))]
    mine = work[state.process_index::state.num_processes]
    todo = [(job, i) for job, i in mine
            if shards.verified_entry(job.directory, i, job.fingerprint) is None]
    stats = gather_object([_compute(cfg, todo, state)])
    state.wait_for_everyone()
    if state.is_main_process:
        _finish(run, jobs, stats, time.perf_counter() - t0)
    state.wait_for_everyone()
    return run.paths.harvest

