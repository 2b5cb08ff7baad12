"""`draftkit train RUN`: train the run's draft (any kind: the kind builds the module, drafts/kind.py),
from the harvest's stored shards (train.mode=stored) or online with the target in the loop,
through the generic loop in loop.py.

    draftkit train runs/demo                                  # train.mode=stored, from harvest/
    draftkit train runs/demo train.mode=online                # target in the loop, no disk
    draftkit train runs/tiny train.max_steps=20 train.batch_tokens=512   # tiny CPU smoke run
    draftkit train runs/rl-200 train.init_from=runs/rl-100 train.extra_runs=[runs/rl-100]  # refresh
    accelerate launch --multi_gpu --num_processes 2 -m draftkit.cli train runs/demo  # 2-proc DDP (gloo on CPU)

The draft vocabulary comes from prepare's token counts (top-`draft_vocab_size` assistant
tokens). Batches pack length-sorted sequences into padded [B, T] tensors of at most
`train.batch_tokens` tokens, T rounded up to `train.pad_multiple`; the batch order is a pure function of (seed, epoch), which is what
makes resume exact. Offline, batches stream from the harvest shards through DataLoader workers
(data.py): the harvest is never held in memory. Best checkpoint = highest simulated AL on the held-out split.
`train.init_from` warm-starts from a trained head (its weights and draft vocab);
`train.extra_runs` adds other runs' harvests to the train data. `draft.kind=draft-lm` trains a
small LM instead (drafts/draft_lm: KL to the target's full-vocab distribution), through the same
batches, loop and best-checkpoint rule.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core import config, hardware
from draftkit.core.artifacts import RunPaths
from draftkit.core.batching import plan_batches, to_device
from draftkit.core.config import Run
from draftkit.core.errors import DraftkitError
from draftkit.core.prepared_data import load_split
from draftkit.drafts import kind as kinds
from draftkit.drafts.acceptance import aggregate
from draftkit.drafts.divergence import Divergence
from draftkit.harvest.shards import open_harvest
from draftkit.targets.capture import OnlineCapture
from draftkit.targets.lineage import same_lineage
from draftkit.targets.load import load_target
from draftkit.train import loop
from draftkit.train.data import (
    BatchBuilder,
    HarvestSource,
    PlannedBatches,
    TokenSource,
    epoch_plan,
)
from draftkit.train.near_hardware import compile_parts, frozen_to


def _extra_runs(run: Run) -> list[RunPaths]:
    """The paths of train.extra_runs, each resolved once here (checked before the target loads)."""
    cfg = run.cfg
    runs = [config.run_paths(p) for p in cfg.train.extra_runs]  # harvest.dir honoured
    seen = {run.paths.root.resolve()}
    for r in runs:
        if r.root.resolve() in seen:
            raise DraftkitError(f"train.extra_runs lists {r.root} twice or names this run "
                                "itself; each run's data would count double")
        seen.add(r.root.resolve())
        if not r.config.is_file():
            raise DraftkitError(f"train.extra_runs entry {r.root} is not a run dir (no "
                                "draftkit.yaml); list run dirs whose `draftkit harvest` finished")
    if runs and cfg.train.mode != "stored":
        raise DraftkitError("train.extra_runs adds harvested (stored) data; use train.mode=stored")
    return runs


def _open_harvest(cfg, paths: RunPaths, split: str):
    """The run's verified harvest of `split` (sha256-checked once here; read lazily later)."""
    hdir = paths.harvest
    if split == "eval":
        hdir = hdir / "eval"
    if not (hdir / "manifest.json").is_file():
        raise DraftkitError(f"no harvest at {hdir}: run `draftkit harvest {paths.root}` first, or "
                            "train online with train.mode=online")
    name = config.load(paths.root).target.name  # an extra run may name another checkpoint
    if name != cfg.target.name:  # of the same lineage (shapes + tokenizer), e.g. an RL step

        if problems := same_lineage(name, cfg.target.name):
            raise DraftkitError(f"train.extra_runs entry {paths.root} harvested target {name!r}, "
                                f"not the lineage of {cfg.target.name!r}: {'; '.join(problems)}")
    return open_harvest(hdir, target_name=name, aux_layer_ids=cfg.draft.aux_layer_ids)


def build_draft(cfg, data_runs: list[RunPaths], target) -> torch.nn.Module:
    """The module `draftkit train` starts from (the run's draft kind builds it), seeded."""
    torch.manual_seed(cfg.train.seed)
    return kinds.of(cfg).build(cfg, data_runs, target)


