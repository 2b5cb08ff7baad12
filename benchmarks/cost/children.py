"""The cost benchmarks' measurements that run in a fresh process and print one JSON line:

    python -m benchmarks.cost.children stream MODE RUN                     # cost/stream.py
    python -m benchmarks.cost.children capture RUN POLICY ROLLOUTS MODE    # cost/capture.py

Each process measures its own peak memory, so what a measurement needs is imported inside its
function (deferred on purpose), and this module imports nothing heavy at the top.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

STREAM_OVERRIDES = ["draft.draft_vocab_size=256", "harvest.shard_tokens=16384", "harvest.batch_tokens=4096",
             "harvest.packing=pad", "train.epochs=1", "train.batch_tokens=4096",
             "train.eval_every=100000", "train.save_every=100000", "tracking.backend=none",
             "train.num_workers=1"]
REFRESH_OVERRIDES = ["refresh.budget_steps=20", "refresh.gate=false", "refresh.batch_tokens=4096"]


def _kib(path: str, key: str) -> int:
    try:
        text = Path(path).read_text()
    except OSError:  # a worker that just exited
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(key)), 0)


class MemSampler(threading.Thread):
    """Peaks, sampled until stopped, of this process's resident memory split into anonymous
    (heap: tensors, caches) and file-backed pages (libraries, mapped shards), of the PSS of its
    DataLoader workers (split the same way) and of PSS(this process) + PSS(workers)."""

    def __init__(self, every: float = 0.05):
        super().__init__(daemon=True)
        self.every, self.done, self.peak_kib = every, threading.Event(), {}

    def _peak(self, key: str, kib: int) -> None:
        self.peak_kib[key] = max(self.peak_kib.get(key, 0), kib)

    def run(self) -> None:
        pid = os.getpid()
        while not self.done.is_set():
            kids = [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                    for c in _read(t / "children").split()]
            for key in ("RssAnon:", "RssFile:"):
                self._peak(key, _kib("/proc/self/status", key))
            for key in ("Pss_Anon:", "Pss_File:", "Pss_Shmem:", "Pss:"):
                self._peak("worker_" + key, sum(_kib(f"/proc/{p}/smaps_rollup", key)
                                                for p in kids))
            self._peak("total_Pss:", sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:")
                                         for p in [pid, *kids]))
            self.done.wait(self.every)

    def mib(self) -> dict:
        names = {"RssAnon:": "peak_rss_anon_mib", "RssFile:": "peak_rss_file_mib",
                 "worker_Pss:": "worker_peak_pss_mib", "worker_Pss_Anon:": "worker_peak_pss_anon_mib",
                 "worker_Pss_File:": "worker_peak_pss_file_mib",
                 "worker_Pss_Shmem:": "worker_peak_pss_shmem_mib", "total_Pss:": "peak_pss_mib"}
        return {name: self.peak_kib.get(key, 0) / 1024 for key, name in names.items()}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def stream(mode: str, run: Path) -> dict:
    """One cost/stream.py measurement of `mode` (materialise | stream | train) on `run`."""
    import torch  # deferred, as every import below: this process measures its own memory

    torch.set_num_threads(1)
    sampler = MemSampler()
    sampler.start()
    t0 = time.perf_counter()
    if mode == "materialise":
        from draftkit.core import artifacts
        from draftkit.harvest.shards import open_harvest

        seqs = list(open_harvest(artifacts.RunPaths(run).harvest).sequences())
        tokens = sum(int(s["input_ids"].shape[0]) for s in seqs)
        for s in seqs:  # read every value once, as an epoch of training does
            s["aux"].float().sum() + s["last"].float().sum()
    elif mode == "stream":
        from draftkit.core import artifacts, config
        from draftkit.harvest.shards import open_harvest
        from draftkit.train.data import BatchBuilder, HarvestSource, PlannedBatches, epoch_plan

        cfg = config.load(run, STREAM_OVERRIDES)
        source = HarvestSource([open_harvest(artifacts.RunPaths(run).harvest)])
        plan = epoch_plan(source.lengths(), cfg.train.batch_tokens, cfg.train.seed, 0,
                          cfg.train.pad_multiple)
        batches = PlannedBatches(plan, BatchBuilder(source, torch.float32,
                                                    pad_multiple=cfg.train.pad_multiple),
                                 cfg.train.num_workers)
        tokens = sum(int(b["attention_mask"].sum()) for b in batches.stream(range(len(plan))))
    else:
        from draftkit.core import artifacts
        from draftkit.train.stage import train

        out = train(run, STREAM_OVERRIDES)
        tokens = artifacts.read_json(artifacts.RunPaths(run).harvest / "manifest.json")[
            "total_tokens"]
        meta = artifacts.read_json(out / "meta.json")
        steps, t0 = meta["steps"], time.perf_counter() - meta["timings"]["train_s_this_call"]
    seconds = time.perf_counter() - t0
    sampler.done.set()
    sampler.join()
    return {"mode": mode, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            **({"steps": steps} if mode == "train" else {}),
            "peak_rss_mib": _kib("/proc/self/status", "VmHWM:") / 1024, **sampler.mib()}


def capture(run: str, policy: str, rollouts: str, mode: str) -> dict:
    """One cost/capture.py refresh of `run` with refresh.capture=`mode` (online | harvest)."""
    import torch  # deferred, as the import below: this process measures its own memory

    from draftkit.rl.job import refresh

    torch.set_num_threads(1)
    res = refresh(run, policy, [rollouts], [*REFRESH_OVERRIDES, f"refresh.capture={mode}"])
    lin = res["lineage"]
    return {"mode": mode, "peak_rss_mib": _kib("/proc/self/status", "VmHWM:") / 1024,
            "wall_s": lin["wall_s"], "train_s": lin["train_s"], "steps": lin["steps"],
            "capture": {k: v for k, v in lin["capture"].items() if k != "dir"}}


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        print(json.dumps(stream(sys.argv[2], Path(sys.argv[3]))))
    else:
        print(json.dumps(capture(*sys.argv[2:6])))
