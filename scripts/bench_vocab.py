"""Benchmark (#15): how much of the target's answers an EAGLE-3 draft vocabulary can propose at
all, per draft vocab size (benchmarks/learning/vocab.py).

    python scripts/bench_vocab.py --run runs/demo

Writes results/bench_vocab.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.learning import vocab  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/demo", help="a run with data/ prepared")
    p.add_argument("--sizes", default=",".join(map(str, vocab.SIZES)))
    p.add_argument("--out", default="results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run = report.prepared_run(args.run)
    if run is None:
        return 2
    bench = vocab.measure(run, [int(s) for s in args.sizes.split(",")])
    md = vocab.markdown(bench)
    report.write_report(Path(args.out), "bench_vocab", bench, md,
                        lambda path: vocab.plot(bench, path))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
