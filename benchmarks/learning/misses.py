"""Where a trained EAGLE-3 head's first draft token misses. Over a run's harvest (eval and train
splits), the head's step-0 prediction at every counted position (the one the acc_0 metric and
vLLM's first draft position score) is compared with the target's greedy token, and each target
token is put in one class: a digit that is / is not in the conversation's prompt, another token
of the prompt (words the answer copies from the question), a token earlier in the answer, or a
new one. n-gram drafting can only propose the first three kinds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks import report
from draftkit.core import config, hardware
from draftkit.core.artifacts import RunPaths
from draftkit.drafts import acceptance
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.targets.load import load_target
from draftkit.train.data import BatchBuilder, HarvestSource

CLASSES = ("digit in prompt", "digit not in prompt", "in prompt", "earlier in answer", "new")


def measure(run: Path, splits: list[str]) -> dict:
    """{run, target, splits: {split: {class: {n, correct}}}} for the run's best head."""
    cfg = config.load(run)
    target = load_target(cfg.target.name, device="cpu", dtype="float32",
                         revision=cfg.target.revision)
    # step 0 only: later TTT steps never change it, so they are not computed
    model = Eagle3Draft.from_pretrained(run / "train" / "best", target.model, ttt_steps=1).eval()
    digits = digit_ids(target.tokenizer)
    out = {"run": str(run), "target": cfg.target.name, "hardware": hardware.summary(),
           "splits": {}}
    for split in splits:
        source = HarvestSource([report.harvest_of(cfg, RunPaths(run), split)])
        build = BatchBuilder(source, torch.float32)
        counts = {c: {"n": 0, "correct": 0} for c in CLASSES}
        with torch.no_grad():
            for i in range(len(source.lengths())):
                batch = build([i])
                want, got, counted = first_draft(model, batch)
                ids, mask = batch["input_ids"][0].tolist(), batch["loss_mask"][0].tolist()
                for t, cls in zip(counted, classify(ids, mask, want, digits), strict=True):
                    counts[cls]["n"] += 1
                    counts[cls]["correct"] += int(got[t] == want[t])
        out["splits"][split] = counts
    return out


def first_draft(model, batch: dict) -> tuple[list[int], list[int], list[int]]:
    """For one sequence: (target's greedy token id at t+2, the head's step-0 draft for it, the
    indices t that count), as the model's forward scores acc_0 (eagle_family/model.py)."""
    valid = batch["attention_mask"].bool()  # [1, T]
    learn = valid & batch["loss_mask"].bool()
    _, tgt_ids = model.verifier_targets(batch["last"], where=valid & acceptance.shift(learn, 1))
    post = model.ttt_states(batch["aux"], batch["input_ids"], valid)[0]  # [1, T, H]
    draft = model.draft_to_target(model.lm_head(post).argmax(-1))  # [1, T] target ids
    counted = (valid & acceptance.shift(learn, 2))[0].nonzero().flatten().tolist()
    want = acceptance.shift(tgt_ids, 1)[0]  # index t: the verifier's token x_{t+2}
    return want.tolist(), draft[0].tolist(), counted


def classify(ids: list[int], loss_mask: list[int], want: list[int],
             digits: set[int]) -> list[str]:
    """The class of want[t] at each counted index t (loss_mask[t+2] set, in order): the prompt
    is every token the loss skips; 'earlier in answer' means among the answer tokens before t+2."""
    prompt = {tok for tok, m in zip(ids, loss_mask, strict=True) if not m}
    out, earlier = [], set()
    for t in range(len(ids) - 2):
        if loss_mask[t + 1]:
            earlier.add(ids[t + 1])
        if not loss_mask[t + 2]:
            continue
        w = want[t]
        if w in digits:
            out.append("digit in prompt" if w in prompt else "digit not in prompt")
        else:
            out.append("in prompt" if w in prompt else
                       "earlier in answer" if w in earlier else "new")
    return out


def digit_ids(tokenizer) -> set[int]:
    """Ids whose text is digits only (SmolLM2 and Qwen3 write numbers one digit a token)."""
    return {i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip().isdigit()}


def markdown(bench: dict) -> str:
    lines = [f"# Where the head's first draft token misses: {bench['run']} ({bench['target']})",
             "", f"CPU: {bench['hardware']['cpu_model']}. Step-0 accuracy (the head's draft vs "
             "the target's greedy token) by the class of the target token.", "",
             "| split | class | tokens | share | accuracy |", "|---|---|---|---|---|"]
    for split, counts in bench["splits"].items():
        total = sum(c["n"] for c in counts.values()) or 1
        correct = sum(c["correct"] for c in counts.values())
        for cls, c in counts.items():
            acc = c["correct"] / c["n"] if c["n"] else None
            lines.append(f"| {split} | {cls} | {c['n']} | {c['n'] / total:.1%} | "
                         f"{report.fmt(acc, '.3f')} |")
        lines.append(f"| {split} | **all** | {total} | 100% | {correct / total:.3f} |")
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(bench["splits"]), 1)
    for i, (split, counts) in enumerate(bench["splits"].items()):
        accs = [c["correct"] / c["n"] if c["n"] else 0.0 for c in counts.values()]
        ax.bar([x + i * width for x in range(len(CLASSES))], accs, width, label=split)
    ax.set_xticks([x + width * (len(bench["splits"]) - 1) / 2 for x in range(len(CLASSES))],
                  CLASSES, fontsize=8)
    ax.set(ylabel="step-0 accuracy", title=f"Where the head misses ({bench['run']})")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

