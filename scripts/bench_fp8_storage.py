"""Benchmark (#55): does FP8 hidden-state storage cost acceptance? The A/B of
benchmarks/learning/levers.py's harvest settings `storage-bf16` and `storage-fp8`: the source
run's prepared data harvested anew twice (bf16 states; e4m3 with per-token scales, about half
the bytes), the same head trained from each under the same CPU-second budget, held-out AL
measured in vLLM on every eval split, in one run. AL within the seeds' noise band
(results/bench_learning_seeds.md: 0.05 AL between seeds on a split) keeps FP8 an option; bf16
stays the default either way.

    python scripts/bench_fp8_storage.py                       # runs/demo's data, 300 CPU-s each
    python scripts/bench_fp8_storage.py --source runs/demo --cpu-seconds 720 --temperatures 0,1

Writes results/bench_fp8_storage/bench_learning.{json,md,png} (--out) and prints the bytes per
token of both harvests. When the source itself stored bf16 states (the demo does), the
storage-bf16 arm is the source's harvest, linked in rather than computed again: the target's
forward is deterministic, so a second bf16 harvest of the same data would be the same bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.learning import levers  # noqa: E402
from draftkit.core import config  # noqa: E402
from scripts import bench_learning  # noqa: E402

SETTINGS = "storage-bf16,storage-fp8"


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if "--settings" in argv:
        print("bench_fp8_storage runs the settings", SETTINGS, "only", file=sys.stderr)
        return 2
    args = bench_learning.parser().parse_args(
        ["--settings", SETTINGS, "--prefix", "fp8", "--out",
         str(ROOT / "results" / "bench_fp8_storage"), *argv])
    reuse_bf16_harvest(Path(args.source), Path(args.dir) / f"{args.prefix}-storage-bf16")
    code = levers.run(args)
    for name in SETTINGS.split(","):
        man = Path(args.dir) / f"{args.prefix}-{name}" / "harvest" / "manifest.json"
        if man.is_file():
            print(f"{name}: {json.loads(man.read_text())['bytes_per_token']:,} bytes per token")
    return code


def reuse_bf16_harvest(src: Path, run: Path) -> None:
    """Link the source's harvest in as the storage-bf16 arm's when the source stored exactly
    that (harvest.dtype bfloat16, no storage_dtype); otherwise the arm harvests its own."""
    h = config.load(src).harvest
    if (h.dtype == "bfloat16" and not h.storage_dtype and not run.exists()
            and (src / "harvest" / "meta.json").is_file()):
        report.link_run(src, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
