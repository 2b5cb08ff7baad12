"""The main job on the embedded target: init -> prepare -> harvest -> train -> export -> eval ->
export, then vLLM's measured AL and speed for the trained EAGLE-3 draft, and for a DFlash draft
trained from the same data and harvest (the sibling run <name>-dflash), next to vLLM n-gram's and
suffix decoding's (the methods that need no training) on the held-out eval split (k=3, T=0 and
T=1, batch 1, 8 and 16), and on two more prompt splits at batch 16: new problems of the training
templates (what RL sees) and hand-written ones (eval/splits.py). From those rows eval picks the
serving choice (<run>/eval/choice.json), which the last export copies into the export
(serving.json): per batch range the fastest method no slower than no speculation at either
temperature (eval/choice.py); the DFlash rows are measured beside it
(eval.compare_runs), not served by it. Export's own vLLM check is off here: eval serves the
exports right after, in the same engines. The DFlash row costs its training (on the same
harvest: no second prepare or harvest) and one more eval engine. Its trade: it trains half the
head's epochs (DFLASH_EPOCHS_SHARE; a DFlash step costs ~1.8x a head step on the CPU, so its full
epochs took 1147 s against the head's 640 s: docs/benchmarks.md#the-demo), and the batch-1 rows
run on 4 prompts and 96 new tokens below (3 and 64 in the fp32 tier, FP32_OVERRIDES).

    make demo                       # = python scripts/demo.py --dir runs --name demo
    python scripts/demo.py --name demo train.max_steps=100   # extra key=value overrides
    make demo TIER=full RUN=demo-full   # the measured recipe whose head passes n-gram (~1 h)

Every stage resumes, so rerunning after an interruption continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from draftkit import api
from draftkit.core import artifacts, config, hardware
from draftkit.core.errors import DraftkitError

# Sized to finish in under 20 minutes on a 2-core CPU; bench_eagle3.py runs the longer training.
DEMO_OVERRIDES = [
    "data.source=local",
    "data.max_samples=240",  # raised by BF16_OVERRIDES where bf16 is native
    "data.eval_samples=48",
    "data.self_instruct=60",
    "data.regen_max_new_tokens=192",
    "train.epochs=4",
    "eval.num_prompts=16",  # per split; FP32_OVERRIDES lowers it
    # T=1 (RL's rollouts) beside T=0, and batch 16: the serving choice must hold at both
    # temperatures. Paid for with batch-1 rows on 4 prompts (was 8) and 96 new tokens (was 128);
    # the splits move to batch 16 (one engine call instead of two). Batch 32 (eval's default)
    # needs 32 prompts per split: left to `draftkit eval` and scripts/bench_goals.py.
    "eval.max_new_tokens=96",
    "eval.k_values=[3]",
    "eval.temperatures=[0.0,1.0]",
    "eval.batch_sizes=[1,8,16]",  # batch 1: latency-bound, where a draft pays on a CPU
    "eval.latency_prompts=4",  # batch 1 decodes one prompt at a time: the costliest rows
    "eval.splits=[seen-templates,hand-written]",
    "eval.lossless_prompts=4",  # two fp32 engines at batch 1 where bf16 is native
    "export.check=false",
]
# Unique conversations are what the demo's head lacks (train-split sim AL 2.37 vs held-out 1.97
# after 340 x 4 epochs), so each tier buys as many as its CPU affords in 20 minutes (docs/benchmarks.md,
# "`make demo`", has the timings): where bf16 runs on AMX tiles (or a GPU), 600 templated
# problems x 3 epochs (demo9: 16.6 min on an Intel Xeon with AMX); where it runs on AVX512-BF16
# alone, every stage is ~1.6x slower and 600 took 20.4 min (demo12, AMD EPYC), so 500 x 3
# (400 x 5, for bench_learning's epochs finding, took 21.0 min and moved unseen-template AL by
# +0.03 to +0.05: demo16); in fp32 (CPUs without native bf16) vLLM generates 2-3x slower still:
# 240 problems and 8 eval prompts per split (280 x 4 took 18.6 min on the Intel Xeon restricted
# to AVX2, demo10, before the T=1, DFlash and batch-16 rows). With those rows 240 x 4 took 32 min
# (demo26, results/demo/: prepare 360 s, harvest 134, head 323, DFlash 295, eval 796), so the
# fp32 tier also cuts what its eval does not use: answers regenerated to 128 tokens (were 192;
# eval decodes 64 past the prompt), 3 epochs, 64 eval tokens, 3 batch-1 prompts, and one other
# split (hand-written, the prompts unlike training; the held-out split already holds new
# problems of the training templates).
BF16_OVERRIDES = ["data.max_samples=600", "train.epochs=3"]
BF16_NO_AMX_OVERRIDES = ["data.max_samples=500", "train.epochs=3"]
FP32_OVERRIDES = ["data.regen_max_new_tokens=128", "train.epochs=3",
                  "eval.num_prompts=8", "eval.batch_sizes=[1,8]",  # a batch needs its prompts
                  "eval.max_new_tokens=64", "eval.latency_prompts=3",
                  "eval.splits=[hand-written]"]
# `--tier full`: the cheapest recipe measured whose head passes n-gram's AL on every split, unseen
# templates included (bench_learning `sub-2-e5` on `data-1120`: 2.38 / 2.74 / 2.30 vs 2.24 / 2.16 /
# 2.14 for 1.9 CPU-hours on the AMD EPYC; docs/benchmarks.md, "AL against the whole compute"). About an hour
# on 2 cores where bf16 is native (demo20-full: 64 min); longer in fp32 (not measured).
FULL_OVERRIDES = ["data.max_samples=1000", "data.self_instruct=120",
                  "data.substitute_copies=2", "train.epochs=5"]
TIERS = ("auto", "full")
# of the head's train.epochs: the DFlash row's trade for the budget. Measured (fp32, 2-core
# Intel Xeon without bf16): half the epochs from random layers trained in 295 s to AL 1.08 at
# T=0 batch 1 (demo26), from target layers 27-28 in 248 s to AL 1.19 on the fp32 tier's shorter
# answers (demo27, results/demo/); random layers at the full epochs reached AL 1.42 in 1147 s
# under load; --dflash-epochs-share 1 buys AL with time
DFLASH_EPOCHS_SHARE = 0.5


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="runs")
    p.add_argument("--name", default="demo")
    p.add_argument("--tier", choices=TIERS, default="auto",
                   help="auto: sized to 20 minutes on this CPU; full: the recipe that passes n-gram")
    p.add_argument("--dflash-epochs-share", type=float, default=DFLASH_EPOCHS_SHARE,
                   help="the DFlash sibling's epochs as a share of the head's (1.0: the same)")
    p.add_argument("overrides", nargs="*")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run = Path(args.dir) / args.name
    overrides = [*demo_overrides(args.tier), *args.overrides]
    timings: dict[str, float] = {}
    try:
        if not (run / config.CONFIG_NAME).exists():
            api.init("smollm2-135m", "math", name=args.name, runs_dir=args.dir,
                          overrides=overrides)
        for stage in ("prepare", "harvest", "train", "export"):
            _stage(stage, run, overrides, timings)
        sibling = dflash_run(run, overrides, args.dflash_epochs_share)
        dflash = dflash_overrides(run, overrides, args.dflash_epochs_share)
        for stage in ("harvest", "train", "export"):  # its harvest: the head's, verified
            _stage(stage, sibling, dflash, timings, "dflash_")
        result = _stage("evaluate", run, [*overrides, f"eval.compare_runs=[{sibling}]"],
                        timings)
        # eval's pick (<run>/eval/choice.json) into the export: serving.json + README section
        _stage("export", run, overrides, timings, "serving_")
    except DraftkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = _summary(result)
    summary["timings_s"] = timings
    artifacts.write_json_atomic(run / "demo-summary.json", summary)
    print("\n" + json.dumps(summary, indent=2))
    return 0


def _stage(stage: str, run: Path, overrides: list[str], timings: dict, prefix: str = ""):
    t0 = time.perf_counter()
    print(f"\n== draftkit {stage} {run}", flush=True)
    result = getattr(api, stage)(run, overrides=overrides)
    timings[prefix + stage] = time.perf_counter() - t0
    return result


def dflash_run(run: Path, overrides: list[str], share: float = DFLASH_EPOCHS_SHARE) -> Path:
    """The sibling run <name>-dflash: a DFlash draft (configs/dflash-<target>.yaml) of the
    head run's target and recipe on the demo's settings, its data a copy of the head's
    prepared data, its harvest.dir the head's harvest (same data and taps, so the fingerprint
    matches: harvest only verifies the head's shards)."""
    head = config.load(run)
    sibling = run.parent / f"{run.name}-dflash"
    if not (sibling / config.CONFIG_NAME).exists():
        api.init(head.target.name, head.data.recipe, kind="dflash", name=sibling.name,
                 runs_dir=run.parent,
                 overrides=[*dflash_overrides(run, overrides, share),
                            f"harvest.dir={run.resolve() / 'harvest'}"])
    if not (sibling / "data").exists():  # copied whole, then renamed: never half there
        tmp = sibling / ".data.copy"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run / "data", tmp)
        tmp.rename(sibling / "data")
    return sibling


