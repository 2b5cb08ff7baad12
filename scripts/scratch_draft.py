"""A draft trained from scratch on policy vN with draft v0's data budget: v0's prompts answered
by vN, v0's settings and step count, the normal pipeline (benchmarks/rl/scratch.py). The run it
writes is what bench_refresh.py takes as `scratch_run=`.

    python scripts/scratch_draft.py runs/smol runs/drift/style/policy runs/smol-vn
    python scripts/scratch_draft.py runs/smol runs/rl-loop/long/policy runs/smol-rl40 \
        data.regen_engine=hf                     # any run-config override of the new run

Prints v0's budget beside the scratch run's (also in <new run>/scratch.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.rl import scratch  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("v0_run", help="draft run v0 (prepared, trained, exported on policy v0)")
    ap.add_argument("policy", help="policy vN: an HF dir of v0's target lineage")
    ap.add_argument("run", help="the new run dir")
    ap.add_argument("overrides", nargs="*", help="run config key=value for the new run")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    budget = scratch.build(args.v0_run, args.policy, args.run, args.overrides)
    print(json.dumps({k: budget[k] for k in ("v0", "scratch", "same_budget")}, indent=1))
    return budget


if __name__ == "__main__":
    main()
