"""Harvest's I/O path: the host ring's CPU fallback, shard files hashed as they are written (and
never hashed again by the run that wrote them), one fsync pass before the manifest, FP8 storage
(round trip, resume, a build that does not know the storage), packed forwards against
one-by-one, and the faults: a disk that fills under a pool of writers, a truncated shard."""

from __future__ import annotations

import errno
import hashlib
import json
import threading

import pytest
import torch
from _runs import make_run, one_thread
from safetensors import safe_open
from safetensors.torch import load_file

from draftkit.core import artifacts, config
from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.harvest import encode, shards, staging, writer
from draftkit.harvest import stage as hv
from draftkit.targets.capture import OnlineCapture


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def states(run, overrides=None) -> list[dict]:
    hs = hv.open_harvest(config.open_run(run, overrides).paths.harvest)
    return [{k: v.clone() for k, v in s.items()} for s in hs.sequences()]


# ----------------------------------------------------------------------------- staging


def test_host_ring_cpu_fallback_and_backpressure():
    """Without CUDA: plain (unpinned) buffers, synchronous copies, no stream or event; a slot
    comes back only when released, so acquire waits while every slot is in flight."""
    ring = staging.HostRing("cpu", {"aux": ((4,), torch.bfloat16), "ok": ((), torch.bool)},
                            capacity=6, slots=2)
    assert not ring.cuda and ring.stream is None
    a, b = ring.acquire(), ring.acquire()
    assert not a.buffers["aux"].is_pinned() and a.buffers["aux"].shape == (6, 4)
    ring.begin()
    src = torch.randn(3, 4)
    ring.copy(a, "aux", 2, src)
    ring.seal(a)
    assert a.event is None
    a.wait()  # returns at once
    assert torch.equal(a.buffers["aux"][2:5], src.to(torch.bfloat16))
    got = []
    t = threading.Thread(target=lambda: got.append(ring.acquire()))
    t.start()
    t.join(0.2)
    assert t.is_alive() and not got  # both slots in flight
    ring.release(b)
    t.join(5)
    assert got == [b] and got[0].buffers is b.buffers  # the same buffers, reused


# ----------------------------------------------------------------------------- shard files


def test_shard_written_raw_is_safetensors_and_hashed_as_written(tmp_path):
    tensors = {"aux": torch.randn(5, 6).to(torch.bfloat16), "last": torch.randn(5, 2),
               "input_ids": torch.arange(5), "aux_scale": torch.rand(5, 3),
               "q": torch.randn(5, 6).to(encode.FP8), "ok": torch.ones(5, dtype=torch.bool)}
    path = tmp_path / "x.safetensors"
    sha = writer.write_safetensors(path, tensors, {"draftkit": "{}"})
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    back = load_file(str(path))
    assert set(back) == set(tensors)
    assert all(torch.equal(back[k].view(torch.uint8), tensors[k].view(torch.uint8))
               for k in tensors)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"draftkit": "{}"}
        assert torch.equal(f.get_slice("aux")[1:3], tensors["aux"][1:3])
    assert not list(tmp_path.glob(".*.tmp"))


def test_run_hashes_only_what_it_did_not_write_and_fsyncs_once(tmp_path, tiny_target,
                                                               monkeypatch):
    run = make_run(tmp_path, tiny_target.tokenizer)
    hashed, synced = [], []
    orig_hash, orig_sync = artifacts.sha256_file, writer.fsync_files
    monkeypatch.setattr(artifacts, "sha256_file", lambda p, *a: hashed.append(p.name)
                        or orig_hash(p, *a))
    monkeypatch.setattr(writer, "fsync_files", lambda paths: synced.append(list(paths))
                        or orig_sync(paths))
    hdir = hv.harvest(run)
    man = json.loads((hdir / "manifest.json").read_text())
    assert hashed == []  # this run wrote every shard: checksums were taken while writing
    for e in man["shards"]:
        assert e["sha256"] == hashlib.sha256((hdir / e["file"]).read_bytes()).hexdigest()
    assert len(synced) == 2  # once per manifest (train, eval), every shard + sidecar in it
    assert {p.name for p in synced[0]} >= {e["file"] for e in man["shards"]}
    # a resumed run re-hashes the shards it did not write, and computes only the missing one
    (hdir / "manifest.json").unlink()
    (hdir / "shard-00001.safetensors").unlink()
    hashed.clear()
    hv.harvest(run)
    eval_shards = len(json.loads((hdir / "eval" / "manifest.json").read_text())["shards"])
    assert sorted(hashed) == sorted([e["file"] for e in man["shards"] if e["file"] !=
                                     "shard-00001.safetensors"] + [
        shards.shard_name(i) for i in range(eval_shards)])
    hv.open_harvest(hdir)


