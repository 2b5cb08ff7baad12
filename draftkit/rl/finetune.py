"""The warm-start fine-tune of a refresh: the draft's own `forward(batch) -> (loss, metrics)`
on rollouts whose policy features are captured once (rl/capture.py: online in RAM, or harvest
shards read back batch by batch; `batches` is any indexable sequence), AdamW at a
constant small lr, until a step or wall-clock budget runs out.

Batches are length-sorted groups of rollouts (train.stage.plan_batches), visited in a seeded
order each epoch, so the same job gives the same draft. `should_stop()` is polled between
steps (the watch daemon's SIGTERM); a stopped fine-tune publishes nothing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from draftkit.core.batching import plan_batches, to_device
from draftkit.core.errors import DraftkitError
from draftkit.rl.drift import pad_rows
from draftkit.rl.rollouts import Rollout


class Stopped(Exception):
    """The fine-tune was asked to stop before its budget ran out."""


@dataclass
class FinetuneResult:
    steps: int
    tokens: int  # response tokens trained on (summed over steps)
    seconds: float
    first_loss: float
    last_loss: float


def feature_batches(kind, model, policy_model, rows: list[Rollout],
                    batch_tokens: int) -> list[dict]:
    """Padded batches with the policy's features, captured once: [B, T] ids/masks + features,
    held in host memory (a refresh's features can outgrow the GPU's)."""
    out = []
    plan = plan_batches([len(r.input_ids) for r in rows], batch_tokens)
    for group in tqdm(plan, desc="capture", leave=False):
        batch = pad_rows([rows[i] for i in group])
        with torch.no_grad():
            feats = kind.features(model, policy_model, batch["input_ids"],
                                  batch["attention_mask"])
        batch.update({name: f.cpu() for name, f in feats.items()})
        out.append(batch)
    return out


def finetune(model: torch.nn.Module, batches: Sequence[dict], steps: int, seconds: float,
             lr: float, seed: int = 0, max_grad_norm: float = 0.5,
             should_stop: Callable[[], bool] = lambda: False) -> FinetuneResult:
    """Train until `steps` optimizer steps or `seconds` of wall time (0 = that limit is off)."""
    if steps <= 0 and seconds <= 0:
        raise DraftkitError("a refresh needs a budget: set refresh.budget_steps or "
                            "refresh.budget_s (--budget-steps / --budget-s)")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device  # batches move there one at a time
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    model.train()
    t0, done, tokens, losses, order = time.perf_counter(), 0, 0, [], []
    bar = tqdm(total=steps or None, desc="refresh", leave=False)
    while (steps <= 0 or done < steps) and (seconds <= 0 or time.perf_counter() - t0 < seconds):
        if should_stop():
            bar.close()
            raise Stopped(f"stopped after {done} fine-tune steps")
        if not order:
            order = list(range(len(batches)))
            rng.shuffle(order)
        batch = to_device(batches[order.pop()], device)
        loss, _ = model(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        done += 1
        tokens += int((batch["loss_mask"] * batch["attention_mask"]).sum())
        losses.append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    model.eval()
    return FinetuneResult(done, tokens, time.perf_counter() - t0,
                          losses[0] if losses else float("nan"),
                          losses[-1] if losses else float("nan"))
