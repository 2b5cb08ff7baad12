"""Benchmark (#15): where a trained EAGLE-3 head's first draft token misses, by the class of the
target token (digit in / not in the prompt, other prompt token, earlier in the answer, new):
benchmarks/learning/misses.py.

    python scripts/bench_misses.py --run runs/demo

Writes results/bench_misses.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.learning import misses  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/demo", help="a run with harvest/ and train/best")
    p.add_argument("--splits", default="eval,train")
    p.add_argument("--out", default="results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run = report.prepared_run(args.run)
    if run is None:
        return 2
    if not (run / "train" / "best").is_dir():
        print(f"error: {run} has no trained head (train/best); run `draftkit train {run}` first",
              file=sys.stderr)
        return 2
    splits = args.splits.split(",")
    if unknown := sorted(set(splits) - {"eval", "train"}):
        print(f"error: unknown split(s) {unknown}; use eval and/or train", file=sys.stderr)
        return 2
    bench = misses.measure(run, splits)
    md = misses.markdown(bench)
    report.write_report(Path(args.out), "bench_misses", bench, md,
                        lambda path: misses.plot(bench, path))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
