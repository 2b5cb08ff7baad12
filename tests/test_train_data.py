"""Training data that streams (train/data.py, core/batching.py): batches read lazily from
harvest shards through DataLoader workers equal the old in-memory batches, resume exactly, keep
no shard mapped; an epoch smaller than grad_accum x processes stops with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftkit.core import batching
from draftkit.core.config import TrackingConfig, TrainConfig
from draftkit.core.errors import DraftkitError
from draftkit.harvest import shards
from draftkit.train import loop
from draftkit.train.data import BatchBuilder, HarvestSource, PlannedBatches, epoch_plan

H, AUX = 8, [1, 2, 3]


def fake_harvest(directory, lengths: list[int], seed: int, shard_tokens: int = 40):
    """A verified harvest dir of random hidden states (the shard format, no target needed)."""
    g = torch.Generator().manual_seed(seed)
    entries = []
    for index, rows in enumerate(shards.plan_shards(lengths, shard_tokens)):
        n = sum(lengths[r] for r in rows)
        tensors = {"aux": torch.randn(n, len(AUX) * H, generator=g).bfloat16(),  # [T, A*H]
                   "last": torch.randn(n, H, generator=g).bfloat16(),  # [T, H]
                   "input_ids": torch.randint(0, 50, (n,), generator=g),
                   "loss_mask": torch.randint(0, 2, (n,), generator=g),
                   "seq_lens": torch.tensor([lengths[r] for r in rows]),
                   "sample_idx": torch.tensor(rows)}
        entries.append(shards.write_shard(directory, index, tensors, "fp"))
    header = {"target": {"name": "fake", "hidden_size": H}, "aux_layer_ids": AUX,
              "dtype": "bfloat16", "data_fingerprint": "fp"}
    shards.write_manifest(directory, header, entries)
    return shards.open_harvest(directory)


LENGTHS = [5, 9, 3, 12, 7, 7, 4, 10, 6, 8, 11, 2, 9, 5]


def test_one_home_for_planning_and_padding():
    assert batching.plan_batches([4, 3, 4, 3, 5], 8) == [[1, 3], [0, 2], [4]]
    assert batching.plan_batches([4, 3, 4, 3, 5], 12) == [[1, 3, 0], [2, 4]]
    assert batching.plan_batches([4, 3, 4, 3, 5], 12, equal_lengths=True) == [[1, 3], [0, 2], [4]]
    assert batching.plan_batches([20, 3], 8) == [[1], [0]]  # too long: a batch of its own
    plan = batching.plan_batches(LENGTHS, 24)
    assert all(len(b) * max(LENGTHS[i] for i in b) <= 24 or len(b) == 1 for b in plan)
    assert sorted(i for b in plan for i in b) == list(range(len(LENGTHS)))
    assert epoch_plan(LENGTHS, 24, 0, 1) == epoch_plan(LENGTHS, 24, 0, 1) != epoch_plan(
        LENGTHS, 24, 0, 2)
    x, mask = batching.pad_right([torch.tensor([1, 2, 3]), torch.tensor([4])])
    assert x.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    b = batching.collate([{"a": torch.ones(2, 3), "ids": torch.tensor([7, 8])},
                          {"a": torch.ones(1, 3), "ids": torch.tensor([9])}], torch.float32)
    assert b["a"].shape == (2, 2, 3) and b["a"].dtype == torch.float32 and b["a"][1, 1].sum() == 0
    assert b["ids"].tolist() == [[7, 8], [9, 0]] and b["attention_mask"].tolist() == [[1, 1], [1, 0]]


def test_streamed_batches_equal_the_in_memory_ones(tmp_path):
    sets = [fake_harvest(tmp_path / "a", LENGTHS, 0), fake_harvest(tmp_path / "b", LENGTHS[:6], 1)]
    source = HarvestSource(sets)
    everything = [s for hs in sets for s in hs.sequences()]  # the old list(hs.sequences())
    assert source.lengths() == [int(s["input_ids"].shape[0]) for s in everything]
    plan = epoch_plan(source.lengths(), 30, seed=3, epoch=1)
    build = BatchBuilder(source, torch.float32)
    streamed = list(PlannedBatches(plan, build, workers=2).stream(range(len(plan))))
    assert len(streamed) == len(plan) > 4
    for idx, got in zip(plan, streamed, strict=True):
        want = batching.collate([everything[i] for i in idx], torch.float32)
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key
    resumed = list(PlannedBatches(plan, build, workers=1).stream(range(3, len(plan), 2)))
    for j, got in zip(range(3, len(plan), 2), resumed, strict=True):  # rank 1 of 2 from micro 2
        assert torch.equal(got["aux"], streamed[j]["aux"])
    fresh = fake_harvest(tmp_path / "c", LENGTHS, 2)  # no other reader maps its shards
    held = fresh.gather(list(range(len(fresh))))  # sequences of every shard, still referenced
    assert len(held) == len(LENGTHS) and not fresh._handles  # no shard stays open after a read
    maps = Path("/proc/self/maps")
    if maps.is_file():  # nor mapped: slices are copied out, not views of a shard's mapping
        assert str(tmp_path / "c") not in maps.read_text()


class Probe(torch.nn.Module):
    """last ~ W aux: a model that consumes harvest batches (loss, metrics) like the draft."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(len(AUX) * H, H)

    def forward(self, batch):
        m = batch["attention_mask"].unsqueeze(-1).float()  # [B, T, 1]
        loss = (((self.lin(batch["aux"]) - batch["last"]) * m) ** 2).sum() / m.sum()
        return loss, {"mse": float(loss.detach())}


