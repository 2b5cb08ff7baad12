"""Rebuild draftkit/_data/hardware_profiles.json (what `draftkit plan RUN --hardware NAME`
plans with) from the bench_scale results in results/: results/gpu_check/<sha>/
bench_scale_cuda.json of lent GPUs and results/bench_scale*.json of CPUs (draftkit/init/
profiles.py). Run it after committing a new bench_scale result; tests/test_plan.py checks the
stored file is what this writes.

    python scripts/hardware_profiles.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from draftkit.init import profiles  # noqa: E402


def main() -> int:
    data = profiles.build(ROOT)
    profiles.STORED.write_text(json.dumps(data, indent=2) + "\n")
    for name, p in data["profiles"].items():
        print(f"{name:40s} {'measured' if p['measured'] else 'derived':9s} "
              f"{len(p['runs'])} run(s): {', '.join(r['commit'] for r in p['runs'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
