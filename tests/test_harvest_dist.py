"""Harvest under `accelerate launch` with 2 CPU processes writes the same bytes as 1 process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _runs import make_run
from test_harvest import REPO, dir_bytes

from draftkit.core.artifacts import RunPaths

# accelerate 1.x runs one process for `--cpu --num_processes 2`; `--multi_gpu` spawns 2 ranks via
# torchrun, which join a gloo group on a machine without CUDA.
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "TQDM_DISABLE": "1"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.dist
def test_two_processes_write_the_same_bytes_as_one(tmp_path, tiny_target):
    tok = tiny_target.tokenizer
    one = make_run(tmp_path / "one", tok, n_train=40, n_eval=8, hi=160)
    two = make_run(tmp_path / "two", tok, n_train=40, n_eval=8, hi=160)
    _run([sys.executable, "-m", "draftkit.cli", "harvest", str(one)])  # 1 process, torch's threads
    _run([*LAUNCH, "-m", "draftkit.cli", "harvest", str(two)])  # 2 processes
    a, b = dir_bytes(RunPaths(one).harvest), dir_bytes(RunPaths(two).harvest)
    assert len([k for k in a if k.endswith(".safetensors")]) >= 6
    assert a == b
    meta = json.loads((RunPaths(two).harvest / "meta.json").read_text())
    assert meta["processes"] == 2 and all(r["shards"] > 0 for r in meta["per_rank"])
    man = json.loads((RunPaths(two).harvest / "manifest.json").read_text())
    assert man["complete"] and man["total_sequences"] == 40
    # a rerun with 2 processes finds every shard verified and recomputes nothing
    _run([*LAUNCH, "-m", "draftkit.cli", "harvest", str(two)])
    meta = json.loads((RunPaths(two).harvest / "meta.json").read_text())
    assert meta["timings"]["computed_shards"] == 0
    assert dir_bytes(RunPaths(two).harvest) == a
