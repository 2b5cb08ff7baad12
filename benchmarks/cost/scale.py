"""What a draft costs at a target's real scale, side by side in one run, on a
`random:<name>` target (the real architecture and shapes, seeded random weights drawn on the
device: targets/random_init.py). AL means nothing on random weights, so none is reported; cost
does not depend on the weights' values.

1. harvest: `draftkit harvest` (the stage) over N random-token sequences of length L, against a
   bare target forward (incl. lm_head) over the same batches: tokens/s and their ratio;
2. EAGLE-3 head training: the head `draftkit train` builds (Eagle3Draft, from the target), fed
   the harvested shards, forward + backward + AdamW under the train loop's autocast: tokens/s;
3. a refresh's parts, with the draft.rl functions on the same rows as rollouts: AL estimate
   (drift.estimate), capture (finetune.feature_batches), fine-tune steps (finetune.finetune);
   a refresh of refresh.budget_steps is projected from them;
4. peak memory of each phase (CUDA max_memory_allocated, or the process's peak RSS);
5. projections from the measured tokens/s: the `TIER=full` demo recipe (589k harvested tokens
   x 5 epochs) and a SpecBundle-size run (1.4M samples x an assumed mean length) on this device;
6. what the hardware allows (scale_hw.py, #55): harvest into a null sink beside harvest to disk,
   the disk's own write rate, head training's MFU with its FLOPs per token written out, and on
   a GPU the target's verify-cost curve (batch 1..256, 1..k+1 tokens per sequence) with the
   projected rollout speedup it implies for a draft's tokens per target step (a projection).
`--lengths mixed` draws chat-like sequence lengths instead of uniform rows.

The report (projections, tables, plot) is scale_report.py's.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import resource
import tempfile
import time
from pathlib import Path

import datasets
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from benchmarks import report
from benchmarks.cost import scale_hw
from benchmarks.cost.scale_report import markdown, plot, project
from draftkit import api
from draftkit.core import artifacts, config, hardware, provenance, registry
from draftkit.core.prepared_data import COUNTS_FILE
from draftkit.drafts import kind as kinds
from draftkit.harvest import stage as hv
from draftkit.harvest.shards import open_harvest
from draftkit.init.stage import init_run
from draftkit.rl import drift, finetune
from draftkit.rl.rollouts import Rollout
from draftkit.targets.load import load_target, target_dir
from draftkit.train import stage
from draftkit.train.data import BatchBuilder, HarvestSource, epoch_plan
from draftkit.train.loop import autocast


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_scale.py's flags ask: measure in a work dir, write
    <out>/<name>.{json,md,png}. With --device cpu the driver hides the GPUs before torch loads."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.dir:
        res = measure(args, Path(args.dir))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            res = measure(args, Path(tmp))
    md = markdown(res)
    report.write_report(args.out, args.name, res, md, lambda path: plot(res, path))
    print(md)
    return 0


def measure(args, work: Path) -> dict:
    """Every measurement of one run, in the order that keeps one target in memory at a time."""
    device = torch.device(args.device)
    run, cfg = setup_run(args, work)
    peak = Peak(device)
    torch.ones(8, device=device).sum().item()  # CUDA context outside every timing
    res = {"target": cfg.target.name, "device": args.device, "hardware": hardware.summary(),
           "git_sha": os.environ.get("DRAFTKIT_COMMIT") or provenance.git_sha(),
           "versions": provenance.versions(), "torch_threads": torch.get_num_threads(),
           "dtypes": {"target": hardware.resolve(cfg.target.dtype, device),
                      "harvest_storage": cfg.harvest.dtype,
                      "train_autocast": hardware.resolve(cfg.train.dtype, device)},
           "shapes": {k: getattr(cfg.target, k) for k in ("num_hidden_layers", "hidden_size",
                                                          "intermediate_size", "vocab_size")},
           "aux_layer_ids": list(cfg.draft.aux_layer_ids),
           "draft_vocab_size": cfg.draft.draft_vocab_size, "ttt_steps": cfg.train.ttt_steps,
           "data": data_stats(run)}
    res["harvest"] = harvest(run, peak)
    free(device)  # the stage's own target copy
    peak.reset()
    t0 = time.perf_counter()
    target = load_target(cfg.target.name, device=str(device), dtype=cfg.target.dtype)
    res["target_build_s"] = time.perf_counter() - t0
    res["target_params_b"] = sum(p.numel() for p in target.model.parameters()) / 1e9
    res["bare_forward"] = bare_forward(target.model, config.open_run(run), device, peak)
    res["harvest_vs_bare"] = res["harvest"]["tokens_per_s"] / res["bare_forward"]["tokens_per_s"]
    # harvest runs the decoder only (no lm_head): at a 151,936-token vocab and 2 layers the
    # lm_head is over half a forward, so the fair bar is the decoder's own forward
    res["bare_decoder"] = bare_forward(target.model.model, config.open_run(run), device, peak)
    res["harvest_vs_decoder"] = res["harvest"]["tokens_per_s"] / res["bare_decoder"][
        "tokens_per_s"]
    hardware_columns(res, args, cfg, run, target, device)
    head = build_head(cfg, run, target, device)
    res["head_trainable_params_m"] = sum(p.numel() for p in head.parameters()
                                         if p.requires_grad) / 1e6
    res["refresh"] = refresh_parts(cfg, head, target, run, device, args, peak)
    del target
    free(device)
    res["train"] = train_head(cfg, head, run, device, args, peak)
    res["mfu"] = mfu(res)
    res["projections"] = project(res, args.specbundle_tokens)
    return res


def hardware_columns(res: dict, args, cfg, run: Path, target, device) -> None:
    """What the device allows (scale_hw.py): harvest into a null sink, the disk's own write
    rate, the head's FLOPs per token and the matmul peak, and on request (default on a GPU) the
    verify-cost curve with its projected rollout speedup."""
    opened = config.open_run(run)
    res["null_sink"] = scale_hw.null_sink(target.model, opened, device, sync)
    res["null_sink_vs_decoder"] = res["null_sink"]["tokens_per_s"] / res["bare_decoder"][
        "tokens_per_s"]
    disk = scale_hw.disk_rate(opened.paths.harvest.parent / "disk-rate", args.disk_mb << 20)
    per_token = res["harvest"]["bytes_per_token"] + 16  # + input_ids, loss_mask
    disk["needed_bytes_per_s"] = per_token * res["bare_decoder"]["tokens_per_s"]
    res["disk"] = disk
    res["train_flops"] = scale_hw.train_flops(target.model.config, cfg.draft.draft_vocab_size,
                                              len(cfg.draft.aux_layer_ids), cfg.train.ttt_steps,
                                              res["data"]["seq_len"])
    res["matmul_peak"] = scale_hw.matmul_peak(
        device, hardware.torch_dtype(cfg.train.dtype, device), res["hardware"].get(
            "cuda_name", ""))
    batches = [int(b) for b in args.verify_batches.split(",") if b] if args.verify_batches \
        else ([2 ** i for i in range(9)] if device.type == "cuda" else [])
    if batches:
        k = cfg.draft.num_speculative_tokens
        res["verify"] = scale_hw.verify_curve(target.model, device, batches, k,
                                              args.verify_context, cfg.target.vocab_size - 64,
                                              sync)
        t = res["train_flops"]["terms"]  # one draft step ~ its forward FLOPs / the target's
        rel = args.draft_step_rel or (t["fc"] + t["layer_per_ttt_step"] + t[
            "lm_head_per_ttt_step"]) / (2 * res["target_params_b"] * 1e9)
        res["projection"] = scale_hw.project(res["verify"], args.tokens_per_step, rel)
    free(device)


def mfu(res: dict) -> dict:
    """Head training's achieved FLOP/s (FLOPs per token x tokens/s) against the measured matmul
    peak and, where known, the spec sheet's dense bf16 figure."""
    achieved = res["train_flops"]["total"] * res["train"]["tokens_per_s"]
    peak = res["matmul_peak"]
    out = {"achieved_flops": achieved, "vs_measured_matmul": achieved / peak["measured_flops"]}
    if "spec_flops" in peak:
        out["vs_spec"] = achieved / peak["spec_flops"]
    return out


