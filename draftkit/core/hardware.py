"""What the machine computes natively, and the one home for dtype names and `auto`.

Every compute dtype in a run config (`target.dtype`, `train.dtype`, `data.regen_dtype`,
`eval.dtype`) may say `auto`, resolved here from the hardware:
- CUDA with bf16 support -> bfloat16 (fp16 on older GPUs);
- a CPU with native bf16 (AVX512-BF16 or AMX) -> bfloat16 if a bf16 matmul measured faster than
  fp32 on it (timed once, cached in $DRAFTKIT_HOME/hardware.json), else float32;
- any other CPU -> float32. Without native bf16 torch emulates it: a 64x576 by 576x1536 matmul
  took 115 ms in bf16 against 1.5 ms in fp32 on an AVX2-only EPYC (docs/design.md).
An explicit dtype still wins; a bf16/fp16 one that this CPU would emulate is warned about.
`DRAFTKIT_CPU_BF16=0` makes `auto` treat the CPU as one without native bf16 (the test suite
sets it, so tests compute the same on every CPU; the AVX2-only behaviour on any machine).
The CPU model and the flags that matter go into every meta.json and results file (`summary`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import time
import warnings
from dataclasses import dataclass, field

import torch

from draftkit.core import artifacts
from draftkit.core.config import ConfigError

AUTO = "auto"
# config spelling -> canonical name; canonical name -> torch dtype
ALIASES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
           "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# /proc/cpuinfo flags that decide a dtype (or explain a slow one)
FLAGS_THAT_MATTER = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile",
                     "amx_bf16", "amx_fp16", "avx512_vnni", "avx_vnni")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
FP16_FLAGS = ("avx512_fp16", "amx_fp16")


class DtypeWarning(UserWarning):
    """An explicit dtype that this machine emulates (much slower than float32)."""


@dataclass(frozen=True)
class Hardware:
    device: str  # cuda | cpu: where torch computes by default
    cpu_model: str
    cpu_flags: tuple[str, ...]  # the subset of FLAGS_THAT_MATTER this CPU has
    torch_cpu_capability: str  # torch's ATen dispatch level (DEFAULT, AVX2, AVX512, ...)
    torch_cpu_bf16: bool  # torch.cpu reports AVX512-BF16 or AMX tiles
    cuda_name: str = ""
    cuda_bf16: bool = False
    bf16_speedup: float | None = field(default=None, compare=False)  # fp32 / bf16 matmul time

    @property
    def cpu_native_bf16(self) -> bool:
        return self.torch_cpu_bf16 or any(f in self.cpu_flags for f in BF16_FLAGS)

    @property
    def cpu_native_fp16(self) -> bool:
        return any(f in self.cpu_flags for f in FP16_FLAGS)


def canonical(name: str, key: str = "dtype") -> str:
    """'bf16' -> 'bfloat16' etc.; 'auto' stays; anything else is a ConfigError naming `key`."""
    if name == AUTO or name in ALIASES.values():
        return name
    if name in ALIASES:
        return ALIASES[name]

    raise ConfigError(f"{key}={name!r} is not a dtype; use auto, bfloat16, float16 or float32")


# ----------------------------------------------------------------------------- detection


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; platform's name elsewhere."""
    model, flags = "", set()
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() == "model name" and not model:
                    model = v.strip()
                elif k.strip() in ("flags", "Features") and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def _torch_cpu() -> tuple[str, bool]:
    cap = str(torch.backends.cpu.get_cpu_capability())
    probes = [getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported",
                                                    "_is_amx_tile_supported")]
    return cap, any(bool(p()) for p in probes if p is not None)


def _measure_bf16_speedup(reps: int = 7) -> float:
    """fp32 time / bf16 time of a [64, 576] x [576, 1536] matmul (best of `reps`, interleaved)."""
    a, b = torch.randn(64, 576), torch.randn(576, 1536)  # [64, 576], [576, 1536]
    pairs = {dt: (a.to(dt), b.to(dt)) for dt in (torch.float32, torch.bfloat16)}
    best = {dt: float("inf") for dt in pairs}
    for _ in range(reps):
        for dt, (x, y) in pairs.items():
            x @ y  # warm
            t0 = time.perf_counter()
            for _ in range(3):
                x @ y  # [64, 1536]
            best[dt] = min(best[dt], time.perf_counter() - t0)
    return best[torch.float32] / best[torch.bfloat16]


def _cached_bf16_speedup(hw: Hardware) -> float:
    """The bf16 speedup of this CPU, measured once per (CPU, flags, torch) and cached."""
    key = f"{hw.cpu_model}|{','.join(hw.cpu_flags)}|{torch.__version__}"
    path = artifacts.home() / "hardware.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = {"bf16_speedup": _measure_bf16_speedup(),
                      "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
        try:
            artifacts.write_json_atomic(path, cache)
        except OSError:
            pass  # a read-only home: measure again next time
    return float(cache[key]["bf16_speedup"])


