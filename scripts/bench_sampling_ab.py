"""Benchmark (#54): training for the sampling RL does, each lever alone and together at the
demo's training budget: T=1 regenerated answers (data.regen_temperature), the TV loss
(train.loss=tv), forward KL mixed with TV (train.loss=mix, train.loss_mix). Held-out tokens per
target step in vLLM at T=0 and T=1, batch 8, probabilistic drafting, mean and band over seeds.

    python scripts/bench_sampling_ab.py                  # runs/demo's data, harvest and budget
    python scripts/bench_sampling_ab.py --arms baseline,regen-t1 --seeds 0,1,2
    python scripts/bench_sampling_ab.py --cpu-seconds 300 train.epochs=3   # key=value: every arm

The arms and how each trains: benchmarks/learning/sampling_ab.py. Writes
results/bench_sampling_ab.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.learning import sampling_ab  # noqa: E402
from draftkit.eval import splits  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="runs/demo", help="run whose data, harvest and training "
                                                         "CPU-seconds to reuse")
    p.add_argument("--dir", default="runs")
    p.add_argument("--prefix", default="ab")
    p.add_argument("--arms", default=",".join(sampling_ab.ARMS))
    p.add_argument("--seeds", default="0,1,2", help="train.seed per arm: the noise band")
    p.add_argument("--cpu-seconds", type=float, default=0.0,
                   help="training budget per arm and seed (0 = the source's own training)")
    p.add_argument("--prompts", type=int, default=0, help="eval prompts per split (0 = source's)")
    p.add_argument("--splits", default=",".join(splits.NAMES))
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--out", default="results")
    p.add_argument("--name", default="bench_sampling_ab", help="result file name")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every arm")
    return p


def main(argv: list[str] | None = None) -> int:
    return sampling_ab.run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
