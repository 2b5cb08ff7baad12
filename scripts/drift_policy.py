"""Controlled drift for the refresh benchmark: fine-tune policy v0 so its answers follow a fixed
layout (Given / Step i / Answer), save it as policy vN and sample vN's rollouts in vLLM at T=1
(benchmarks/rl/style_shift.py). The output is what bench_refresh.py takes as policy vN.

    python scripts/drift_policy.py --out runs/drift/style                 # SmolLM2, 60 steps
    python scripts/bench_refresh.py draft_run=runs/smol policy_vn=runs/drift/style/policy \
        rollouts=[runs/drift/style/rollouts] scratch_run=runs/smol-vn
    # tiny smoke (seconds): the in-process tiny-llama
    python scripts/drift_policy.py --out /tmp/drift policy=tiny-llama examples=64 steps=30 \
        lr=3e-3 heldout=4 measure_tokens=24 rollout_prompts=4 group_size=2 max_tokens=32

Settings are `StyleShiftConfig` fields (defaults there), from --config YAML and key=value
overrides. `--no-rollouts` stops after the policy (no vLLM).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.rl import style_shift  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="StyleShiftConfig key=value (e.g. steps=100)")
    ap.add_argument("--config", help="YAML with StyleShiftConfig fields")
    ap.add_argument("--out", required=True, help="output dir (policy/, rollouts/, meta.json)")
    ap.add_argument("--no-rollouts", action="store_true", help="only fine-tune and measure")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    cfg = style_shift.load_config(args.config, args.overrides)
    summary = style_shift.run(cfg, args.out, rollouts=not args.no_rollouts)
    print(json.dumps({"policy": summary["policy"], "rollouts": summary["rollout_dir"],
                      "drift": {k: v for k, v in summary["drift"].items() if k != "example"},
                      "loss": summary["loss"]}, indent=1))
    return summary


if __name__ == "__main__":
    main()
