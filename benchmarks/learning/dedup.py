"""What deduplication could remove from a run's prepared data. For every train conversation, the
highest word-5-gram Jaccard similarity to any other one, measured on the prompt, on the answer,
and on the prompt with its numbers masked (the template's skeleton); for every eval prompt, the
same against the train prompts (how unseen the held-out split is). Exact duplicate prompts are
already dropped by prepare (data/stats.json counts them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets

from benchmarks import report
from draftkit.core import artifacts

THRESHOLDS = (0.5, 0.7, 0.9)
N = 5  # word n-gram size


def measure(run: Path) -> dict:
    """Per view (prompt, answer, prompt skeleton; eval skeleton vs train), each item's highest
    Jaccard similarity to another, and how many reach each threshold."""
    train = [json.loads(m) for m in datasets.load_from_disk(str(run / "data" / "train"))["messages"]]
    evals = [json.loads(m) for m in datasets.load_from_disk(str(run / "data" / "eval"))["messages"]]
    stats = artifacts.read_json(run / "data" / "stats.json")
    views = {"prompt": _prompt, "answer": _answer, "prompt skeleton (numbers masked)": _skeleton}
    sets = {name: [_shingles(f(c)) for c in train] for name, f in views.items()}
    best = {name: _nearest(s) for name, s in sets.items()}
    best["eval prompt skeleton vs train"] = [
        max(_jaccard(_shingles(_skeleton(c)), t) for t in sets["prompt skeleton (numbers masked)"])
        for c in evals]
    dropped = {name: s.get("dropped", {}) for name, s in stats["load"]["sources"].items()
               if "dropped" in s}
    return {"run": str(run), "train": len(train), "eval": len(evals), "ngram": N,
            "exact_duplicates_dropped_by_prepare": dropped,
            "views": {name: {"max_jaccard": [round(x, 3) for x in xs],
                             "at_least": {str(t): sum(x >= t for x in xs) for t in THRESHOLDS}}
                      for name, xs in best.items()}}


def _prompt(conv: list[dict]) -> str:
    return next(m["content"] for m in conv if m["role"] == "user")


def _answer(conv: list[dict]) -> str:
    return " ".join(m["content"] for m in conv if m["role"] == "assistant")


def _skeleton(conv: list[dict]) -> str:
    return re.sub(r"\d+", "#", _prompt(conv))


def _shingles(text: str) -> frozenset:
    words = re.findall(r"[a-z]+|\d+|#", text.lower())
    return frozenset(tuple(words[i:i + N]) for i in range(max(1, len(words) - N + 1)))


def _jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def _nearest(sets: list[frozenset]) -> list[float]:
    """Per item, the highest Jaccard similarity to any other item (quadratic: fine at 1e3)."""
    return [max((_jaccard(a, b) for j, b in enumerate(sets) if j != i), default=0.0)
            for i, a in enumerate(sets)]


def markdown(bench: dict) -> str:
    n = {"eval prompt skeleton vs train": bench["eval"]}
    lines = [f"# Near-duplicates in {bench['run']}'s prepared data", "",
             f"{bench['train']} train conversations, {bench['eval']} eval prompts; word "
             f"{bench['ngram']}-gram Jaccard similarity to the nearest other item. Exact "
             f"duplicate prompts dropped by prepare: {bench['exact_duplicates_dropped_by_prepare']}.",
             "", "| view | " + " | ".join(f">= {t}" for t in THRESHOLDS) + " |",
             "|---" * (len(THRESHOLDS) + 1) + "|"]
    for name, v in bench["views"].items():
        total = n.get(name, bench["train"])
        lines.append(f"| {name} | " + " | ".join(
            f"{v['at_least'][str(t)]} of {total}" for t in THRESHOLDS) + " |")
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    """Cumulative share of items against their nearest neighbour's similarity, one line per view."""
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, v in bench["views"].items():
        xs = sorted(v["max_jaccard"])
        ax.plot(xs, [1 - i / len(xs) for i in range(len(xs))], label=name)
    ax.set_xlabel(f"Jaccard similarity to the nearest other item (word {bench['ngram']}-grams)")
    ax.set_ylabel("share of items at or above")
    ax.set_title(f"Near-duplicates in {bench['run']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
