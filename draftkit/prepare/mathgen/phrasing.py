"""What the templates draw from (mathgen/__init__.py): people with their pronouns, items,
openers, numbers (`G`, one per problem), number and money formatting, and the table each
template module registers its functions in."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

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


def template_table() -> tuple[dict[str, Template], Callable[[Template], Template]]:
    """A template module's table and the decorator that registers a function in it."""
    table: dict[str, Template] = {}

    def template(fn: Template) -> Template:
        table[fn.__name__] = fn
        return fn
    return table, template
