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


@pytest.mark.parametrize("kind,mode", [("eagle3", "stored"), ("eagle3", "online"),
                                       ("draft-lm", "stored")])
def test_train_runs_on_a_device_that_is_not_the_cpu(runs, kind, mode, tmp_path):
    from _runs import copy_run

    run = copy_run(runs[kind], f"{kind}-{mode}-{tmp_path.name}")
    with one_thread(), device_guard() as dev:
        out = api.train(run, overrides=[f"train.device={dev.type}", f"train.mode={mode}"])
    hist = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in hist] == [1, 2]
    assert all(h["loss"] == h["loss"] for h in hist)  # not NaN
    assert (out / "best" / "meta.json").is_file()


def _device_target(dev):
    from draftkit.targets.load import load_target

    return load_target("tiny-llama", device=dev, dtype="float32")


def test_harvest_on_the_device_writes_the_cpu_shards(runs, monkeypatch):
    from _runs import copy_run
    from safetensors.torch import load_file

    from draftkit.targets import load as target_load

    cpu_run = runs["eagle3"]
    run = copy_run(cpu_run, "eagle3-harvest", subs=("data",))
    real = target_load.load_target
    with one_thread(), device_guard() as dev:  # the rank's device, as accelerate gives it
        monkeypatch.setattr(target_load, "load_target",
                            lambda *a, device=None, **kw: real(*a, device=dev, **kw))
        api.harvest(run)
    names = sorted(p.name for p in (artifacts.RunPaths(cpu_run).harvest).glob("*.safetensors"))
    assert names
    for name in names:
        want = load_file(str(artifacts.RunPaths(cpu_run).harvest / name))
        got = load_file(str(artifacts.RunPaths(run).harvest / name))
        assert set(got) == set(want)
        for key in want:  # ids exact; features to fp32 rounding (ops under Python dispatch
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-4)  # decompose)


def test_reference_decoder_step_on_the_device_equals_the_cpu(runs, tiny_target):
    from _runs import AUX, chat_prompts, random_draft

    from draftkit.drafts.eagle_family.drafter import Eagle3Drafter
    from draftkit.eval.spec_decode import HFTarget, speculative_decode

    prompt = chat_prompts(tiny_target.tokenizer, 1)[0]
    draft = random_draft(runs["eagle3"], tiny_target.model)

    def decode(model, head):
        target = HFTarget(model, aux_layer_ids=AUX)
        return speculative_decode(target, Eagle3Drafter(head, target), prompt, k=3,
                                  max_new_tokens=8, temperature=0.0)

    with one_thread():
        want = decode(tiny_target.model, draft)
        with device_guard() as dev:
            got = decode(_device_target(dev).model, draft.to(dev))
    assert got.tokens == want.tokens and got.counters == want.counters


def _rollout_rows(tok, n: int = 4):
    from draftkit.rl.rollouts import encode_row

    rows = []
    for i, p in enumerate(_rl_prompts(tok, n)):
        resp = tok(f" {i} apples and {i + 3} books make {2 * i + 3} things.",
                   add_special_tokens=False)["input_ids"]
        rows.append(encode_row(f"mem:{i}", {"prompt_ids": p, "response_ids": resp}, tok,
                               len(tok)))
    return rows


def _rl_prompts(tok, n):
    from _rl_helpers import prompts

    return prompts(tok, n)


def test_drift_estimate_and_finetune_step_on_the_device(runs, tiny_target):
    from _runs import random_draft

    from draftkit.drafts import kind as kinds
    from draftkit.rl import drift, finetune

    kind = kinds.get("eagle3")
    rows = _rollout_rows(tiny_target.tokenizer)
    head = random_draft(runs["eagle3"], tiny_target.model)
    with one_thread():
        want = drift.estimate(kind, head, tiny_target.model, rows, 3, [0.0, 1.0])
        with device_guard() as dev:
            policy = _device_target(dev).model
            model = head.to(dev)
            got = drift.estimate(kind, model, policy, rows, 3, [0.0, 1.0])
            batches = finetune.feature_batches(kind, model, policy, rows, 256)
            assert not any(on_device(v) for b in batches for v in b.values())  # host memory
            fit = finetune.finetune(model, batches, steps=2, seconds=0, lr=1e-3)
            assert all(on_device(p) for p in model.parameters())
    for key in want:
        assert got[key]["starts"] == want[key]["starts"] > 0
        assert got[key]["al"] == pytest.approx(want[key]["al"], abs=1e-5)
    assert fit.steps == 2 and fit.last_loss == fit.last_loss


@pytest.mark.parametrize("capture", ["online", "harvest"])
def test_refresh_job_on_the_device_publishes(tmp_path, tiny_target, capture):
    from _rl_helpers import make_run as make_rl_run
    from _rl_helpers import save_policy, write_rollouts

    from draftkit.rl.job import refresh
    from draftkit.rl.publish import DraftStore

    with one_thread():
        run = make_rl_run(tmp_path / "runs", tiny_target)
        policy = save_policy(tiny_target, tmp_path / "ckpt" / "step_1")
        rollouts = write_rollouts(tiny_target, tmp_path / "r" / "step_1.jsonl", 8, 0, gen=16)
        with device_guard() as dev:
            res = refresh(run, policy, [rollouts], [
                f"train.device={dev.type}", f"refresh.capture={capture}",
                "refresh.budget_steps=2", "refresh.gate=false", "harvest.dtype=float32"])
    assert res["status"] == "published", res
    lineage = DraftStore(run).lineage(res["version"])
    assert lineage["steps"] == 2 and lineage["al_after"]["T=0"]["starts"] > 0
