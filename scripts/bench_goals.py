"""Benchmark (#34 goals): the demo's drafts against the free methods where rollouts run
(benchmarks/serving/goals.py): one vLLM engine per (method, k) — no speculation, n-gram,
suffix decoding, each draft at every `--draft-k`, and the exported serving choice — each
serving the three prompt splits at T=0 and T=1 and batch 1, 8, 16 and 32; the draft a batch
gets is chosen on the run's own split, then measured against the goals on every split.

    python scripts/bench_goals.py --run runs/demo                       # the demo's head
    python scripts/bench_goals.py --run runs/demo --drafts runs/demo-peagle --draft-k 1,2,3
    python scripts/bench_goals.py --run runs/demo --smoke --out /tmp/goals   # a quick check
    python scripts/bench_goals.py --render results/bench_goals.json   # analysis again, no engine

Writes <out>/bench_goals.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.serving import goals, goals_report  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="the demo run (its export is the first draft)")
    p.add_argument("--render", metavar="JSON", type=Path,
                   help="rebuild a written result's analysis and report from its rows instead")
    p.add_argument("--drafts", default="",
                   help="more runs with an export, comma-separated; RUN:1/3 gives a run its own k")
    p.add_argument("--k", type=int, default=3, help="k of n-gram and suffix decoding")
    p.add_argument("--draft-k", default="1,2,3", help="k values each draft is measured at")
    p.add_argument("--temperature", default="0,1")
    p.add_argument("--batch", default="1,8,16,32")
    p.add_argument("--prompts", type=int, default=32,
                   help="prompts per split at batch > 1 (at least the largest batch)")
    p.add_argument("--latency-prompts", type=int, default=4, help="prompts per split at batch 1")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--smoke", action="store_true", help=f"quick end-to-end check: {goals.SMOKE}")
    p.add_argument("--out", default="results")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, `--smoke`'s settings applied, a batch larger than its prompts refused."""
    p = parser()
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in goals.SMOKE.items():
            setattr(args, key, value)
    if (args.run is None) == (args.render is None):
        p.error("give --run (measure) or --render JSON (rebuild a result's report), not both")
    if max(goals.ints(args.batch)) > args.prompts:
        p.error(f"--batch {args.batch} needs --prompts >= {max(goals.ints(args.batch))}: a "
                "batch row must run that many sequences at once")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.render:
        return goals_report.render(args.render, Path(args.out), sys.argv)
    bench = goals.run(args)
    if bench is None:
        return 2
    goals_report.write(bench, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
