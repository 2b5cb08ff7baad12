"""DraftStore's failed versions (no vLLM, no model): a version a live swap refused is marked
failed, is never `current` again, and is never the parent of a later refresh."""

from __future__ import annotations

import pytest

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.rl.publish import FAILED, DraftStore


def _store(tmp_path, n: int) -> DraftStore:
    store = DraftStore(tmp_path / "run")
    for i in range(1, n + 1):
        store.publish(f"v{i:04d}", lambda tmp, final: (tmp / "config.json").write_text("{}"),
                      {"job": f"j{i}", "parent": f"v{i - 1:04d}" if i > 1 else "export"})
    return store


def test_a_failed_version_goes_back_and_is_never_current_again(tmp_path):
    store = _store(tmp_path, 3)
    store.set_current("v0003")
    assert store.mark_failed("v0003", "probe AL 1.000 <= 1.2", back_to="v0001") == "v0001"
    assert store.current() == "v0001" and store.parent() == "v0001"
    marker = artifacts.read_json(store.root / "v0003" / FAILED)
    assert marker["reason"].startswith("probe AL") and store.failure("v0003") == marker
    with pytest.raises(DraftkitError, match="marked it failed"):
        store.set_current("v0003")
    assert store.current() == "v0001"
    event = store.events()[-1]
    assert event["event"] == "failed" and event["version"] == "v0003"
    assert event["current"] == "v0001" and event["moved_current"] is True
    assert store.versions() == ["v0001", "v0002", "v0003"]  # kept: its number is never reused
    assert store.good_versions() == ["v0001", "v0002"] and store.next_version() == "v0004"


def test_without_a_known_engine_version_current_goes_to_the_newest_good_older_one(tmp_path):
    store = _store(tmp_path, 3)
    store.set_current("v0003")
    store.mark_failed("v0002", "bad")  # not current: current stays
    assert store.current() == "v0003"
    store.mark_failed("v0003", "bad", back_to=None)  # v0002 failed too: v0001
    assert store.current() == "v0001"
    store.mark_failed("v0001", "bad", back_to="v0002")  # a failed back_to is never used
    assert store.current() is None  # no good version left: the run's export serves


def test_parent_skips_a_failed_current_a_crash_left_behind(tmp_path):
    store = _store(tmp_path, 2)
    store.set_current("v0002")
    artifacts.write_json_atomic(store.root / "v0002" / FAILED, {"reason": "crash after mark"})
    assert store.current() == "v0002" and store.parent() == "v0001"
    assert store.mark_failed("v0002", "again") == "v0001"  # a rerun finishes the move


def test_version_of_resolves_links_and_rejects_other_dirs(tmp_path):
    store = _store(tmp_path, 2)
    store.set_current("v0002")
    assert store.version_of(store.current_link) == "v0002"
    assert store.version_of(store.root / "v0001") == "v0001"
    assert store.version_of(tmp_path) is None and store.version_of(None) is None
