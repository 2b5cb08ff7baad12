"""Which draft an engine serves, by name and by hash, where the engine says it: draftkit's
`GET /draftkit/state` and a Prometheus info metric on the engine's own `/metrics`.

vLLM's weight version is the policy's (vLLM tags every output with it; drafter_swap.py never
sets it), so the draft is named elsewhere:

    draftkit_draft_info{version="v0007",hash="3f1c..."} 1.0

`hash` is `weights_hash` of the draft dir's weight files: the sha256 over the
{file name: sha256} map that publish records in lineage.json (`weights`) and that a swap
checks the files against before it loads. The client computes the same from lineage.json, so
a version name that matches while the hash does not means the engine serves something else
(rl/rollout_servers.observe). The metric is registered in the API server's default
prometheus_client registry, which vLLM's /metrics serves (with PROMETHEUS_MULTIPROC_DIR set,
a multiprocess gauge whose most recent value counts); a draft no longer served reads 0.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from draftkit.core.artifacts import sha256_file

METRIC = "draftkit_draft_info"
_cache: dict[tuple, str | None] = {}  # (dir, its weight files' names, sizes, mtimes) -> hash
_gauge = None
_shown: tuple[str, str] | None = None  # the labels set to 1 now


def weights_hash(weights: dict[str, str] | None) -> str | None:
    """One sha256 for a draft's {weight file name: sha256} (lineage.json `weights`); None when
    there is nothing to hash."""
    if not weights:
        return None
    body = json.dumps({Path(k).name: v for k, v in weights.items()}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def file_digests(directory: str | Path) -> dict[str, str]:
    """{name: sha256} of the dir's *.safetensors files, as publish records them."""
    return {f.name: sha256_file(f) for f in sorted(Path(directory).glob("*.safetensors"))}


def dir_hash(directory: str | Path) -> str | None:
    """`weights_hash` of the dir's files now (cached while their sizes and mtimes stay)."""
    path = os.path.realpath(directory)
    try:
        key = (path, *((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                       for f in sorted(Path(path).glob("*.safetensors"))))
    except OSError:
        return None
    if key not in _cache:
        try:
            _cache[key] = weights_hash(file_digests(path))
        except OSError:
            return None
    return _cache[key]


def show(version: str | None, digest: str | None) -> None:
    """Set `draftkit_draft_info{version, hash}` to 1 (the labels shown before go to 0)."""
    global _gauge, _shown
    from prometheus_client import Gauge  # vLLM's dependency: only in a server's process

    if _gauge is None:
        _gauge = Gauge(METRIC, "The draft this engine serves (draftkit): its version (the "
                       "draft dir's name) and the sha256 of its weight files",
                       ["version", "hash"], multiprocess_mode="mostrecent")
    labels = (version or "unknown", digest or "")
    if _shown is not None and _shown != labels:
        _gauge.labels(*_shown).set(0)
    _gauge.labels(*labels).set(1)
    _shown = labels
