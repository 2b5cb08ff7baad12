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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError

SPLITS = ("train", "eval")

# (name, pronoun) pairs; he/she only so verbs agree in every phrasing.
_PEOPLE = [
    ("Natalia", "she"), ("James", "he"), ("Aisha", "she"), ("Mateo", "he"), ("Priya", "she"),
    ("Kenji", "he"), ("Olivia", "she"), ("Liam", "he"), ("Fatima", "she"), ("Diego", "he"),
    ("Mei", "she"), ("Noah", "he"), ("Zara", "she"), ("Ethan", "he"), ("Amara", "she"),
    ("Lucas", "he"), ("Sofia", "she"), ("Omar", "he"), ("Hannah", "she"), ("Ravi", "he"),
    ("Chloe", "she"), ("Samuel", "he"), ("Ingrid", "she"), ("Tariq", "he"), ("Grace", "she"),
    ("Mohammed", "he"), ("Lena", "she"), ("Carlos", "he"), ("Yuki", "she"), ("Daniel", "he"),
    ("Nadia", "she"), ("Felix", "he"), ("Emma", "she"), ("Jamal", "he"), ("Rosa", "she"),
    ("Arjun", "he"), ("Beatriz", "she"), ("Tom", "he"), ("Leila", "she"), ("Hugo", "he"),
    ("Maya", "she"), ("Andre", "he"), ("Julia", "she"), ("Kofi", "he"), ("Elena", "she"),
    ("Ben", "he"), ("Anika", "she"), ("Marcus", "he"), ("Ivy", "she"), ("Pedro", "he"),
    ("Claire", "she"), ("Sanjay", "he"), ("Nora", "she"), ("Wei", "he"), ("Lucia", "she"),
    ("Oscar", "he"), ("Hana", "she"), ("Victor", "he"), ("Ada", "she"), ("Malik", "he"),
]

# category -> (singular, plural) pairs
_ITEMS = {
    "snack": [("cookie", "cookies"), ("muffin", "muffins"), ("cupcake", "cupcakes"),
              ("brownie", "brownies"), ("granola bar", "granola bars"), ("bagel", "bagels"),
              ("donut", "donuts"), ("pretzel", "pretzels"), ("croissant", "croissants")],
    "fruit": [("apple", "apples"), ("orange", "oranges"), ("peach", "peaches"),
              ("mango", "mangoes"), ("pear", "pears"), ("lemon", "lemons"), ("plum", "plums"),
              ("banana", "bananas"), ("kiwi", "kiwis")],
    "supply": [("pencil", "pencils"), ("notebook", "notebooks"), ("eraser", "erasers"),
               ("marker", "markers"), ("folder", "folders"), ("pen", "pens"),
               ("ruler", "rulers"), ("glue stick", "glue sticks"), ("sketchbook", "sketchbooks")],
    "toy": [("marble", "marbles"), ("toy car", "toy cars"), ("puzzle", "puzzles"),
            ("yo-yo", "yo-yos"), ("kite", "kites"), ("action figure", "action figures"),
            ("trading card", "trading cards"), ("sticker", "stickers"), ("board game", "board games")],
    "flower": [("rose", "roses"), ("tulip", "tulips"), ("daisy", "daisies"),
               ("sunflower", "sunflowers"), ("lily", "lilies"), ("orchid", "orchids")],
    "clothing": [("shirt", "shirts"), ("hat", "hats"), ("scarf", "scarves"),
                 ("pair of socks", "pairs of socks"), ("sweater", "sweaters"),
                 ("jacket", "jackets"), ("pair of gloves", "pairs of gloves")],
    "plant": [("tomato plant", "tomato plants"), ("pepper plant", "pepper plants"),
              ("bean plant", "bean plants"), ("lettuce head", "lettuce heads"),
              ("carrot", "carrots"), ("strawberry plant", "strawberry plants")],
    "craft": [("bracelet", "bracelets"), ("necklace", "necklaces"), ("candle", "candles"),
              ("birdhouse", "birdhouses"), ("keychain", "keychains"), ("painting", "paintings"),
              ("clay pot", "clay pots")],
}

_OPENERS = ["", "", "", "On Saturday, ", "Last week, ", "For a school fair, ", "This morning, ",
            "During the holidays, ", "On a sunny day, ", "Before the trip, "]


class Person(str):
    """A name that also knows its pronouns: f"{p} ... {p.he}" / {p.His}."""

    he: str
    him: str
    his: str

    def __new__(cls, name: str, pronoun: str):
        obj = super().__new__(cls, name)
        obj.he, obj.him, obj.his = ("he", "him", "his") if pronoun == "he" else (
            "she", "her", "her")
        return obj

    @property
    def He(self) -> str:  # noqa: N802 - reads like the word it stands for
        return self.he.capitalize()

    @property
    def His(self) -> str:  # noqa: N802
        return self.his.capitalize()


@dataclass(frozen=True)
class Item:
    s: str  # singular
    pl: str  # plural

    @property
    def Pl(self) -> str:  # noqa: N802
        return self.pl[0].upper() + self.pl[1:]


class G:
    """Random choices for one problem: numbers, distinct people and items, phrasings."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self._people: set[str] = set()
        self._items: set[str] = set()

    def n(self, lo: int, hi: int, step: int = 1) -> int:
        """A random integer in [lo, hi] that is a multiple of `step` (lo should be one too)."""
        return self.rng.randrange(lo, hi + 1, step)

    def pick(self, *options):
        return self.rng.choice(options)

    def person(self) -> Person:
        while True:
            name, pronoun = self.rng.choice(_PEOPLE)
            if name not in self._people:
                self._people.add(name)
                return Person(name, pronoun)

    def item(self, category: str) -> Item:
        while True:
            s, pl = self.rng.choice(_ITEMS[category])
            if s not in self._items:
                self._items.add(s)
                return Item(s, pl)

    def opener(self) -> str:
        return self.rng.choice(_OPENERS)


def num(x: float) -> str:
    """12 -> '12', 4.5 -> '4.5', 2.25 -> '2.25' (no float noise)."""
    x = round(float(x), 6)
    return str(int(x)) if x == int(x) else f"{x:.2f}".rstrip("0").rstrip(".")


def money(x: float) -> str:
    """12 -> '$12', 4.5 -> '$4.50'."""
    x = round(float(x), 6)
    return f"${int(x)}" if x == int(x) else f"${x:.2f}"


Template = Callable[[G], tuple[str, list[str], float]]


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # step lines + '#### N'
    value: float  # the final answer
    template: str

    def record(self) -> dict:
        """GSM8K schema (+ the template name)."""
        return {"question": self.question, "answer": self.answer, "template": self.template}


def template_table() -> tuple[dict[str, Template], Callable[[Template], Template]]:
    """A template module's table and the decorator that registers a function in it."""
    table: dict[str, Template] = {}

    def template(fn: Template) -> Template:
        table[fn.__name__] = fn
        return fn
    return table, template


def templates(split: str) -> dict[str, Template]:
    """The template functions of one split (train and eval share none)."""
    if split == "train":
        from draftkit.prepare.mathgen import train_count, train_measure, train_money

        return {**train_count.TEMPLATES, **train_measure.TEMPLATES,
                **train_money.TEMPLATES}
    if split == "eval":
        from draftkit.prepare.mathgen.eval_templates import TEMPLATES

        return dict(TEMPLATES)
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