def _fit(out, source, steps, stop_after=None, grad_accum=2, batch_tokens=30):
    cfg = TrainConfig(max_steps=steps, grad_accum=grad_accum, lr=0.02, eval_every=4,
                      save_every=2, device="cpu", num_workers=1, batch_tokens=batch_tokens)
    build = BatchBuilder(source, torch.float32)
    lengths = source.lengths()

    def batches(epoch):
        return PlannedBatches(epoch_plan(lengths, cfg.batch_tokens, 0, epoch), build, 1)

    model = Probe()
    probe = list(range(min(4, len(lengths))))
    res = loop.fit(model, batches, lambda m: {"sim_al": -float(m(build(probe))[0])},
                   cfg, out, TrackingConfig(backend="none"), stop_after=stop_after)
    return model, res


def test_streamed_training_resumes_exactly(tmp_path, one_thread):
    source = HarvestSource([fake_harvest(tmp_path / "h", LENGTHS * 2, 0)])
    model_a, res_a = _fit(tmp_path / "a", source, steps=9)  # > one epoch: crosses epochs
    _fit(tmp_path / "b", source, steps=9, stop_after=5)
    model_b, res_b = _fit(tmp_path / "b", source, steps=9)  # resumes from step 4
    assert res_a.state.step == res_b.state.step == 9 and res_a.state.epoch >= 1
    assert [r["loss"] for r in res_a.history] == [r["loss"] for r in res_b.history]
    assert torch.equal(model_a.lin.weight, model_b.lin.weight)
    best = json.loads((tmp_path / "a" / "best" / "meta.json").read_text())  # says what ran where
    assert best["hardware"]["cpu_model"] and "cpu_flags" in best["hardware"]