def dflash_overrides(run: Path, overrides: list[str],
                     share: float = DFLASH_EPOCHS_SHARE) -> list[str]:
    """The demo's overrides for the DFlash sibling: `overrides`, then its epochs, a share (at
    least 1 epoch) of the head run's train.epochs."""
    epochs = max(1, round(config.load(run, overrides).train.epochs * share))
    return [*overrides, f"train.epochs={epochs}"]


def demo_overrides(tier: str = "auto") -> list[str]:
    """The demo's budget for this machine: where `auto` resolves to bf16, BF16_OVERRIDES on top
    (BF16_NO_AMX_OVERRIDES on a CPU without AMX tiles), else FP32_OVERRIDES; the `full` tier
    then replaces the data and epochs with FULL_OVERRIDES, keeping the eval settings."""
    if hardware.resolve("auto") != "bfloat16":
        budget = [*DEMO_OVERRIDES, *FP32_OVERRIDES]
    else:
        hw = hardware.detect()
        amx = hw.device != "cpu" or "amx_bf16" in hw.cpu_flags
        budget = [*DEMO_OVERRIDES, *(BF16_OVERRIDES if amx else BF16_NO_AMX_OVERRIDES)]
    return [*budget, *FULL_OVERRIDES] if tier == "full" else budget


