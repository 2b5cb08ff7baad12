"""Harvest benchmark on the embedded target (smollm2-135m), in one run
(benchmarks/cost/harvest.py): regeneration tokens/s through vLLM, `draftkit harvest` against a
bare target forward over the same batches, and bytes per harvested token. Torch runs with
`--threads 1` unless told otherwise (two OpenMP threads on a shared machine are slower and far
noisier). Writes results/bench_harvest.{json,md,png}.

    python scripts/bench_harvest.py                 # ~4-5 min on 2 busy CPU cores
    python scripts/bench_harvest.py --prompts 16 --max-tokens 64 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: benchmarks/
from benchmarks.cost import harvest  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--harvest-seqs", type=int, default=12, help="conversations harvested")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch default)")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    return ap


def main(argv: list[str] | None = None) -> None:
    harvest.run(parser().parse_args(argv))


if __name__ == "__main__":
    main()
