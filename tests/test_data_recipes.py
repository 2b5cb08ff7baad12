"""Data recipes (every YAML in data_recipes/), their offline samples, mathgen, the mix, and
self-instruct filtering. CPU only, no target model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftkit.core.config import DataConfig
from draftkit.core.errors import DraftkitError
from draftkit.prepare import mathgen, recipes, selfinstruct, sources

RECIPES = sorted((Path(__file__).parent.parent / "data_recipes").glob("*.yaml"))
# `a op b op c = r` as written in mathgen's step lines (money signs allowed before results)
EQ = re.compile(r"((?:\(?\d+(?:\.\d+)?\)?\s*[-+*/]\s*)+\(?\d+(?:\.\d+)?\)?)\s*=\s*\$?(\d+(?:\.\d+)?)")


def test_all_four_recipes_exist():
    assert {p.stem for p in RECIPES} >= {"math", "code", "chat", "local"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_held_out_alone_is_the_mixs_eval_split(path, tmp_path):
    """What eval reads in a run never prepared (sources.load_held_out) is what prepare's mix
    holds out, recipe with an eval source or not (local.yaml: a slice of the mix)."""
    recipe = recipes.load_recipe(str(path))
    d = DataConfig(recipe=str(path), source="local", max_samples=30, eval_samples=6)
    want = sources.load_mix(recipe, d, tmp_path / "mix").eval
    got = sources.load_held_out(recipe, d, tmp_path / "alone")
    assert [c.messages for c in got] == [c.messages for c in want] and got


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates_and_offline_sample_loads_through_datasets(path, tmp_path):
    recipe = recipes.load_recipe(str(path))
    assert recipe.name == path.stem and recipe.sources
    for src in recipe.sources + ([recipe.eval] if recipe.eval else []):
        if src.hub is not None:  # real hub datasets are named
            assert "/" in src.hub.path, src.name
    mix = sources.load_mix(recipe, DataConfig(recipe=str(path), source="local", max_samples=30,
                                           eval_samples=6), tmp_path)
    assert 0 < len(mix.train) <= 30 and 0 < len(mix.eval) <= 6
    for conv in mix.train + mix.eval:
        roles = [m["role"] for m in conv.messages if m["role"] != "system"]
        assert roles[0] == "user" and roles[-1] == "assistant", conv.id
        assert all(a != b for a, b in zip(roles, roles[1:], strict=False)), conv.id  # alternating
        assert conv.messages[-2]["content"].strip()
    train_ids = {c.id for c in mix.train}
    assert len(train_ids) == len(mix.train) and not train_ids & {c.id for c in mix.eval}
    if recipe.self_instruct is not None:
        assert selfinstruct.instruction(recipe.self_instruct, 3, 0).strip()


def test_offline_samples_use_the_hub_schema(tmp_path):
    """The shipped samples carry the columns the hub datasets have, mapped the same way."""
    chat = recipes.load_recipe("chat")
    ultra = sources.load_files([chat.resolve(chat.sources[0].local.files[0])], tmp_path)
    assert {"prompt", "prompt_id", "messages"} <= set(ultra.column_names)
    sharegpt = sources.load_files([chat.resolve(chat.sources[1].local.files[0])], tmp_path)
    assert "conversations" in sharegpt.column_names
    assert set(sharegpt[0]["conversations"][0]) == {"from", "value"}
    multi = [r for r in ultra if len(r["messages"]) >= 4]
    assert len(multi) >= 10  # real multi-turn conversations
    code = recipes.load_recipe("code")
    assert {"instruction", "response"} <= set(
        sources.load_files([code.resolve(code.sources[0].local.files[0])], tmp_path).column_names)
    mix = sources.load_mix(chat, DataConfig(recipe="chat", source="local", max_samples=100),
                        tmp_path)
    sg = [c for c in mix.train if c.source == "sharegpt"]
    assert sg and any(c.messages[0]["role"] == "system" for c in sg)  # from/value + roles mapped


def test_math_offline_is_mathgen_in_gsm8k_schema_with_disjoint_eval(tmp_path):
    recipe = recipes.load_recipe("math")
    mix = sources.load_mix(recipe, DataConfig(recipe="math", source="local", max_samples=300,
                                           eval_samples=50), tmp_path)
    assert len(mix.train) == 300 and len(mix.eval) == 50
    assert mix.stats["sources"]["math"] == {"skipped": "no local data for this source"}
    assert all(c.messages[1]["content"].split("\n")[-1].startswith("#### ") for c in mix.train)
    files = sorted(tmp_path.glob("mathgen-*.jsonl"))
    templates = {s: {json.loads(line)["template"] for line in f.read_text().splitlines()}
                 for s, f in (("eval", files[0]), ("train", files[1]))}
    assert not templates["train"] & templates["eval"]
    train_q = {c.messages[0]["content"] for c in mix.train}
    assert not train_q & {c.messages[0]["content"] for c in mix.eval}


def test_mathgen_template_counts_and_disjointness():
    train, evl = mathgen.templates("train"), mathgen.templates("eval")
    assert len(train) >= 40 and len(evl) >= 12
    assert not set(train) & set(evl)
    # and no eval scenario's function is reused under another name
    assert not {f.__code__ for f in train.values()} & {f.__code__ for f in evl.values()}
    got = {p.template for p in mathgen.generate("train", 600, seed=5)}
    assert got == set(train)  # round-robin reaches every template
    assert {p.template for p in mathgen.generate("eval", 200, seed=5)} == set(evl)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_mathgen_answers_are_arithmetically_correct(split):
    problems = mathgen.generate(split, 1500, seed=11)
    checked = 0
    for p in problems:
        lines = p.answer.split("\n")
        assert lines[-1] == f"#### {mathgen.num(p.value)}" and p.value == int(p.value) >= 0
        assert 1 <= len(lines) - 1 <= 6, p.answer  # 2-5 steps (plus rare conclusion lines)
        for line in lines[:-1]:
            for expr, result in EQ.findall(line):
                assert abs(eval(expr) - float(result)) < 1e-9, (p.template, line)
                checked += 1
        numbers = [float(r) for _, r in EQ.findall(p.answer)]
        assert p.value in numbers or p.template == "elevator_boxes", p.answer
    assert checked > 2 * len(problems)


def test_mathgen_is_deterministic_and_varied():
    a = mathgen.generate("train", 300, seed=3)
    assert a == mathgen.generate("train", 300, seed=3)
    b = mathgen.generate("train", 300, seed=4)
    assert [p.question for p in a] != [p.question for p in b]
    assert len({p.question for p in a}) == 300
    many = mathgen.generate("train", 2000, 0)
    openings = {" ".join(p.question.split()[:3]) for p in many}
    assert len(openings) > 500  # names, items and phrasings vary
    # several phrasings per template: sentence shapes with names/numbers/items blanked out
    shapes = {re.sub(r"\b[A-Z][a-z]+\b|\$?\d+", "_", p.question)[:25]
              for p in many if p.template == "change_from_bill"}
    assert len(shapes) >= 3


def test_allocate_and_mix_are_deterministic(tmp_path):
    assert sources.allocate(10, [1, 1, 1]) == [4, 3, 3]
    assert sources.allocate(7, [0.35, 0.25, 0.4]) == [2, 2, 3]
    recipe = recipes.load_recipe("chat")
    cfg = DataConfig(recipe="chat", source="local", max_samples=20, eval_samples=4)
    a = sources.load_mix(recipe, cfg, tmp_path)
    b = sources.load_mix(recipe, cfg, tmp_path)
    assert [c.id for c in a.train] == [c.id for c in b.train]
    cfg.seed = 1
    assert [c.id for c in sources.load_mix(recipe, cfg, tmp_path).train] != [c.id for c in a.train]
    assert a.stats["sources"]["ultrachat"]["selected"] == 14  # 0.7 * 20
    assert a.stats["sources"]["sharegpt"]["selected"] == 6


def _write_recipe(tmp_path, body: str, rows: list[dict], name="r") -> Path:
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / f"{name}.yaml"
    path.write_text(body.replace("FILE", f"{name}.jsonl"))
    return path


def test_missing_field_names_field_and_recipe(tmp_path):
    path = _write_recipe(tmp_path, "name: mine\nsources:\n  - name: s\n    format: qa\n"
                         "    fields: {prompt: question}\n    files: [FILE]\n",
                         [{"q": "What is 2+2?"}])
    recipe = recipes.load_recipe(str(path))
    with pytest.raises(DraftkitError, match=r"'mine'.*prompt -> column 'question'.*columns: q"):
        sources.load_mix(recipe, DataConfig(source="local"), tmp_path)


def test_empty_result_and_drop_reasons(tmp_path):
    rows = [{"messages": [{"role": "robot", "content": "hi"}]},
            {"messages": [{"role": "assistant", "content": "first"}]}]
    path = _write_recipe(tmp_path, "name: empty\nsources:\n  - name: s\n    format: messages\n"
                         "    fields: {messages: messages}\n    files: [FILE]\n", rows)
    with pytest.raises(DraftkitError, match="gave no train conversations.*unknown_role:robot"):
        sources.load_mix(recipes.load_recipe(str(path)), DataConfig(source="local", eval_samples=1),
                      tmp_path)


@pytest.mark.parametrize("body, match", [
    ("name: x\nsources:\n  - name: s\n    format: qa\n    fields: {}\n    files: [a.jsonl]\n",
     r"must map field\(s\) \['prompt'\]"),
    ("name: x\nsources:\n  - name: s\n    format: chat\n    fields: {prompt: p}\n    files: [a]\n",
     "format 'chat'"),
    ("name: x\nsources:\n  - name: s\n    format: qa\n    fields: {prompt: p}\n    hubb: {}\n",
     "unknown key 'sources\\[0\\].hubb'"),
    ("name: x\nsources:\n  - name: s\n    format: qa\n    fields: {prompt: p}\n"
     "    hub: {path: a/b, split: 3}\n", "split' must be a str"),
    ("name: x\nsources: []\n", "non-empty list"),
])
def test_bad_recipes_are_rejected_with_the_key(tmp_path, body, match):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(recipes.RecipeError, match=match):
        recipes.load_recipe(str(path))


def test_hub_loading_fails_with_offline_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "hub.yaml"
    path.write_text("name: hubonly\nsources:\n  - name: s\n    format: qa\n"
                    "    fields: {prompt: question}\n"
                    "    hub: {path: draftkit-test/no-such-dataset, split: train}\n")
    with pytest.raises(DraftkitError, match="draftkit-test/no-such-dataset.*data.source=local"):
        sources.load_mix(recipes.load_recipe(str(path)), DataConfig(source="hub"), tmp_path)


def test_self_instruct_clean_and_filters():
    spec = recipes.load_recipe("math").self_instruct
    text, cut = selfinstruct.clean('Problem: "Ana has 3 pens and buys 4 more. How many pens does '
                                   'she have?"\n\nSolution: 3 + 4 = 7', spec)
    assert text == "Ana has 3 pens and buys 4 more. How many pens does she have?" and cut
    seen = {"ana has 3 pens and buys 4 more. how many pens does she have?"}
    assert selfinstruct.reject(text, spec, seen) == "duplicate"
    assert selfinstruct.reject(text, spec, set()) is None
    assert selfinstruct.reject("Ana has some pens and buys more. How many does she have?", spec,
                               set()) == "no_number"
    assert selfinstruct.reject("Ana has 3 pens and buys 4 more pens at the shop today.", spec,
                               set()) == "no_question"
    assert selfinstruct.reject("How many? 3", spec, set()) == "too_short"
    text, cut = selfinstruct.clean("Here's a new math word problem about a zoo:\n\nA zoo has 12 "
                                   "lions and 3 more tigers. How many big cats are there? Let x "
                                   "be the tigers.", spec)
    assert text == "A zoo has 12 lions and 3 more tigers. How many big cats are there?" and cut
    asks = {selfinstruct.instruction(spec, i, 0) for i in range(50)}
    assert len(asks) > 25 and all("{" not in a for a in asks)