def ready(model: torch.nn.Module, cfg, compute: torch.dtype) -> torch.nn.Module:
    """What training sets on a built draft (in place; benchmarks/cost/train_step.py does the
    same): the frozen target parts in the `compute` dtype, train.compile, the loss
    (train.loss), train.feature_noise and train.freeze_head."""
    frozen_to(model, compute)
    if cfg.train.compile:
        compile_parts(model)
    model.divergence = Divergence.from_config(cfg.train)  # train.loss, every kind
    if cfg.train.feature_noise:
        model.feature_noise = cfg.train.feature_noise
    if cfg.train.freeze_head:
        model.norm.requires_grad_(False)
        model.lm_head.requires_grad_(False)
    return model


def _online_source(paths: RunPaths, split: str) -> TokenSource:
    ds = load_split(paths.data, split)
    return TokenSource([{"input_ids": torch.tensor(r["input_ids"]),
                         "loss_mask": torch.tensor(r["loss_mask"])} for r in ds])


def make_evaluator(build: BatchBuilder, batch_tokens: int):
    """Eval over the whole held-out split, batches in length order (no shuffle)."""
    batches = PlannedBatches(plan_batches(build.source.lengths(), batch_tokens,
                                          pad_multiple=build.pad_multiple), build)

    def evaluate(model) -> dict:
        device = next(model.parameters()).device
        return aggregate([model(to_device(batch, device))[1]
                          for batch in batches.stream(range(len(batches)))])
    return evaluate


def train(run_dir: Path, overrides: list[str] | None = None,
          stop_after: int | None = None) -> Path:
    """Train the run's draft; returns the train dir (best checkpoint in train/best)."""
    run = config.open_run(run_dir, overrides)
    cfg = run.cfg
    if cfg.train.mode not in ("stored", "online"):
        raise DraftkitError(f"train.mode must be stored or online, got {cfg.train.mode!r}")
    kinds.of(cfg).check_train(cfg)
    if not 0 <= cfg.train.feature_noise < 10:
        raise DraftkitError(f"train.feature_noise is a std relative to the features' RMS: "
                            f"use a small value like 0.05 (0 = off), got {cfg.train.feature_noise}")
    data_runs = [run.paths, *_extra_runs(run)]  # checked before the target loads
    device = loop.train_device(cfg.train)  # this rank's GPU under accelerate launch
    dtype = torch.float32  # master weights; train.dtype sets autocast (loop.py)
    # the dtype autocast computes in (bf16 where native, else fp32): the frozen target copies
    # and the batches' states are held in it (the harvest's bf16 states as stored, half the
    # host-to-device copy of fp32)
    compute = hardware.torch_dtype(cfg.train.dtype, device, key="train.dtype")
    target = load_target(cfg.target.name, device=device, dtype=cfg.target.dtype,
                         revision=cfg.target.revision)
    model = ready(build_draft(cfg, data_runs, target).to(device=device, dtype=dtype), cfg,
                  compute)

    capture = None
    if cfg.train.mode == "online":
        capture = OnlineCapture(target.model, cfg.draft.aux_layer_ids)
        train_src, eval_src = _online_source(run.paths, "train"), _online_source(run.paths, "eval")
    else:
        del target  # stored: the target's features are on disk
        train_src = HarvestSource([_open_harvest(cfg, r, "train") for r in data_runs])
        eval_src = HarvestSource([_open_harvest(cfg, run.paths, "eval")])
    pad = cfg.train.pad_multiple
    build = BatchBuilder(train_src, compute, capture, cfg.train.loss_on, pad)  # eval: assistant only
    lengths = train_src.lengths()
    out = run.paths.train

    def batches(epoch: int) -> PlannedBatches:
        plan = epoch_plan(lengths, cfg.train.batch_tokens, cfg.train.seed, epoch, pad)
        return PlannedBatches(plan, build, cfg.train.num_workers, pin=device.type == "cuda")

    evaluate = make_evaluator(BatchBuilder(eval_src, compute, capture, pad_multiple=pad),
                              cfg.train.batch_tokens)
    loop.fit(model, batches, evaluate, cfg.train, out, cfg.tracking, run_name=cfg.name,
             config_dict=cfg.to_dict(), stop_after=stop_after)
    return out
