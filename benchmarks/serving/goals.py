"""The demo's drafts against the free methods where rollouts run.

One vLLM engine per (method, k), one after another in this run: no speculation, n-gram and
suffix decoding (k=--k), each draft (`--run` and `--drafts`: runs with an export; the kind
says how vLLM serves it) at every k of `--draft-k`, and the exported choice: the one engine of
`--run`'s export/serving.json (`draftkit eval` wrote it: one method, a measured safe k per
batch range; none where some range must not draft, then no speculation's rows stand for it;
eval/choice.py). Each engine serves the demo's three
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
their own. goals_report.py writes the report, or rebuilds one from a written result's rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from draftkit.core import artifacts, config, hardware, provenance
from draftkit.drafts import kind as kinds
from draftkit.eval import splits, stage
from draftkit.eval.splits import OWN
from draftkit.serving import speculative, vllm_engine
from draftkit.serving.speculative import SERVING_FILE

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


def run(args: argparse.Namespace) -> dict | None:
    """The bench as scripts/bench_goals.py's flags ask: every engine's rows, analysed (the
    choice and the goals; goals_report writes it); None when a draft run has no export."""
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
            return None
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
    return analyse(bench)


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
    spec = speculative.method_config(source, k, export, cfg.draft.draft_sample_method)
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
        rng = speculative.range_for(serving["ranges"], b)
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
