"""How much of the target's answers an EAGLE-3 draft vocabulary can propose at all. For each
draft vocab size, the vocab train builds from the run's token counts (eagle_family/build.load_vocab:
`DraftVocab.build`, end-of-turn ids included) and the share of assistant tokens of the train and
eval conversations (the target's own answers) that fall outside it: every such token is a
rejected draft. For the eval misses, the share that also occurs in the conversation's prompt
(words the answer copies from the question, which n-gram drafting can propose).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import datasets
import torch

from benchmarks import report
from draftkit.core import config
from draftkit.core.artifacts import RunPaths
from draftkit.core.prepared_data import load_token_counts
from draftkit.drafts.eagle_family.build import load_vocab
from draftkit.prepare.stage import load_tokenizer
from draftkit.targets.load import run_target_dir

SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


def measure(run: Path, sizes: list[int]) -> dict:
    """{run, target, train token counts, rows: per draft vocab size, coverage per split}."""
    cfg = config.load(run)
    counts = load_token_counts(run / "data")
    tok = load_tokenizer(run_target_dir(cfg.target))
    splits = {s: datasets.load_from_disk(str(run / "data" / s)) for s in ("train", "eval")}
    rows = []
    for size in sizes:
        if size > counts.numel():
            continue
        sized = dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, draft_vocab_size=size))
        t2d = load_vocab(sized, [RunPaths(run)], tok).t2d  # the vocab train would build
        row = {"draft_vocab_size": size}
        for name, ds in splits.items():
            row[name] = coverage(ds["input_ids"], ds["loss_mask"], ds["prompt_ids"], t2d)
        rows.append(row)
    return {"run": str(run), "target": cfg.target.name, "train_distinct_tokens":
            int((counts > 0).sum()), "train_tokens": int(counts.sum()),
            "configured_draft_vocab_size": cfg.draft.draft_vocab_size, "rows": rows}


def coverage(input_ids: list[list[int]], loss_mask: list[list[int]],
             prompt_ids: list[list[int]], t2d) -> dict:
    """Assistant tokens outside the draft vocab `t2d` [V] bool, and how many of those occur in
    their own conversation's prompt."""
    total = miss = in_prompt = 0
    for ids, mask, prompt in zip(input_ids, loss_mask, prompt_ids, strict=True):
        answer = torch.tensor(ids)[torch.tensor(mask, dtype=torch.bool)]
        missed = answer[~t2d[answer]].tolist()
        total, miss = total + answer.numel(), miss + len(missed)
        prompt_set = set(prompt)
        in_prompt += sum(t in prompt_set for t in missed)
    return {"tokens": total, "outside": miss, "outside_share": miss / total if total else 0.0,
            "outside_in_prompt": in_prompt}


def markdown(bench: dict) -> str:
    lines = [f"# Draft vocab coverage of {bench['run']}'s answers ({bench['target']})", "",
             f"{bench['train_tokens']} train tokens, {bench['train_distinct_tokens']} distinct; "
             f"the run's draft vocab is {bench['configured_draft_vocab_size']}. Slots past the "
             "train tokens fill by token id (the tokenizer's merge order).", "",
             "| draft vocab | train answer tokens outside | eval answer tokens outside | "
             "of those, in their own prompt |", "|---|---|---|---|"]
    for r in bench["rows"]:
        tr, ev = r["train"], r["eval"]
        lines.append(f"| {r['draft_vocab_size']} | {tr['outside_share']:.2%} | "
                     f"{ev['outside_share']:.2%} ({ev['outside']} of {ev['tokens']}) | "
                     f"{ev['outside_in_prompt']} of {ev['outside']} |")
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = [r["draft_vocab_size"] for r in bench["rows"]]
    for split in ("train", "eval"):
        ax.plot(sizes, [100 * r[split]["outside_share"] for r in bench["rows"]], "o-",
                label=f"{split} answers")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="draft vocab size", ylabel="% of answer tokens outside the draft vocab",
           title=f"Draft vocab coverage ({bench['run']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