def _summary(report: dict) -> dict:
    """vLLM AL and speed (k=3; T=0 in `methods` / `other_splits`, T=1 in the `_t1` keys) per
    method (none, n-gram, suffix, the draft) and batch size of the eval report, side by side
    (a method eval could not serve here says why), the serving choice per batch range, and the
    commit and machine the eval ran on (as every results/ file records them)."""
    t1 = _methods(report, 1.0)
    return {**_methods(report, 0.0), "methods_t1": t1["methods"],
            "other_splits_t1": t1["other_splits"],
            "serving_choice": [{key: p[key] for key in ("batch_from", "batch_to", "method", "k")}
                               | {"speedup": {t: x["speedup"]
                                              for t, x in p["by_temperature"].items()}}
                               for p in report.get("choice", {}).get("ranges", [])],
            "git_sha": report.get("git_sha"), "hardware": report.get("hardware")}


def _methods(report: dict, temperature: float) -> dict:
    """The k=3 rows at one temperature: per method and batch, and per other split."""
    rows: dict[str, dict] = {}
    for r in report.get("vllm", {}).get("rows", []):
        if r["k"] in (3, None) and r["temperature"] == temperature:
            rows.setdefault(r["method"], {})[f"batch_{r['batch_size']}"] = _cell(r, {
                "AL": r.get("acceptance_length"), "tokens_per_step": r.get("tokens_per_step"),
                "per_position": r.get("per_position"),
                "tokens_per_s": r["tokens_per_s"], "speedup": r["speedup"]})
    splits: dict[str, dict] = {}
    for r in report.get("vllm", {}).get("splits", {}).get("rows", []):
        if r["k"] in (3, None) and r["temperature"] == temperature:
            splits.setdefault(r["split"], {})[r["method"]] = _cell(r, {
                "AL": r.get("acceptance_length"), "tokens_per_step": r.get("tokens_per_step"),
                "batch": r["batch_size"], "speedup": r["speedup"]})
    return {"k": 3, "temperature": temperature, "methods": rows, "other_splits": splits,
            "report": report.get("files", {}).get("md")}


def _cell(r: dict, numbers: dict) -> dict:
    """A summary cell: the row's numbers, or why the method was not measured."""
    return {"unavailable": r["unavailable"]} if r.get("unavailable") else numbers


if __name__ == "__main__":
    sys.exit(main())
