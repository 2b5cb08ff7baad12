"""How hidden states are stored in a shard: a float dtype as is, or FP8 e4m3 with per-token
scales (`harvest.storage_dtype=fp8`), encoded on the device before the copy to the host and
decoded by the reader.

FP8 layout (as speculators stores it, its PR #491: Qwen3-8B EAGLE-3 on math 2.87 AL at k=3 with
FP8 and bf16 states alike). Each token row of `aux` [T, A*H] holds A layer blocks of H; each
block gets its own scale, so a layer with large activations does not flatten a quiet one:

    aux        [T, A*H]  float8_e4m3fn      aux_scale  [T, A]  float32
    last       [T, H]    float8_e4m3fn      last_scale [T, 1]  float32
    value = float(q) * scale,  scale = max|x| over the block / 448 (e4m3's largest finite value)

That is (A+1)*H bytes + (A+1)*4 per token, against (A+1)*H*2 in bf16: 4 aux+last blocks of
Qwen3-8B's 4096 take 16,400 bytes instead of 32,768. A reader gets the states back in
`harvest.dtype` (the manifest's `dtype`).
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError

FLOAT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STORAGE = ("", "fp8")  # '' = harvest.dtype as is
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALE_BYTES = 4  # one float32 scale per block per token


def float_dtype(name: str) -> torch.dtype:
    if name not in FLOAT_DTYPES:
        raise DraftkitError(f"harvest.dtype={name!r} is not a storage dtype; choose one of "
                            f"{', '.join(FLOAT_DTYPES)}")
    return FLOAT_DTYPES[name]


def check_storage(storage: str, where: str = "harvest.storage_dtype") -> str:
    """The storage name, or a clear error for one this build does not know (a shard written by
    a newer draftkit included)."""
    if storage not in STORAGE:
        raise DraftkitError(f"{where}={storage!r} is a hidden-state storage this draftkit does "
                            f"not know; it reads '' (harvest.dtype as is) and 'fp8' (e4m3 with "
                            "per-token scales). Upgrade draftkit, or rerun `draftkit harvest` "
                            "with a storage it knows")
    return storage


def bytes_per_token(num_aux: int, hidden: int, dtype: str, storage: str = "") -> int:
    """Hidden-state bytes per stored token: (A aux + 1 last) * H * itemsize, plus the per-token
    scales of fp8 (ids not counted)."""
    blocks = num_aux + 1
    if check_storage(storage) == "fp8":
        return blocks * (hidden + SCALE_BYTES)
    return blocks * hidden * float_dtype(dtype).itemsize


def encode(x: torch.Tensor, groups: int, dtype: torch.dtype, storage: str) -> dict[str, torch.Tensor]:
    """x [..., G*H] (any float dtype, any device) -> {"q": [..., G*H]} in `dtype`, or for fp8
    {"q": [..., G*H] e4m3, "scale": [..., G] float32}. Runs where x is (the GPU, before the
    copy to the host: half the bytes cross PCIe)."""
    if storage != "fp8":
        return {"q": x.to(dtype)}
    blocks = x.float().unflatten(-1, (groups, -1))  # [..., G, H]
    scale = blocks.abs().amax(-1).div(FP8_MAX)  # [..., G]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero block: 1
    q = (blocks / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)  # [..., G, H]
    return {"q": q.flatten(-2), "scale": scale}


def decode(q: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `encode`: [..., G*H] in `dtype` (scale None: q is already a float)."""
    if scale is None:
        return q.to(dtype)
    blocks = q.float().unflatten(-1, (scale.shape[-1], -1))  # [..., G, H]
    return (blocks * scale.float().unsqueeze(-1)).flatten(-2).to(dtype)
