"""The prepared-data artifact's reader: `<run>/data/{train,eval}` (Arrow, one conversation per
row) and `<run>/data/token_freqs.safetensors`. Harvest and train read prepare's output only
through here."""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError

SPLITS = ("train", "eval")
COUNTS_FILE = "token_freqs.safetensors"


def load_split(run_dir: str | Path, split: str):
    """The prepared `train` or `eval` split as a `datasets.Dataset`."""
    import datasets

    if split not in SPLITS:
        raise DraftkitError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    data_dir = RunPaths(Path(run_dir)).data
    path = data_dir / split
    if not (data_dir / "meta.json").is_file() or not path.is_dir():
        raise DraftkitError(f"no prepared data at {path}; run `draftkit prepare {run_dir}` first")
    return datasets.load_from_disk(str(path))


def load_token_counts(run_dir: str | Path) -> torch.Tensor:
    """counts [target_vocab] int64 over loss-masked train tokens."""
    from safetensors.torch import load_file

    path = RunPaths(Path(run_dir)).data / COUNTS_FILE
    if not path.is_file():
        raise DraftkitError(f"no token counts at {path}; run `draftkit prepare {run_dir}` first")
    return load_file(str(path))["counts"]
