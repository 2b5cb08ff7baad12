"""`draftkit train RUN`: train the EAGLE-3 head, offline from harvest shards or online with the
target in the loop, through the generic loop in loop.py.

    draftkit train runs/demo                                  # offline, from harvest/
    draftkit train runs/demo train.mode=online                # target in the loop, no disk
    draftkit train runs/tiny train.max_steps=20 train.batch_tokens=512   # tiny CPU smoke run
    draftkit train runs/rl-200 train.init_from=runs/rl-100 train.extra_runs=[runs/rl-100]  # refresh
    accelerate launch --multi_gpu --num_processes 2 -m draftkit.cli train runs/demo  # 2-proc DDP (gloo on CPU)

The draft vocabulary comes from prepare's token counts (top-`draft_vocab_size` assistant
tokens). Batches pack length-sorted sequences into padded [B, T] tensors of at most
`train.batch_tokens` tokens; the batch order is a pure function of (seed, epoch), which is what
makes resume exact. Best checkpoint = highest simulated AL on the held-out split.
`train.init_from` warm-starts from a trained head (its weights and draft vocab);
`train.extra_runs` adds other runs' harvests to the train data.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.train import loop

Seq = dict[str, torch.Tensor]  # one sequence: aux [T,A*H], last [T,H], input_ids [T], loss_mask [T]


def plan_batches(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped into padded batches of <= batch_tokens tokens (B * T_max), shuffled.

    Sequences are sorted by length (so padding stays small), cut greedily into batches, and the
    batch order is shuffled with Random(seed * 1000 + epoch): same epoch, same plan.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    plan, cur, cur_max = [], [], 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > batch_tokens:
            plan.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        plan.append(cur)
    random.Random(seed * 1000 + epoch).shuffle(plan)
    return plan


def collate(seqs: list[Seq], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Right-pad sequences into a batch; float tensors cast to the compute dtype."""
    b, t = len(seqs), max(int(s["input_ids"].shape[0]) for s in seqs)
    out: dict[str, torch.Tensor] = {"attention_mask": torch.zeros(b, t, dtype=torch.long)}
    for key in seqs[0]:
        ref = seqs[0][key]
        shape = (b, t, *ref.shape[1:])  # [B, T] or [B, T, D]
        out[key] = torch.zeros(shape, dtype=dtype if ref.is_floating_point() else torch.long)
    for i, s in enumerate(seqs):
        n = int(s["input_ids"].shape[0])
        out["attention_mask"][i, :n] = 1
        for key, value in s.items():
            out[key][i, :n] = value.to(out[key].dtype)
    return out


class LazyBatches(Sequence):
    """A batch plan whose items are built when indexed (online mode runs the target here)."""

    def __init__(self, plan: list[list[int]], build: Callable[[list[int]], dict]):
        self.plan, self.build = plan, build

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i):
        return self.build(self.plan[i])


def _extra_runs(cfg, run_dir: Path) -> list[Path]:
    runs = [config.run_dir_of(p) for p in cfg.train.extra_runs]
    seen = {Path(run_dir).resolve()}
    for r in runs:
        if r.resolve() in seen:
            raise DraftkitError(f"train.extra_runs lists {r} twice or names this run itself; "
                                "each run's data would count double")
        seen.add(r.resolve())
        if not artifacts.RunPaths(r).config.is_file():
            raise DraftkitError(f"train.extra_runs entry {r} is not a run dir (no draftkit.yaml); "
                                "list run dirs whose `draftkit harvest` finished")
    if runs and cfg.train.mode != "offline":
        raise DraftkitError("train.extra_runs adds harvested (offline) data; use train.mode=offline")
    return runs


