"""Word-substituted train copies (prepare/substitute.py): which words swap, that a swap is one
consistent renaming across question and answer, and prepare's use of it. CPU, no model."""

from __future__ import annotations

import json
import re

import pytest

from draftkit.core import prepared_data
from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.prepare import stage as prepare
from draftkit.prepare import substitute
from draftkit.prepare.sources import Conversation

NOUNS = ["pizzas", "slices", "boxes", "cookies", "berries", "kites", "candles", "houses",
         "marbles", "glasses", "lemons", "buses", "tickets", "shells", "stamps", "coins"]
PEOPLE = ["Pedro", "Julia", "Mei", "Omar"]
TOKEN = re.compile(r"[A-Za-z]+|[^A-Za-z]+")


def _sing(plural: str) -> str:
    return {"cookies": "cookie", "berries": "berry", "boxes": "box", "houses": "house",
            "glasses": "glass", "buses": "bus"}.get(plural, plural[:-1])


def _conv(i: int) -> Conversation:
    a, b = NOUNS[i % len(NOUNS)], NOUNS[(3 * i + 1) % len(NOUNS)]
    who = PEOPLE[i % len(PEOPLE)]
    q = (f"At {who}'s party there are {i + 2} {a} with 6 {b} in each. If 4 guests take 3 "
         f"{b}, how many {b} are left?")
    ans = (f"{a.capitalize()} first: {i + 2} {a} * 6 = {6 * (i + 2)} {b}. Each one {_sing(b)} "
           f"counts once, so {6 * (i + 2)} - 12 = {6 * (i + 2) - 12} {b} are left.\n#### "
           f"{6 * (i + 2) - 12}")
    return Conversation(f"m-{i}", "mine", [{"role": "user", "content": q},
                                           {"role": "assistant", "content": ans}])


def test_singular_prefers_a_form_the_data_has():
    seen = {"cookie", "kit"}
    assert substitute.singular("cookies", seen) == "cookie"
    assert substitute.singular("berries", seen) == "berry"
    assert substitute.singular("boxes", seen) == "box"
    assert substitute.singular("houses", seen) == "house"
    assert substitute.singular("glasses", seen) == "glass"
    assert substitute.singular("kites", seen) == "kit"  # by the data, not by a dictionary


def test_pool_holds_rare_counted_nouns_only():
    convs = [_conv(i) for i in range(64)]
    pool = substitute.nouns(convs, max_df=0.5)
    assert set(pool.values()) == set(NOUNS)  # each follows a number; 'guests' is in every one
    assert "guest" in substitute.nouns(convs, max_df=1.0)  # in all 64: rare only at max_df 1
    assert substitute.nouns(convs, max_df=0.01) == {}  # every noun is in more than 1 problem


def test_copy_is_one_consistent_renaming_of_question_and_answer():
    convs = [_conv(i) for i in range(64)]
    pool = substitute.nouns(convs, max_df=0.5)
    by_form = {f: s for s, p in pool.items() for f in (s, p)}
    out = substitute.copies(convs, 2, max_df=0.5, seed=0)
    assert len(out) == 2 * len(convs)
    assert out == substitute.copies(convs, 2, max_df=0.5, seed=0)  # deterministic
    assert out != substitute.copies(convs, 2, max_df=0.5, seed=1)
    orig = {c.id: c for c in convs}
    for copy in out:
        src = orig[copy.id.rsplit("-sub", 1)[0]]
        assert copy.source == "mine+sub" and copy.id.endswith(("-sub0", "-sub1"))
        renamed = {}  # original singular -> replacement singular, over every message
        for m, m2 in zip(src.messages, copy.messages, strict=True):
            assert m["role"] == m2["role"]
            a, b = TOKEN.findall(m["content"]), TOKEN.findall(m2["content"])
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                if x.lower() not in by_form:
                    assert x == y  # numbers, names, every other word: untouched
                    continue
                s, r = by_form[x.lower()], by_form[y.lower()]
                assert r != s and renamed.setdefault(s, r) == r  # one replacement per noun
                assert (x.lower() == s) == (y.lower() == r)  # singular stays singular
                assert x[0].isupper() == y[0].isupper()
        assert renamed  # something was swapped


def test_prepare_adds_copies_to_train_only(tmp_path):
    from tests.test_prepare import _local_run

    rows = [{"messages": c.messages} for c in (_conv(i) for i in range(40))]
    run = _local_run(tmp_path, rows, ["data.max_seq_len=256", "data.substitute_copies=1",
                                      "data.substitute_max_df=0.5"])
    out = prepare.prepare(run)
    train = prepared_data.load_split(RunPaths(run).data, "train")
    evals = prepared_data.load_split(RunPaths(run).data, "eval")
    assert len(evals) == 1 and not any(i.endswith("-sub0") for i in evals["id"])
    subs = [i for i in train["id"] if i.endswith("-sub0")]
    assert len(subs) == len(train) // 2 == 39
    st = json.loads((out / "stats.json").read_text())
    assert st["substitute"] == {"copies": 39, "of": 39}
    fp = json.loads((out / "meta.json").read_text())["data_fingerprint"]
    assert json.loads((prepare.prepare(run) / "meta.json").read_text())["data_fingerprint"] == fp
    with pytest.raises(DraftkitError, match="substitute_copies=-1"):
        prepare.prepare(run, ["data.substitute_copies=-1"])
