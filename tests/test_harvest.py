"""Harvest: exact capture vs HF hidden states, logits rebuilt from stored states, the shard
format, resume after a crash or a kill, clean redo on changed data, and the load-time checks
(checksums, other target / layer ids, NaN and malformed samples)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _runs import conversations, make_run, one_thread, write_split

from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.harvest import shards
from draftkit.harvest import stage as hv
from draftkit.init.stage import init_run
from draftkit.targets.capture import OnlineCapture, logits_from_last

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny-model matmuls on 2 OpenMP threads crawl on a shared, busy CPU; results are the
    same with any thread count (the 2-process test compares 1 vs 2 threads per process)."""
    with one_thread():
        yield


def rows(run: Path, split: str = "train"):
    import datasets

    return datasets.load_from_disk(str(RunPaths(run).data / split))


def dir_bytes(directory: Path) -> dict[str, bytes]:
    """Every shard and manifest under a harvest dir (sidecars and meta.json excluded)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.name == "manifest.json" or p.suffix == ".safetensors"}


# ----------------------------------------------------------------------------- planning


def test_plan_shards_and_batches():
    assert shards.plan_shards([5, 4, 3, 9], 8) == [[0], [1, 2], [3]]
    assert shards.plan_shards([10], 8) == [[0]]
    assert hv.plan_batches([4, 3, 4, 3, 5], 8, "equal") == [[1, 3], [0, 2], [4]]
    assert hv.plan_batches([4, 3, 4, 3, 5], 8, "pad") == [[1, 3], [0, 2], [4]]
    assert hv.plan_batches([4, 3, 4, 3, 5], 12, "pad") == [[1, 3, 0], [2, 4]]
    assert hv.plan_batches([4, 4, 4, 4], 12, "equal") == [[0, 1, 2], [3]]
    assert hv.plan_batches([4, 3, 4, 3, 5], 8, "varlen") == [[0, 1], [2, 3], [4]]
    assert hv.plan_batches([9, 2], 8, "varlen") == [[0], [1]]
    assert shards.bytes_per_token(3, 576, "bfloat16") == 4 * 576 * 2


# ----------------------------------------------------------------------------- exactness


def check_exact(run: Path, model, ids: list[int]) -> None:
    """Stored fp32 states == the unpadded single-sequence HF forward, per sequence."""
    hs = hv.open_harvest(RunPaths(run).harvest, aux_layer_ids=ids)
    ds = rows(run)
    n = model.config.num_hidden_layers
    assert len(hs) == len(ds) and hs.sample_indices() == list(range(len(ds)))
    h = model.config.hidden_size
    for i, seq in enumerate(hs.sequences()):
        x = torch.tensor(ds[i]["input_ids"])[None]  # [1, T]
        assert torch.equal(seq["input_ids"], x[0])
        assert torch.equal(seq["loss_mask"], torch.tensor(ds[i]["loss_mask"]))
        with torch.no_grad():
            out = model(x, output_hidden_states=True)  # hidden_states[-1] pre-norm (untied)
        assert len(out.hidden_states) == n + 1
        for j, k in enumerate(ids):
            assert torch.equal(seq["aux"][:, j * h:(j + 1) * h], out.hidden_states[k][0]), (i, k)
        assert torch.equal(seq["last"], out.hidden_states[n][0])
        # logits rebuilt from the stored last state through the frozen norm + lm_head
        assert torch.equal(logits_from_last(model, seq["last"]), out.logits[0])


def check_bf16(run: Path, overrides: list[str]) -> None:
    """bf16 storage == the fp32 reference harvest cast to bf16 (a config change: clean redo)."""
    ref = [{k: v.clone() for k, v in s.items()}
           for s in hv.open_harvest(RunPaths(run).harvest).sequences()]
    hv.harvest(run, overrides)
    hs = hv.open_harvest(RunPaths(run).harvest)
    assert hs.manifest["dtype"] == "bfloat16"
    for a, b in zip(ref, hs.sequences(), strict=True):
        assert b["aux"].dtype == torch.bfloat16
        assert torch.equal(b["aux"], a["aux"].to(torch.bfloat16))
        assert torch.equal(b["last"], a["last"].to(torch.bfloat16))


def test_tiny_exact_and_logits(tmp_path, tiny_target, monkeypatch):
    tok, model = tiny_target.tokenizer, tiny_target.model
    n = model.config.num_hidden_layers
    ids = [0, 2, n // 2, n - 3, n]  # embeddings, 2, N//2, N-3, N
    run = make_run(tmp_path, tok, overrides=[f"draft.aux_layer_ids={ids}",
                                             "harvest.dtype=float32"])
    batches, orig = [], OnlineCapture.__call__
    monkeypatch.setattr(OnlineCapture, "__call__", lambda self, x, m=None: batches.append(
        (tuple(x.shape), m)) or orig(self, x, m))
    out = hv.harvest(run)
    assert any(b > 1 for (b, _), _ in batches) and all(m is None for _, m in batches)
    assert out == RunPaths(run).harvest
    man = json.loads((out / "manifest.json").read_text())
    assert man["complete"] and man["dtype"] == "float32" and man["aux_layer_ids"] == ids
    assert man["bytes_per_token"] == (len(ids) + 1) * 128 * 4
    assert man["total_tokens"] == sum(rows(run)["length"]) == sum(s["tokens"]
                                                                  for s in man["shards"])
    assert len(man["shards"]) > 2 and (out / "meta.json").is_file()
    monkeypatch.setattr(model.config, "tie_last_hidden_states", False, raising=False)
    check_exact(run, model, ids)
    check_bf16(run, ["harvest.dtype=bfloat16"])


def test_padded_batches_match_within_fp32_noise(tmp_path, tiny_target, monkeypatch):
    """harvest.packing=pad packs different lengths into one forward: equal up to fp32 noise."""
    run = make_run(tmp_path, tiny_target.tokenizer, overrides=["harvest.dtype=float32"])
    hv.harvest(run)
    exact = [s["aux"].clone() for s in hv.open_harvest(RunPaths(run).harvest).sequences()]
    shapes, orig = [], OnlineCapture.__call__
    monkeypatch.setattr(OnlineCapture, "__call__", lambda self, x, m=None: shapes.append(
        (tuple(x.shape), m is not None)) or orig(self, x, m))
    hv.harvest(run, ["harvest.packing=pad"])
    assert any(padded and b >= 2 for (b, _), padded in shapes)
    padded = [s["aux"] for s in hv.open_harvest(RunPaths(run).harvest).sequences()]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(exact, padded,
                                                                          strict=True))


@pytest.mark.slow
def test_smollm2_exact_and_logits(tmp_path, smollm2_target, monkeypatch):
    tok, model = smollm2_target.tokenizer, smollm2_target.model
    ids = [2, 15, 27, 30]  # 2, N//2, N-3, N
    run = make_run(tmp_path, tok, target="smollm2-135m", n_train=8, n_eval=2, hi=30,
                   overrides=[f"draft.aux_layer_ids={ids}", "target.dtype=float32",
                              "harvest.dtype=float32",
                              "harvest.batch_tokens=256"])
    hv.harvest(run)
    monkeypatch.setattr(model.config, "tie_last_hidden_states", False, raising=False)
    check_exact(run, model, ids)
    check_bf16(run, ["harvest.dtype=bfloat16", "harvest.batch_tokens=256"])


def test_online_capture_matches_shards(tmp_path, tiny_target):
    run = make_run(tmp_path, tiny_target.tokenizer, overrides=["harvest.dtype=float32"])
    hv.harvest(run)
    hs = hv.open_harvest(RunPaths(run).harvest)
    cap = OnlineCapture(tiny_target.model, [2, 4, 5])
    lens = hs.lengths()
    a, b = next((i, j) for i in range(len(lens)) for j in range(i + 1, len(lens))
                if lens[i] == lens[j])
    feats = cap(torch.stack([hs[a]["input_ids"], hs[b]["input_ids"]]),
                torch.ones(2, lens[a], dtype=torch.long))  # [2, T]
    assert feats["aux"].shape == (2, lens[a], 3 * 128) and feats["last"].shape == (2, lens[a], 128)
    for row, i in enumerate((a, b)):
        assert torch.equal(feats["aux"][row], hs[i]["aux"])
        assert torch.equal(feats["last"][row], hs[i]["last"])


# ----------------------------------------------------------------------------- format + reader


def test_eval_subset_and_reader(tmp_path, tiny_target):
    run = make_run(tmp_path, tiny_target.tokenizer, n_eval=10,
                   overrides=["harvest.eval_sequences=7"])
    hv.harvest(run)
    hdir = RunPaths(run).harvest
    ev = hv.open_harvest(hdir / "eval", target_name="tiny-llama", aux_layer_ids=[2, 4, 5])
    assert len(ev) == 7 and ev.manifest["split"] == "eval"
    eval_rows = rows(run, "eval")
    assert [s["input_ids"].tolist() for s in ev.sequences()] == list(eval_rows["input_ids"])[:7]
    tr = hv.open_harvest(hdir)
    whole = tr.shard(0)
    assert set(whole) == {"aux", "last", "input_ids", "loss_mask", "seq_lens", "sample_idx"}
    assert whole["aux"].dtype == torch.bfloat16 and whole["input_ids"].dtype == torch.int64
    first = int(whole["seq_lens"][0])
    assert torch.equal(tr[0]["aux"], whole["aux"][:first])
    assert tr.lengths() == list(rows(run)["length"])


def test_wrong_target_layers_data_and_corruption(tmp_path, tiny_target):
    run = make_run(tmp_path, tiny_target.tokenizer)
    hdir = hv.harvest(run)
    with pytest.raises(DraftkitError, match="target 'tiny-llama', not 'smollm2-135m'"):
        hv.open_harvest(hdir, target_name="smollm2-135m")
    with pytest.raises(DraftkitError, match=r"aux layer ids \[2, 4, 5\].*\[1, 3, 5\]"):
        hv.open_harvest(hdir, aux_layer_ids=[1, 3, 5])
    with pytest.raises(DraftkitError, match="other prepared data"):
        hv.open_harvest(hdir, data_fingerprint="0" * 64)
    shard = hdir / "shard-00001.safetensors"
    blob = bytearray(shard.read_bytes())
    blob[-3] ^= 0xFF  # flip one byte of tensor data
    shard.write_bytes(bytes(blob))
    with pytest.raises(DraftkitError, match=r"shard-00001.safetensors is corrupted.*rerun"):
        hv.open_harvest(hdir)
    lazy = hv.open_harvest(hdir, lazy=True)  # opens; the bad shard fails at its first read
    lazy[0]
    with pytest.raises(DraftkitError, match="shard-00001.safetensors is corrupted"):
        list(lazy.sequences())
    hv.harvest(run)  # the corrupted shard fails its checksum on resume and is redone
    assert len(hv.open_harvest(hdir)) == 24


def test_nan_and_bad_samples_are_named(tmp_path, tiny_target, monkeypatch):
    run = make_run(tmp_path, tiny_target.tokenizer)
    bad = rows(run)[9]
    orig = OnlineCapture.__call__

    def poisoned(self, input_ids, attention_mask=None):
        out = orig(self, input_ids, attention_mask)
        for b in range(input_ids.shape[0]):
            if input_ids[b, :bad["length"]].tolist() == bad["input_ids"]:
                out["last"][b, 1, 5] = float("nan")
        return out

    monkeypatch.setattr(OnlineCapture, "__call__", poisoned)
    with pytest.raises(DraftkitError, match=r"NaN/Inf hidden states \(last\).*id='s-train-9' \(row 9 "):
        hv.harvest(run)
    assert not (RunPaths(run).harvest / "manifest.json").exists()
    monkeypatch.undo()

    import datasets

    data = rows(run).to_dict()
    data["length"][5] += 1  # length column disagrees with input_ids
    datasets.Dataset.from_dict(data).save_to_disk(str(RunPaths(run).data / "train"))
    with pytest.raises(DraftkitError, match=r"id='s-train-5' \(row 5 of the prepared train"):
        hv.harvest(run)


def test_shape_mismatch_is_named(tmp_path, tiny_target, monkeypatch):
    run = make_run(tmp_path, tiny_target.tokenizer)
    orig = OnlineCapture.__call__
    monkeypatch.setattr(OnlineCapture, "__call__", lambda self, x, m=None: {
        **orig(self, x, m), "last": orig(self, x, m)["last"][..., :64]})
    with pytest.raises(DraftkitError, match=r"last \(\d+, \d+, 64\).*id='s-train-\d+'"):
        hv.harvest(run)


# ----------------------------------------------------------------------------- resume + redo


def test_crash_resume_equals_clean_run(tmp_path, tiny_target, monkeypatch):
    tok = tiny_target.tokenizer
    clean = make_run(tmp_path / "a", tok)
    hv.harvest(clean)
    # one writer thread: "after two shards" is then a fixed point (test_harvest_io.py kills a pool)
    run = make_run(tmp_path / "b", tok, overrides=["harvest.writers=1"])
    orig, written = shards.write_shard, []

    def crash_after_two(*args, **kwargs):
        if len(written) == 2:
            raise KeyboardInterrupt("simulated kill")
        written.append(args[1])
        return orig(*args, **kwargs)

    monkeypatch.setattr(shards, "write_shard", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        hv.harvest(run)
    hdir = RunPaths(run).harvest
    assert not (hdir / "manifest.json").exists() and written == [0, 1]
    # leftovers of a kill: a temp file and a half-written shard that never got its sidecar
    (hdir / ".shard-00002.safetensors.x.tmp").write_bytes(b"partial")
    (hdir / "shard-00003.safetensors").write_bytes(b"truncated")
    monkeypatch.setattr(shards, "write_shard", orig)
    computed = []
    orig_shard = hv.harvest_shard
    monkeypatch.setattr(hv, "harvest_shard", lambda job, i, *a: computed.append(
        (job.split, i)) or orig_shard(job, i, *a))
    hv.harvest(run)
    n_train = len(json.loads((hdir / "manifest.json").read_text())["shards"])
    assert ("train", 0) not in computed and ("train", 1) not in computed
    assert [i for s, i in computed if s == "train"] == list(range(2, n_train))
    assert dir_bytes(hdir) == dir_bytes(RunPaths(clean).harvest)
    assert not list(hdir.glob(".*.tmp"))
    computed.clear()
    hv.harvest(run)  # complete: nothing is recomputed, the target is not even loaded
    assert computed == [] and dir_bytes(hdir) == dir_bytes(RunPaths(clean).harvest)


def test_changed_data_redoes_cleanly(tmp_path, tiny_target, capfd):
    tok = tiny_target.tokenizer
    run = make_run(tmp_path, tok, n_train=40)
    hdir = hv.harvest(run)
    old = json.loads((hdir / "manifest.json").read_text())
    assert hv.current_fingerprint(run) == old["data_fingerprint"]
    write_split(run, "train", tok, conversations(12, seed=5), "t")
    with pytest.raises(DraftkitError, match="other prepared data"):
        hv.open_harvest(hdir, data_fingerprint=hv.current_fingerprint(run))
    hv.harvest(run)
    hv.open_harvest(hdir, data_fingerprint=hv.current_fingerprint(run))
    assert "made from other data or settings; redoing" in capfd.readouterr().err
    new = hv.open_harvest(hdir)
    assert new.manifest["data_fingerprint"] != old["data_fingerprint"]
    assert len(new) == 12 and len(list(hdir.glob("shard-*.safetensors"))) == new.num_shards
    assert [s["input_ids"].tolist() for s in new.sequences()] == list(rows(run)["input_ids"])


def test_missing_prepared_data(tmp_path):
    run = init_run("tiny-llama", "math", name="empty", runs_dir=tmp_path)
    with pytest.raises(DraftkitError, match="draftkit prepare"):
        hv.harvest(run)


_SLOW_HARVEST = """
import sys, time
from draftkit import api
from draftkit.harvest import shards
orig = shards.write_shard
def slow(*a, **k):
    out = orig(*a, **k)
    time.sleep(0.4)
    return out
shards.write_shard = slow
api.harvest(sys.argv[1])
"""


def test_sigkill_then_rerun_equals_clean_run(tmp_path, tiny_target):
    tok = tiny_target.tokenizer
    clean = make_run(tmp_path / "a", tok)
    hv.harvest(clean)
    run = make_run(tmp_path / "b", tok)
    hdir = RunPaths(run).harvest
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_HARVEST, str(run)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while not (hdir / ".progress" / "shard-00000.json").exists():
            assert proc.poll() is None and time.time() < deadline, "harvest ended early"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (hdir / "manifest.json").exists()
    hv.harvest(run)
    assert dir_bytes(hdir) == dir_bytes(RunPaths(clean).harvest)