def setup_run(args, work: Path):
    """A run of the target (`draftkit init`) whose prepared train split is random tokens."""
    info = registry.resolve(args.target)
    big = info.params_b >= 1
    n, length = args.seqs or (64 if big else 16), args.seq_len or (1024 if big else 256)
    run = init_run(args.target, "math", name="scale", runs_dir=work, force=True, overrides=[
        "tracking.backend=none", f"train.device={args.device}", "train.num_workers=0",
        *args.overrides])
    tok = AutoTokenizer.from_pretrained(target_dir(info))
    write_data(run, len(tok), n, length, mixed=args.lengths == "mixed")
    return run, config.load(run)


def write_data(run: Path, tokens: int, n: int, length: int, seed: int = 0,
               mixed: bool = False) -> None:
    """n sequences of `length` random regular token ids (the last 64 ids, where tokenizers keep
    their specials, left out), or of chat-like mixed lengths up to `length`; the first eighth
    is the prompt. Plus prepare's token counts."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, max(tokens - 64, 2), (n, length), generator=g)  # [N, L]
    lens = [length] * n
    if mixed:  # chat-like: log-normal around L/3, long tail cut at L (at least 16)
        draw = torch.exp(torch.randn(n, generator=g) * 0.7) * length / 3
        lens = draw.clamp(16, length).long().tolist()
    prompt = [max(1, n_i // 8) for n_i in lens]
    rows = [ids[i, :lens[i]].tolist() for i in range(n)]
    masks = [[0] * p + [1] * (n_i - p) for p, n_i in zip(prompt, lens, strict=True)]
    data = artifacts.RunPaths(run).data
    datasets.Dataset.from_dict({
        "id": [f"scale-{i}" for i in range(n)], "messages": ["[]"] * n,
        "prompt_ids": [r[:p] for r, p in zip(rows, prompt, strict=True)], "input_ids": rows,
        "loss_mask": masks, "length": lens,
    }).save_to_disk(str(data / "train"))
    kept = torch.tensor([t for r, m in zip(rows, masks, strict=True)
                         for t, keep in zip(r, m, strict=True) if keep])
    counts = torch.bincount(kept, minlength=config.load(run).target.vocab_size)
    save_file({"counts": counts}, str(data / COUNTS_FILE))


def data_stats(run: Path) -> dict:
    ds = datasets.load_from_disk(str(artifacts.RunPaths(run).data / "train"))
    lengths = ds["length"]
    return {"sequences": len(ds), "seq_len": round(sum(lengths) / len(ds)),
            "min_len": min(lengths), "max_len": max(lengths), "tokens": sum(lengths)}


class Peak:
    """Peak memory of one phase in GiB: CUDA max_memory_allocated, or this process's peak RSS
    (VmHWM, reset through /proc/self/clear_refs where Linux allows it; else the process's)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass

    def gib(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**30
        try:
            kb = int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())[1])
        except (OSError, TypeError):  # no /proc: the kernel's peak RSS (kB on Linux)
            kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / 2**20


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def harvest(run: Path, peak: Peak) -> dict:
    """`draftkit harvest` of the train split: its own target load, capture + shard writes."""
    peak.reset()
    t0 = time.perf_counter()
    hdir = api.harvest(run)
    wall = time.perf_counter() - t0
    timings = artifacts.read_json(hdir / "meta.json")["timings"]
    man = artifacts.read_json(hdir / "manifest.json")
    out = {"tokens": man["total_tokens"], "load_s": timings["load_s"],
           "compute_s": timings["compute_s"], "wall_s": wall,
           "bytes_per_token": man["bytes_per_token"], "peak_gib": peak.gib()}
    out["tokens_per_s"] = out["tokens"] / out["compute_s"]
    return out


