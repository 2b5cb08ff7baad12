"""How fast this machine computes and moves memory: a matmul's FLOP/s per dtype and a copy's
bytes/s, measured once per (device, CPU/GPU model, torch) and cached in
$DRAFTKIT_HOME/hardware.json beside the bf16 speedup (core/hardware.py).

These two figures are what `draftkit plan` (init/plan.py) scales a target's shapes by: a
forward is compute-bound (2 x params FLOPs per token), one decode step of a batch is bounded by
reading the weights once. They are a floor to calibrate from, not a benchmark: the planned
times come out as estimates and say so. A measurement takes well under a second.
"""

from __future__ import annotations

import json
import time

import torch

from draftkit.core import artifacts, hardware

CACHE = "hardware.json"


def _best(fn, reps: int) -> float:
    """Best wall time of `fn` over `reps` calls after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_matmul_flops(device: str, dtype: torch.dtype, reps: int = 3) -> float:
    """FLOP/s of an [n, n] x [n, n] matmul (n = 1024 on a CPU, 8192 on a GPU)."""
    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)  # [n, n]
    b = torch.randn(n, n, device=device).to(dtype)  # [n, n]

    def run():
        a @ b  # [n, n]
        _sync(device)
    return 2 * n**3 / _best(run, reps)


def measure_bandwidth(device: str, reps: int = 3) -> float:
    """Bytes/s of copying a buffer far larger than the caches (read + write counted)."""
    nbytes = (1 << 30) if device == "cuda" else (128 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)

    def run():
        dst.copy_(src)
        _sync(device)
    return 2 * nbytes / _best(run, reps)


def _key(hw: hardware.Hardware, device: str) -> str:
    name = hw.cuda_name if device == "cuda" else f"{hw.cpu_model}|{','.join(hw.cpu_flags)}"
    return f"speed|{device}|{name}|{torch.__version__}"


def machine_speed(device: str | None = None, hw: hardware.Hardware | None = None) -> dict:
    """{'device', 'flops': {dtype: FLOP/s}, 'bandwidth': bytes/s, 'measured': time} of `device`
    (default: where torch computes), measured once and cached."""
    hw = hw or hardware.detect()
    device = device or hw.device
    path = artifacts.home() / CACHE
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    key = _key(hw, device)
    if key not in cache:
        dtypes = ["float32", hardware.resolve("auto", device, hw)]
        cache[key] = {"device": device,
                      "flops": {d: measure_matmul_flops(device, hardware.TORCH_DTYPES[d])
                                for d in dict.fromkeys(dtypes)},
                      "bandwidth": measure_bandwidth(device),
                      "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
        try:
            artifacts.write_json_atomic(path, cache)
        except OSError:
            pass  # a read-only home: measure again next time
    return cache[key]


def flops(speed: dict, dtype: str) -> float:
    """FLOP/s of `dtype` on the measured device (fp32's where that dtype was not measured)."""
    return float(speed["flops"].get(dtype, speed["flops"]["float32"]))
