"""Benchmark (#15): what deduplication could remove from a run's prepared data: near-duplicate
prompts, answers and template skeletons by word-5-gram Jaccard similarity
(benchmarks/learning/dedup.py).

    python scripts/bench_dedup.py --run runs/demo

Writes results/bench_dedup.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.learning import dedup  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/demo", help="a run with data/ prepared")
    p.add_argument("--out", default="results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run = report.prepared_run(args.run)
    if run is None:
        return 2
    bench = dedup.measure(run)
    md = dedup.markdown(bench)
    report.write_report(Path(args.out), "bench_dedup", bench, md,
                        lambda path: dedup.plot(bench, path))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
