"""Streaming benchmark: peak memory and tokens/s of offline training as the harvest grows 10x
(benchmarks/cost/stream.py): random harvests of the in-process `tiny-llama` target, each size
measured materialised (the old path), as a data stream alone, and in one epoch of `draftkit
train`, each in a fresh process. Writes results/bench_stream.{json,md,png}.

    python scripts/bench_stream.py --mid                 # ~10 min on 2 busy CPU cores
    python scripts/bench_stream.py --tokens 10000 --scale 3   # smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: benchmarks/
from benchmarks.cost import stream  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=50_000, help="train tokens of the small harvest")
    ap.add_argument("--scale", type=int, default=10, help="the large harvest is this many times more")
    ap.add_argument("--mid", action="store_true", help="also a size in between (x scale/2.5)")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    return ap


def main(argv: list[str] | None = None) -> None:
    stream.run(parser().parse_args(argv))


if __name__ == "__main__":
    main()
