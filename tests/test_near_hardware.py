"""The train loop near the hardware: batches fed to the device, frozen target parts in the
compute dtype, and steps that read the device only every tracking.log_every steps."""

from __future__ import annotations

import pytest
import torch
from _eagle3_helpers import make_batch, make_model, make_spec

from draftkit.core.config import TrackingConfig, TrainConfig
from draftkit.drafts.acceptance import DeviceMetrics
from draftkit.train import loop
from draftkit.train.near_hardware import DeviceFeed, frozen_to


def test_on_the_cpu_the_feed_moves_each_batch_when_taken_and_reads_nothing_ahead():
    batches = [{"x": torch.full((2,), float(i)), "n": i} for i in range(3)]
    read = []

    def stream():
        for b in batches:
            read.append(b["n"])
            yield b

    feed = DeviceFeed(stream(), torch.device("cpu"))
    assert feed.stream is None  # the plain path: no side stream, no pinning
    first = feed.take()
    assert read == [0] and torch.equal(first["x"], batches[0]["x"]) and first["n"] == 0
    assert [feed.take()["n"], feed.take()["n"]] == [1, 2]
    with pytest.raises(StopIteration):
        feed.take()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_next_batch_is_copied_ahead_and_arrives_whole():
    batches = [{"x": torch.randn(256, 1024), "ids": torch.arange(7) + i} for i in range(4)]
    feed = DeviceFeed(iter(batches), torch.device("cuda"))
    got = [feed.take() for _ in range(4)]
    for b, g in zip(batches, got, strict=True):
        assert g["x"].is_cuda and torch.equal(g["x"].cpu(), b["x"])
        assert torch.equal(g["ids"].cpu(), b["ids"])
    assert feed.ahead is None


