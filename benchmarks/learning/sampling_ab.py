"""Training for the sampling RL does (#54): an A/B of each lever alone and together at the demo's
training budget (the same CPU-seconds), measured as held-out tokens per target step in vLLM at
T=0 and T=1, batch 8, probabilistic drafting, with the noise band of seeds.

Levers (ARMS: run-config overrides on top of the source run's config):
    baseline      the source's data (answers regenerated as it says), forward KL (the A/B's
                  reference, whatever loss the source's config names)
    regen-t1      answers regenerated at T=1 (data.regen_temperature=1.0): its own prepare and
                  harvest, done once in <dir>/<prefix>-regen-t1-data and linked into every arm
                  that needs them
    tv            total-variation loss (train.loss=tv): acceptance under sampling is 1 - TV
    mix           forward KL and TV mixed (train.loss=mix, train.loss_mix)
    regen-t1+tv, regen-t1+mix   both levers
Every arm trains under each seed (train.seed) for train.max_cpu_seconds = the budget (default:
the CPU-seconds the source's own training took, train/meta.json), from the source's data and
harvest (hard links) or the regen-t1 data. vLLM: one engine per trained draft, k=3, every split
(draftkit/eval/splits.py) at every temperature, batch --batch, draft_sample_method
probabilistic. Per arm the report gives the mean over seeds and the band (min..max): a lever
counts where its band clears the baseline's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import mean

from benchmarks import report
from benchmarks.learning import levers
from draftkit import api
from draftkit.core import artifacts, config, hardware
from draftkit.core.errors import DraftkitError
from draftkit.eval import splits
from draftkit.serving import speculative

REGEN_T1 = ["data.regen_temperature=1.0"]
ARMS = {
    "baseline": ["train.loss=kl"],
    "regen-t1": ["train.loss=kl"],
    "tv": ["train.loss=tv"],
    "mix": ["train.loss=mix", "train.loss_mix=0.5"],
    "regen-t1+tv": ["train.loss=tv"],
    "regen-t1+mix": ["train.loss=mix", "train.loss_mix=0.5"],
}
SAMPLE = "probabilistic"  # how vLLM drafts above T=0 in every arm


def check_arms(src: Path, names: list[str]) -> list[str]:
    """Problems with the arms asked for: unknown names, overrides this draftkit does not know
    (train.loss before the loss options exist), each naming the arm."""
    out = [f"unknown arm {n!r}; choose from {', '.join(ARMS)}" for n in names if n not in ARMS]
    for n in (n for n in names if n in ARMS):
        try:
            config.load(src, [*ARMS[n], *(REGEN_T1 if n.startswith("regen-t1") else [])])
        except DraftkitError as e:
            out.append(f"arm {n}: {e}")
    return out


def budget_of(src: Path, cpu_seconds: float) -> float:
    """The training budget: `cpu_seconds`, or (0) what the source's own training took."""
    if cpu_seconds > 0:
        return cpu_seconds
    meta = src / "train" / "meta.json"
    if not meta.is_file():
        raise DraftkitError(f"{src} has no train/meta.json to take the budget from; pass "
                            "--cpu-seconds or run `make demo` first")
    return float(artifacts.read_json(meta)["cpu_s"])


def run(args: argparse.Namespace) -> int:
    """The A/B as scripts/bench_sampling_ab.py's flags ask; 2 on a bad flag or source."""
    src = Path(args.source)
    names = args.arms.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    for need in ("harvest/manifest.json", "data/meta.json"):
        if not (src / need).is_file():
            print(f"error: {src} has no {need}; run `make demo` first", file=sys.stderr)
            return 2
    problems = check_arms(src, names)
    if problems:
        print("error: " + "\n  ".join(problems), file=sys.stderr)
        return 2
    budget = budget_of(src, args.cpu_seconds)
    base = [f"train.max_cpu_seconds={budget}", "train.num_workers=0", "export.check=false",
            "tracking.backend=none", f"draft.draft_sample_method={SAMPLE}", *args.overrides]
    regen = regen_data(src, Path(args.dir) / f"{args.prefix}-regen-t1-data", base) \
        if any(n.startswith("regen-t1") for n in names) else None
    runs = {}
    for name in names:
        for seed in seeds:
            run_dir = Path(args.dir) / f"{args.prefix}-{name}-s{seed}"
            data = regen["run"] if name.startswith("regen-t1") else src
            runs[(name, seed)] = train_arm(Path(data), run_dir, [*base, *ARMS[name],
                                                                 f"train.seed={seed}"])
    cfg = config.open_run(src, [f"eval.num_prompts={args.prompts}"] if args.prompts else []).cfg
    prompts = splits.build(src, cfg, cfg.eval.num_prompts, tuple(args.splits.split(",")))
    temps = [float(t) for t in args.temperatures.split(",")]
    rows = measure(cfg, runs, prompts, temps, args.batch)
    bench = {"source": str(src), "target": cfg.target.name, "hardware": hardware.summary(),
             "budget_cpu_s": budget, "arms": {n: ARMS[n] for n in names}, "seeds": seeds,
             "regen_t1_data": regen, "splits": {s: len(v) for s, v in prompts.items()},
             "runs": {f"{n}-s{s}": r for (n, s), r in runs.items()},
             "vllm": {"k": 3, "temperatures": temps, "batch_size": args.batch,
                      "draft_sample_method": SAMPLE, "max_new_tokens": cfg.eval.max_new_tokens,
                      "rows": rows},
             "summary": summarize(rows, names, temps)}
    md = markdown(bench)
    report.write_report(Path(args.out), args.name, bench, md, lambda path: plot(bench, path))
    print(md)
    return 0


