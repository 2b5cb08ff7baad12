"""Benchmark (#42 part 4, #45): vLLM's CPU thread binding for draftkit's offline engines
(benchmarks/serving/cpu_bind.py): vLLM's default (`VLLM_CPU_OMP_THREADS_BIND=auto`) keeps one
core for its frontend; `engine.cpu_threads_bind=all` binds every core to the engine. Each
setting runs in a fresh process at batch 1, 8 and 64; optionally (--compiled) the same engine
compiled against eager. `--record` stores the choice in $DRAFTKIT_HOME/hardware.json for this
CPU, where `engine.cpu_threads_bind=auto` (and `engine.enforce_eager=auto`) read it.

    python scripts/bench_cpu_bind.py                        # smollm2-135m, ~3 min on 2 cores
    python scripts/bench_cpu_bind.py --record --compiled    # then every engine uses the winner
    python scripts/bench_cpu_bind.py --target tiny-llama --tokens 16 --batches 1,8   # smoke run

Time it alone on the machine: other jobs on the cores decide the result. Writes
results/bench_cpu_bind.{json,md} (--out, --name).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: benchmarks/
from benchmarks.serving import cpu_bind  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--compiled", action="store_true", help="also measure enforce_eager=False")
    p.add_argument("--record", action="store_true", help="store the choice for this CPU")
    p.add_argument("--timeout", type=int, default=900, help="seconds per setting")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    p.add_argument("--name", default="bench_cpu_bind")
    return p


def main(argv: list[str] | None = None) -> int:
    return cpu_bind.run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
