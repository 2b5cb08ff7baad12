"""EAGLE-3 training under `accelerate launch` with 2 CPU processes (gloo) follows the same loss
curve and ends at the same weights as 1 process accumulating the same 2 micro-batches per step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from _runs import DRAFT, make_run, write_token_counts
from safetensors.torch import load_file

from draftkit.core.artifacts import RunPaths
from draftkit.harvest import stage as hv
from draftkit.train.loop import latest_checkpoint

# accelerate 1.x runs one process for `--cpu --num_processes 2`; `--multi_gpu` spawns 2 ranks via
# torchrun, which join a gloo group on a machine without CUDA.
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
STEPS = 6
TRAIN = [f"train.max_steps={STEPS}", "train.batch_tokens=512", "train.lr=3e-3",
         "train.eval_every=3", "train.save_every=3", "train.device=cpu", "tracking.backend=none"]


def _train(launcher: list[str], run, grad_accum: int) -> None:
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([*launcher, "-m", "draftkit.cli", "train", str(run),
                          f"train.grad_accum={grad_accum}"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def _final(run) -> tuple[list[dict], dict[str, torch.Tensor]]:
    ckpt = latest_checkpoint(RunPaths(run).train / "checkpoints")
    history = torch.load(ckpt / "trainer.pt", weights_only=False)["history"]
    return history, load_file(str(ckpt / "trainable.safetensors"))


@pytest.mark.dist
def test_two_processes_match_one_process_with_accumulation(tmp_path, tiny_target, one_thread):
    one = make_run(tmp_path, tiny_target.tokenizer, name="one", n_train=40, n_eval=8, hi=60,
                   overrides=[*DRAFT, "harvest.dtype=float32", *TRAIN])
    write_token_counts(one)
    hv.harvest(one)
    two = tmp_path / "two"
    shutil.copytree(one, two)
    _train([sys.executable], one, grad_accum=2)  # 1 process, 2 micro-batches per step
    _train(LAUNCH, two, grad_accum=1)  # 2 processes, 1 micro-batch each per step
    h1, w1 = _final(one)
    h2, w2 = _final(two)
    assert [h["step"] for h in h1] == [h["step"] for h in h2] == list(range(1, STEPS + 1))
    loss1, loss2 = (torch.tensor([h["loss"] for h in h]) for h in (h1, h2))
    print("losses 1 process:", loss1.tolist(), "\n2 processes:", loss2.tolist())
    assert loss1[-1] < loss1[0]  # it trains
    # DDP's all-reduce vs local accumulation: the same sums, in another order
    torch.testing.assert_close(loss2, loss1, rtol=1e-5, atol=1e-6)
    evals = [[v for h in hist if "eval/loss" in h for v in (h["step"], h["eval/loss"],
                                                             h["eval/sim_al"])]
             for hist in (h1, h2)]
    assert len(evals[0]) == 6 and evals[1] == pytest.approx(evals[0], rel=1e-5)
    assert set(w1) == set(w2) and len(w1) > 5
    for name, value in w1.items():
        torch.testing.assert_close(w2[name], value, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")
