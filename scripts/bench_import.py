"""Benchmark (#53): a head trained by the speculators package on the demo's data, imported with
`draftkit init --from-draft` and refreshed by draftkit; held-out tokens per target step before
and after the refresh (benchmarks/rl/import_refresh.py).

    python scripts/bench_import.py --run runs/demo     # make demo's run (smollm2-135m), ~30 min on 2 cores
    python scripts/bench_import.py --tiny --out /tmp/bi # tiny-llama, minutes: checks the script

speculators trains for the CPU time the demo's own head took (its train/meta.json cpu_s;
--cpu-seconds to change it). Writes <out>/bench_import.{json,md,png} (default results/).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.rl import import_refresh  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/demo", help="a prepared run: its train conversations")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--rows", type=int, default=400, help="conversations: half train, half refresh")
    p.add_argument("--cpu-seconds", type=float, default=None,
                   help="process CPU-seconds of speculators' training steps (default: the run's "
                        "train/meta.json cpu_s, what the demo's head took)")
    p.add_argument("--steps", type=int, default=0,
                   help="speculators training steps, 1 row each (0 = --cpu-seconds decides)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--refresh-steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="tiny-llama, generated rows: a check")
    p.add_argument("--new-tokens", type=int, default=40, help="--tiny: tokens per continuation")
    p.add_argument("--work", default=None, help="scratch dir (default a temp dir)")
    p.add_argument("--out", default="results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.command = "python scripts/bench_import.py " + shlex.join(argv if argv is not None
                                                                 else sys.argv[1:])
    if args.tiny:
        args.target, args.dtype, args.rows, args.draft_vocab = "tiny-llama", "float32", 24, 256
        args.steps = min(args.steps, 24) if args.steps else 24
        args.refresh_steps = min(args.refresh_steps, 8)
    with tempfile.TemporaryDirectory() as tmp:
        args.work = args.work or tmp
        result = import_refresh.run(args)
    import_refresh.save(result, Path(args.out))
    print(import_refresh.markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