def test_frozen_target_parts_take_the_compute_dtype_and_the_loss_stays_close():
    """bf16 frozen embedding/verifier (what train.dtype=auto gives where bf16 is native) under
    bf16 autocast: loss within 2% of fp32 frozen parts under the same autocast; trainable
    weights stay fp32."""
    spec = make_spec()
    model, batch = make_model(spec).train(), make_batch(spec, [9, 6], 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, _ = model(batch)
    assert frozen_to(model, torch.bfloat16) == ["embed_tokens.weight", "verifier_norm",
                                                 "verifier_lm_head"]
    assert all(p.dtype == torch.float32 for p in model.trainable_parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, metrics = model(batch)
    loss.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=0.02)
    assert metrics["n_0"] > 0 and frozen_to(model, torch.bfloat16) == []
    type(model).FROZEN_TARGET_PARTS += ("lm_head.weight",)
    try:
        with pytest.raises(ValueError, match="trainable"):
            frozen_to(model, torch.bfloat16)
    finally:
        type(model).FROZEN_TARGET_PARTS = type(model).FROZEN_TARGET_PARTS[:-1]


class _Counting(torch.nn.Module):
    """A toy whose metrics are device counts (DeviceMetrics), like every draft's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, batch):
        err = self.lin(batch["x"]).squeeze(-1) - batch["y"]
        loss = err.pow(2).mean()
        return loss, DeviceMetrics({"sq_sum": err.detach().pow(2).sum(), "n": 4.0},
                                   lambda c: {"mse": c["sq_sum"] / c["n"]})


def test_steps_read_the_device_every_log_every_steps(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(1)
    data = [{"x": (x := torch.randn(4, 4, generator=g)), "y": x.sum(-1)} for _ in range(10)]
    reads = []
    real = loop._read_pending
    monkeypatch.setattr(loop, "_read_pending",
                        lambda pending, acc: (reads.append([r["step"] for r, *_ in pending]),
                                              real(pending, acc)))
    cfg = TrainConfig(max_steps=10, lr=0.05, eval_every=100, save_every=6, device="cpu")
    res = loop.fit(_Counting(), lambda epoch: data, lambda m: {"sim_al": 0.0}, cfg, tmp_path,
                   TrackingConfig(backend="none", log_every=4))
    assert reads == [[1, 2, 3, 4], [5, 6], [7, 8], [9, 10]]  # log 4, 8; checkpoint 6; end 10
    assert [h["step"] for h in res.history] == list(range(1, 11))
    for h in res.history:
        assert h["train/mse"] == pytest.approx(h["loss"], rel=1e-5)
    assert res.history[-1]["loss"] < res.history[0]["loss"]


def test_train_compile_names_the_norms_and_mlps_and_refuses_a_model_without_parts():
    from draftkit.core.errors import DraftkitError
    from draftkit.drafts.eagle_family.layer import MLP, RMSNorm
    from draftkit.train.near_hardware import compile_parts

    model = make_model(make_spec(num_layers=2))
    parts = compile_parts(model)
    assert parts and all(isinstance(m, (RMSNorm, MLP)) for m in parts)
    assert sum(isinstance(m, MLP) for m in parts) == 2
    assert all(m._compiled_call_impl is not None for m in parts)  # compiled at first call
    with pytest.raises(DraftkitError, match="train.compile=false"):
        compile_parts(torch.nn.Linear(2, 2))
    assert TrainConfig().compile is False  # off until measured to pay


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_compiled_parts_give_the_same_loss():
    from draftkit.train.near_hardware import compile_parts

    spec = make_spec()
    model = make_model(spec).cuda().train()
    batch = {k: v.cuda() for k, v in make_batch(spec, [9, 6], 10).items()}
    ref, _ = model(batch)
    compile_parts(model)
    got, _ = model(batch)
    assert got.item() == pytest.approx(ref.item(), rel=1e-4)


def test_device_metrics_are_written_as_json_like_a_dict(tmp_path):
    """A draft's metrics (read from the device on access) saved as they are, e.g. in a best
    checkpoint's meta.json, give their numbers, not a repr."""
    import json

    from draftkit.core import artifacts

    m = DeviceMetrics({"n_0": torch.tensor(4), "correct_0": torch.tensor(3), "cond_n_0": 4.0,
                       "cond_correct_0": torch.tensor(3), "kl_sum_0": torch.tensor(2.0),
                       "w_0": 1.0})
    artifacts.write_json_atomic(tmp_path / "m.json", {"eval": m})
    got = json.loads((tmp_path / "m.json").read_text())["eval"]
    assert got == dict(m) and got["acc_0"] == 0.75 and got["sim_al"] == 1.75


def test_train_holds_batches_and_frozen_parts_in_the_compute_dtype(tmp_path, tiny_target,
                                                                   monkeypatch):
    """`draftkit train RUN train.dtype=bfloat16` (what auto gives where bf16 is native): the
    model sees bf16 states and bf16 frozen target parts beside fp32 trainable weights; with
    train.dtype=float32 everything stays fp32."""
    import warnings

    from _runs import DRAFT, make_run, one_thread, write_token_counts

    from draftkit import api
    from draftkit.drafts.eagle_family.model import Eagle3Draft

    seen = []
    real = Eagle3Draft.forward

    def spy(self, batch):
        seen.append((batch["aux"].dtype, batch["last"].dtype, self.verifier_lm_head.dtype,
                     self.embed_tokens.weight.dtype, self.fc.weight.dtype))
        return real(self, batch)

    monkeypatch.setattr(Eagle3Draft, "forward", spy)
    with one_thread():
        run = make_run(tmp_path, tiny_target.tokenizer, n_train=4, n_eval=2, overrides=[
            *DRAFT, "train.max_steps=1", "train.batch_tokens=256", "train.num_workers=0",
            "tracking.backend=none"])
        write_token_counts(run)
        api.harvest(run)
        with warnings.catch_warnings():  # a CPU without native bf16 warns it is slow
            warnings.simplefilter("ignore")
            api.train(run, ["train.dtype=bfloat16"])
        bf16 = set(seen)
        seen.clear()
        api.train(run, ["train.dtype=float32", "train.max_steps=2"])
    b, f = torch.bfloat16, torch.float32
    assert bf16 == {(b, b, b, b, f)}
    assert set(seen) == {(f, f, f, f, f)}
