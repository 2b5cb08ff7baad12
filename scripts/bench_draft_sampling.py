"""Benchmark (#15): how vLLM drafts at T > 0, the RL setting: `greedy` (vLLM's default: the
draft's argmax, verified as a one-hot proposal) against `probabilistic` (sampled from the draft,
verified against its probabilities), n-gram and no speculation beside them in the same run
(benchmarks/serving/draft_sampling.py), each serving every eval split at every temperature:

    python scripts/bench_draft_sampling.py --run runs/demo                 # T=1, batch 8
    python scripts/bench_draft_sampling.py --run runs/demo --temperatures 0,1 --batch 1

Writes results/bench_draft_sampling.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.serving import draft_sampling  # noqa: E402
from draftkit.eval import splits  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/demo", help="a run with a finished export")
    p.add_argument("--temperatures", default="1", help="comma list; at 0 both drafts are argmax")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16, help="per split")
    p.add_argument("--splits", default=",".join(splits.NAMES))
    p.add_argument("--out", default="results")
    return p


def main(argv: list[str] | None = None) -> int:
    return draft_sampling.run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
