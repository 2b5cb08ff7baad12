"""The refresh benchmark (benchmarks/rl/refresh.py): draft v0 on policy v0, the stale draft on
policy vN, the refreshed draft (hot-swapped), a from-scratch draft, n-gram, suffix decoding and
no speculation, at T=1 and T=0, on held-out math prompts in vLLM.
Writes results/bench_refresh.{json,md,png}.

    # policy vN and its rollouts from a longer / higher-lr RL run
    python scripts/rl_loop.py --out runs/rl-loop/long draft=ngram steps=40 lr=3e-5
    python scripts/bench_refresh.py draft_run=runs/smol policy_vn=runs/rl-loop/long/policy \
        rollouts=[runs/rl-loop/long/rollouts] scratch_run=runs/smol-vn
    # or a controlled drift (a fine-tune into another answer layout), and the from-scratch
    # draft on vN with v0's data budget
    python scripts/drift_policy.py --out runs/drift/style
    python scripts/scratch_draft.py runs/smol runs/drift/style/policy runs/smol-vn
    # smoke (tiny prompts/tokens; prints the table, writes under --out)
    python scripts/bench_refresh.py --out /tmp/bench draft_run=... policy_vn=... \
        rollouts=[...] prompts=4 max_tokens=16 batch_size=4

Settings are `BenchConfig` fields as key=value (`free_methods=[ngram]` leaves suffix decoding
out; without arctic-inference its row says why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import report  # noqa: E402
from benchmarks.rl import refresh  # noqa: E402
from draftkit.core import provenance  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="BenchConfig key=value")
    ap.add_argument("--out", default="results", help="dir for bench_refresh.{json,md,png}")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cfg = refresh.load_config(args.overrides)
    out = Path(args.out)
    result = refresh.run(cfg, out)
    result["meta"] = provenance.make_meta("bench_refresh", None)
    md = refresh.markdown(result)
    report.write_report(out, "bench_refresh", result, md,
                        lambda path: refresh.plot(result, path))
    print(md)


if __name__ == "__main__":
    main()
