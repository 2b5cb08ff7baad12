"""Versioned drafts of a run: `drafts/vNNNN/` (an export dir vLLM loads as it is, plus
`lineage.json`), `drafts/current` (a symlink replaced by rename), the refresh log and the lock.

    runs/<name>/drafts/
      v0001/  config.json model.safetensors speculative_config.json README.md meta.json lineage.json
      v0002/  ... failed.json       a version a live swap refused (why, when, who): never current
      v0001/  ... checked.json      a version that passed a live swap's check on some engine
      current -> v0002              os.replace of a fresh symlink: readers see old or new, never none
      checked -> v0001              the newest checked good version: what a server starts on
      refresh-log.jsonl             one event per line (published, rejected, resumed, ...)
      .lock                         flock: one refresh at a time (released when the process dies)
      .push.lock                    flock: one push into rollout servers at a time (it waits)
      engines.json                  what each rollout server serves (write_record: atomic, synced)

A version dir is built under a temp name and renamed when complete (lineage.json inside), so a
crash leaves either nothing or a whole version. A version carries its job key (a hash of the
policy, the rollout files, the parent and the settings): a rerun of the same job finds it and
only finishes what is left (moving `current`), so nothing is published twice. Before the first
refresh the run's own export (`<run>/export`) is the current draft.

A version that fails a live swap's check (`DraftRefresher.swap_into`: tensor hashes or probe AL)
is marked failed (`mark_failed`: `failed.json` written atomically, a `failed` log event), and
`current` moves back to the version the engine held before (else the newest good version older
than it, else none: the export). `set_current` refuses a failed version, so a failed version
is never what a restarted engine loads. Parent of the next refresh: `parent()` (= `current()`
once `mark_failed` has returned; it also skips a failed `current` left by a crash between the
marker and the move back), and `recover()` moves such a `current` back when a refresher, a
watch or a push starts. A version's files are synced to disk before its lineage.json is
written. Limit: `mark_failed` does not take the refresh lock; a refresh that
chose the failed version as its parent before the mark still publishes its child.
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
from draftkit.serving import draft_info

LINEAGE = "lineage.json"
FAILED = "failed.json"
CHECKED = "checked.json"
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
        if (failed := self.failure(version)) is not None:
            raise DraftkitError(
                f"cannot make {version} current: a live swap marked it failed "
                f"({failed.get('reason', '')[:200]}); refresh again, or delete "
                f"{self.root / version / FAILED} if the failure was not the draft's")
        self._point_current(version)

    def _point_current(self, version: str | None) -> None:
        """`current` -> version by renaming a fresh symlink over it; None removes it (export)."""
        if version is None:
            with contextlib.suppress(FileNotFoundError):
                self.current_link.unlink()
        else:
            tmp = self.root / f".current.tmp-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.symlink(version, tmp)
            os.replace(tmp, self.current_link)
        _fsync_dir(self.root)

    def failure(self, version: str) -> dict | None:
        """The failed.json marker of `version` ({"reason", "time", ...}), None if not failed."""
        path = self.root / version / FAILED
        return artifacts.read_json(path) if path.is_file() else None

    def good_versions(self) -> list[str]:
        """Complete versions not marked failed, oldest first."""
        return [v for v in self.versions() if self.failure(v) is None]

    def version_of(self, directory: str | Path | None) -> str | None:
        """The version a directory is (symlinks resolved), None if it is no version here."""
        if directory is None:
            return None
        path = Path(os.path.realpath(directory))
        if path.parent != Path(os.path.realpath(self.root)) or not _VERSION.match(path.name):
            return None
        return path.name if (path / LINEAGE).is_file() else None

    def mark_failed(self, version: str, reason: str, back_to: str | None = None,
                    **fields) -> str | None:
        """Mark `version` failed (failed.json, then a `failed` event); if it is current, point
        `current` at `back_to` (a good version: what the engine held), else at the newest good
        version older than it, else remove `current` (the export serves). Returns the new
        current. Idempotent: calling it again finishes a move a crash interrupted."""
        if not (self.root / version / LINEAGE).is_file():
            raise DraftkitError(f"cannot mark {version} failed: it is not a complete version")
        marker = {"version": version, "reason": reason, "pid": os.getpid(),
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
        artifacts.write_json_atomic(self.root / version / FAILED, marker)
        _fsync_dir(self.root / version)
        moved = self.current() == version
        if moved:
            if back_to is None or back_to == version or self.failure(back_to) is not None:
                back_to = self._good_before(version)
            self._point_current(back_to)
        self._point_checked()
        self.log("failed", version=version, reason=reason[:500],
                 current=self.current(), moved_current=moved, **fields)
        return self.current()

    def mark_checked(self, version: str, **fields) -> None:
        """`version` passed a live swap's check on an engine (checked.json, kept from the first
        pass); `checked` moves to the newest checked good version. Idempotent."""
        if not (self.root / version / CHECKED).is_file():
            artifacts.write_json_atomic(self.root / version / CHECKED, {
                "version": version, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields})
            _fsync_dir(self.root / version)
        self._point_checked()

    def checked(self) -> str | None:
        """The newest version that passed a live swap's check and is not marked failed."""
        ok = [v for v in self.good_versions() if (self.root / v / CHECKED).is_file()]
        return ok[-1] if ok else None

    def _point_checked(self) -> None:
        """`checked` -> checked() (removed when none: the export is what servers start on)."""
        version, link = self.checked(), self.root / "checked"
        if version is None:
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
        elif not link.is_symlink() or os.readlink(link) != version:
            tmp = self.root / f".checked.tmp-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.symlink(version, tmp)
            os.replace(tmp, link)
        _fsync_dir(self.root)

    def _good_before(self, version: str) -> str | None:
        older = [v for v in self.good_versions() if int(v[1:]) < int(version[1:])]
        return older[-1] if older else None

    def parent(self) -> str | None:
        """The version the next refresh starts from (None = the run's export): `current`,
        unless it is marked failed (a crash between the marker and the move back), then the
        newest good version older than it."""
        current = self.current()
        if current is None or self.failure(current) is None:
            return current
        return self._good_before(current)

    def log(self, event: str, **fields) -> dict:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event, **fields}
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return record

    def events(self) -> list[dict]:
        """Every event of the log; a torn line (a crash mid-write) is skipped with a warning,
        and a record appended onto it (`{"time": ...` after the torn part) is kept."""
        import warnings

        if not self.log_path.is_file():
            return []
        out = []
        for n, line in enumerate(self.log_path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
                continue
            except ValueError:
                warnings.warn(f"{self.log_path}:{n}: torn line skipped ({line[:80]!r})",
                              stacklevel=2)
            glued = line.rfind('{"time": ', 1)  # a record appended after the torn part
            with contextlib.suppress(ValueError):
                out += [json.loads(line[glued:])] if glued > 0 else []
        return [e for e in out if isinstance(e, dict)]

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
        """Build `version` with write(tmp_dir, final_dir), sync its files to disk, then write
        lineage.json (what makes it a version; `weights`: the sha256 of each *.safetensors, which
        a swap checks the files against before it loads), then rename: a crash never leaves a
        version whose lineage is on disk and whose weights are not."""
        final = self.root / version
        with artifacts.atomic_dir(final) as tmp:
            write(tmp, final)
            for f in sorted(tmp.rglob("*")):
                if f.is_file() and not f.is_symlink():
                    _fsync_file(f)
            _fsync_dir(tmp)
            weights = draft_info.file_digests(tmp)  # what the engines check and hash
            artifacts.write_json_atomic(tmp / LINEAGE, {**lineage, "weights": weights})
            _fsync_dir(tmp)
        _fsync_dir(self.root)
        return final

    def recover(self) -> str | None:
        """On start: a `current` left on a version marked failed (a crash between failed.json
        and the move back) moves back now (a `recovered` event). Returns the current version."""
        current = self.current_link.is_symlink() and self.current()
        if current and self.failure(current) is not None:
            back = self._good_before(current)
            self._point_current(back)
            self.log("recovered", version=current, current=back,
                     reason="current was left on a version marked failed")
        return self.current()

    def write_record(self, name: str, record: dict) -> None:
        """A JSON record of the store (engines.json): atomic, and the rename synced."""
        self.root.mkdir(parents=True, exist_ok=True)
        artifacts.write_json_atomic(self.root / name, record)
        _fsync_dir(self.root)

    @contextlib.contextmanager
    def push_lock(self, timeout: float = 600.0) -> Iterator[None]:
        """Exclusive, waiting up to `timeout` s: one push into rollout servers (and its
        engines.json update) at a time per run, across processes (flock, released when the
        process dies)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".push.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = path.read_text().strip() or "unknown"
                        raise DraftkitError(
                            f"another push into the rollout servers of {self.run} holds "
                            f"{path} (pid {holder}) after {timeout:g}s; nothing was pushed. "
                            "Push again when it is done") from None
                    time.sleep(0.05)
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            yield
        finally:
            os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
