"""A small GRPO run on the embedded SmolLM2-135M policy with speculative rollouts in vLLM,
the draft refreshed and hot-swapped by `DraftRefresher` (benchmarks/rl/grpo_loop.py).

    # EAGLE-3 draft from a run dir, refreshed every 5 steps (~20 min for 20 steps on 2 cores)
    python scripts/rl_loop.py --out runs/rl-loop/refresh draft_run=runs/smol refresh_every=5
    python scripts/rl_loop.py --out runs/rl-loop/stale draft_run=runs/smol     # no refresh
    python scripts/rl_loop.py --out runs/rl-loop/ngram draft=ngram
    # suffix decoding (no training): G=8 samples per problem, drafted from sibling rollouts
    python scripts/rl_loop.py --out runs/rl-loop/suffix draft=suffix group_size=8
    # plot AL and reward against step, with and without refresh, beside n-gram and suffix
    python scripts/rl_loop.py --plot results/rl_loop.png \
        --log refresh=runs/rl-loop/refresh/log.jsonl --log stale=runs/rl-loop/stale/log.jsonl \
        --log ngram=runs/rl-loop/ngram/log.jsonl --log suffix=runs/rl-loop/suffix/log.jsonl
    # tiny smoke: 2 steps, 2 problems x 2 samples, 32 tokens
    python scripts/rl_loop.py --out /tmp/rl-smoke draft=ngram steps=2 prompts_per_step=2 \
        group_size=2 max_tokens=32 tracking.backend=none

Settings are `LoopConfig` fields (defaults there), from --config YAML and key=value overrides.
Run the no-refresh variant first on a shared draft run: a refresh moves its drafts/current.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.rl import grpo_loop  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="LoopConfig key=value (e.g. steps=20)")
    ap.add_argument("--config", help="YAML with LoopConfig fields")
    ap.add_argument("--out", help="output dir (log.jsonl, meta.json, wandb/)")
    ap.add_argument("--plot", help="write a PNG of AL and reward vs step from --log files")
    ap.add_argument("--log", action="append", default=[], help="LABEL=PATH/log.jsonl")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    logs = dict(item.split("=", 1) for item in args.log)
    if args.out:
        cfg = grpo_loop.load_config(args.config, args.overrides)
        records = grpo_loop.run(cfg, args.out)
        last = records[-1] if records else {}
        print(json.dumps({k: last.get(k) for k in ("step", "reward", "al", "tokens_per_step",
                                                   "tokens_per_s", "kl_ref", "elapsed_s")}))
        logs.setdefault(cfg.draft + (" + refresh" if cfg.refreshing else ""),
                        f"{args.out}/log.jsonl")
    if args.plot:
        print(f"plot: {grpo_loop.plot(logs, args.plot)}")
    if not args.out and not args.plot:
        ap.error("nothing to do: give --out (run) and/or --plot with --log files")


if __name__ == "__main__":
    main()
