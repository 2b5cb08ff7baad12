"""Hardware profiles: what `draftkit plan RUN --hardware NAME` plans with on a machine that is
not this one. Each is built from `scripts/bench_scale.py` results (results/gpu_check/<sha>/
bench_scale_cuda.json from lent GPUs, results/bench_scale*.json from CPUs) by
scripts/hardware_profiles.py, stored versioned in draftkit/_data/hardware_profiles.json, and
names every run it came from (file, commit, target).

A profile holds achieved rates that carry to another target of the same kind by FLOPs: the
forward's FLOP/s (bare forward tokens/s x 2 x params), head training's (tokens/s x 6 x the
head's trained params x TTT steps, plan.py's count), harvest's share of the forward, and the
device's memory and copy bandwidth (the vendors' sheets on a GPU). With several runs of one
kind, each rate is their median. `h100` has no run of its own: it is the H200 profile with the
H100's memory and bandwidth (same dense bf16 compute on the sheet), marked `derived`.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from draftkit.core.errors import DraftkitError

VERSION = 1
STORED = Path(__file__).resolve().parents[1] / "_data" / "hardware_profiles.json"
MIN_PARAMS_B = 0.05  # smaller bench targets are overhead-bound: they calibrate nothing
# the vendors' sheets: memory, HBM bandwidth, dense bf16 FLOP/s
GPU_SHEETS = {
    "h200": {"match": "H200", "memory_bytes": 141e9, "bandwidth": 4.8e12, "bf16_flops": 989.5e12},
    "h100": {"match": "H100", "memory_bytes": 80e9, "bandwidth": 3.35e12, "bf16_flops": 989.5e12},
}
CPU_BANDWIDTH = 10e9  # assumed copy bandwidth of a measured CPU kind (bench_scale records none)


def kind_name(hw: dict) -> str:
    """'h200' for an NVIDIA H200, else a CPU kind from its model and native bf16: e.g.
    'cpu-intel-xeon-processor-2-50ghz' or '...-bf16'."""
    if hw.get("device") == "cuda":
        name = hw.get("cuda_name", "")
        for key, sheet in GPU_SHEETS.items():
            if sheet["match"] in name:
                return key
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    slug = re.sub(r"[^a-z0-9]+", "-", hw.get("cpu_model", "cpu").lower().replace("(r)", ""))
    return f"cpu-{slug.strip('-')}" + ("-bf16" if hw.get("cpu_native_bf16") else "")


def _run(path: Path, root: Path) -> dict | None:
    """The rates one bench_scale result gives, or None when it calibrates nothing."""
    res = json.loads(path.read_text())
    if res["target_params_b"] < MIN_PARAMS_B:
        return None
    params, head = res["target_params_b"] * 1e9, res["head_trainable_params_m"] * 1e6
    return {"file": str(path.relative_to(root)), "commit": res["git_sha"][:10],
            "target": res["target"], "hardware": res["hardware"],
            "forward_flops_per_s": res["bare_forward"]["tokens_per_s"] * 2 * params,
            "train_flops_per_s": res["train"]["tokens_per_s"] * 6 * head * res["ttt_steps"],
            "harvest_vs_forward": res["harvest_vs_bare"],
            "peak_gib": {k: res[k]["peak_gib"] for k in ("harvest", "train")}}


def build(root: Path) -> dict:
    """Every profile the results under `root` (the repo) give, plus the derived h100."""
    files = sorted((root / "results").glob("bench_scale*.json")) + sorted(
        (root / "results" / "gpu_check").glob("*/bench_scale_*.json"))
    runs: dict[str, list[dict]] = {}
    for path in files:
        run = _run(path, root)
        if run is not None:
            runs.setdefault(kind_name(run["hardware"]), []).append(run)
    profiles = {}
    for name, rs in sorted(runs.items()):
        hw = rs[0]["hardware"]
        sheet = GPU_SHEETS.get(name, {})
        profiles[name] = {
            "device": hw["device"], "machine": hw.get("cuda_name") or hw["cpu_model"],
            "cpu_native_bf16": hw.get("cpu_native_bf16"), "measured": True,
            **{k: statistics.median(r[k] for r in rs) for k in (
                "forward_flops_per_s", "train_flops_per_s", "harvest_vs_forward")},
            "memory_bytes": sheet.get("memory_bytes"),
            "bandwidth": sheet.get("bandwidth", CPU_BANDWIDTH),
            "runs": [{k: r[k] for k in ("file", "commit", "target")} for r in rs]}
    if "h200" in profiles and "h100" not in profiles:
        h = GPU_SHEETS["h100"]
        profiles["h100"] = {**profiles["h200"], "machine": "NVIDIA H100 (derived)",
                            "measured": False, "memory_bytes": h["memory_bytes"],
                            "bandwidth": h["bandwidth"],
                            "derived": "the h200 profile's rates (the same dense bf16 "
                                       "FLOP/s on the sheets) with the H100's memory and "
                                       "bandwidth; no H100 run"}
    return {"version": VERSION, "profiles": profiles}


def load(path: Path = STORED) -> dict[str, dict]:
    data = json.loads(path.read_text())
    if data.get("version") != VERSION:
        raise DraftkitError(f"{path} holds hardware profiles of version {data.get('version')}; "
                            f"this draftkit reads version {VERSION}: rebuild them with "
                            "scripts/hardware_profiles.py")
    return data["profiles"]


def get(name: str, path: Path = STORED) -> dict:
    """The profile `name`, or an error listing the known ones."""
    profiles = load(path)
    if name not in profiles:
        raise DraftkitError(f"--hardware {name!r} is not a known hardware profile; known: "
                            f"{', '.join(sorted(profiles))} (built from bench_scale results: "
                            "scripts/hardware_profiles.py)")
    return {**profiles[name], "name": name}
