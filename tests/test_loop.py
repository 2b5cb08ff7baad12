"""The generic train loop: exact resume, best-checkpoint selection, wandb offline files, DDP."""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from toy_fit import run  # noqa: E402

from draftkit.core.config import TrainConfig  # noqa: E402
from draftkit.train.loop import cosine_lambda, latest_checkpoint  # noqa: E402


def test_resume_after_crash_reproduces_the_loss_curve_and_weights(tmp_path):
    model_a, res_a = run(tmp_path / "a", grad_accum=2, steps=11)
    _, partial = run(tmp_path / "b", grad_accum=2, steps=11, stop_after=5)
    assert partial.state.step == 5
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step-0000004"
    model_b, res_b = run(tmp_path / "b", grad_accum=2, steps=11)  # resumes from step 4
    assert [h["loss"] for h in res_b.history] == [h["loss"] for h in res_a.history]
    for (name, pa), (_, pb) in zip(model_a.state_dict().items(), model_b.state_dict().items(),
                                   strict=True):
        assert torch.equal(pa, pb), name


def test_best_checkpoint_is_the_best_eval_and_loads(tmp_path):
    model, res = run(tmp_path, grad_accum=1, steps=12)
    evals = [(h["step"], h["eval/sim_al"]) for h in res.history if "eval/sim_al" in h]
    best_step, best = max(evals, key=lambda e: e[1])
    assert res.state.best_step == best_step and res.state.best_metric == best
    import json

    meta = json.loads((res.best_dir / "meta.json").read_text())
    assert meta["step"] == best_step
    saved = load_file(str(res.best_dir / "trainable.safetensors"))
    assert set(saved) == {"lin.weight", "lin.bias"}
    if best_step == 12:
        assert torch.equal(saved["lin.weight"], model.lin.weight.detach())


def test_loss_decreases_and_schedule_shape(tmp_path):
    """Training fits the toy regression (y = x @ [0..7], init loss ~140) and each optimizer
    step runs at the cosine schedule's learning rate."""
    f = cosine_lambda(total=100, warmup=10, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(100) == pytest.approx(0.1)
    assert f(55) == pytest.approx(0.55)
    _, res = run(tmp_path, grad_accum=1, steps=24, lr=0.5)
    losses = [h["loss"] for h in res.history]
    assert sum(losses[-4:]) < 0.05 * sum(losses[:4]), losses
    evals = [-h["eval/sim_al"] for h in res.history if "eval/sim_al" in h]  # held-out MSE
    assert len(evals) == 8 and evals[-1] < 0.05 * evals[0], evals
    assert all(a > b for a, b in pairwise(evals)), evals  # every eval improves
    sched = cosine_lambda(total=24, warmup=2, min_ratio=TrainConfig().min_lr_ratio)
    assert [h["lr"] for h in res.history] == pytest.approx([0.5 * sched(s) for s in range(1, 25)])


def test_wandb_offline_run_files(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    _, res = run(tmp_path, grad_accum=1, steps=4, backend="wandb")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs, "wandb offline run dir missing"
    assert list(runs[0].glob("*.wandb")), "no .wandb log file"
    assert res.history[-1]["loss"] < res.history[0]["loss"]


@pytest.mark.dist
def test_two_process_ddp_matches_single_process_accumulation(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = str(Path(__file__).parent / "scripts" / "toy_fit.py")
    # --multi_gpu = torchrun with 2 processes; with no GPU, Accelerator(cpu=True) picks gloo.
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    subprocess.run([*launch, script, str(tmp_path / "ddp"), "1", "6"], check=True, env=env,
                   timeout=300)
    subprocess.run([sys.executable, script, str(tmp_path / "one"), "2", "6"], check=True, env=env,
                   timeout=300)
    assert (tmp_path / "ddp" / "world-2").exists(), "accelerate did not start 2 processes"
    ddp = load_file(str(tmp_path / "ddp" / "final.safetensors"))
    one = load_file(str(tmp_path / "one" / "final.safetensors"))
    for k in one:  # DDP all-reduce vs local accumulation: same math, float rounding only
        torch.testing.assert_close(ddp[k], one[k], rtol=1e-5, atol=1e-6)


def test_a_finished_rank_exits_past_teardown_and_a_failed_one_exits_normally(
        tmp_path, monkeypatch):
    import torch.distributed as dist

    from draftkit import cli

    class Exited(Exception):
        pass

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    monkeypatch.setattr(cli, "run", lambda argv: 0)
    with pytest.raises(SystemExit) as alone:  # no process group: an ordinary exit
        cli.main([])
    assert alone.value.code == 0
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        with pytest.raises(SystemExit) as single:  # a group of one: still an ordinary exit
            cli.main([])
        assert single.value.code == 0
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)  # a launched rank
        monkeypatch.setattr(cli, "run", lambda argv: 2)
        with pytest.raises(SystemExit) as failed:
            cli.main([])
        assert failed.value.code == 2
        monkeypatch.setattr(cli, "run", lambda argv: 0)
        with pytest.raises(Exited) as done:
            cli.main([])
        assert done.value.args == (0,)
    finally:
        dist.destroy_process_group()
