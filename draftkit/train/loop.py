"""One generic train loop for every draft kind: the model's `forward(batch) -> (loss, metrics)`.

It owns what every draft needs and nothing model-specific: accelerate (DDP/FSDP on GPUs, gloo
with `--cpu` here), gradient accumulation, AdamW with a cosine schedule and warmup, periodic
checkpoints that resume *exactly* (same batches, same RNG, same loss curve), evaluation with
best-checkpoint selection, wandb logging (offline without a key) and a tqdm progress line.

Batches come from `batches(epoch) -> Sequence[batch]` (built when indexed, or read ahead by its
`stream(indices)` when it has one: train/data.py), a pure function of the epoch, so a resumed
run re-derives the same order and skips what it already consumed. Each rank takes every
`world`-th micro-batch. An epoch must hold at least one optimizer step (grad_accum x processes
micro-batches), else training stops with an error instead of spinning through empty epochs.
A checkpoint dir is complete once its `meta.json` exists (written last).

Near the hardware: on CUDA the next batch is copied to the device during the current step
(near_hardware.py). A step does not wait for the device: its loss and the model's metrics
(counts left on the device, drafts/acceptance.py DeviceMetrics) are read every
`tracking.log_every` steps, at evals and checkpoints, in one read; only train.max_cpu_seconds
over several processes reduces each step's CPU-seconds across ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftkit.core import artifacts, hardware, provenance
from draftkit.core.config import TrackingConfig, TrainConfig
from draftkit.core.errors import DraftkitError
from draftkit.train.near_hardware import DeviceFeed

Batch = dict[str, torch.Tensor]


@dataclass
class LoopState:
    step: int = 0  # optimizer steps done
    micro: int = 0  # micro-batches consumed in the current epoch (all ranks together)
    epoch: int = 0
    best_metric: float = float("-inf")
    best_step: int = -1
    cpu_s: float = 0.0  # process CPU-seconds of the optimizer steps so far (evals excluded)
    wall_s: float = 0.0  # wall seconds of the same


@dataclass
class FitResult:
    state: LoopState
    history: list[dict]  # one record per optimizer step: step, loss, lr, cpu_s, wall_s
    # (+ eval metrics); also written to out_dir/history.json when training ends
    best_dir: Path | None


def cosine_lambda(total: int, warmup: int, min_ratio: float) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def autocast(cfg: TrainConfig, device: torch.device):
    """Mixed precision for forward passes: master weights stay fp32. `train.dtype` auto = what
    the hardware does natively (hardware.py): bf16 on CUDA and on CPUs with native bf16 that
    measured faster, else fp32 (no autocast)."""
    dtype = hardware.torch_dtype(cfg.dtype, device, key="train.dtype")
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def check_epoch(n_micro: int, grad_accum: int, processes: int) -> None:
    """An epoch of `n_micro` micro-batches must fill one optimizer step."""
    if n_micro < grad_accum * processes:
        raise DraftkitError(
            f"an epoch has {n_micro} micro-batch(es) but one optimizer step takes train.grad_accum"
            f" x processes = {grad_accum} x {processes} = {grad_accum * processes}, so training "
            "would never step. Lower train.batch_tokens (more, smaller micro-batches), lower "
            "train.grad_accum or the process count, or add data.")


def _stream(epoch_batches: Sequence[Batch], indices: range) -> Iterator[Batch]:
    if hasattr(epoch_batches, "stream"):
        return epoch_batches.stream(indices)
    return (epoch_batches[j] for j in indices)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None elsewhere."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc). Batches of varying shapes leave freed
    memory that glibc keeps: an epoch over 500k harvested tokens of the tiny head peaked at
    2.5 GB RSS without this and 1.4 GB with it, at 50k tokens 1.3 and 1.1 GB
    (scripts/bench_stream.py). Called once per optimizer step and per streamed batch."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    done = sorted(p for p in ckpt_root.glob("step-*") if (p / "meta.json").is_file())
    return done[-1] if done else None


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def _save_model(model: torch.nn.Module, directory: Path) -> None:
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(directory)
    save_file(_trainable(model), str(directory / "trainable.safetensors"))


class Tracker:
    """wandb when configured (offline mode without WANDB_API_KEY), else a no-op."""

    def __init__(self, cfg: TrackingConfig, run_name: str, directory: Path, config: dict,
                 enabled: bool):
        self.run = None
        if not enabled or cfg.backend != "wandb":
            return
        import wandb

        mode = cfg.mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=cfg.project, name=run_name, dir=str(directory),
                              mode=mode, config=config, reinit="finish_previous")

    def log(self, metrics: dict, step: int) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


def fit(model: torch.nn.Module, batches: Callable[[int], Sequence[Batch]],
        evaluate: Callable[[torch.nn.Module], dict], cfg: TrainConfig, out_dir: Path,
        tracking: TrackingConfig, run_name: str = "run", config_dict: dict | None = None,
        select_metric: str = "sim_al", stop_after: int | None = None) -> FitResult:
    """Train `model` until cfg.max_steps / cfg.epochs; resume from out_dir/checkpoints if any.

    `stop_after` ends the call after that many optimizer steps of *this* call (tests use it to
    simulate a crash; checkpoints make the next call resume exactly).
    """
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    acc = Accelerator(cpu=_cpu_only(cfg), device_placement=False)  # placement is ours
    device = train_device(cfg)  # the model and every batch
    model.to(device)  # before the optimizer sees the parameters
    out_dir = Path(out_dir)
    ckpt_root = out_dir / "checkpoints"
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    n_micro = len(batches(0))
    per_step = cfg.grad_accum * acc.num_processes
    check_epoch(n_micro, cfg.grad_accum, acc.num_processes)
    steps_per_epoch = max(1, n_micro // per_step)
    total = cfg.max_steps or cfg.epochs * steps_per_epoch
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine_lambda(total, int(cfg.warmup_ratio * total), cfg.min_lr_ratio))
    model, opt = acc.prepare(model, opt)  # the scheduler stays ours: one step per update
    raw = acc.unwrap_model(model)

    state, history = LoopState(), []
    resume = latest_checkpoint(ckpt_root)
    if resume is not None:
        state, history = _load_checkpoint(resume, raw, opt, sched)

    tracker = Tracker(tracking, run_name, out_dir, config_dict or {}, acc.is_main_process)
    bar = tqdm(total=total, initial=state.step, desc="train", disable=not acc.is_main_process)
    t0, steps_this_call = time.perf_counter(), 0
    pending: list[tuple[dict, torch.Tensor, Mapping]] = []  # steps whose numbers are unread
    while state.step < total:
        epoch_batches = batches(state.epoch)
        usable = (len(epoch_batches) // per_step) * per_step
        # this rank's micro-batches from here to the epoch's end: j = micro + rank + world * t
        stream = _stream(epoch_batches, range(state.micro + acc.process_index, usable,
                                              acc.num_processes))
        feed = DeviceFeed(stream, device)  # CUDA: the next batch copied during this step
        while state.micro < usable and state.step < total and not _out_of_time(cfg, state):
            cpu0, wall0 = time.process_time(), time.perf_counter()
            mine = [feed.take() for _ in range(cfg.grad_accum)]  # this rank's share of the step
            losses, metrics = [], {}
            for i, batch in enumerate(mine):
                last = i == len(mine) - 1
                with contextlib.nullcontext() if last else acc.no_sync(model), \
                        autocast(cfg, device):
                    loss, metrics = model(batch)
                    acc.backward(loss / len(mine))  # mean over the accumulated micro-batches
                losses.append(loss.detach())
            if cfg.max_grad_norm > 0:
                acc.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()  # once per optimizer step, whatever the process count
            opt.zero_grad(set_to_none=True)
            trim_heap()
            state.micro += per_step
            state.step += 1
            steps_this_call += 1
            state.cpu_s += _step_cpu(time.process_time() - cpu0, cfg, acc, device)
            state.wall_s += time.perf_counter() - wall0
            done = state.step == total or _out_of_time(cfg, state)
            stopping = stop_after is not None and steps_this_call >= stop_after
            record = {"step": state.step, "lr": sched.get_last_lr()[0], "cpu_s": state.cpu_s,
                      "wall_s": state.wall_s}  # + loss and train/ metrics when read
            history.append(record)
            pending.append((record, torch.stack(losses).mean().float(), metrics))
            evaluating = state.step % cfg.eval_every == 0 or done
            saving = state.step % cfg.save_every == 0 or done
            if state.step % tracking.log_every == 0 or evaluating or saving or stopping:
                _read_pending(pending, acc)  # the device's numbers since the last read
                bar.set_postfix(loss=f"{record['loss']:.3f}", best=f"{state.best_metric:.3f}")
            if evaluating:
                with autocast(cfg, device):
                    record.update(_evaluate(raw, evaluate, state, out_dir, acc, select_metric))
            if state.step % tracking.log_every == 0 or "eval/" + select_metric in record:
                tracker.log(record, state.step)
            bar.update(1)
            if saving:
                _save_checkpoint(ckpt_root, raw, opt, sched, state, history, acc)
            if stopping:
                stream.close()  # stops the DataLoader workers
                bar.close()
                tracker.finish()
                return FitResult(state, history, _best_dir(out_dir))
        stream.close()
        if _out_of_time(cfg, state):
            break
        if state.micro >= usable:
            state.epoch += 1
            state.micro = 0
    bar.close()
    tracker.finish()
    if acc.is_main_process:
        artifacts.write_json_atomic(out_dir / "history.json", history)
        provenance.write_meta(out_dir, "train", config_dict,
                             {"train_s_this_call": time.perf_counter() - t0},
                             steps=state.step, best_step=state.best_step, cpu_s=state.cpu_s,
                             best_metric={select_metric: state.best_metric})
    acc.wait_for_everyone()
    return FitResult(state, history, _best_dir(out_dir))


def _step_cpu(seconds: float, cfg: TrainConfig, acc, device: torch.device) -> float:
    """A step's CPU-seconds. With train.max_cpu_seconds across processes, the rank mean (one
    collective per step), so every rank holds the same cpu_s and stops at the same step."""
    if acc.num_processes == 1 or not cfg.max_cpu_seconds:
        return seconds
    return float(acc.reduce(torch.tensor(seconds, device=device), reduction="mean"))


def _read_pending(pending: list[tuple[dict, torch.Tensor, Mapping]], acc) -> None:
    """Fill the records of the unread steps with their loss (rank mean) and train/ metrics:
    one read from the device for all of them (the steps ran without waiting for it)."""
    if not pending:
        return
    losses = acc.reduce(torch.stack([loss for _, loss, _ in pending]),
                        reduction="mean").tolist()
    for (record, _, metrics), loss in zip(pending, losses, strict=True):
        record["loss"] = loss
        record.update({f"train/{k}": v for k, v in metrics.items() if isinstance(v, float)})
    pending.clear()


def _cpu_only(cfg: TrainConfig) -> bool:
    return cfg.device == "cpu" or not torch.cuda.is_available()


def train_device(cfg: TrainConfig) -> torch.device:
    """Where the model and its batches live: for `train.device=auto` accelerate's device for
    this process (under `accelerate launch` each rank's own GPU, set as the current device),
    else the device `train.device` names. Call it before loading the target, so that each rank
    loads it onto its own GPU."""
    from accelerate import PartialState

    state = PartialState(cpu=_cpu_only(cfg))  # the process group + current device, once
    return state.device if cfg.device == "auto" else torch.device(cfg.device)


def _out_of_time(cfg: TrainConfig, state: LoopState) -> bool:
    """train.max_cpu_seconds spent (0 = no limit)."""
    return 0 < cfg.max_cpu_seconds <= state.cpu_s


def _best_dir(out_dir: Path) -> Path | None:
    best = out_dir / "best"
    return best if (best / "meta.json").is_file() else None


def _evaluate(raw, evaluate, state: LoopState, out_dir: Path, acc, select_metric: str) -> dict:
    raw.eval()
    with torch.no_grad():
        metrics = evaluate(raw)
    raw.train()
    value = metrics.get(select_metric, float("nan"))
    if value > state.best_metric:
        state.best_metric, state.best_step = value, state.step
        if acc.is_main_process:
            with artifacts.atomic_dir(out_dir / "best", overwrite=True) as tmp:
                _save_model(raw, tmp)
                artifacts.write_json_atomic(tmp / "meta.json",
                                            {"step": state.step, "eval": metrics,
                                             "hardware": hardware.summary()})
        acc.wait_for_everyone()
    return {f"eval/{k}": v for k, v in metrics.items()}


def _save_checkpoint(root: Path, raw, opt, sched, state: LoopState, history: list[dict],
                     acc) -> None:
    if acc.is_main_process:
        with artifacts.atomic_dir(root / f"step-{state.step:07d}", overwrite=True) as tmp:
            _save_model(raw, tmp)
            torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                        "rng": _rng_state(), "state": asdict(state), "history": history},
                       tmp / "trainer.pt")
            artifacts.write_json_atomic(tmp / "meta.json", {"step": state.step,
                                                            "hardware": hardware.summary()})
        for old in sorted(root.glob("step-*"))[:-2]:  # keep the two newest
            shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def _load_checkpoint(path: Path, raw, opt, sched) -> tuple[LoopState, list[dict]]:
    weights = load_file(str(path / "trainable.safetensors"))
    missing = set(_trainable(raw)) - set(weights)
    if missing:
        raise DraftkitError(f"checkpoint {path} lacks {sorted(missing)[:3]}...: it was written "
                            "by a different model config; move it away or train in a new run")
    with torch.no_grad():
        for name, p in raw.named_parameters():
            if name in weights:
                p.copy_(weights[name])
    blob = torch.load(path / "trainer.pt", weights_only=False)
    opt.load_state_dict(blob["optimizer"])
    sched.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return LoopState(**blob["state"]), blob["history"]
