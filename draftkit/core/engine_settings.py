"""What every vLLM engine draftkit starts is given, resolved from the run config's `engine`
section on this machine the way dtypes are (core/hardware.py): `auto` becomes a value here, and
serving/vllm_engine.py's `start` is the one place that turns it into `LLM(...)` keywords and
environment. `draftkit env` prints the result and the reason for each value.

- tensor_parallel_size: auto = 1 on a CPU; on GPUs the fewest (a power of two dividing the
  target's attention heads) whose share of the target's weights fills at most WEIGHT_SHARE of
  each GPU's vLLM budget, leaving the rest to the KV cache.
- data_parallel_size: engine replicas for regeneration (vLLM's data parallel; GPUs).
- enforce_eager: auto = CUDA graphs on CUDA; on a CPU eager (vLLM's compile takes minutes to
  start on 2 cores) unless a measurement recorded here says compiled is faster.
- gpu_memory_utilization: 0 = vLLM's default; passed on GPUs only.
- max_num_seqs: 0 = each use's own (regeneration: data.regen_batch_size up to 256).
- cpu_threads_bind (VLLM_CPU_OMP_THREADS_BIND): vLLM's `auto` binding reserves one core for its
  frontend, so on a 2-core machine the engine computes on one. `all` binds every core of this
  process (the frontend then shares them). auto = what `scripts/bench_cpu_bind.py --record`
  measured faster on this CPU, else vLLM's default.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from draftkit.core import artifacts, hardware
from draftkit.core.config import ConfigError

WEIGHT_SHARE = 0.6  # of a GPU's vLLM memory budget the target's weights may take (auto TP)
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default, for the auto TP arithmetic
CACHE = "hardware.json"


@dataclass(frozen=True)
class EngineSettings:
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enforce_eager: bool = True
    gpu_memory_utilization: float | None = None  # None = vLLM's default
    max_num_seqs: int | None = None  # None = the caller's
    cpu_threads_bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND; None = vLLM's default
    why: dict[str, str] = field(default_factory=dict, compare=False)

    def llm_kwargs(self) -> dict:
        """The `LLM(...)` keywords these settings set (max_num_seqs: the caller's default)."""
        out = {"tensor_parallel_size": self.tensor_parallel_size,
               "enforce_eager": self.enforce_eager}
        if self.data_parallel_size > 1:
            out["data_parallel_size"] = self.data_parallel_size
        if self.gpu_memory_utilization is not None:
            out["gpu_memory_utilization"] = self.gpu_memory_utilization
        return out

    def env(self) -> dict[str, str]:
        """Environment the engine's processes must start with."""
        return {} if self.cpu_threads_bind is None else {
            "VLLM_CPU_OMP_THREADS_BIND": self.cpu_threads_bind}


# ----------------------------------------------------------------------------- measured choices


def _key(what: str, hw: hardware.Hardware) -> str:
    return f"{what}|{hw.cpu_model}|{os.cpu_count()}"


def _cache() -> dict:
    try:
        return json.loads((artifacts.home() / CACHE).read_text())
    except (OSError, ValueError):
        return {}


def measured(what: str, hw: hardware.Hardware | None = None) -> dict | None:
    """A choice recorded for this CPU ('cpu_threads_bind' or 'cpu_enforce_eager'), or None."""
    return _cache().get(_key(what, hw or hardware.detect()))


def record(what: str, choice, figures: dict, hw: hardware.Hardware | None = None) -> None:
    """Record the measured `choice` for this CPU (the benchmark scripts call this)."""
    cache = _cache()
    cache[_key(what, hw or hardware.detect())] = {
        "choice": choice, "figures": figures, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    artifacts.write_json_atomic(artifacts.home() / CACHE, cache)


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))


def all_cores_mask() -> str:
    """VLLM_CPU_OMP_THREADS_BIND binding every core this process may run on, e.g. '0-1'."""
    cores = usable_cores()
    runs, start = [], cores[0]
    for a, b in zip(cores, [*cores[1:], None], strict=True):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a != start else str(a))
            start = b
    return ",".join(runs)


# ----------------------------------------------------------------------------- resolution