def bare_forward(model, opened, device, peak: Peak) -> dict:
    """model(input_ids) over exactly the batches harvest ran (one warm-up): the CausalLM incl.
    lm_head, or its decoder (`model.model`, what harvest's capture runs)."""
    h = opened.cfg.harvest
    batches = []
    for job in hv.plan(opened, str(device)):  # the packing harvest ran with on this device
        for rows in job.shards:
            seqs = [torch.tensor(x) for x in job.ds[rows]["input_ids"]]
            packing = job.header["packing"]
            for b in hv.plan_batches([len(s) for s in seqs], h.batch_tokens, packing):
                inputs = hv.forward_inputs([seqs[j] for j in b], packing)  # [B, T] each
                batches.append({k: None if v is None else v.to(device)
                                for k, v in inputs.items()})
    with torch.no_grad():
        model(**batches[0], use_cache=False)
        peak.reset()
        t0 = time.perf_counter()
        for inputs in batches:
            model(**inputs, use_cache=False)
        sync(device)
    seconds = time.perf_counter() - t0
    tokens = sum(int(b["input_ids"].numel() if b["attention_mask"] is None else
                     b["attention_mask"].sum()) for b in batches)
    return {"tokens": tokens, "seconds": seconds, "forwards": len(batches),
            "tokens_per_s": tokens / seconds, "peak_gib": peak.gib()}


def build_head(cfg, run: Path, target, device):
    """The head `draftkit train` starts from (train.stage.build_draft), fp32 on `device`."""
    head = stage.build_draft(cfg, [artifacts.RunPaths(run)], target)
    return head.to(device=device, dtype=torch.float32)


