"""Benchmark: a longer EAGLE-3 training on the embedded target, then vLLM measurements of the
draft next to vLLM n-gram and no speculation, all in one run, on held-out eval prompts (mathgen
eval templates, never seen in training): benchmarks/learning/eagle3.py.

    python scripts/bench_eagle3.py                          # reuses runs/demo's data + harvest
    python scripts/bench_eagle3.py --source runs/demo --epochs 12 --k 1,2,3,4,5
    python scripts/bench_eagle3.py --epochs 6 --k 1,3,5 draft.draft_vocab_size=4096

Writes results/bench_eagle3.{json,md,png}: data budget (samples, tokens), wall time per stage,
training-time simulated AL, and the vLLM table (AL, per-position acceptance, tokens/s,
speedup) for every (method, k, T, batch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.learning import eagle3  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="runs/demo", help="run whose data/ and harvest/ to reuse")
    p.add_argument("--name", default="bench-eagle3")
    p.add_argument("--dir", default="runs")
    p.add_argument("--epochs", type=int, default=12)
    report.add_grid_args(p)
    p.add_argument("overrides", nargs="*", help="extra key=value run-config overrides")
    return p


def main(argv: list[str] | None = None) -> int:
    return eagle3.run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
