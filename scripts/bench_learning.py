"""Benchmark (#15): which training and data levers buy acceptance per CPU-second. Training
settings train from the same prepared data and harvest under the same CPU-second budget; data
settings prepare and harvest their own data first (the source's config plus their overrides,
prepare and harvest wall time recorded). Simulated AL (k=3) is recorded against CPU-seconds
during training, and vLLM-measured AL (k=3) at the end, next to vLLM n-gram on the same
prompts, in one run.

    python scripts/bench_learning.py                         # reuses runs/demo's data + harvest
    python scripts/bench_learning.py --cpu-seconds 300 --settings baseline,init-layer
    python scripts/bench_learning.py --settings baseline,data-regen-t1 --temperatures 0,1
    python scripts/bench_learning.py --epochs 8 train.lr=2e-3   # key=value for every setting

The settings (training, data, harvest and reuse: benchmarks/learning/levers.py) and the
vLLM splits are described there. Writes results/bench_learning.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.learning import levers  # noqa: E402
from draftkit.eval import splits  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="runs/demo", help="run whose data/ and harvest/ to reuse")
    p.add_argument("--dir", default="runs")
    p.add_argument("--prefix", default="learn")
    p.add_argument("--settings", default=",".join(levers.SETTINGS))
    p.add_argument("--cpu-seconds", type=float, default=300.0, help="training budget per setting")
    p.add_argument("--epochs", type=int, default=0, help="lr schedule length (0 = the setting's)")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--prompts", type=int, default=0, help="eval prompts per split (0 = source's)")
    p.add_argument("--samples", type=int, default=1, help="completions per prompt (T > 0: "
                   "each one sampled anew, so AL averages over samples x prompts)")
    p.add_argument("--splits", default=",".join(splits.NAMES))
    p.add_argument("--temperatures", default="0", help="vLLM sampling temperatures, comma list")
    p.add_argument("--batch", type=int, default=0, help="vLLM batch size (0 = the source's "
                   "first eval.batch_sizes)")
    p.add_argument("--out", default="results")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every setting")
    return p


def main(argv: list[str] | None = None) -> int:
    return levers.run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