def _tensor_parallel(ec, params_b: float, heads: int, dtype: str, hw) -> tuple[int, str]:
    if ec.tensor_parallel_size:
        return ec.tensor_parallel_size, "set"
    if hw.device != "cuda":
        return 1, "a CPU engine runs one rank"
    import torch

    gpus, total = torch.cuda.device_count(), torch.cuda.mem_get_info()[1]
    util = ec.gpu_memory_utilization or VLLM_GPU_MEMORY_UTILIZATION
    weights = params_b * 1e9 * hardware.TORCH_DTYPES[dtype].itemsize
    tp = 1
    while tp < gpus and (weights / tp > WEIGHT_SHARE * util * total or (heads and heads % tp)):
        tp *= 2
    tp = min(tp, gpus)
    return tp, (f"{weights / 1e9:.0f} GB of {dtype} weights over {tp} of {gpus} GPU(s) of "
                f"{total / 2**30:.0f} GiB (at most {WEIGHT_SHARE:.0%} of each one's budget)")


def _eager(ec, hw) -> tuple[bool, str]:
    if isinstance(ec.enforce_eager, bool):
        return ec.enforce_eager, "set"
    if hw.device == "cuda":
        return False, "CUDA graphs on CUDA"
    rec = measured("cpu_enforce_eager", hw)
    if rec is not None:
        return bool(rec["choice"]), f"measured on this CPU ({rec['measured']})"
    return True, "CPU: vLLM's compile takes minutes on few cores; no measurement says otherwise"


def _bind(ec, hw) -> tuple[str | None, str]:
    mode = ec.cpu_threads_bind
    if hw.device == "cuda":
        return None, "GPU engine"
    if mode == "auto":
        rec = measured("cpu_threads_bind", hw)
        if rec is None:
            return None, "vLLM's default (one core kept for its frontend); not yet measured here"
        mode = rec["choice"]
        why = f"measured faster on this CPU ({rec['measured']})"
    else:
        why = "set"
    if mode == "vllm":
        return None, f"vLLM's default (one core kept for its frontend); {why}"
    if mode == "all":
        return all_cores_mask(), f"every core bound to the engine; {why}"
    return mode, why  # a literal vLLM mask ('0-1', 'nobind', ...)


def resolve(ec, params_b: float = 0.0, num_heads: int = 0, dtype: str = "auto",
            hw: hardware.Hardware | None = None, max_num_seqs: int | None = None,
            regeneration: bool = False) -> EngineSettings:
    """The engine settings of config section `ec` (config.EngineConfig) for a target of
    `params_b` billion parameters with `num_heads` attention heads computing in `dtype`.
    `max_num_seqs` is the caller's default (engine.max_num_seqs wins when set); data parallel
    applies to regeneration engines only."""
    hw = hw or hardware.detect()
    if not ec.cpu_threads_bind:
        raise ConfigError("engine.cpu_threads_bind must be auto, vllm, all or a "
                          "VLLM_CPU_OMP_THREADS_BIND mask such as 0-1")
    tp, tp_why = _tensor_parallel(ec, params_b, num_heads, hardware.resolve(dtype, hw=hw), hw)
    eager, eager_why = _eager(ec, hw)
    bind, bind_why = _bind(ec, hw)
    dp = ec.data_parallel_size if regeneration else 1
    seqs = ec.max_num_seqs or max_num_seqs
    gpu_util = ec.gpu_memory_utilization if hw.device == "cuda" and ec.gpu_memory_utilization \
        else None
    return EngineSettings(
        tensor_parallel_size=tp, data_parallel_size=max(1, dp), enforce_eager=eager,
        gpu_memory_utilization=gpu_util, max_num_seqs=seqs, cpu_threads_bind=bind,
        why={"tensor_parallel_size": tp_why, "enforce_eager": eager_why,
             "cpu_threads_bind": bind_why,
             "data_parallel_size": "regeneration only" if dp > 1 else "one engine",
             "gpu_memory_utilization": "set" if gpu_util else "vLLM's default",
             "max_num_seqs": "set" if ec.max_num_seqs else "the use's own"})


def for_run(cfg, dtype: str = "auto", max_num_seqs: int | None = None,
            regeneration: bool = False, hw: hardware.Hardware | None = None) -> EngineSettings:
    """The engine settings of run config `cfg` (config.RunConfig) for its target."""
    t = cfg.target
    return resolve(cfg.engine, t.params_b, t.num_attention_heads, dtype, hw, max_num_seqs,
                   regeneration)
