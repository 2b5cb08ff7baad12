"""Harvest shard format: plan, write, verify and read safetensors shards of target hidden states.

One harvest dir per split (train in `<run>/harvest`, eval in `<run>/harvest/eval`), same format:

    shard-00000.safetensors     aux [T, A*H], last [T, H] (storage dtype), input_ids [T] int64,
                                loss_mask [T] int64, seq_lens [S] int64, sample_idx [S] int64;
                                whole sequences stored contiguously in dataset order; with
                                harvest.storage_dtype=fp8 also aux_scale [T, A], last_scale
                                [T, 1] (encode.py), and the manifest says format 2
    .progress/shard-00000.json  sidecar written (atomically) after its shard: sha256, counts and
                                the fingerprint of the data + settings the shard was made from
    manifest.json               written last, by rank 0, once every shard is verified

Shard boundaries are a pure function of the sequence lengths and `harvest.shard_tokens` (never
of the process count), so any number of processes writes the same bytes. A shard is first
written to a temp name and renamed, so a partial shard never carries the final name; a shard
counts as done only if its sidecar's fingerprint is the current one and its sha256 matches.
Shards are written by writer.py (raw bytes, hashed as written, no fsync each); the manifest
fsyncs them all once before it is written. `open_harvest` checks the manifest against what the caller expects (target, aux layer ids,
data fingerprint) and the sha256 of every shard before any tensor is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.harvest import encode, writer

FORMAT_VERSION = 1  # plain float states; FP8 shards are format 2, so older builds refuse them
FP8_FORMAT_VERSION = 2
FORMATS = (FORMAT_VERSION, FP8_FORMAT_VERSION)
MANIFEST = "manifest.json"
PROGRESS = ".progress"
STORE_DTYPES = encode.FLOAT_DTYPES


class HarvestError(DraftkitError):
    """A harvest dir that is missing, incomplete, corrupted or made for another target/config."""


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def store_dtype(name: str) -> torch.dtype:
    return encode.float_dtype(name)


def bytes_per_token(num_aux: int, hidden: int, dtype: str, storage: str = "") -> int:
    """Hidden-state bytes per stored token (encode.py; ids not counted)."""
    return encode.bytes_per_token(num_aux, hidden, dtype, storage)


def format_version(storage: str) -> int:
    return FP8_FORMAT_VERSION if storage == "fp8" else FORMAT_VERSION


ID_BYTES = 16  # per stored token besides the states: input_ids + loss_mask, int64 each
# what a user can do when the shards do not fit the disk (harvest's refusal, the plan's note)
DISK_FIXES = ("train online (train.mode=online: the target in the loop, no hidden states on "
              "disk), harvest fewer samples (data.max_samples=N), or put the shards on a larger "
              "disk (harvest.dir=PATH)")


# ----------------------------------------------------------------------------- planning


def plan_shards(lengths: list[int], shard_tokens: int) -> list[list[int]]:
    """Rows grouped into shards of whole sequences, in order, ~shard_tokens tokens each.

    A shard closes before the sequence that would push it past shard_tokens; a sequence longer
    than shard_tokens gets a shard of its own. E.g. lengths [5, 4, 3, 9], shard_tokens 8 ->
    [[0], [1, 2], [3]].
    """
    plan: list[list[int]] = []
    cur: list[int] = []
    tokens = 0
    for row, n in enumerate(lengths):
        if cur and tokens + n > shard_tokens:
            plan.append(cur)
            cur, tokens = [], 0
        cur.append(row)
        tokens += n
    if cur:
        plan.append(cur)
    return plan


def fingerprint(ds, settings: dict) -> str:
    """sha256 over the dataset rows that are harvested (ids, input_ids, loss_mask) + settings."""
    return artifacts.fingerprint(settings, _row_chunks(ds))


def _row_chunks(ds) -> Iterator:
    import pyarrow.compute as pc

    yield str(len(ds)).encode()
    for table in ds.select_columns(["id", "input_ids", "loss_mask"]).with_format("arrow").iter(
            batch_size=4096):
        yield "\x00".join(map(str, table.column("id").to_pylist())).encode()
        for name in ("input_ids", "loss_mask"):
            col = table.column(name)
            yield pc.list_value_length(col).to_numpy(zero_copy_only=False).astype("int64")
            yield pc.list_flatten(col).to_numpy(zero_copy_only=False).astype("int64")


# ----------------------------------------------------------------------------- writing


def _sidecar(directory: Path, index: int) -> Path:
    return directory / PROGRESS / f"{shard_name(index).removesuffix('.safetensors')}.json"


def write_shard(directory: Path, index: int, tensors: dict[str, torch.Tensor],
                data_fingerprint: str) -> dict:
    """Write one shard atomically, hashed as it is written, then its sidecar; returns the
    manifest entry. Neither is fsynced here (write_manifest does, once)."""
    fmt = FP8_FORMAT_VERSION if "aux_scale" in tensors else FORMAT_VERSION
    # one metadata key: safetensors readers see a plain string map
    meta = {"draftkit": json.dumps({"format": fmt, "shard": index,
                                    "data_fingerprint": data_fingerprint})}
    sha = writer.write_safetensors(directory / shard_name(index), tensors, meta)
    entry = {"file": shard_name(index), "sha256": sha,
             "tokens": int(tensors["input_ids"].numel()),
             "sequences": int(tensors["seq_lens"].numel())}
    writer.write_json(_sidecar(directory, index), {**entry, "data_fingerprint": data_fingerprint})
    return entry


def verified_entry(directory: Path, index: int, data_fingerprint: str) -> dict | None:
    """The manifest entry of a finished shard made from `data_fingerprint`, else None (redo)."""
    side, path = _sidecar(directory, index), directory / shard_name(index)
    if not side.is_file() or not path.is_file():
        return None
    try:
        rec = artifacts.read_json(side)
    except (OSError, ValueError):
        return None
    if rec.get("data_fingerprint") != data_fingerprint:
        return None
    if artifacts.sha256_file(path) != rec.get("sha256"):
        return None
    return {k: rec[k] for k in ("file", "sha256", "tokens", "sequences")}


def clean_dir(directory: Path, num_shards: int, data_fingerprint: str) -> bool:
    """Prepare `directory` for a (re)harvest; True if an older harvest of other data was found.

    Removes temp files of killed writes, shards beyond `num_shards` and, when the manifest's
    fingerprint differs (changed data or settings), the manifest: its shards are then redone
    because their sidecars carry the old fingerprint.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PROGRESS).mkdir(exist_ok=True)
    for tmp in [*directory.glob(".*.tmp"), *(directory / PROGRESS).glob(".*.tmp")]:
        tmp.unlink(missing_ok=True)
    for path in directory.glob("shard-*.safetensors"):
        index = int(path.stem.split("-")[1])
        if index >= num_shards:
            path.unlink(missing_ok=True)
            _sidecar(directory, index).unlink(missing_ok=True)
    manifest = directory / MANIFEST
    stale = False
    if manifest.is_file():
        try:
            stale = artifacts.read_json(manifest).get("data_fingerprint") != data_fingerprint
        except (OSError, ValueError):
            stale = True
        if stale:
            manifest.unlink()
    return stale


