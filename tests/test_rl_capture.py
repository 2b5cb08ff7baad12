"""`refresh.capture=harvest` on the tiny target: the same draft as online capture (EAGLE-3;
the draft LM in test_draft_lm_refresh.py), a capture reused after a crash, one stopped midway
resumed, a truncated shard recaptured, the capture removed after a rejection, a bad mode
refused."""

from __future__ import annotations

import pytest
import torch
from _rl_helpers import make_run, save_policy, write_rollouts

from draftkit.core.errors import DraftkitError
from draftkit.harvest import shards
from draftkit.rl import capture, finetune
from draftkit.rl.job import refresh
from draftkit.rl.publish import DraftStore

# several fine-tune batches (padded: rows of different lengths) over several shards
BASE = ["refresh.budget_steps=30", "refresh.lr=3e-3", "refresh.batch_tokens=256",
        "refresh.gate=false", "harvest.shard_tokens=256"]
FP32 = [*BASE, "harvest.dtype=float32"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("capture")
    try:
        yield {"tmp": tmp, "target": tiny_target,
               "policy": save_policy(tiny_target, tmp / "ckpt" / "step_1"),
               "r1": write_rollouts(tiny_target, tmp / "rollouts" / "step_1.jsonl", 16, 0)}
    finally:
        torch.set_num_threads(threads)


def _refresh(setup, name: str, overrides: list[str], **kw) -> tuple[dict, dict]:
    """A fresh run refreshed once: (result, published tensors)."""
    from safetensors.torch import load_file

    run = setup["tmp"] / "runs" / name
    if not run.is_dir():
        make_run(setup["tmp"] / "runs", setup["target"], name=name)
    res = refresh(run, setup["policy"], [setup["r1"]], overrides, **kw)
    return res, load_file(str(run / "drafts" / res["version"] / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def online(setup):
    """Online-capture drafts of the same job: fp32 features, and features rounded to bf16
    (what a bfloat16 shard stores) -> {dtype: (result, tensors)}."""
    out = {"float32": _refresh(setup, "online-fp32", [*FP32, "refresh.capture=online"])}
    real = finetune.feature_batches

    def rounded(*args):
        return [{k: v.to(torch.bfloat16).float() if k in capture.FEATURES else v
                 for k, v in b.items()} for b in real(*args)]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(finetune, "feature_batches", rounded)
        out["bfloat16"] = _refresh(setup, "online-bf16", [*BASE, "refresh.capture=online"])
    return out


def _count_shards(monkeypatch) -> list[int]:
    calls, real = [], capture.capture_shard

    def counted(*args):
        calls.append(args[6])  # the shard index
        return real(*args)

    monkeypatch.setattr(capture, "capture_shard", counted)
    return calls


def _crash_after_capture(setup, name: str) -> DraftStore:
    """A refresh stopped right after its capture completed (SIGTERM during the fine-tune)."""
    make_run(setup["tmp"] / "runs", setup["target"], name=name)
    store = DraftStore(setup["tmp"] / "runs" / name)
    with pytest.raises(finetune.Stopped):
        _refresh(setup, name, [*FP32, "refresh.capture=harvest"],
                 should_stop=lambda: any((store.root / capture.ROOT).glob("*/manifest.json")))
    assert store.versions() == [] and not store.events()
    return store


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harvest_capture_trains_the_same_draft_as_online(setup, online, dtype, monkeypatch):
    calls = _count_shards(monkeypatch)
    res, tensors = _refresh(setup, f"harvest-{dtype}",
                            [*BASE, f"harvest.dtype={dtype}", "refresh.capture=harvest"])
    ref_res, ref = online[dtype]
    assert res["status"] == "published" and _same(tensors, ref)  # bit for bit
    assert not _same(online["float32"][1], online["bfloat16"][1])  # the dtype does matter
    cap, ref_cap = res["lineage"]["capture"], ref_res["lineage"]["capture"]
    assert cap["mode"] == "harvest" and ref_cap["mode"] == "online"
    assert cap["tokens"] == ref_cap["tokens"] > 0 and cap["dtype"] == dtype
    assert cap["shards"] == len(calls) > 1 and cap["reused_shards"] == 0
    per_token = shards.bytes_per_token(3, setup["target"].model.config.hidden_size, dtype)
    assert cap["bytes"] > cap["tokens"] * per_token  # hidden states + ids + headers
    store = DraftStore(setup["tmp"] / "runs" / f"harvest-{dtype}")
    assert store.lineage(res["version"])["capture"] == cap
    assert not (store.root / capture.ROOT).exists()  # removed once published


def test_crash_after_capture_reuses_it(setup, online, monkeypatch):
    store = _crash_after_capture(setup, "crash")
    calls = _count_shards(monkeypatch)
    res, tensors = _refresh(setup, "crash", [*FP32, "refresh.capture=harvest"])
    assert calls == [] and res["lineage"]["capture"]["reused_shards"] > 1  # nothing recaptured
    assert _same(tensors, online["float32"][1])  # = the uninterrupted run
    assert [e["event"] for e in store.events()] == ["published"]
    assert not (store.root / capture.ROOT).exists()


def test_truncated_shard_is_recaptured(setup, online, monkeypatch):
    store = _crash_after_capture(setup, "truncated")
    (job,) = [p for p in (store.root / capture.ROOT).iterdir()]
    shard = job / shards.shard_name(1)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a torn write
    other = store.root / capture.ROOT / "0123456789abcdef"  # a capture another job left
    other.mkdir()
    calls = _count_shards(monkeypatch)
    res, tensors = _refresh(setup, "truncated", [*FP32, "refresh.capture=harvest"])
    assert calls == [1]  # only the bad shard
    assert _same(tensors, online["float32"][1])
    assert not other.exists() and not (store.root / capture.ROOT).exists()


def test_capture_stopped_midway_keeps_its_finished_shards(setup, online, monkeypatch):
    name = "midway"
    make_run(setup["tmp"] / "runs", setup["target"], name=name)
    store = DraftStore(setup["tmp"] / "runs" / name)
    with pytest.raises(finetune.Stopped, match="during capture"):  # SIGTERM after shard 0
        _refresh(setup, name, [*FP32, "refresh.capture=harvest"],
                 should_stop=lambda: any((store.root / capture.ROOT).glob("*/shard-*")))
    calls = _count_shards(monkeypatch)
    res, tensors = _refresh(setup, name, [*FP32, "refresh.capture=harvest"])
    cap = res["lineage"]["capture"]
    assert calls == list(range(1, cap["shards"])) and cap["reused_shards"] == 1
    assert _same(tensors, online["float32"][1])


def test_rejected_job_removes_its_capture(setup, tmp_path):
    run = make_run(tmp_path, setup["target"], name="rejected")
    res = refresh(run, setup["policy"], [setup["r1"]],
                  [*FP32, "refresh.capture=harvest", "refresh.budget_steps=2",
                   "refresh.min_gain=100", "refresh.gate=true"])
    assert res["status"] == "rejected" and res["lineage"]["capture"]["mode"] == "harvest"
    assert not (DraftStore(run).root / capture.ROOT).exists()


def test_capture_mode_is_checked_before_anything_runs(setup, tmp_path):
    from draftkit import cli

    run = make_run(tmp_path, setup["target"], name="bad")
    with pytest.raises(DraftkitError, match=r"refresh.capture='disk'.*online.*harvest"):
        refresh(run, tmp_path / "no-such-policy", [setup["r1"]], ["refresh.capture=disk"])
    with pytest.raises(DraftkitError, match=r"refresh.capture='disk'"):  # a CLI override
        cli.run(["refresh", str(run), "--policy", str(setup["policy"]), "--rollouts",
                 str(setup["r1"]), "refresh.capture=disk"])