def _load_vocab(cfg, data_runs: list[Path], tokenizer):
    """Top-`draft_vocab_size` tokens of prepare's counts summed over the runs trained on."""
    from draftkit.drafts.eagle3.vocab import DraftVocab, end_of_turn_ids
    from draftkit.prepare.dataset import load_token_counts

    counts = None
    for r in data_runs:
        c = load_token_counts(r)
        if c.numel() != cfg.target.vocab_size:
            raise DraftkitError(f"token counts of {r} cover {c.numel()} ids but the target vocab "
                                f"is {cfg.target.vocab_size}: rerun `draftkit prepare {r}`")
        counts = c if counts is None else counts + c
    return DraftVocab.build(counts, cfg.draft.draft_vocab_size,
                            must_include=end_of_turn_ids(tokenizer))


def warm_start(cfg, target_model):
    """The head in `train.init_from`, checked against this run's draft (shapes, norms, target,
    aux layer ids). Its draft vocab is kept: lm_head rows are indexed by draft id."""
    from draftkit.drafts.eagle3 import format as fmt
    from draftkit.drafts.eagle3.model import Eagle3Draft

    src = config.run_dir_of(cfg.train.init_from)
    if artifacts.RunPaths(src).config.is_file():  # a run dir stands for its best checkpoint
        src = artifacts.RunPaths(src).train / "best"
    model = Eagle3Draft.from_pretrained(src, target_model, cfg.train.ttt_steps,
                                        cfg.train.ttt_decay)
    got = model.spec
    if cfg.draft.draft_vocab_size not in (0, got.draft_vocab_size):
        raise DraftkitError(f"train.init_from={src} has a draft vocab of {got.draft_vocab_size} "
                            f"but this run has draft.draft_vocab_size={cfg.draft.draft_vocab_size}"
                            f"; set draft.draft_vocab_size={got.draft_vocab_size} to warm-start")
    want = fmt.spec_from_run_config(cfg, got.draft_vocab_size, got.verifier_name_or_path)
    free = {"verifier_name_or_path", "target_name", "num_speculative_tokens"}
    diff = [f"{f.name}={getattr(got, f.name)!r} there, {getattr(want, f.name)!r} here"
            for f in dataclasses.fields(want)
            if f.name not in free and getattr(got, f.name) != getattr(want, f.name)]
    if got.target_name and got.target_name != cfg.target.name:  # lineage: shapes + tokenizer
        from draftkit.rl.policy import same_lineage

        diff[:0] = [f"target {got.target_name!r} there, {cfg.target.name!r} here: {p}"
                    for p in same_lineage(got.target_name, cfg.target.name)]
    if diff:
        raise DraftkitError(f"train.init_from={src} does not fit this run's draft: "
                            f"{'; '.join(diff)}. Warm-start from a head of the same target and "
                            "draft settings, or set this run's draft.* to match it")
    model.spec = fmt.with_k(got, want.num_speculative_tokens)
    return model


def _offline_sequences(cfg, run_dir: Path, split: str) -> list[Seq]:
    from draftkit.harvest.shards import open_harvest

    hdir = artifacts.RunPaths(run_dir).harvest
    if split == "eval":
        hdir = hdir / "eval"
    if not (hdir / "manifest.json").is_file():
        raise DraftkitError(f"no harvest at {hdir}: run `draftkit harvest {run_dir}` first, or "
                            "train online with train.mode=online")
    name = config.load(run_dir).target.name  # an extra run may name another checkpoint
    if name != cfg.target.name:  # of the same lineage (shapes + tokenizer), e.g. an RL step
        from draftkit.rl.policy import same_lineage

        if problems := same_lineage(name, cfg.target.name):
            raise DraftkitError(f"train.extra_runs entry {run_dir} harvested target {name!r}, "
                                f"not the lineage of {cfg.target.name!r}: {'; '.join(problems)}")
    hs = open_harvest(hdir, target_name=name, aux_layer_ids=cfg.draft.aux_layer_ids)
    return list(hs.sequences())


