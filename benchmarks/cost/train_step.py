"""Where an EAGLE-3 training step's time goes, and what packing could save. Builds the run's head
as `draftkit train` does (same config, harvest, batch plan, autocast), then profiles optimizer
steps with torch.profiler: time per phase (batch read, forward, backward, optimizer) and the
ops that cost most. Alongside, the epoch plan's padding: the share of batch slots that hold no
token (what sequence packing could remove at most) and the share that carry a loss.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, record_function

from benchmarks import report
from draftkit.core import config, hardware
from draftkit.core.config import open_run
from draftkit.targets.load import load_target
from draftkit.train import stage
from draftkit.train.data import BatchBuilder, HarvestSource, epoch_plan
from draftkit.train.loop import autocast

PHASES = ("batch", "forward", "backward", "optimizer")


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_train_step.py's flags ask: profile, write
    results/bench_train_step.{json,md,png}; 2 without a harvest."""
    src = Path(args.source)
    if not (src / "harvest" / "manifest.json").is_file():
        print(f"error: {src} has no harvest; run `make demo` first", file=sys.stderr)
        return 2
    cfg = config.open_run(src, args.overrides).cfg
    model, build, plan = setup(src, cfg)
    bench = {"source": str(src), "target": cfg.target.name, "hardware": hardware.summary(),
             "batch_tokens": cfg.train.batch_tokens, "pad_multiple": cfg.train.pad_multiple,
             "ttt_steps": cfg.train.ttt_steps, "draft_vocab_size": cfg.draft.draft_vocab_size,
             "padding": padding(build, plan),
             **profile(model, build, plan, cfg, args.warmup, args.steps, args.top)}
    md = markdown(bench)
    report.write_report(Path(args.out), "bench_train_step", bench, md,
                        lambda path: plot(bench, path))
    print(md)
    return 0


def setup(src: Path, cfg):
    """(head, batch builder, epoch-0 plan) exactly as the train stage builds them."""
    paths = open_run(src).paths
    target = load_target(cfg.target.name, device="cpu", dtype=cfg.target.dtype,
                         revision=cfg.target.revision)
    compute = hardware.torch_dtype(cfg.train.dtype, "cpu", key="train.dtype")
    model = stage.ready(stage.build_draft(cfg, [paths], target).to(dtype=torch.float32), cfg,
                        compute)  # train.loss, train.compile, ... as training sets them
    del target
    source = HarvestSource([report.harvest_of(cfg, paths, "train")])
    pad = cfg.train.pad_multiple
    build = BatchBuilder(source, compute, None, cfg.train.loss_on, pad)
    return model, build, epoch_plan(source.lengths(), cfg.train.batch_tokens, cfg.train.seed, 0,
                                    pad)


def padding(build, plan: list[list[int]]) -> dict:
    """Slots of the epoch's [B, T] batches: holding a token, and carrying a loss."""
    lengths = build.source.lengths()
    slots = tokens = 0
    for batch in plan:
        t = max(lengths[i] for i in batch)
        t = -(-t // build.pad_multiple) * build.pad_multiple
        slots += len(batch) * t
        tokens += sum(lengths[i] for i in batch)
    return {"batches": len(plan), "slots": slots, "tokens": tokens,
            "pad_share": round(1 - tokens / slots, 4)}


def profile(model, build, plan, cfg, warmup: int, steps: int, top: int) -> dict:
    """Time per phase and per op over `steps` optimizer steps after `warmup` unprofiled ones."""
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=cfg.train.lr)
    device = torch.device("cpu")
    loss_tokens = 0

    def step(i: int) -> None:
        nonlocal loss_tokens
        with record_function("batch"):
            batch = build(plan[i % len(plan)])
        loss_tokens += int(batch["loss_mask"].sum())
        with record_function("forward"), autocast(cfg.train, device):
            loss, _ = model(batch)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    for i in range(warmup):
        step(i)
    loss_tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(warmup, warmup + steps):
            step(i)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    events = prof.key_averages()
    phases = {e.key: e.cpu_time_total / 1e6 for e in events if e.key in PHASES}
    ops = sorted((e for e in events if e.key not in PHASES and not e.key.startswith("Profiler")),
                 key=lambda e: e.self_cpu_time_total, reverse=True)
    total_self = sum(e.self_cpu_time_total for e in events) / 1e6
    return {"steps": steps, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "wall_s_per_step": round(wall / steps, 3), "loss_tokens_per_step": loss_tokens / steps,
            "phases_s": {k: round(phases.get(k, 0.0), 3) for k in PHASES},
            "ops": [{"op": e.key, "self_s": round(e.self_cpu_time_total / 1e6, 3),
                     "share": round(e.self_cpu_time_total / 1e6 / total_self, 4),
                     "calls": e.count} for e in ops[:top]]}


def markdown(bench: dict) -> str:
    hw, pad, ph = bench["hardware"], bench["padding"], bench["phases_s"]
    total = sum(ph.values()) or 1.0
    lines = [f"# Where an EAGLE-3 training step's time goes ({bench['target']})", "",
             f"Run {bench['source']}: {bench['batch_tokens']}-token batches padded to multiples "
             f"of {bench['pad_multiple']}, TTT {bench['ttt_steps']}, draft vocab "
             f"{bench['draft_vocab_size']}. {bench['steps']} profiled steps: "
             f"{bench['wall_s_per_step']:.2f} s wall per step "
             f"({bench['loss_tokens_per_step']:.0f} loss tokens per step). CPU: "
             f"{hw.get('cpu_model')} ({hw.get('cpu_count')} cores, native bf16: "
             f"{hw.get('cpu_native_bf16')}).", "",
             "| phase | s (profiled steps) | share |", "|---|---|---|"]
    lines += [f"| {k} | {v:.2f} | {v / total:.0%} |" for k, v in ph.items()]
    lines += ["", f"Padding over the epoch's {pad['batches']} batches: {pad['pad_share']:.1%} of "
              f"{pad['slots']} slots hold no token — the most sequence packing could save.", "",
              "| op | self s | share of all op time | calls |", "|---|---|---|---|"]
    lines += [f"| `{o['op']}` | {o['self_s']:.2f} | {o['share']:.1%} | {o['calls']} |"
              for o in bench["ops"]]
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    ph = bench["phases_s"]
    a.bar(list(ph), list(ph.values()), color="C0")
    a.set(ylabel="seconds (profiled steps)", title="time per phase")
    ops = bench["ops"][:8][::-1]
    b.barh([o["op"].replace("aten::", "") for o in ops], [o["share"] for o in ops], color="C1")
    b.set(xlabel="share of op self time", title="costliest ops")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
