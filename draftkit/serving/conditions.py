"""The engine conditions a speed measurement holds for: what `draftkit eval` records beside its
serving choice (eval/choice.py, serving.json's `measured.engine`) and what an RL loop's engine
is compared against before `method="auto"` serves a speculative pick (rl/in_loop.py).

    device                 cpu | cuda
    model                  the CPU's or the GPU's model name
    tensor_parallel_size   the engine's TP
    dtype                  the engine's compute dtype
    cpu_cores_per_worker   CPU only: the cores each vLLM worker is given, from
                           VLLM_CPU_OMP_THREADS_BIND where it is a mask, else this process's
                           cores shared by the node's workers (eval: one engine; a colocated
                           RL loop: one worker per trainer process, LOCAL_WORLD_SIZE), a
                           count of what the node gives, not of the threads vLLM then binds

On a CPU a speculative method pays only where the target's verify pass has compute to spare,
so a pick measured with 2 cores per worker does not vouch for a worker on 1 (a 2-process TRL
loop on the 2 cores eval measured on: results/bench_trl_2proc.md). Prompts are not compared:
serving.json measured the run's eval prompts, the loop samples its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from draftkit.core import artifacts, engine_settings, hardware
from draftkit.serving.speculative import SERVING_FILE

KEYS = ("device", "model", "tensor_parallel_size", "dtype", "cpu_cores_per_worker")


def cores_in_mask(mask: str | None, local_rank: int = 0) -> int | None:
    """The cores VLLM_CPU_OMP_THREADS_BIND gives worker `local_rank` ('0-1', '0|1', '0,2-3'),
    None where it is no mask (unset, auto, all, nobind)."""
    if not mask or mask in ("auto", "nobind", "all"):
        return None
    from vllm.utils.cpu_resource_utils import parse_id_list  # the mask's own parser

    lists = mask.split("|")
    return len(parse_id_list(lists[min(local_rank, len(lists) - 1)]))


def engine(tp: int, workers_on_node: int, dtype: str, bind: str | None = None,
           local_rank: int = 0, hw: hardware.Hardware | None = None) -> dict:
    """The conditions of an engine of TP `tp` computing in `dtype`, one of `workers_on_node`
    vLLM workers on this node, threads bound by mask `bind` (None: vLLM's own binding)."""
    hw = hw or hardware.detect()
    out = {"device": hw.device, "tensor_parallel_size": int(tp), "dtype": dtype}
    if hw.device == "cuda":
        return {**out, "model": hw.cuda_name}
    per = cores_in_mask(bind, local_rank) or max(
        1, len(engine_settings.usable_cores()) // max(1, workers_on_node))
    return {**out, "model": hw.cpu_model, "cpu_cores_per_worker": per}


def differences(measured: dict | None, here: dict) -> list[str]:
    """How `here` differs from the `measured` conditions, one phrase each ('cpu_cores_per_worker:
    measured 2, here 1'); every key where nothing was recorded (serving.json from before)."""
    if not measured:
        return ["no engine conditions recorded (serving.json from an older draftkit)"]
    return [f"{k}: measured {measured.get(k)}, here {here.get(k)}" for k in KEYS
            if measured.get(k) != here.get(k)]


def fix(here: dict) -> str:
    """The `draftkit eval` that measures under the conditions `here`: on this machine, at its TP
    and dtype, each worker bound to as many cores as here."""
    keys = [f"engine.tensor_parallel_size={here['tensor_parallel_size']}",
            f"eval.dtype={here['dtype']}"]
    if here.get("cpu_cores_per_worker"):
        n = here["cpu_cores_per_worker"]
        keys.append(f"engine.cpu_threads_bind={'0' if n == 1 else f'0-{n - 1}'}")
    return f"`draftkit eval RUN {' '.join(keys)}` on a {here['device']} {here['model']}"


def of_loop(engine_kwargs: dict, dtype: str) -> dict:
    """The conditions of an RL loop's engine started with LLM keywords `engine_kwargs` (its TP;
    with TRL's external launcher each trainer process is a worker: LOCAL_WORLD_SIZE of them on
    this node) computing in `dtype` (a config value: auto resolves here)."""
    tp = int(engine_kwargs.get("tensor_parallel_size") or 1)
    external = engine_kwargs.get("distributed_executor_backend") == "external_launcher"
    return engine(tp, int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if external else tp,
                  hardware.resolve(dtype, key="DraftkitConfig.dtype"),
                  os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                  int(os.environ.get("LOCAL_RANK", "0")) if external else 0)


def unvouched(export_dir: str | Path, engine_kwargs: dict, dtype: str) -> str | None:
    """Why the speed figures of `export_dir`'s serving.json do not hold for a loop's engine
    (of_loop), naming each difference and the fix; None where they hold."""
    serving = artifacts.read_json(Path(export_dir) / SERVING_FILE)
    here = of_loop(engine_kwargs, dtype)
    diffs = differences((serving.get("measured") or {}).get("engine"), here)
    if not diffs:
        return None
    return (f"serving.json's pick was measured under other engine conditions than this loop's "
            f"({'; '.join(diffs)}), so its speedup does not carry over: "
            "DraftkitConfig(method='auto') serves no speculation. Measure under the loop's "
            f"conditions ({fix(here)}) and export again, or name a method "
            "(DraftkitConfig(method='draft'|'ngram'|'suffix'))")
