"""Offline GSM8K-style word problems: the `math` recipe's sample when there is no internet.

`generate(split, n, seed)` draws `n` problems from many hand-written templates (2-5 steps,
several phrasings and question forms each, varied names, items, units and numbers). Every
problem carries a reference answer in GSM8K's format: one line per step, each with the
arithmetic written out (`3 * 12 = $36`), then `#### N`. Records use GSM8K's schema
(`question`, `answer`) plus `template`, so the same recipe field mapping loads them and the
hub dataset alike.

The `train` and `eval` splits use disjoint template sets (`train_*.py`,
`eval_templates.py`): acceptance measured on `eval` is not measured on memorized text.
Departure from GSM8K: answers omit the `<<a*b=c>>` calculator annotations (the recipe strips
them from the hub data too), and problems come from templates, so `prepare` widens them with
target-written problems (`data.self_instruct`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.prepare.mathgen import eval_templates, train_count, train_measure, train_money
from draftkit.prepare.mathgen.phrasing import G, Template, num

SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # step lines + '#### N'
    value: float  # the final answer
    template: str

    def record(self) -> dict:
        """GSM8K schema (+ the template name)."""
        return {"question": self.question, "answer": self.answer, "template": self.template}


def templates(split: str) -> dict[str, Template]:
    """The template functions of one split (train and eval share none)."""
    if split == "train":
        return {**train_count.TEMPLATES, **train_measure.TEMPLATES,
                **train_money.TEMPLATES}
    if split == "eval":
        return dict(eval_templates.TEMPLATES)
    raise DraftkitError(f"mathgen split must be one of {SPLITS}, got {split!r}")


def make(name: str, fn: Template, rng: random.Random) -> Problem:
    question, steps, value = fn(G(rng))
    if value != int(value) or value < 0:
        raise AssertionError(f"mathgen template {name} produced answer {value}, not a non-negative integer")
    question = question[0].upper() + question[1:]
    answer = "\n".join(steps + [f"#### {num(value)}"])
    return Problem(question=question, answer=answer, value=value, template=name)


def generate(split: str, n: int, seed: int = 0) -> list[Problem]:
    """`n` distinct problems, templates used round-robin in a seeded order; deterministic."""
    table = templates(split)
    names = sorted(table)
    order = random.Random(f"order-{split}-{seed}")
    out: list[Problem] = []
    seen: set[str] = set()
    attempt = 0
    while len(out) < n:
        if attempt % len(names) == 0:
            order.shuffle(names)
        name = names[attempt % len(names)]
        attempt += 1
        if attempt > 50 * n + 1000:
            raise DraftkitError(f"mathgen could only make {len(out)} distinct {split} problems "
                                f"out of {n}; ask for fewer (data.max_samples)")
        p = make(name, table[name], random.Random(f"{split}-{seed}-{attempt}"))
        if p.question not in seen:
            seen.add(p.question)
            out.append(p)
    return out


def write_jsonl(path: str | Path, split: str, n: int, seed: int = 0) -> Path:
    """Write `generate(split, n, seed)` as GSM8K-schema JSONL (atomic; reused if present)."""
    path = Path(path)
    if not path.is_file():
        lines = [json.dumps(p.record()) for p in generate(split, n, seed)]
        artifacts.write_text_atomic(path, "\n".join(lines) + "\n")
    return path