def test_truncated_shard_is_found_on_resume_and_rewritten(tmp_path, tiny_target, monkeypatch):
    run = make_run(tmp_path, tiny_target.tokenizer)
    hdir = hv.harvest(run)
    before = (hdir / "shard-00002.safetensors").read_bytes()
    (hdir / "shard-00002.safetensors").write_bytes(before[: len(before) // 2])  # sidecar kept
    with pytest.raises(DraftkitError, match="shard-00002.safetensors is corrupted"):
        hv.open_harvest(hdir)
    computed, orig = [], hv.harvest_shard
    monkeypatch.setattr(hv, "harvest_shard", lambda job, i, *a: computed.append(
        (job.split, i)) or orig(job, i, *a))
    hv.harvest(run)
    assert computed == [("train", 2)]
    assert (hdir / "shard-00002.safetensors").read_bytes() == before
    hv.open_harvest(hdir)


def test_disk_full_under_a_writer_pool_keeps_finished_shards(tmp_path, tiny_target,
                                                            monkeypatch):
    """Four writer threads, the disk fills at the third shard: every shard with a sidecar
    verifies, the rerun computes exactly the others, the result equals a clean harvest."""
    tok = tiny_target.tokenizer
    clean = hv.harvest(make_run(tmp_path / "a", tok))
    run = make_run(tmp_path / "b", tok, overrides=["harvest.writers=4"])
    orig, calls, lock = shards.write_shard, [], threading.Lock()

    def fills(*args):
        with lock:
            calls.append(args[1])
            full = len(calls) == 3
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return orig(*args)

    monkeypatch.setattr(shards, "write_shard", fills)
    with pytest.raises(shards.HarvestError, match=r"is full: \d+ shard\(s\) .* kept"):
        hv.harvest(run)
    monkeypatch.setattr(shards, "write_shard", orig)
    hdir = RunPaths(run).harvest
    job = hv.plan(config.open_run(run))[0]
    kept = [i for i in range(len(job.shards)) if shards.verified_entry(hdir, i, job.fingerprint)]
    assert 2 <= len(kept) < len(job.shards) and not list(hdir.glob(".*.tmp"))
    computed, orig_shard = [], hv.harvest_shard
    monkeypatch.setattr(hv, "harvest_shard", lambda job, i, *a: computed.append(
        (job.split, i)) or orig_shard(job, i, *a))
    hv.harvest(run)
    assert sorted(i for s, i in computed if s == "train") == [
        i for i in range(len(job.shards)) if i not in kept]
    for p in clean.glob("shard-*.safetensors"):
        assert (hdir / p.name).read_bytes() == p.read_bytes()


# ----------------------------------------------------------------------------- FP8


def test_fp8_encode_round_trip_per_token_scales():
    x = torch.randn(2, 7, 3 * 16) * torch.tensor([1e-3, 1.0, 50.0]).repeat_interleave(16)
    x[0, 0] = 0  # an all-zero token
    enc = encode.encode(x, 3, torch.bfloat16, "fp8")
    assert enc["q"].dtype == encode.FP8 and enc["scale"].shape == (2, 7, 3)
    back = encode.decode(enc["q"], enc["scale"], torch.float32)
    blocks = (back - x).abs().unflatten(-1, (3, 16)).amax(-1)  # [2, 7, 3]
    # e4m3 keeps 3 mantissa bits: error <= 1/16 of the block's max, each block on its own scale
    assert (blocks <= x.abs().unflatten(-1, (3, 16)).amax(-1) / 16 + 1e-12).all()
    assert torch.equal(back[0, 0], torch.zeros(48))
    assert encode.bytes_per_token(3, 4096, "bfloat16", "fp8") * 2 < encode.bytes_per_token(
        3, 4096, "bfloat16") * 1.01
    with pytest.raises(DraftkitError, match="'fp4'.*does not know.*'fp8'"):
        encode.check_storage("fp4")


def test_fp8_harvest_round_trip_resume_and_unknown_storage(tmp_path, tiny_target, monkeypatch):
    tok = tiny_target.tokenizer
    ref_run = make_run(tmp_path / "ref", tok, overrides=["harvest.dtype=float32"])
    hv.harvest(ref_run)
    ref = states(ref_run)
    fp8 = ["harvest.dtype=float32", "harvest.storage_dtype=fp8"]
    clean_run = make_run(tmp_path / "a", tok, overrides=fp8)
    clean = hv.harvest(clean_run)
    man = json.loads((clean / "manifest.json").read_text())
    assert man["format"] == 2 and man["storage_dtype"] == "fp8"
    assert man["bytes_per_token"] == 4 * (128 + 4)  # 3 aux + last, 1 byte each + a scale
    with safe_open(str(clean / "shard-00000.safetensors"), framework="pt") as f:
        assert f.get_slice("aux").get_dtype() == "F8_E4M3"
        assert f.get_slice("aux_scale").get_shape()[1] == 3
    got = states(clean_run)
    for a, b in zip(ref, got, strict=True):
        assert b["aux"].dtype == torch.float32 and torch.equal(a["input_ids"], b["input_ids"])
        for name in ("aux", "last"):
            err = (a[name] - b[name]).abs().amax() / a[name].abs().amax()
            assert err <= 1 / 16, (name, err)
    whole = hv.open_harvest(clean).shard(0)
    assert "aux_scale" not in whole and whole["aux"].dtype == torch.float32
    # resume after a kill mid-harvest: byte-identical to the clean fp8 run
    run = make_run(tmp_path / "b", tok, overrides=[*fp8, "harvest.writers=1"])
    orig, written = shards.write_shard, []

    def crash(*args):
        if len(written) == 2:
            raise KeyboardInterrupt("simulated kill")
        written.append(args[1])
        return orig(*args)

    monkeypatch.setattr(shards, "write_shard", crash)
    with pytest.raises(KeyboardInterrupt):
        hv.harvest(run)
    monkeypatch.setattr(shards, "write_shard", orig)
    hdir = hv.harvest(run)
    for p in [*clean.glob("shard-*.safetensors"), clean / "manifest.json"]:
        assert (hdir / p.name).read_bytes() == p.read_bytes(), p.name
    # a storage this build does not know, or a newer format: a clear error, no tensor read
    man["storage_dtype"] = "fp4"
    (hdir / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(shards.HarvestError, match="'fp4' is a hidden-state storage this "
                                                  "draftkit does not know.*Upgrade draftkit"):
        hv.open_harvest(hdir)
    man["format"] = 3
    (hdir / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(shards.HarvestError, match=r"format version \(3; this draftkit reads 1, "
                                                  r"2\): upgrade draftkit"):
        hv.open_harvest(hdir)


# ----------------------------------------------------------------------------- packing


@pytest.mark.parametrize("packing", ["varlen", "pad"])
def test_packed_forwards_give_the_one_by_one_states(tmp_path, tiny_target, monkeypatch, packing):
    """Several sequences of different lengths in one forward (varlen: back to back in one row,
    positions restarting; pad: sorted and right-padded) store the states each sequence's own
    forward gives, within fp32 noise."""
    run = make_run(tmp_path, tiny_target.tokenizer, overrides=[
        "harvest.dtype=float32", "harvest.batch_tokens=1000000"])
    one = []
    monkeypatch.setattr(hv, "plan_batches", lambda lens, *a: [[j] for j in range(len(lens))])
    hv.harvest(run)
    one = states(run)
    monkeypatch.undo()
    shapes, orig = [], OnlineCapture.__call__
    monkeypatch.setattr(OnlineCapture, "__call__", lambda self, x, m=None, **k: shapes.append(
        (tuple(x.shape), sorted(k))) or orig(self, x, m, **k))
    hv.harvest(run, [f"harvest.packing={packing}"])
    assert json.loads((RunPaths(run).harvest / "manifest.json").read_text())["packing"] == packing
    if packing == "varlen":
        assert all(b == 1 and k == ["position_ids"] for (b, _), k in shapes)
    assert len(shapes) < len(one) / 2  # forwards hold several sequences
    packed = states(run, [f"harvest.packing={packing}"])
    for a, b in zip(one, packed, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
        for name in ("aux", "last"):
            assert torch.allclose(a[name], b[name], rtol=1e-4, atol=1e-4), name


def test_packing_resolves_from_the_device():
    assert hv.resolve_packing("auto", "cpu") == "equal"
    assert hv.resolve_packing("auto", "cuda:0") == "pad"
    assert hv.forward_inputs([torch.tensor([5, 6]), torch.tensor([7, 8, 9])], "varlen")[
        "position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    with pytest.raises(DraftkitError, match="harvest.packing='sorted'; choose one of auto"):
        hv.resolve_packing("sorted", "cpu")
