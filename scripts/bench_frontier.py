"""Benchmark (#15): vLLM AL against the whole CPU cost of a head, over every bench_learning run
already measured: the Pareto frontier per eval split, a log-linear fit of it, and the compute
the fit puts at n-gram's AL and at the goal (benchmarks/learning/frontier.py). No model runs
here: it reads results/bench_learning*.json.

    python scripts/bench_frontier.py                       # every results/bench_learning*.json
    python scripts/bench_frontier.py --like results/bench_learning_1h.json --goal 2.8

Only files measured on `--like`'s eval prompts are used (the others are listed as skipped).
Writes results/bench_frontier.{json,md,png}.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.learning import frontier  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="bench_learning JSONs (default: results/bench_learning*.json)")
    p.add_argument("--like", default="results/bench_learning_1h.json",
                   help="use the files measured on this file's eval prompts")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--goal", type=float, default=2.8, help="the AL goal to project (#15: 2.8)")
    p.add_argument("--demo", default="baseline",
                   help="the setting that is `make demo`'s recipe, marked on the plot")
    p.add_argument("--out", default="results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    files = args.files or sorted(glob.glob("results/bench_learning*.json"))
    try:
        benches = {f: json.loads(Path(f).read_text()) for f in [args.like, *files]}
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: cannot read a bench_learning JSON ({e}); run scripts/bench_learning.py "
              "first or name the files", file=sys.stderr)
        return 2
    bench = frontier.frontier(benches, args.like, args.temperature, args.goal, args.demo)
    if not bench["points"]:
        print(f"error: no setting of {len(benches)} files was measured at T={args.temperature:g} "
              f"on {args.like}'s prompts", file=sys.stderr)
        return 2
    md = frontier.markdown(bench)
    report.write_report(Path(args.out), "bench_frontier", bench, md,
                        lambda path: frontier.plot(bench, path))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
