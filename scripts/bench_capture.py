"""Refresh capture benchmark: peak memory and time of one `draftkit refresh` with
`refresh.capture=online` (features in RAM) and `harvest` (shards on disk, streamed back) as the
rollout set grows (benchmarks/cost/capture.py: the in-process `tiny-llama` target, a random-init
EAGLE-3 head, random rollouts; each refresh in a fresh process).
Writes results/bench_capture.{json,md,png}.

    python scripts/bench_capture.py                        # 500 and 3000 rollouts, ~10 min
    python scripts/bench_capture.py --rows 100 --scale 2   # smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: benchmarks/
from benchmarks.cost import capture  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500, help="rollouts of the small set")
    ap.add_argument("--scale", type=int, default=6, help="the large set has this many times more")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    return ap


def main(argv: list[str] | None = None) -> None:
    capture.run(parser().parse_args(argv))


if __name__ == "__main__":
    main()
