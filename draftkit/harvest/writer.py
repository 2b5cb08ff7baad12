"""Shard files written the fast way: safetensors' header and each tensor's raw bytes streamed
to a temp file and renamed, sha256 computed over the same chunks as they are written (no second
read, no blob built in memory), and a pool of writer threads (file writes and hashlib release
the GIL, so they overlap with each other and with the target's forwards).

No fsync per shard: a shard counts as done once renamed with its sidecar, and a resumed run
re-hashes every shard it did not write itself (shards.verified_entry), so a shard lost to a
power cut is found and redone. `shards.write_manifest` fsyncs every shard and sidecar once,
just before the manifest that promises them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import queue
import tempfile
import threading
from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError

ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
             torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8",
             torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3"}
CHUNK = 8 << 20  # bytes hashed and written at a time


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy when it is contiguous (a ring-buffer view is)."""
    flat = t.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def safetensors_header(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> tuple[
        bytes, list[str]]:
    """The safetensors header (8-byte length + JSON padded to 8) and the tensors' order in the
    data: widest dtype first, then by name, so every tensor starts aligned to its itemsize."""
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    meta: dict = {"__metadata__": metadata}
    offset = 0
    for name in order:
        t = tensors[name]
        if t.dtype not in ST_DTYPES:
            raise DraftkitError(f"shard tensor {name!r} has dtype {t.dtype}, which the shard "
                                "writer does not store")
        n = t.numel() * t.element_size()
        meta[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                      "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str]) -> str:
    """Write a safetensors file atomically (temp + rename, no fsync); returns its sha256."""
    head, order = safetensors_header(tensors, metadata)
    digest = hashlib.sha256(head)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            f.write(head)
            for name in order:
                raw = _raw(tensors[name])
                for s in range(0, len(raw), CHUNK):
                    chunk = raw[s:s + CHUNK]
                    digest.update(chunk)
                    f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return digest.hexdigest()


def write_json(path: Path, obj) -> None:
    """A small JSON file atomically (temp + rename), without an fsync of its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def fsync_files(paths: list[Path]) -> None:
    """fsync each file and then their directories: what makes renamed shards durable."""
    dirs = set()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dirs.add(Path(p).parent)
    for d in dirs:
        with contextlib.suppress(OSError):  # some filesystems refuse a directory fsync
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class WriterPool:
    """`threads` writer threads. `put(directory, index, item, fingerprint, write)` queues a shard:
    `item.ready()` (waits for its copies, checks it) gives the tensors, `write(...)` stores them,
    `item.release()` runs after, whatever happened. The first error (a full disk included) stops
    further writes; `put` and `close` raise it. Shards written before it stay on disk with their
    sidecars, so a rerun resumes after them."""

    def __init__(self, threads: int = 4, full_message=None):
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.entries: dict[tuple[str, int], dict] = {}
        self.error: BaseException | None = None
        self.directory: Path | None = None
        self._full_message = full_message
        self._threads = [threading.Thread(target=self._run, name=f"harvest-writer-{i}",
                                          daemon=True) for i in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            directory, index, item, fingerprint, write = job
            try:
                if self.error is None:  # after an error: drain, release, write nothing
                    entry = write(directory, index, item.ready(), fingerprint)
                    with self._lock:
                        self.entries[(str(directory), index)] = entry
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                with self._lock:
                    self.error = self.error or e
            finally:
                item.release()

    def _raise(self) -> None:
        e = self.error
        if e is None:
            return
        if isinstance(e, OSError) and e.errno == errno.ENOSPC and self._full_message:
            raise self._full_message(self.directory, len(self.entries)) from e
        raise e

    def put(self, directory: Path, index: int, item, fingerprint: str, write) -> None:
        self._raise()
        self.directory = directory
        self._queue.put((directory, index, item, fingerprint, write))

    def close(self) -> dict[tuple[str, int], dict]:
        """Wait for every queued shard; their entries by (directory, index)."""
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        self._raise()
        return self.entries
