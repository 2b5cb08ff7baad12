"""Toy regression trained through draftkit.loop.fit; run directly or under `accelerate launch`.

usage: toy_fit.py OUT_DIR GRAD_ACCUM STEPS [STOP_AFTER]
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftkit.cli import exit_process
from draftkit.core.config import TrackingConfig, TrainConfig
from draftkit.train.loop import fit


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, batch):
        pred = self.lin(batch["x"]).squeeze(-1)  # [B]
        loss = torch.nn.functional.mse_loss(pred, batch["y"])
        return loss, {"mse": float(loss.detach())}


def toy_batches(epoch: int):
    g = torch.Generator().manual_seed(100 + epoch)
    w = torch.arange(8, dtype=torch.float32)
    out = []
    for _ in range(8):
        x = torch.randn(4, 8, generator=g)
        out.append({"x": x, "y": x @ w + 0.1 * torch.randn(4, generator=g)})
    return out


def make_eval():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(16, 8, generator=g)
    y = x @ torch.arange(8, dtype=torch.float32)

    def evaluate(model):
        loss = torch.nn.functional.mse_loss(model.lin(x).squeeze(-1), y)
        return {"sim_al": -float(loss)}
    return evaluate


def run(out: Path, grad_accum: int, steps: int, stop_after=None, backend="none", lr=0.05):
    cfg = TrainConfig(max_steps=steps, grad_accum=grad_accum, lr=lr, warmup_ratio=0.1,
                      eval_every=3, save_every=2, device="cpu", max_grad_norm=10.0)
    model = Toy()
    res = fit(model, toy_batches, make_eval(), cfg, out, TrackingConfig(backend=backend,
              log_every=1), run_name="toy", config_dict={"toy": True}, stop_after=stop_after)
    return model, res


if __name__ == "__main__":
    out = Path(sys.argv[1])
    model, res = run(out, int(sys.argv[2]), int(sys.argv[3]))
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    (out / f"world-{world}").touch()

    if not dist.is_initialized() or dist.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(out / "final.safetensors"))
    exit_process(0)