def rollouts(run: Path) -> list:
    """The prepared sequences as refresh rollouts (prompt = the unmasked head)."""
    ds = datasets.load_from_disk(str(artifacts.RunPaths(run).data / "train"))
    return [Rollout(r["input_ids"], r["loss_mask"], len(r["prompt_ids"]), f"scale:{i}")
            for i, r in enumerate(ds)]


def refresh_parts(cfg, head, target, run: Path, device, args, peak: Peak) -> dict:
    """A refresh's costly parts on the rows as rollouts (the policy = the target): AL estimate
    on the held-out share, capture of the rest (online, in RAM), fine-tune steps."""
    rc, k, kind = cfg.refresh, cfg.draft.num_speculative_tokens, draft_kind(cfg.draft.kind)
    rows = rollouts(run)
    n_held = max(1, int(len(rows) * rc.heldout_fraction))
    held, train_rows = rows[:n_held], rows[n_held:]
    peak.reset()
    t0 = time.perf_counter()
    drift.estimate(kind, head, target.model, held, k, [rc.temperature], rc.draft_sampling,
                   rc.batch_tokens)
    sync(device)
    t1 = time.perf_counter()
    batches = finetune.feature_batches(kind, head, target.model, train_rows, rc.batch_tokens)
    sync(device)
    t2 = time.perf_counter()
    if args.warmup:
        finetune.finetune(head, batches, args.warmup, 0, rc.lr, rc.seed)
    sync(device)
    t3 = time.perf_counter()
    fit = finetune.finetune(head, batches, args.refresh_steps, 0, rc.lr, rc.seed)
    sync(device)
    step_s = (time.perf_counter() - t3) / fit.steps
    out = {"heldout_rows": len(held), "train_rows": len(train_rows),
           "estimate_s": t1 - t0, "capture_s": t2 - t1,
           "capture_tokens_per_s": sum(len(r.input_ids) for r in train_rows) / (t2 - t1),
           "finetune_steps": fit.steps, "finetune_step_s": step_s,
           "finetune_tokens_per_s": fit.tokens / (step_s * fit.steps),
           "batch_tokens": rc.batch_tokens, "budget_steps": rc.budget_steps,
           "peak_gib": peak.gib()}
    # a refresh: AL before and after on the held-out rows, one capture, budget_steps steps
    out["projected_s"] = 2 * out["estimate_s"] + out["capture_s"] + rc.budget_steps * step_s
    return out


def draft_kind(name: str):
    """The draft kind's refresh interface (drafts/kind.py)."""
    return kinds.get(name)


def train_head(cfg, head, run: Path, device, args, peak: Peak) -> dict:
    """Head training tokens/s from the harvest, as the train loop steps (batch to the device,
    autocast forward, backward, clip, AdamW); train.batch_tokens halves after an OOM."""
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    tokens, ooms = cfg.train.batch_tokens, []
    while True:
        try:
            return {**_train_steps(cfg, head, run, device, args, peak, tokens), "oom_at": ooms}
        except oom:
            ooms.append(tokens)
            tokens //= 2
            free(device)
            if tokens < 1024:
                raise


def _train_steps(cfg, head, run: Path, device, args, peak: Peak, batch_tokens: int) -> dict:
    tc = cfg.train
    source = HarvestSource([open_harvest(artifacts.RunPaths(run).harvest)])
    plan = epoch_plan(source.lengths(), batch_tokens, tc.seed, 0, tc.pad_multiple)
    build = BatchBuilder(source, torch.float32, None, tc.loss_on, tc.pad_multiple)
    batches = [build(b) for b in plan[: args.warmup + args.train_steps]]  # read once, on CPU
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.95))
    head.train()

    def step(i: int) -> int:
        batch = {k: v.to(device, non_blocking=True) for k, v in batches[i % len(batches)].items()}
        with autocast(tc, device):
            loss, _ = head(batch)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tc.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return int(batch["attention_mask"].sum())

    for i in range(args.warmup):
        step(i)
    peak.reset()
    t0 = time.perf_counter()
    tokens = sum(step(args.warmup + i) for i in range(args.train_steps))
    sync(device)
    seconds = time.perf_counter() - t0
    shapes = sorted({tuple(b["input_ids"].shape) for b in batches})
    return {"batch_tokens": batch_tokens, "batch_shapes": [list(s) for s in shapes],
            "steps": args.train_steps, "tokens": tokens, "seconds": seconds,
            "step_s": seconds / args.train_steps, "tokens_per_s": tokens / seconds,
            "peak_gib": peak.gib()}
