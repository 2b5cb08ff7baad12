"""Versioned drafts of a run: `drafts/vNNNN/` (an export dir vLLM loads as it is, plus
`lineage.json`), `drafts/current` (a symlink replaced by rename), the refresh log and the lock.

    runs/<name>/drafts/
      v0001/  config.json model.safetensors speculative_config.json README.md meta.json lineage.json
      v0002/  ...
      current -> v0002              os.replace of a fresh symlink: readers see old or new, never none
      refresh-log.jsonl             one event per line (published, rejected, resumed, ...)
      .lock                         flock: one refresh at a time (released when the process dies)

A version dir is built under a temp name and renamed when complete (lineage.json inside), so a
crash leaves either nothing or a whole version. A version carries its job key (a hash of the
policy, the rollout files, the parent and the settings): a rerun of the same job finds it and
only finishes what is left (moving `current`), so nothing is published twice. Before the first
refresh the run's own export (`<run>/export`) is the current draft.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError

LINEAGE = "lineage.json"
_VERSION = re.compile(r"^v(\d{4,})$")


class RefreshLocked(DraftkitError):
    """Another refresh of this run holds the lock."""


class DraftStore:
    def __init__(self, run_dir: str | Path):
        self.run = Path(run_dir)
        self.root = self.run / "drafts"

    @property
    def log_path(self) -> Path:
        return self.root / "refresh-log.jsonl"

    @property
    def current_link(self) -> Path:
        return self.root / "current"

    def versions(self) -> list[str]:
        """Complete versions, oldest first (temp dirs of a crashed publish are not listed)."""
        if not self.root.is_dir():
            return []
        found = [p.name for p in self.root.iterdir()
                 if _VERSION.match(p.name) and (p / LINEAGE).is_file()]
        return sorted(found, key=lambda n: int(n[1:]))

    def lineage(self, version: str) -> dict:
        return artifacts.read_json(self.root / version / LINEAGE)

    def current(self) -> str | None:
        """Name of the current version, None before the first publish."""
        link = self.current_link
        if not link.is_symlink():
            return None
        name = os.readlink(link)
        if not (self.root / name / LINEAGE).is_file():
            raise DraftkitError(f"{link} points to {name}, which is not a complete version; "
                                "point it at one of " + ", ".join(self.versions()))
        return name

    def current_dir(self) -> Path:
        """The draft serving now: the current version, else the run's export."""
        name = self.current()
        if name is not None:
            return self.root / name
        export = artifacts.RunPaths(self.run).export
        if not (export / "config.json").is_file():
            raise DraftkitError(f"run {self.run} has no draft yet (no drafts/current and no "
                                f"export); run `draftkit export {self.run}` first")
        return export

    def next_version(self) -> str:
        names = self.versions()
        n = int(names[-1][1:]) + 1 if names else 1
        return f"v{n:04d}"

    def find_job(self, job: str) -> str | None:
        return next((v for v in self.versions() if self.lineage(v).get("job") == job), None)

    def set_current(self, version: str) -> None:
        """Point `current` at a complete version: a new symlink renamed over the old one."""
        if not (self.root / version / LINEAGE).is_file():
            raise DraftkitError(f"cannot make {version} current: it is not a complete version")
        tmp = self.root / f".current.tmp-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(version, tmp)
        os.replace(tmp, self.current_link)
        _fsync_dir(self.root)

    def log(self, event: str, **fields) -> dict:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event, **fields}
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return record

    def events(self) -> list[dict]:
        if not self.log_path.is_file():
            return []
        lines = self.log_path.read_text().splitlines()
        return [json.loads(x) for x in lines if x.strip()]

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive, non-blocking: a second refresh fails at once and names the holder."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = path.read_text().strip() or "unknown"
                raise RefreshLocked(f"another refresh of {self.run} is running (pid {holder}); "
                                    "wait for it, or stop it first") from None
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def clean_partial(self) -> None:
        """Remove temp dirs left by a crashed publish (never a complete version)."""
        import shutil

        if self.root.is_dir():
            for p in self.root.glob(".v*.tmp-*"):
                shutil.rmtree(p, ignore_errors=True)

    def publish(self, version: str, write, lineage: dict) -> Path:
        """Build `version` with write(tmp_dir, final_dir), then lineage.json, then rename."""
        final = self.root / version
        with artifacts.atomic_dir(final) as tmp:
            write(tmp, final)
            artifacts.write_json_atomic(tmp / LINEAGE, lineage)
        _fsync_dir(self.root)
        return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
