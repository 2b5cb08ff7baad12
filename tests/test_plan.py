"""`draftkit plan` / init's plan: tokens, hidden-state disk, memory and time for a run; init
picks online training when a stored harvest cannot fit the disk; harvest refuses to start on
a disk too small, and a disk that fills mid-harvest keeps every shard written and resumes."""

from __future__ import annotations

import errno
import json
import shutil
from collections import namedtuple

import pytest
import yaml
from _runs import make_run, one_thread

from draftkit import cli
from draftkit.core import config
from draftkit.core.artifacts import RunPaths
from draftkit.harvest import shards
from draftkit.harvest import stage as hv
from draftkit.init import plan

Usage = namedtuple("Usage", "total used free")


def fake_free(monkeypatch, free_bytes: int) -> None:
    """Every disk looks like it has `free_bytes` free (what plan and harvest read)."""
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: Usage(10**15, 0, free_bytes))


def _cli(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_qwen3_8b_init_plans_disk_memory_time_and_picks_online_when_it_cannot_fit(
        tmp_path, capsys, monkeypatch):
    fake_free(monkeypatch, 500 * 10**9)  # 500 GB: the ~1.1 TB stored harvest does not fit
    code, out, err = _cli(capsys, "init", "--target", "Qwen3-8B", "--data", "math",
                          "--dir", str(tmp_path))
    assert code == 0, err
    run = tmp_path / "qwen3-8b-math-eagle3"
    assert yaml.safe_load((run / "draftkit.yaml").read_text())["train"]["mode"] == "online"
    assert "ESTIMATE" in out and "a stored harvest would need 1.1 TB" in out
    for line in ("harvest     ", "disk        ", "memory      ", "time        "):
        assert line in out
    # taps [2, 18, 33] + last, x 4096 x bf16 bytes = 32 KiB per token, + 16 B of ids
    assert "x 32,784 B" in out and "online train" in out and " h" in out
    assert f"draftkit harvest {run}" not in out  # online: no harvest step
    p = plan.plan_run(run)
    assert p.mode == "online" and not p.fits and p.bytes_per_token == 4 * 4096 * 2 + 16
    assert p.harvest_tokens == (20000 + 200) * p.tokens_per_sample
    assert p.memory["online train"] > p.memory["stored train"] > 0
    assert all(s > 0 for s in p.seconds.values())


def test_big_disk_keeps_stored_and_an_explicit_mode_is_kept(tmp_path, capsys, monkeypatch):
    fake_free(monkeypatch, 5 * 10**12)
    code, out, _ = _cli(capsys, "init", "--target", "Qwen3-8B", "--data", "math", "--dir",
                        str(tmp_path), "--name", "big")
    assert code == 0 and "stored harvest fits" in out
    assert config.load(tmp_path / "big").train.mode == "stored"
    fake_free(monkeypatch, 10**9)
    code, out, _ = _cli(capsys, "init", "--target", "Qwen3-8B", "--data", "math", "--dir",
                        str(tmp_path), "--name", "forced", "train.mode=stored")
    assert code == 0 and config.load(tmp_path / "forced").train.mode == "stored"
    assert "does NOT fit" in out and "harvest.dir=PATH" in out and "data.max_samples" in out
    # `draftkit plan` of an edited config: fewer samples fit again
    code, out, _ = _cli(capsys, "plan", str(tmp_path / "forced"), "data.max_samples=10",
                        "data.eval_samples=1")
    assert code == 0 and "10 train + 1 eval" in out and "stored harvest fits" not in out
    fake_free(monkeypatch, 5 * 10**12)
    code, out, _ = _cli(capsys, "plan", str(tmp_path / "forced"), "data.max_samples=10")
    assert "stored harvest fits" in out


def test_harvest_refuses_a_disk_too_small_and_names_the_fixes(tmp_path, tiny_target,
                                                              monkeypatch, capsys):
    run = make_run(tmp_path, tiny_target.tokenizer)
    p = plan.plan_run(run)  # prepared data: real counts
    assert p.tokens_from.startswith("prepared data") and p.train_samples == 24
    fake_free(monkeypatch, p.disk_bytes // 2)
    with pytest.raises(shards.HarvestError) as e:
        hv.harvest(run)
    for fix in ("train.mode=online", "data.max_samples", "harvest.dir", "nothing was started"):
        assert fix in str(e.value)
    assert not list(RunPaths(run).harvest.glob("shard-*"))
    code, out, _ = _cli(capsys, "plan", str(run))
    assert code == 0 and "does NOT fit" in out
    # harvest.dir on another (big) disk: the shards go there, the run's own dir stays empty
    fake_free(monkeypatch, 10**12)
    other = tmp_path / "big-disk" / "h"
    hdir = hv.harvest(run, [f"harvest.dir={other}"])
    assert hdir == other and (other / "manifest.json").is_file()
    assert not (RunPaths(run).harvest / "manifest.json").exists()


def test_disk_full_mid_harvest_keeps_written_shards_and_resumes(tmp_path, tiny_target,
                                                                monkeypatch):
    run = make_run(tmp_path, tiny_target.tokenizer)
    orig, written = shards.write_shard, []

    def full_after_two(*args, **kwargs):
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(args[1])
        return orig(*args, **kwargs)

    monkeypatch.setattr(shards, "write_shard", full_after_two)
    with one_thread(), pytest.raises(shards.HarvestError, match="is full: 2 shard"):
        hv.harvest(run)
    hdir = RunPaths(run).harvest
    job = hv.plan(config.open_run(run))[0]
    assert [i for i in range(len(job.shards))
            if shards.verified_entry(hdir, i, job.fingerprint)] == [0, 1]
    monkeypatch.setattr(shards, "write_shard", orig)
    computed = []
    orig_shard = hv.harvest_shard
    monkeypatch.setattr(hv, "harvest_shard", lambda job, i, *a: computed.append(
        (job.split, i)) or orig_shard(job, i, *a))
    with one_thread():
        hv.harvest(run)
    n_train = len(json.loads((hdir / "manifest.json").read_text())["shards"])
    assert [i for s, i in computed if s == "train"] == list(range(2, n_train))
    hv.open_harvest(hdir)  # complete and verified
