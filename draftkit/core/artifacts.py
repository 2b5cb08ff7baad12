"""Atomic writes, run-directory layout and content fingerprints: the floor every artifact
stands on (the `meta.json` each one carries is assembled above this, in provenance.py).

Every file is written to a temp name in the same directory and renamed into place, and every
directory artifact is built under `<name>.tmp-<pid>` and renamed when complete, so a crash never
leaves something that a later stage would trust. `meta.json` records the resolved config, argv,
git sha, package versions, the machine (CPU model and flags, device) and timings, enough to
redo the run and to say what a number ran on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any


def home() -> Path:
    """draftkit's cache root: $DRAFTKIT_HOME, default ~/.cache/draftkit."""
    return Path(os.environ.get("DRAFTKIT_HOME", Path.home() / ".cache" / "draftkit")).expanduser()


class RunPaths:
    """Where each stage of a run keeps its artifacts."""

    def __init__(self, run_dir: str | Path, harvest_dir: str | Path | None = None):
        self.root = Path(run_dir)
        # harvest.dir: the shards on another disk (None = <run>/harvest)
        self._harvest = Path(harvest_dir).expanduser() if harvest_dir else None

    @property
    def config(self) -> Path:
        return self.root / "draftkit.yaml"

    @property
    def data(self) -> Path:  # prepare: Arrow datasets train/ eval/, stats.json, token_freqs
        return self.root / "data"

    @property
    def harvest(self) -> Path:  # safetensors shards + manifest.json (harvest.dir, if set)
        return self._harvest or self.root / "harvest"

    @property
    def train(self) -> Path:  # checkpoints/, best/, meta.json
        return self.root / "train"

    @property
    def export(self) -> Path:  # the vLLM-loadable draft
        return self.root / "export"

    @property
    def eval(self) -> Path:
        return self.root / "eval"


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(obj: Any) -> Any:
    """A mapping that is not a dict (a draft's metrics, read from the device on access) as a
    dict; anything else as its str."""
    return dict(obj) if isinstance(obj, Mapping) else str(obj)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


@contextlib.contextmanager
def atomic_dir(final: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp dir beside `final`; on success rename it to `final` (replacing if asked)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if final.exists():
            if not overwrite:
                raise FileExistsError(f"{final} already exists")
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def free_disk(path: str | Path) -> tuple[int, Path]:
    """(free bytes, the directory measured) of the disk that holds or will hold `path`: its
    nearest existing ancestor."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return int(shutil.disk_usage(p).free), p


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint(obj: Any, chunks: Iterable = ()) -> str:
    """The one content hash behind every cache key and staleness check: sha256 (hex) over `obj`
    as canonical JSON (sorted keys, other values by str()), then over each chunk of raw bytes
    (anything with the buffer protocol: a token array, encoded ids), in order."""
    h = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode())
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()
