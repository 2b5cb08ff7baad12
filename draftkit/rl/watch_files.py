"""The watch's file contract (rl/watch.py's doc): when a policy checkpoint, and when a rollout
file, is complete enough to use. Half-written checkpoints and rollout files still being written
are never read: a checkpoint counts with a marker file or every weight file as long as its own
header says; a rollout file with a `.done` marker, or a final newline and no change for
`refresh.rollout_settle_s`.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from pathlib import Path

from draftkit.rl.policy import shard_problems

MARKERS = ("draftkit.ready", "COMPLETE", ".complete", "DONE")
DONE = ".done"  # rollouts: NAME.jsonl.done marks NAME.jsonl complete


def safetensors_complete(path: Path) -> bool:
    """The file is as long as its header says (8-byte length + JSON header + data)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size:
                return False
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError):
        return False
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return size == 8 + n + max(ends, default=0)


def model_dir(ckpt: Path) -> Path | None:
    if (ckpt / "config.json").is_file():
        return ckpt
    found = sorted(p.parent for p in ckpt.glob("*/*/config.json")) + \
        sorted(p.parent for p in ckpt.glob("*/config.json"))
    return min(found, key=lambda p: len(p.parts), default=None)


def checkpoint_complete(ckpt: Path) -> bool:
    if any((ckpt / m).exists() for m in MARKERS):
        return True
    hf = model_dir(ckpt)
    if hf is None or any(hf.glob("*.tmp")) or any(hf.glob("*.incomplete")):
        return False
    index = hf / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError):
            return False
        files = [hf / n for n in names]
    else:
        if shard_problems(hf):  # shards named -of-N, and no index yet
            return False
        files = sorted(hf.glob("*.safetensors"))
    return bool(files) and all(safetensors_complete(f) for f in files)


def step_of(ckpt: Path) -> int | None:
    nums = re.findall(r"\d+", ckpt.name)
    return int(nums[-1]) if nums else None


def complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    out = [(step_of(p), p) for p in Path(directory).iterdir() if p.is_dir()]
    return sorted((s, p) for s, p in out if s is not None and checkpoint_complete(p))


def rollout_complete(f: Path, settle_s: float = 0.0, now: float | None = None) -> bool:
    """The file contract above: a .done marker, or a final newline and no change for settle_s."""
    if f.with_name(f.name + DONE).exists():
        return True
    try:
        st = f.stat()
        if st.st_size == 0 or (now or time.time()) - st.st_mtime < settle_s:
            return False
        with open(f, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"
    except OSError:
        return False


def rollout_candidates(directory: Path) -> list[Path]:
    """*.jsonl files a writer has placed (hidden names are its temp files)."""
    return [f for f in sorted(Path(directory).glob("*.jsonl"))
            if not f.name.startswith(".") and f.is_file()]


def complete_rollouts(directory: Path, settle_s: float = 0.0) -> list[Path]:
    now = time.time()
    return [f for f in rollout_candidates(directory) if rollout_complete(f, settle_s, now)]


def _stat(f: Path) -> list[int] | None:
    try:
        st = f.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]
