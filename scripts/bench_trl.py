"""The TRL benchmark (benchmarks/rl/trl_grpo.py): TRL GRPO steps with draftkit in TRL's
colocated vLLM engine, no speculation, n-gram, suffix decoding, the run's draft frozen, and the
draft refreshed every N steps with its features from TRL's loss forward and with its own pass,
in a background thread, or by `draftkit watch` in another process; rollout tokens/s, step time,
AL and tokens per target step, and what a refresh costs the trainer (in GRPO steps).
Writes results/bench_trl.{json,md}.

    # the demo run's draft on the embedded target, TRL's defaults for T (1.0) and batch
    python scripts/bench_trl.py run=runs/demo21 steps=20 every=5
    # 2 trainer processes (accelerate launch, gloo), each with its engine; the refresh's cost
    # to the trainer: synchronous, background thread, `draftkit watch` + follow
    python scripts/bench_trl.py --out results/trl2 run=runs/demo21 steps=20 every=5 \
        processes=2 \
        variants=[none,ngram,suffix,frozen,refresh,refresh-bg,refresh-watch,auto]
    # smoke (a tiny-llama run with an export): 2 steps, 2 x 2 completions, 16 tokens
    python scripts/bench_trl.py --out /tmp/bench-trl run=runs/tiny steps=2 prompts=2 \
        generations=2 max_tokens=16 every=1 variants=[none,frozen,refresh,refresh-own]

Settings are `BenchConfig` fields as key=value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.rl import trl_grpo  # noqa: E402
from draftkit.core import provenance  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="BenchConfig key=value")
    ap.add_argument("--out", default="results", help="dir for bench_trl.{json,md}")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cfg = trl_grpo.load_config(args.overrides)
    out = Path(args.out)
    result = trl_grpo.run(cfg, out)
    result["meta"] = provenance.make_meta("bench_trl", result["config"])
    md = trl_grpo.markdown(result)
    report.write_report(out, "bench_trl", result, md,
                        plot=lambda path: trl_grpo.plot(result, path))
    print(md)


if __name__ == "__main__":
    main()
