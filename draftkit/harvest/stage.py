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
- Exactness over padding on the CPU: a padded batch runs the attention reductions over the
  padded key length, which moves the last fp32 bits, so `harvest.packing=equal` (auto's pick on
  the CPU) batches only sequences of equal length, and every stored tensor equals the
  sequence's own unpadded forward bit for bit. On CUDA auto picks `pad` (length-sorted padded
  batches); `varlen` packs sequences back to back in one row with restarting positions (no
  padding; the block-diagonal mask costs attention over the whole row). Both agree with
  `equal` within fp32 noise (tests/test_harvest_io.py).
- Batches are planned per shard and shards go to ranks round-robin (shard j -> rank j % P), so
  one process or P processes write byte-identical shards and manifest.
- Changed data or settings (a different fingerprint of the prepared rows + target + layer ids +
  dtype + shard/batch sizes + packing) trigger a clean redo, announced on stderr: the old
  manifest is removed first, so no reader ever sees a mix. Resume keeps every shard whose
  sidecar has the current fingerprint and whose sha256 still matches; the rest are recomputed.
- The GPU never waits for the disk (as speculators' capture): per batch, the encode to the
  storage dtype (bf16, or fp8 with per-token scales: encode.py) and the finite check run on the
  device, then non-blocking copies on a side stream fill a pinned host ring slot (staging.py);
  a pool of writer threads waits on the slot's event, writes header + raw bytes and hashes them
  as written (writer.py). One fsync pass over every shard precedes the manifest; the run does
  not hash its own shards again, while a resumed run re-hashes those it did not write.
- Harvest refuses to start when the shards still to write exceed the free disk (`check_disk`;
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

from draftkit.core import artifacts, config, hardware, prepared_data, provenance
from draftkit.core.config import Run, RunConfig
from draftkit.core.errors import DraftkitError
from draftkit.harvest import encode, shards, staging, writer
from draftkit.harvest.packing import forward_inputs, pad_right, plan_batches, resolve_packing  # noqa: F401
from draftkit.harvest.shards import HarvestError, HarvestSet, open_harvest  # noqa: F401 - public API
from draftkit.targets import capture as capture_mod
from draftkit.targets import load as target_load

SPLITS = ("train", "eval")


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
    encode.check_storage(h.storage_dtype)
    compute = hardware.resolve(t.dtype, device, key="target.dtype")
    return {
        "split": split,
        "target": {"name": t.name, "hub_id": t.hub_id, "revision": t.revision,
                   "num_hidden_layers": t.num_hidden_layers, "hidden_size": t.hidden_size,
                   "vocab_size": t.vocab_size},
        "aux_layer_ids": list(cfg.draft.aux_layer_ids),
        "dtype": h.dtype,
        **({"storage_dtype": h.storage_dtype} if h.storage_dtype else {}),
        "compute_dtype": compute,
        "shard_tokens": h.shard_tokens,
        "batch_tokens": h.batch_tokens,
        "packing": resolve_packing(h.packing, device),
        "bytes_per_token": shards.bytes_per_token(len(cfg.draft.aux_layer_ids), t.hidden_size,
                                                  h.dtype, h.storage_dtype),
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


class Staged:
    """A shard on its way to disk: host tensors a writer thread stores once `ready` (its copies
    have landed and every state is finite), then `release`s the ring slot they live in."""

    def __init__(self, tensors: dict, ring: staging.HostRing, slot: staging.Slot, name_bad):
        self.tensors, self._ring, self._slot, self._name_bad = tensors, ring, slot, name_bad

    def ready(self) -> dict[str, torch.Tensor]:
        self._slot.wait()
        t = len(self.tensors["input_ids"])
        ok = {n: self._slot.buffers[f"{n}_ok"][:t] for n in ("aux", "last")}  # [T] each
        if not (bool(ok["aux"].all()) and bool(ok["last"].all())):
            self._name_bad(ok)
        return self.tensors

    def release(self) -> None:
        self._ring.release(self._slot)


def host_ring(cfg: RunConfig, device, capacity: int, shards_todo: int) -> staging.HostRing:
    """The ring harvest_shard stages into: per token the encoded aux/last (+ fp8 scales) and a
    finite flag of each; one slot per writer thread and one being filled (no more than there
    are shards to do)."""
    h, hidden, groups = cfg.harvest, cfg.target.hidden_size, len(cfg.draft.aux_layer_ids)
    store = encode.FP8 if h.storage_dtype == "fp8" else shards.store_dtype(h.dtype)
    specs = {"aux": ((groups * hidden,), store), "last": ((hidden,), store),
             "aux_ok": ((), torch.bool), "last_ok": ((), torch.bool)}
    if h.storage_dtype == "fp8":
        specs.update(aux_scale=((groups,), torch.float32), last_scale=((1,), torch.float32))
    return staging.HostRing(device, specs, capacity,
                            slots=min(max(1, h.writers) + 1, max(1, shards_todo)))


def _spans(batch: list[int], lens: list[int], starts: list[int], packing: str):
    """(row b, first token, end token) in the forward's output -> shard offset, per copy:
    one per sequence, or one per batch when varlen keeps the batch's sequences contiguous."""
    if packing == "varlen":  # planned in order: the row is the shard's tokens starts[batch[0]]..
        return [(0, 0, sum(lens[j] for j in batch), starts[batch[0]])]
    return [(b, 0, lens[j], starts[j]) for b, j in enumerate(batch)]


def harvest_shard(job: SplitJob, index: int, capture: capture_mod.OnlineCapture,
                  cfg: RunConfig, ring: staging.HostRing) -> Staged:
    """Compute shard `index` of `job` into a ring slot: per batch, the forward, the encode to the
    storage dtype and the finite flags run on the device, then non-blocking copies to the host.
    Returns the shard for a writer thread (`shards.write_shard`'s tensors once ready)."""
    rows = job.shards[index]
    data = job.ds[rows]  # columns -> lists, dataset order
    seqs = [_sequence(job, r, *fields, cfg.target.vocab_size) for r, *fields in zip(
        rows, data["id"], data["input_ids"], data["loss_mask"], data["length"], strict=True)]
    lens = [len(ids) for ids, _ in seqs]
    starts = [0, *itertools.accumulate(lens)]  # offset of each sequence in the shard
    h, hidden = cfg.harvest, cfg.target.hidden_size
    groups, packing = len(capture.aux_layer_ids), job.header["packing"]
    store = shards.store_dtype(h.dtype)
    slot = ring.acquire()
    for batch in plan_batches(lens, h.batch_tokens, packing):
        inputs = forward_inputs([seqs[j][0] for j in batch], packing)
        x = inputs["input_ids"]  # [B, T]
        feats = capture(x, inputs["attention_mask"], **(
            {"position_ids": inputs["position_ids"]} if "position_ids" in inputs else {}))
        _check(feats, x, groups * hidden, hidden, job, [rows[j] for j in batch],
               [data["id"][j] for j in batch])
        out = {}
        for name, g in (("aux", groups), ("last", 1)):
            enc = encode.encode(feats[name], g, store, h.storage_dtype)  # on the device
            out[name], out[f"{name}_ok"] = enc["q"], torch.isfinite(feats[name]).all(-1)
            if "scale" in enc:
                out[f"{name}_scale"] = enc["scale"]  # [B, T, G]
        ring.begin()
        for b, s, e, at in _spans(batch, lens, starts, packing):
            for name, t in out.items():
                ring.copy(slot, name, at, t[b, s:e])  # padding stripped
    ring.seal(slot)
    n = starts[-1]
    tensors = {name: slot.buffers[name][:n] for name in slot.buffers if not name.endswith("_ok")}
    tensors.update({
        "input_ids": torch.cat([ids for ids, _ in seqs]),  # [T_shard]
        "loss_mask": torch.cat([m for _, m in seqs]),  # [T_shard]
        "seq_lens": torch.tensor(lens, dtype=torch.long),  # [S]
        "sample_idx": torch.tensor(rows, dtype=torch.long),  # [S]
    })
    return Staged(tensors, ring, slot,
                  lambda ok: _name_nonfinite(job, rows, data["id"], starts, ok, cfg))


def _name_nonfinite(job: SplitJob, rows: list[int], ids: list[str], starts: list[int],
                    ok: dict[str, torch.Tensor], cfg: RunConfig) -> None:
    """Raise for the first sequence of the shard whose states hold NaN/Inf (`ok[name]` [T]: the
    device's per-token finite flags)."""
    for j, row in enumerate(rows):
        s, e = starts[j], starts[j + 1]
        bad = [n for n in ("aux", "last") if not bool(ok[n][s:e].all())]
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


def _disk_full(directory: Path, written: int) -> HarvestError:
    return HarvestError(
        f"the disk holding {directory} is full: {written} shard(s) of this process were written "
        f"before and are kept. Free space, or {shards.DISK_FIXES}; then rerun `draftkit "
        "harvest RUN` to resume after them")


def _compute(cfg: RunConfig, todo: list[tuple[SplitJob, int]], state) -> dict:
    """Harvest this rank's unfinished shards (the target is loaded only if there are any):
    the main thread runs forwards, a pool of writer threads stores finished shards."""
    from tqdm.auto import tqdm

    stats = {"rank": state.process_index, "shards": 0, "tokens": 0, "load_s": 0.0,
             "compute_s": 0.0, "entries": {}}
    if not todo:
        return stats
    t0 = time.perf_counter()
    tgt = target_load.load_target(cfg.target.name, device=str(state.device),
                                 dtype=cfg.target.dtype, revision=cfg.target.revision)
    capture = capture_mod.OnlineCapture(tgt.model, cfg.draft.aux_layer_ids)
    sizes = [sum(job.lengths[r] for r in job.shards[i]) for job, i in todo]
    ring = host_ring(cfg, tgt.model.get_input_embeddings().weight.device, max(sizes), len(todo))
    t1 = time.perf_counter()  # load_s: the target and the host ring; compute_s: the rest
    bar = tqdm(total=sum(sizes), unit="tok", desc=f"harvest rank {state.process_index}",
               disable=not state.is_main_process)
    pool = writer.WriterPool(cfg.harvest.writers, _disk_full)
    try:
        for (job, i), size in zip(todo, sizes, strict=True):
            pool.put(job.directory, i, harvest_shard(job, i, capture, cfg, ring),
                     job.fingerprint, lambda *a: shards.write_shard(*a))
            bar.update(size)
    finally:  # an error here still writes the shards computed before it
        entries = pool.close()
    bar.close()
    stats["shards"], stats["tokens"] = len(entries), sum(e["tokens"] for e in entries.values())
    stats["load_s"], stats["compute_s"] = t1 - t0, time.perf_counter() - t1
    stats["entries"] = entries
    return stats


def _finish(run: Run, jobs: list[SplitJob], stats: list[dict], done: dict,
            seconds: float) -> None:
    """Rank 0, after every rank is done: the manifests from the entries this run wrote or
    verified at its start (no shard is hashed again), then meta.json."""
    known = dict(done)
    for s in stats:
        known.update(s.pop("entries"))
    for job in jobs:
        entries = []
        for i in range(len(job.shards)):
            entry = known.get((str(job.directory), i))
            if entry is None:
                raise HarvestError(f"shard {i} of {job.directory} is missing after harvest; "
                                   f"rerun `draftkit harvest {run.paths.root}`")
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
    done, todo = {}, []
    for job, i in work[state.process_index::state.num_processes]:  # shards an earlier run
        entry = shards.verified_entry(job.directory, i, job.fingerprint)  # wrote: re-hashed
        if entry is None:
            todo.append((job, i))
        else:
            done[(str(job.directory), i)] = entry
    stats = gather_object([{**_compute(cfg, todo, state), "verified": done}])
    state.wait_for_everyone()
    if state.is_main_process:
        verified = {k: v for s in stats for k, v in s.pop("verified").items()}
        _finish(run, jobs, stats, verified, time.perf_counter() - t0)
    state.wait_for_everyone()
    return run.paths.harvest

