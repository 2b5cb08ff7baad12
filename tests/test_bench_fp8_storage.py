"""scripts/bench_fp8_storage.py: the storage-bf16 arm is the source's own harvest when the source
stored bf16 states (linked in, not computed again), and harvests its own otherwise."""

from __future__ import annotations

import json

import pytest
from _runs import script

from draftkit.init.stage import init_run


@pytest.mark.parametrize("storage, linked", [("", True), ("fp8", False)])
def test_the_bf16_arm_reuses_a_bf16_source_harvest(tmp_path, storage, linked):
    src = init_run("tiny-llama", "math", name="src", runs_dir=tmp_path,
                   overrides=["harvest.dtype=bfloat16", f"harvest.storage_dtype={storage}"])
    (src / "harvest").mkdir()
    (src / "harvest" / "meta.json").write_text(json.dumps({"stage": "harvest"}))
    (src / "data").mkdir()
    arm = tmp_path / "fp8-storage-bf16"
    script("bench_fp8_storage").reuse_bf16_harvest(src, arm)
    meta = arm / "harvest" / "meta.json"
    assert meta.is_file() == linked
    if linked:  # the same file, not a copy: no second harvest
        assert meta.stat().st_ino == (src / "harvest" / "meta.json").stat().st_ino
