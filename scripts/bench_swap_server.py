"""Swap drafts into a running `vllm serve` rollout server (issue 37): how long a swap takes with
its health check, whether any client request fails while 16 stream, and how long clients stall
(benchmarks/serving/swap_server.py). Writes results/bench_swap_server.{json,md,png}.

    python scripts/bench_swap_server.py --run runs/demo21           # a finished `make demo` run
    python scripts/bench_swap_server.py --run runs/demo21 --swaps 2 --load-s 5 --out /tmp/b
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.serving import swap_server  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="runs/demo21", help="a finished demo run (export/)")
    ap.add_argument("--swaps", type=int, default=3, help="pushes per phase")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--load-s", type=float, default=4.0, help="load between loaded swaps")
    ap.add_argument("--short-probe-tokens", type=int, default=16,
                    help="idle pushes again with probes this short (refresh.probe_max_tokens)")
    ap.add_argument("--work", default="/tmp/draftkit-bench-swap", help="bench run dir")
    ap.add_argument("--out", default="results")
    return ap


def main(argv: list[str] | None = None) -> None:
    swap_server.run(parser().parse_args(argv))


if __name__ == "__main__":
    main()