def regen_data(src: Path, run: Path, base: list[str]) -> dict:
    """The source's config with answers regenerated at T=1, prepared and harvested once."""
    if not (run / config.CONFIG_NAME).is_file():
        cfg = config.load(src, REGEN_T1)
        cfg.name = run.name
        run.mkdir(parents=True, exist_ok=True)
        artifacts.write_text_atomic(run / config.CONFIG_NAME, config.dump(cfg))
    for stage, done in (("prepare", "data/meta.json"), ("harvest", "harvest/meta.json")):
        if not (run / done).is_file():
            getattr(api, stage)(run, overrides=base)
    prep = artifacts.read_json(run / "data" / "meta.json")
    harv = artifacts.read_json(run / "harvest" / "meta.json")
    return {"run": str(run), "prepare_s": round(prep["timings"]["total_s"], 1),
            "harvest_s": round(harv["timings"]["seconds"], 1)}


def train_arm(data_run: Path, run: Path, overrides: list[str]) -> dict:
    """Train and export one (arm, seed) on `data_run`'s data and harvest (linked in)."""
    report.link_run(data_run, run)
    t0 = time.perf_counter()
    if not (run / "train" / "meta.json").is_file():
        api.train(run, overrides=overrides)
    if not (run / "export" / "config.json").is_file():
        api.export(run, overrides=overrides)
    return {"run": str(run), "overrides": overrides, "train_wall_s":
            round(time.perf_counter() - t0, 1), **levers.curve(run)}


def measure(cfg, runs: dict, prompts: dict, temps: list[float], batch: int) -> list[dict]:
    """vLLM rows of every trained draft: one engine each, every split and temperature."""
    rows = []
    for (name, seed), r in runs.items():
        spec = speculative.method_config("eagle3", 3, Path(r["run"]) / "export", SAMPLE)
        rows += [{"arm": name, "seed": seed, **row}
                 for row in report.serve_splits(cfg, "eagle3", 3, spec, prompts, temps, batch)]
    return rows


def summarize(rows: list[dict], names: list[str], temps: list[float]) -> list[dict]:
    """Per (arm, split, T): tokens per target step over seeds, mean and band (min, max)."""
    out = []
    for name in names:
        for split in dict.fromkeys(r["split"] for r in rows):
            for t in temps:
                xs = [r["tokens_per_step"] for r in rows if r["arm"] == name and
                      r["split"] == split and r["temperature"] == t and
                      r.get("tokens_per_step") is not None]
                if xs:
                    out.append({"arm": name, "split": split, "temperature": t,
                                "tokens_per_step": round(mean(xs), 3),
                                "band": [round(min(xs), 3), round(max(xs), 3)], "seeds": len(xs)})
    return out


def markdown(bench: dict) -> str:
    v, hw = bench["vllm"], bench["hardware"]
    names, splits_ = list(bench["arms"]), list(bench["splits"])
    cell = {(s["arm"], s["split"], s["temperature"]): s for s in bench["summary"]}
    lines = [f"# Training for RL's sampling: T=1 answers, TV loss, the mix ({bench['target']})",
             "", f"Source run {bench['source']}; {bench['budget_cpu_s']:.0f} training CPU-s per "
             f"arm and seed (seeds {bench['seeds']}); vLLM k={v['k']}, batch {v['batch_size']}, "
             f"{v['draft_sample_method']} drafting, {v['max_new_tokens']} new tokens; prompts "
             f"per split {bench['splits']}. CPU: {hw.get('cpu_model')}, native bf16: "
             f"{hw.get('cpu_native_bf16')}.", "",
             "Tokens per target step, mean over seeds [min..max]:"]
    for t in v["temperatures"]:
        lines += ["", f"T={t:g}:", "", "| arm | " + " | ".join(splits_) + " |",
                  "|---" * (len(splits_) + 1) + "|"]
        for n in names:
            cells = [(f"{c['tokens_per_step']:.3f} [{c['band'][0]:.3f}..{c['band'][1]:.3f}]"
                      if (c := cell.get((n, s, t))) else "–") for s in splits_]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if bench.get("regen_t1_data"):
        d = bench["regen_t1_data"]
        lines += ["", f"regen-t1 data: prepare {d['prepare_s']:.0f} s + harvest "
                  f"{d['harvest_s']:.0f} s (paid once, beside the training budget)."]
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    """Per split, one panel: each arm's tokens per target step at every temperature, the bar the
    mean over seeds and the whisker the band (min..max)."""
    plt = report.pyplot()
    splits_, names = list(bench["splits"]), list(bench["arms"])
    temps = bench["vllm"]["temperatures"]
    cell = {(c["arm"], c["split"], c["temperature"]): c for c in bench["summary"]}
    fig, axes = plt.subplots(1, len(splits_), figsize=(5 * len(splits_), 4), squeeze=False)
    width = 0.8 / len(temps)
    for ax, split in zip(axes[0], splits_, strict=True):
        for j, t in enumerate(temps):
            cs = [cell.get((n, split, t)) for n in names]
            xs = [i + j * width for i in range(len(names))]
            ys = [c["tokens_per_step"] if c else 0.0 for c in cs]
            err = [[(c["tokens_per_step"] - c["band"][0]) if c else 0.0 for c in cs],
                   [(c["band"][1] - c["tokens_per_step"]) if c else 0.0 for c in cs]]
            ax.bar(xs, ys, width, yerr=err, capsize=3, label=f"T={t:g}")
        ax.set_xticks([i + width * (len(temps) - 1) / 2 for i in range(len(names))], names,
                      rotation=30, ha="right", fontsize=8)
        ax.set(title=split, ylabel="tokens per target step", ylim=(1.0, None))
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
