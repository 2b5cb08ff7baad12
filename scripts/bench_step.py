"""Benchmark (#34 part 2): where a speculative step's time goes in vLLM, per method and batch
(benchmarks/serving/step.py, timed by benchmarks/serving/step_timers.py): tokens/s, tokens per
target step, vLLM's AL and ms per decode step split into parts, on the hand-written math
prompts, greedy, k=3, at batch 1, 8, 16 and 32; profiles of the model drafts' propose; then
the same target compiled.

    python scripts/bench_step.py --run runs/demo                   # the demo's EAGLE-3 export
    python scripts/bench_step.py --random-head                     # an untrained head, same shape
    python scripts/bench_step.py --run runs/demo --draft-lm runs/dlm/export --batch 1,8
    python scripts/bench_step.py --random-head --smoke --out /tmp/bench-step   # ~7 min

Writes <out>/bench_step.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks.serving import step  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a run with an EAGLE-3 export (e.g. runs/demo)")
    src.add_argument("--random-head", action="store_true",
                     help="an untrained EAGLE-3 head of the demo's shape for smollm2-135m")
    p.add_argument("--draft-lm", help="an exported draft LM dir, measured as draft_model")
    p.add_argument("--methods", default="none,ngram,suffix,eagle3")
    p.add_argument("--batch", default="1,8,16,32")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--draft-k", default="",
                   help="more k values for the model drafts (eager), e.g. 1,2: the k a batch wants")
    p.add_argument("--prompts", type=int, default=32, help="hand-written prompts at batch > 1")
    p.add_argument("--latency-prompts", type=int, default=8, help="prompts at batch 1")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--profile-batch", default="1,8", help="batches profiled for model drafts")
    p.add_argument("--profile-steps", type=int, default=16)
    p.add_argument("--compiled", default="none,eagle3",
                   help="methods measured again with enforce_eager=False ('' = none)")
    p.add_argument("--smoke", action="store_true", help=f"quick end-to-end check: {step.SMOKE}")
    p.add_argument("--out", default="results")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, `--smoke`'s settings applied."""
    args = parser().parse_args(argv)
    if args.smoke:
        for key, value in step.SMOKE.items():
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    return step.run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
