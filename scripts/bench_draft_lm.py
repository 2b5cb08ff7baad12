"""Benchmark: a draft LM distilled on an EAGLE-3 run's own data and harvest, then vLLM
measurements of the draft LM, that run's EAGLE-3 export, vLLM n-gram and no speculation, all
in one process on the same held-out prompts (benchmarks/learning/draft_lm.py).

    python scripts/bench_draft_lm.py --source runs/bench-eagle3          # after bench_eagle3.py
    python scripts/bench_draft_lm.py --source runs/demo --layers 4 --k 1,3,5
    python scripts/bench_draft_lm.py --source RUN --epochs 1 --k 2 --temperature 0 --batch 1 \\
        --prompts 2 --max-new-tokens 16 --out /tmp/bench     # smoke run

Writes results/bench_draft_lm.{json,md,png}: draft parameters and bytes, train time,
simulated AL and the vLLM table (AL, per-position acceptance, tokens/s, speedup) for every
(method, k, T, batch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.learning import draft_lm  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="runs/bench-eagle3",
                   help="EAGLE-3 run with data/, harvest/ and export/ (e.g. after bench_eagle3)")
    p.add_argument("--name", default="bench-draft-lm")
    p.add_argument("--dir", default="runs")
    p.add_argument("--layers", type=int, default=0, help="truncated layers (0 = init's default)")
    p.add_argument("--epochs", type=int, default=0, help="0 = the source run's train.epochs")
    p.add_argument("--cpu-budget", default="same",
                   help="training CPU-seconds of the draft LM: 'same' = the EAGLE-3 run's "
                        "(train.max_cpu_seconds), a number, or 0 = epochs only")
    report.add_grid_args(p)
    p.add_argument("overrides", nargs="*", help="extra key=value overrides of the draft-lm run")
    return p


def main(argv: list[str] | None = None) -> int:
    return draft_lm.run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
