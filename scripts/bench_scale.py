"""Benchmark (#33): what a draft costs at a target's real scale, side by side in one run, on a
`random:<name>` target (the real architecture and shapes, seeded random weights drawn on the
device): harvest against a bare forward, EAGLE-3 head training, a refresh's parts, peak memory
of each, and projections from the measured tokens/s (benchmarks/cost/scale.py and
scale_report.py). scripts/gpu_check.sh runs it by this path on a lent GPU machine.

    python scripts/bench_scale.py                                   # random:tiny-llama, CPU, < 60 s
    python scripts/bench_scale.py --target random:Qwen3-8B --device cuda      # one GPU, ~3 min
    python scripts/bench_scale.py --target random:Qwen3-8B --device cuda --lengths mixed \
        --name bench_scale_cuda_mixed      # chat-like lengths: how harvest's packing batches them
    python scripts/bench_scale.py --target random:Qwen3-8B@layers=2 --seqs 8 --seq-len 512 \
        --name bench_scale_qwen3_8b_l2 draft.draft_vocab_size=4096 train.batch_tokens=2048
        # Qwen3-8B's widths on a CPU (hidden 4096, vocab 151,936; ~10 GiB, minutes): harvest
        # vs the bare decoder forward; the overrides keep the head's training within RAM

Writes results/bench_scale.{json,md,png} (--out, --name).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: benchmarks/


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="random:tiny-llama", help="a random:<name> target")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--seqs", type=int, default=0, help="sequences (0: 16 tiny, 64 at >= 1B)")
    p.add_argument("--seq-len", type=int, default=0, help="tokens each (0: 256 / 1024)")
    p.add_argument("--train-steps", type=int, default=8, help="timed head training steps")
    p.add_argument("--refresh-steps", type=int, default=4, help="timed fine-tune steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each timing")
    p.add_argument("--specbundle-tokens", type=int, default=1024,
                   help="assumed mean tokens per SpecBundle sample")
    p.add_argument("--lengths", default="uniform", choices=["uniform", "mixed"],
                   help="mixed: chat-like log-normal lengths up to --seq-len")
    p.add_argument("--disk-mb", type=int, default=0, help="MiB written to time the disk "
                   "(0: 1024 on CUDA, 64 on the CPU)")
    p.add_argument("--verify-batches", default="", help="verify-cost batch sizes, comma list "
                   "(default: 1,2,..,256 on CUDA, none on the CPU)")
    p.add_argument("--verify-context", type=int, default=512, help="KV-cache tokens per row")
    p.add_argument("--tokens-per-step", type=float, default=1.62, help="a draft's measured "
                   "tokens per target step for the projection (default: the demo head at T=1, "
                   "batch 8, k=3: docs/design.md)")
    p.add_argument("--draft-step-rel", type=float, default=0.0, help="a draft step's cost "
                   "relative to a 1-token target step (0: the weight-bytes ratio)")
    p.add_argument("--threads", type=int, default=0, help="CPU torch threads (0: torch's)")
    p.add_argument("--dir", default="", help="work dir (default: a temp dir, removed)")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    p.add_argument("--name", default="bench_scale")
    p.add_argument("overrides", nargs="*", help="key=value run-config overrides")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.disk_mb = args.disk_mb or (1024 if args.device == "cuda" else 64)
    if args.device == "cpu":  # harvest picks its device through accelerate: keep it off GPUs
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    # deferred: the bench loads torch, which must not see the GPUs hidden just above
    from benchmarks.cost import scale

    return scale.run(args)


if __name__ == "__main__":
    sys.exit(main())
