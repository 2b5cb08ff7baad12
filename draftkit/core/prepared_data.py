"""The prepared-data artifact's reader: `<run>/data/{train,eval}` (Arrow, one conversation per
row) and `<run>/data/token_freqs.safetensors`. Harvest, train, export, eval and the draft vocab
(drafts' token counts) read prepare's output only through here, given the data dir
(`RunPaths.data`). It lives in core, below drafts, not in prepare/: the prepare stage runs
serving's vLLM engine, and serving asks drafts' kinds."""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError

SPLITS = ("train", "eval")
COUNTS_FILE = "token_freqs.safetensors"
ROW_COLUMNS = ("id", "input_ids", "loss_mask", "length")  # what harvest and train consume


def _prepare_cmd(data_dir: Path) -> str:
    return f"`draftkit prepare {Path(data_dir).parent}`"


def _split_dir(data_dir: Path, split: str) -> Path:
    if split not in SPLITS:
        raise DraftkitError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return Path(data_dir) / split


def load_split(data_dir: str | Path, split: str):
    """The complete prepared `train` or `eval` split (meta.json written) as a datasets.Dataset."""
    import datasets

    path = _split_dir(data_dir, split)
    if not (Path(data_dir) / "meta.json").is_file() or not path.is_dir():
        raise DraftkitError(f"no prepared data at {path}; run {_prepare_cmd(data_dir)} first")
    return datasets.load_from_disk(str(path))


def load_rows(data_dir: str | Path, split: str):
    """The split's ROW_COLUMNS as a datasets.Dataset; None for a missing eval split (it is
    optional), an error for a missing train split or a column this draftkit needs."""
    import datasets

    path = _split_dir(data_dir, split)
    if not path.is_dir():
        if split == "eval":
            return None
        raise DraftkitError(f"no prepared data at {path}: run {_prepare_cmd(data_dir)} first")
    ds = datasets.load_from_disk(str(path))
    missing = set(ROW_COLUMNS) - set(ds.column_names)
    if missing:
        raise DraftkitError(f"prepared data at {path} lacks columns {sorted(missing)}; rerun "
                            f"{_prepare_cmd(data_dir)} with this draftkit version")
    return ds.select_columns(list(ROW_COLUMNS))


def load_prompts(data_dir: str | Path, n: int) -> list[list[int]]:
    """The first `n` prompt_ids of the eval split (the prompts eval and export's check serve)."""
    import datasets

    path = _split_dir(data_dir, "eval")
    if not path.is_dir():
        raise DraftkitError(f"no prepared eval split at {path}; run {_prepare_cmd(data_dir)} "
                            "first")
    ds = datasets.load_from_disk(str(path))
    if len(ds) == 0:
        raise DraftkitError(f"the eval split at {path} is empty; raise data.eval_samples and "
                            f"rerun {_prepare_cmd(data_dir)}")
    return [[int(t) for t in p] for p in ds.select(range(min(n, len(ds))))["prompt_ids"]]


def load_token_counts(data_dir: str | Path) -> torch.Tensor:
    """counts [target_vocab] int64 over loss-masked train tokens."""
    from safetensors.torch import load_file

    path = Path(data_dir) / COUNTS_FILE
    if not path.is_file():
        raise DraftkitError(f"no token counts at {path}; run {_prepare_cmd(data_dir)} first")
    return load_file(str(path))["counts"]
