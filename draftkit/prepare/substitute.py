"""Word-substituted copies of train conversations: the head must copy words, not recall them.

Where a head misses on new templates is the words an answer copies from its question
(`scripts/bench_misses.py`: step-0 accuracy 0.79 on train, 0.58 on unseen templates, on 45% of
the tokens). On the training templates it can learn which noun follows which word by heart;
n-gram drafting copies them from the context. `data.substitute_copies = n` adds, per train
conversation, n copies in which every rare counted noun of its user turns (a plural that
follows a number somewhere in the train questions, in at most `max_df` of them, not a unit) is
replaced wherever it occurs, answers included, by another such noun of the same data:
"3 pizzas with 6 slices" -> "3 kites with 6 candles", and the answer follows. The harvest
labels each copy with the target's own distribution on the new text, so a word the answer
repeats is only predictable by looking back at the question. Measured (README, "Word-substituted
copies"): one copy at 5 epochs beats 8 epochs of the originals by +0.11 vLLM AL on unseen
templates at about the same training CPU.

Departures from a full regeneration: the answers are the target's for the original question,
edited, not written anew for the copy (regenerating would cost what new problems cost, the
bottleneck this avoids); numbers are kept, so the arithmetic stays right; only nouns swap (a
word after a number is a count noun in a word problem), since swapping verbs or names made the
copies read as nonsense. Singular and plural of a noun swap together ("slice"/"slices" ->
"candle"/"candles": plurals as the data writes them, singulars by rule and the data). Eval
conversations are never substituted.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from draftkit.prepare.sources import Conversation, seed_for

WORD = re.compile(r"[A-Za-z]{3,}")
# "6 slices" -> slices: a plural after a number other than 1 (a count noun, seldom a verb)
COUNTED = re.compile(r"\b(?!1\b)\d[\d,.]*\s+([a-z]{2,}s)\b")
# plurals after numbers in any problem, whatever the template: units, quantifiers, verbs
STOPWORDS = frozenset("""
seconds minutes hours days weeks months years dollars cents percents times others ones
people its this has was does gets sells costs makes takes gives plus less points
""".split())


def singular(word: str, seen: set[str]) -> str:
    """The singular of a plural by rule, preferring a form seen in the data: cookies -> cookie
    (seen) or cooky, boxes -> box, houses -> house."""
    if word.endswith("ies"):
        options, default = [word[:-1], word[:-3] + "y"], word[:-3] + "y"
    elif word.endswith("es"):
        options = [word[:-1], word[:-2]]
        default = options[word.endswith(("xes", "ches", "shes", "sses", "oes", "zes"))]
    else:
        options, default = [word[:-1]], word[:-1]
    return next((o for o in options if o in seen), default)


def _user_text(c: Conversation) -> str:
    return " ".join(m["content"] for m in c.messages if m["role"] == "user")


def nouns(convs: list[Conversation], max_df: float) -> dict[str, str]:
    """Singular -> plural of the rare counted nouns of the train questions."""
    seen, df, forms = set(), Counter(), {}
    for c in convs:
        seen.update(w.lower() for m in c.messages for w in WORD.findall(m["content"]))
    for c in convs:
        found = {singular(w, seen): w for w in sorted(set(COUNTED.findall(_user_text(c))))
                 if w not in STOPWORDS}
        forms |= found
        df.update(found.keys())
    return {w: forms[w] for w in sorted(df) if df[w] <= max_df * len(convs)}


def _apply(text: str, mapping: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        w = m.group(0)
        r = mapping.get(w.lower())
        if r is None:
            return w
        return r.upper() if w.isupper() else r.capitalize() if w[0].isupper() else r
    return WORD.sub(sub, text)


def copies(convs: list[Conversation], n: int, max_df: float, seed: int) -> list[Conversation]:
    """`n` substituted copies of each conversation that has a rare counted noun in its
    question (ids `<id>-sub<j>`, source `<source>+sub`); deterministic in `seed` and the ids."""
    pool = nouns(convs, max_df) if n > 0 else {}
    if len(pool) < 2:
        return []
    by_form = {f: s for s, p in pool.items() for f in (s, p)}  # either form -> singular
    singulars, out = sorted(pool), []
    for c in convs:
        found = sorted({by_form[w.lower()] for w in WORD.findall(_user_text(c))
                        if w.lower() in by_form})
        for j in range(n if found else 0):
            rng = random.Random(seed_for("substitute", seed, c.id, j))
            mapping = {}
            for s in found:
                r = rng.choice([p for p in singulars if p != s])
                mapping |= {s: r, pool[s]: pool[r]}
            msgs = [m if m["role"] == "system" else {**m, "content": _apply(m["content"], mapping)}
                    for m in c.messages]
            out.append(Conversation(id=f"{c.id}-sub{j}", source=f"{c.source}+sub", messages=msgs))
    return out