def build_draft(cfg, data_runs: list[Path], target):
    """The head training starts from: `train.init_from`'s, or a new one whose vocab comes from
    the counts of `data_runs` (this run, then train.extra_runs)."""
    from draftkit.drafts.eagle3.model import Eagle3Draft

    torch.manual_seed(cfg.train.seed)
    if cfg.train.init_from:
        return warm_start(cfg, target.model)
    vocab = _load_vocab(cfg, data_runs, target.tokenizer)
    return Eagle3Draft.from_run_config(cfg, vocab, target.model)


def _online_sequences(run_dir: Path, split: str) -> list[Seq]:
    from draftkit.prepare.dataset import load_split

    ds = load_split(run_dir, split)
    return [{"input_ids": torch.tensor(r["input_ids"]), "loss_mask": torch.tensor(r["loss_mask"])}
            for r in ds]


def _batch_builder(seqs: list[Seq], capture, dtype: torch.dtype) -> Callable[[list[int]], dict]:
    def build(idx: list[int]) -> dict:
        batch = collate([seqs[i] for i in idx], dtype)
        if capture is not None:  # online: the target computes aux/last for this batch now
            feats = capture(batch["input_ids"], batch["attention_mask"])
            batch["aux"], batch["last"] = feats["aux"].to(dtype), feats["last"].to(dtype)
        return batch
    return build


def make_evaluator(seqs: list[Seq], build, batch_tokens: int):
    from draftkit.drafts.eagle3.losses import aggregate

    plan = plan_batches([int(s["input_ids"].shape[0]) for s in seqs], batch_tokens, 0, 0)

    def evaluate(model) -> dict:
        return aggregate([model(build(idx))[1] for idx in plan])
    return evaluate


def train(run_dir: Path, overrides: list[str] | None = None,
          stop_after: int | None = None) -> Path:
    """Train the run's draft; returns the train dir (best checkpoint in train/best)."""
    from draftkit.target.load import default_device, load_target

    run_dir = config.run_dir_of(run_dir)
    cfg = config.load(run_dir, overrides)
    if cfg.draft.kind != "eagle3":
        raise DraftkitError(f"draft kind {cfg.draft.kind!r} has no trainer yet; use eagle3")
    if cfg.train.mode not in ("offline", "online"):
        raise DraftkitError(f"train.mode must be offline or online, got {cfg.train.mode!r}")
    data_runs = [run_dir, *_extra_runs(cfg, run_dir)]  # checked before the target loads
    device = default_device() if cfg.train.device == "auto" else cfg.train.device
    dtype = torch.float32  # master weights and batches; train.dtype sets autocast (loop.py)
    target = load_target(cfg.target.name, device=device, dtype=cfg.target.dtype,
                         revision=cfg.target.revision)
    model = build_draft(cfg, data_runs, target).to(device=device, dtype=dtype)

    capture = None
    if cfg.train.mode == "online":
        from draftkit.target.capture import OnlineCapture

        capture = OnlineCapture(target.model, cfg.draft.aux_layer_ids)
        train_seqs, eval_seqs = _online_sequences(run_dir, "train"), _online_sequences(run_dir, "eval")
    else:
        del target  # offline: the target's features are on disk
        train_seqs = [s for r in data_runs for s in _offline_sequences(cfg, r, "train")]
        eval_seqs = _offline_sequences(cfg, run_dir, "eval")
    build = _batch_builder(train_seqs, capture, dtype)
    lengths = [int(s["input_ids"].shape[0]) for s in train_seqs]
    out = artifacts.RunPaths(run_dir).train

    def batches(epoch: int) -> LazyBatches:
        return LazyBatches(plan_batches(lengths, cfg.train.batch_tokens, cfg.train.seed, epoch),
                           build)

    evaluate = make_evaluator(eval_seqs, _batch_builder(eval_seqs, capture, dtype),
                              cfg.train.batch_tokens)
    loop.fit(model, batches, evaluate, cfg.train, out, cfg.tracking, run_name=cfg.name,
             config_dict=cfg.to_dict(), stop_after=stop_after)
    return out
