"""Benchmark (#15): where an EAGLE-3 training step's time goes, and what packing could save
(benchmarks/cost/train_step.py): torch.profiler over optimizer steps of the head `draftkit
train` builds, time per phase and costliest ops, and the epoch plan's padding.

    python scripts/bench_train_step.py --source runs/demo --steps 12

Writes results/bench_train_step.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.cost import train_step  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="runs/demo", help="a run with data/ and harvest/")
    p.add_argument("--steps", type=int, default=12, help="profiled optimizer steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=12, help="ops listed")
    p.add_argument("--out", default="results")
    p.add_argument("overrides", nargs="*", help="key=value run-config overrides")
    return p


def main(argv: list[str] | None = None) -> int:
    return train_step.run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