def write_manifest(directory: Path, header: dict, entries: list[dict]) -> dict:
    """fsync every shard and sidecar once, then write the manifest that promises them."""
    writer.fsync_files([p for e in entries for p in (
        directory / e["file"], _sidecar(directory, int(e["file"][6:11])))])
    manifest = {
        "format": format_version(header.get("storage_dtype", "")),
        **header,
        "shards": entries,
        "total_tokens": sum(e["tokens"] for e in entries),
        "total_sequences": sum(e["sequences"] for e in entries),
        "complete": True,
    }
    artifacts.write_json_atomic(directory / MANIFEST, manifest)
    return manifest


# ----------------------------------------------------------------------------- reading

_FIX = "rerun `draftkit harvest RUN` (verified shards are kept, the others are redone)"


class HarvestSet:
    """Read access to a verified harvest dir: sequences in stored order or by index.

    Each shard is sha256-checked before its first tensor is read (all at `open_harvest` unless
    `lazy=True`). Sequences are sliced from memory-mapped shards with `safe_open`.
    """

    def __init__(self, directory: Path, manifest: dict):
        self.dir = Path(directory)
        self.manifest = manifest
        self.aux_layer_ids: list[int] = list(manifest["aux_layer_ids"])
        self.hidden_size: int = int(manifest["target"]["hidden_size"])
        self.dtype: str = manifest["dtype"]  # what readers get back (fp8 is decoded to it)
        self.storage: str = manifest.get("storage_dtype", "")
        self._verified: set[int] = set()
        self._handles: dict[int, object] = {}
        self._index: list[tuple[int, int, int]] = []  # sequence -> (shard, start, end)
        self._sample_idx: list[int] = []

    def __len__(self) -> int:
        return int(self.manifest["total_sequences"])

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["total_tokens"])

    @property
    def num_shards(self) -> int:
        return len(self.manifest["shards"])

    def lengths(self) -> list[int]:
        return [end - start for _, start, end in self._index]

    def sample_indices(self) -> list[int]:
        """Row in the prepared split of each stored sequence."""
        return list(self._sample_idx)

    def verify(self, indices: list[int] | None = None) -> None:
        """sha256 of each shard against the manifest; HarvestError naming the first bad shard."""
        for i in range(self.num_shards) if indices is None else indices:
            if i in self._verified:
                continue
            entry = self.manifest["shards"][i]
            path = self.dir / entry["file"]
            if not path.is_file():
                raise HarvestError(f"harvest shard {path} is missing; {_FIX}")
            if artifacts.sha256_file(path) != entry["sha256"]:
                raise HarvestError(f"harvest shard {path} is corrupted (sha256 differs from "
                                   f"{self.dir / MANIFEST}); delete it and {_FIX}")
            self._verified.add(i)

    def _handle(self, shard: int):
        """The open (memory-mapped) shard, sha256-verified before its first use."""
        self.verify([shard])
        if shard not in self._handles:
            self._handles[shard] = self._open(shard)
        return self._handles[shard]

    def _open(self, shard: int):
        from safetensors import safe_open

        path = self.dir / self.manifest["shards"][shard]["file"]
        try:
            return safe_open(path, framework="pt")
        except Exception as e:  # safetensors raises several types
            raise HarvestError(f"harvest shard {path} cannot be read ({e}); {_FIX}") from e

    def _build_index(self) -> None:
        """Sequence -> (shard, start, end) from each shard's seq_lens (checked vs the manifest)."""
        width = len(self.aux_layer_ids) * self.hidden_size
        for i, entry in enumerate(self.manifest["shards"]):
            f = self._handles.get(i) or self._open(i)  # header + seq_lens only; not kept open
            try:
                lens = f.get_tensor("seq_lens").tolist()
                sample_idx = f.get_tensor("sample_idx").tolist()
                aux_shape = list(f.get_slice("aux").get_shape())
            except Exception as e:  # safetensors raises several types
                raise HarvestError(f"harvest shard {self.dir / entry['file']} cannot be read "
                                   f"({e}); {_FIX}") from e
            if sum(lens) != entry["tokens"] or len(lens) != entry["sequences"] or (
                    aux_shape != [entry["tokens"], width]):
                raise HarvestError(f"harvest shard {self.dir / entry['file']} does not match "
                                   f"its manifest entry (tokens/sequences/shape); {_FIX}")
            start = 0
            for n in lens:
                self._index.append((i, start, start + n))
                start += n
            self._sample_idx += sample_idx

    def _read(self, f, start: int, end: int) -> dict[str, torch.Tensor]:
        """Tokens [start, end) of an open shard: aux, last (in `dtype`), input_ids, loss_mask."""
        out = {name: f.get_slice(name)[start:end] for name in ("input_ids", "loss_mask")}
        for name in ("aux", "last"):
            q = f.get_slice(name)[start:end]
            scale = f.get_slice(f"{name}_scale")[start:end] if self.storage == "fp8" else None
            out[name] = q if scale is None else encode.decode(q, scale,
                                                              store_dtype(self.dtype))
        return out

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Sequence i: aux [T, A*H], last [T, H] (`dtype`), input_ids [T], loss_mask [T]."""
        shard, start, end = self._index[i]
        return self._read(self._handle(shard), start, end)

    def gather(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """Sequences `indices` (any order), each shard opened once and closed after: memory-mapped
        slices are copied out (a slice is a view that keeps its whole shard mapped), so one shard
        at a time is mapped, however many shards a batch draws from (flat RSS at any size)."""
        by_shard: dict[int, list[int]] = {}
        for pos, i in enumerate(indices):
            by_shard.setdefault(self._index[i][0], []).append(pos)
        out: list[dict[str, torch.Tensor]] = [{} for _ in indices]
        for shard, positions in by_shard.items():
            self.verify([shard])
            with self._open(shard) as f:
                for pos in positions:
                    _, start, end = self._index[indices[pos]]
                    out[pos] = {name: t.clone() if self.storage != "fp8" or name not in (
                        "aux", "last") else t for name, t in self._read(f, start, end).items()}
        return out

    def __getstate__(self) -> dict:  # DataLoader workers: open shard handles stay behind
        return {**self.__dict__, "_handles": {}}

    def sequences(self) -> Iterator[dict[str, torch.Tensor]]:
        """Every sequence in stored order (= the prepared split's order)."""
        for i in range(len(self)):
            yield self[i]

    def shard(self, index: int) -> dict[str, torch.Tensor]:
        """All tensors of one shard (bulk reads: one call instead of one per sequence)."""
        f = self._handle(index)
        out = {name: f.get_tensor(name) for name in f.keys()}
        if self.storage == "fp8":  # decoded like every other read: the scales are not returned
            for name in ("aux", "last"):
                out[name] = encode.decode(out[name], out.pop(f"{name}_scale"),
                                          store_dtype(self.dtype))
        return out


def _check_expectations(directory: Path, manifest: dict, target_name: str | None,
                        aux_layer_ids: list[int] | None, data_fingerprint: str | None) -> None:
    have = manifest["target"]["name"]
    if target_name is not None and target_name != have:
        raise HarvestError(f"harvest at {directory} was made with target {have!r}, not "
                           f"{target_name!r}; {_FIX} for this run's target")
    if aux_layer_ids is not None and list(aux_layer_ids) != list(manifest["aux_layer_ids"]):
        raise HarvestError(f"harvest at {directory} holds aux layer ids "
                           f"{manifest['aux_layer_ids']}, but {list(aux_layer_ids)} were asked "
                           f"for (draft.aux_layer_ids); {_FIX} with the current config")
    if data_fingerprint is not None and data_fingerprint != manifest["data_fingerprint"]:
        raise HarvestError(f"harvest at {directory} was made from other prepared data or harvest "
                           f"settings (fingerprint {manifest['data_fingerprint'][:12]} != "
                           f"{data_fingerprint[:12]}); {_FIX}")


def open_harvest(harvest_dir: str | Path, target_name: str | None = None,
                 aux_layer_ids: list[int] | None = None, data_fingerprint: str | None = None,
                 lazy: bool = False) -> HarvestSet:
    """Open a complete harvest dir, checking it against the expectations that are given.

    Raises HarvestError when the manifest is missing/incomplete, was made for another target,
    other aux layer ids or other data, or when a shard's sha256 fails (at open, or at the
    shard's first read with lazy=True).
    """
    directory = Path(harvest_dir)
    path = directory / MANIFEST
    if not path.is_file():
        raise HarvestError(f"no complete harvest at {directory} (no {MANIFEST}); {_FIX}")
    try:
        manifest = artifacts.read_json(path)
    except ValueError as e:
        raise HarvestError(f"{path} is not valid JSON ({e}); {_FIX}") from e
    if not manifest.get("complete") or manifest.get("format") not in FORMATS:
        raise HarvestError(f"harvest at {directory} is incomplete or of another format "
                           f"version ({manifest.get('format')}; this draftkit reads "
                           f"{', '.join(map(str, FORMATS))}): upgrade draftkit if a newer one "
                           f"wrote it, else {_FIX}")
    try:
        encode.check_storage(manifest.get("storage_dtype", ""),
                             f"harvest at {directory}: storage_dtype")
    except DraftkitError as e:
        raise HarvestError(str(e)) from None
    _check_expectations(directory, manifest, target_name, aux_layer_ids, data_fingerprint)
    hs = HarvestSet(directory, manifest)
    if not lazy:
        hs.verify()
    hs._build_index()
    return hs