@pytest.mark.timeout(120)
def test_an_epoch_smaller_than_one_step_stops_with_a_clear_error(tmp_path, one_thread):
    source = HarvestSource([fake_harvest(tmp_path / "h", [6, 6, 6], 0)])  # one micro-batch
    with pytest.raises(DraftkitError, match=r"1 micro-batch\(es\) but one optimizer step takes "
                                            r"train.grad_accum x processes = 2 x 1 = 2"):
        _fit(tmp_path / "out", source, steps=3, grad_accum=2, batch_tokens=64)
    with pytest.raises(DraftkitError, match="Lower train.batch_tokens"):
        loop.check_epoch(3, grad_accum=2, processes=2)
    loop.check_epoch(4, grad_accum=2, processes=2)
    _, res = _fit(tmp_path / "ok", source, steps=2, grad_accum=1, batch_tokens=64)  # 1 x 1: trains
    assert res.state.step == 2 and res.state.epoch == 2


def test_length_buckets_bound_the_batch_shapes():
    rng = torch.Generator().manual_seed(0)
    shapes = {}
    for n in (200, 2000):  # a harvest and one 10x larger
        lengths = torch.randint(64, 513, (n,), generator=rng).tolist()
        for m in (64, 1):
            plan = batching.plan_batches(lengths, 4096, pad_multiple=m)
            assert sorted(i for b in plan for i in b) == list(range(n))
            ts = [batching.padded_length(max(lengths[i] for i in b), m) for b in plan]
            assert all(len(b) * t <= 4096 for b, t in zip(plan, ts, strict=True))
            if m > 1:  # one bucket per batch
                assert all(batching.padded_length(lengths[i], m) == t
                           for b, t in zip(plan, ts, strict=True) for i in b)
            shapes[n, m] = len({(len(b), t) for b, t in zip(plan, ts, strict=True)})
    buckets = 512 // 64  # padded lengths 128..512 (and 64 itself)
    assert shapes[200, 64] <= shapes[2000, 64] <= 2 * buckets + 2  # full batches + a remainder
    assert shapes[2000, 1] > 4 * shapes[2000, 64]  # without buckets: ~one shape per batch
    x, mask = batching.pad_right([torch.tensor([1, 2, 3]), torch.tensor([4])], pad_multiple=4)
    assert x.tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]] and mask.sum(1).tolist() == [3, 1]
    rows = batching.pad_rows(torch.ones(5, 2), 4)
    assert rows.shape == (8, 2) and rows[5:].abs().sum() == 0
    assert batching.pad_rows(torch.ones(8, 2), 4).shape == (8, 2)
    with pytest.raises(DraftkitError, match="train.pad_multiple=0"):
        BatchBuilder(None, torch.float32, pad_multiple=0)


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss, metrics = model(batch)
    loss.backward()
    return loss.detach(), metrics, {n: p.grad.clone() for n, p in model.named_parameters()
                                    if p.grad is not None}


@pytest.mark.parametrize("row_multiple", [1, 64])
def test_padding_to_a_multiple_leaves_loss_and_grads_unchanged(monkeypatch, row_multiple):
    """A batch padded to its longest sequence and the same batch padded to a multiple of 64 (and
    masked rows picked in row counts rounded up, or not) train the same: padding is masked."""
    from _eagle3_helpers import make_batch, make_model, make_spec

    from draftkit.drafts.eagle_family import model as eagle3_model

    spec = make_spec()
    model = make_model(spec).train()
    tight = make_batch(spec, [13, 7, 20], t=20)  # [B, 20]
    wide = {k: torch.cat([v, v.new_zeros(v.shape[0], 44, *v.shape[2:])], dim=1)  # [B, 64]
            for k, v in tight.items()}
    loss_a, metrics_a, grads_a = _loss_and_grads(model, tight)
    monkeypatch.setattr(eagle3_model, "ROW_MULTIPLE", row_multiple)
    loss_b, metrics_b, grads_b = _loss_and_grads(model, wide)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-6, atol=1e-7)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 5
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, rtol=1e-5, atol=1e-7, msg=name)
    assert {k: metrics_a[k] for k in metrics_a if k.startswith(("n_", "correct_"))} == {
        k: metrics_b[k] for k in metrics_b if k.startswith(("n_", "correct_"))}