@functools.lru_cache(maxsize=1)
def detect() -> Hardware:
    """This machine (cached per process); the CPU's bf16 speed is measured only if native."""
    model, flags = _cpuinfo()
    cap, torch_bf16 = _torch_cpu()
    if os.environ.get("DRAFTKIT_CPU_BF16") == "0":
        flags, torch_bf16 = flags - set(BF16_FLAGS) - {"amx_tile"}, False
    cuda = torch.cuda.is_available()
    hw = Hardware(device="cuda" if cuda else "cpu", cpu_model=model,
                  cpu_flags=tuple(f for f in FLAGS_THAT_MATTER if f in flags),
                  torch_cpu_capability=cap, torch_cpu_bf16=torch_bf16,
                  cuda_name=torch.cuda.get_device_name(0) if cuda else "",
                  cuda_bf16=bool(cuda and torch.cuda.is_bf16_supported()))
    return _with_speedup(hw, _cached_bf16_speedup(hw)) if hw.cpu_native_bf16 else hw


def _with_speedup(hw: Hardware, speedup: float) -> Hardware:
    return dataclasses.replace(hw, bf16_speedup=speedup)


def summary(hw: Hardware | None = None) -> dict:
    """What every meta.json and results file records about the machine."""
    hw = hw or detect()
    out = {"device": hw.device, "cpu_model": hw.cpu_model, "cpu_flags": list(hw.cpu_flags),
           "cpu_native_bf16": hw.cpu_native_bf16, "torch_cpu_capability": hw.torch_cpu_capability,
           "cpu_count": os.cpu_count(), "machine": platform.machine()}
    if hw.bf16_speedup is not None:
        out["cpu_bf16_matmul_speedup"] = round(hw.bf16_speedup, 2)
    if hw.device == "cuda":
        out.update(cuda_name=hw.cuda_name, cuda_bf16=hw.cuda_bf16)
    return out


# ----------------------------------------------------------------------------- resolution


def _device_type(device: str | torch.device | None, hw: Hardware) -> str:
    return hw.device if device is None else torch.device(device).type


def resolve(name: str, device: str | torch.device | None = None, hw: Hardware | None = None,
            key: str = "dtype") -> str:
    """Canonical dtype name for config value `name` on `device` (default: hw.device).

    `auto`: bf16 on CUDA with bf16 (else fp16); on a CPU, bf16 only when it is native and
    measured faster than fp32, else fp32. Explicit names pass through, with a DtypeWarning when
    the CPU would emulate them."""
    name = canonical(name, key)
    hw = hw or detect()
    dev = _device_type(device, hw)
    if name == AUTO:
        if dev == "cuda":
            return "bfloat16" if hw.cuda_bf16 else "float16"
        fast = hw.cpu_native_bf16 and (hw.bf16_speedup is None or hw.bf16_speedup > 1.0)
        return "bfloat16" if fast else "float32"
    if dev == "cpu" and emulated(name, hw):
        warnings.warn(f"{key}={name} on this CPU ({hw.cpu_model}, flags "
                      f"{' '.join(hw.cpu_flags) or 'none'}) is emulated by torch and runs far "
                      f"slower than float32; set {key}=auto or float32", DtypeWarning,
                      stacklevel=2)
    return name


def emulated(name: str, hw: Hardware | None = None) -> bool:
    """True if this CPU has no native arithmetic for dtype `name`."""
    hw = hw or detect()
    name = canonical(name)
    return (name == "bfloat16" and not hw.cpu_native_bf16) or (
        name == "float16" and not hw.cpu_native_fp16)


def torch_dtype(name: str, device: str | torch.device | None = None, hw: Hardware | None = None,
                key: str = "dtype") -> torch.dtype:
    """The torch dtype for config value `name` on `device` (see `resolve`)."""
    return TORCH_DTYPES[resolve(name, device, hw, key)]


def compute_dtypes(cfg, hw: Hardware | None = None) -> dict[str, str]:
    """What each compute dtype of run config `cfg` resolves to on this machine."""
    hw = hw or detect()
    train_dev = None if cfg.train.device == "auto" else cfg.train.device
    return {
        "target.dtype": resolve(cfg.target.dtype, None, hw, "target.dtype"),
        "train.dtype": resolve(cfg.train.dtype, train_dev, hw, "train.dtype"),
        "data.regen_dtype": resolve(cfg.data.regen_dtype, None, hw, "data.regen_dtype"),
        "eval.dtype": resolve(cfg.eval.dtype, None, hw, "eval.dtype"),
    }


def autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast computes in on this device type; float32 when it is off, or when the
    device type has no autocast at all."""
    try:
        on = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # "unknown device type for autocast"
        return torch.float32
    return torch.get_autocast_dtype(device_type) if on else torch.float32
