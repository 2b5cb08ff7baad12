"""Print the README's headline table from a bench_goals result (benchmarks/headline.py).

    python scripts/headline.py results/bench_goals.json [--split hand-written]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks import headline  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="a bench_goals JSON (results/bench_goals.json)")
    ap.add_argument("--split", default=headline.SPLIT, help="the prompt split shown")
    args = ap.parse_args(argv)
    result = headline.load(args.result)
    print(headline.caption(result, args.split))
    print()
    print("\n".join(headline.table(result, args.split)))


if __name__ == "__main__":
    main()
