"""`draftkit prepare`: loss masks (multi-turn ChatML, Qwen3-style <think>), token counts,
truncation/drop accounting, errors, HF regeneration end to end, and resume. CPU, tiny-llama."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from draftkit.core import config, prepared_data
from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.init.stage import init_run
from draftkit.prepare import chat_mask, recipes, regen, selfinstruct
from draftkit.prepare import stage as prepare
from draftkit.prepare.sources import Dropped

# Qwen3's rule: assistant turns after the last user message render their reasoning block
# (an empty one if none); earlier assistant turns drop it.
QWEN3_LIKE = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set content = m.content -%}{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
SMALL = ["data.source=local", "data.max_samples=8", "data.eval_samples=2",
         "data.max_seq_len=192", "data.regen_engine=hf", "data.regen_max_new_tokens=8",
         "data.regen_batch_size=4"]


@pytest.fixture()
def tok(tiny_target):
    return prepare.load_tokenizer(tiny_target.path)  # a fresh instance: tests edit its template


def masked_runs(tok, ids: list[int], mask: list[int]) -> list[str]:
    """Decoded text of each maximal run of masked tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs, cur = runs + [cur], []
    runs += [cur] if cur else []
    return [tok.decode(r, skip_special_tokens=False) for r in runs]


def test_mask_multi_turn_chatml(tok):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tom has 3 apples and buys 4 more. How many?"},
            {"role": "assistant", "content": "He has 3 + 4 = 7 apples.\n#### 7"},
            {"role": "user", "content": "And if he eats 2?"},
            {"role": "assistant", "content": "7 - 2 = 5 apples are left."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "You're welcome."}]
    enc = chat_mask.encode(tok, msgs, 1024)
    assert masked_runs(tok, enc.input_ids, enc.loss_mask) == [
        m["content"] + "<|im_end|>" for m in msgs if m["role"] == "assistant"]
    assert not enc.truncated and len(enc.loss_mask) == len(enc.input_ids)
    prompt = chat_mask.render(tok, msgs[:-1], add_generation_prompt=True)
    assert enc.prompt_ids == chat_mask.token_ids(tok, prompt)
    assert enc.input_ids[:len(enc.prompt_ids)] == enc.prompt_ids
    assert enc.loss_mask[len(enc.prompt_ids)] == 1 and enc.loss_mask[len(enc.prompt_ids) - 1] == 0


def test_mask_follows_qwen3_think_template(tok):
    tok.chat_template = QWEN3_LIKE
    msgs = [{"role": "user", "content": "What is 6 * 7?"},
            {"role": "assistant", "content": "<think>\nsix sevens are 42\n</think>\n\n42"},
            {"role": "user", "content": "And 6 * 8?"},
            {"role": "assistant", "content": "<think>\nadd one more six: 48\n</think>\n\n48"}]
    enc = chat_mask.encode(tok, msgs, 1024)
    runs = masked_runs(tok, enc.input_ids, enc.loss_mask)
    # earlier turn: the template drops its reasoning, so only the answer is rendered and masked
    assert runs == ["42<|im_end|>",
                    "<think>\nadd one more six: 48\n</think>\n\n48<|im_end|>"]
    text = tok.decode(enc.input_ids, skip_special_tokens=False)
    assert "six sevens" not in text and "add one more six" in text
    # a final turn without reasoning gets the template's empty block, masked with it
    msgs[-1] = {"role": "assistant", "content": "48"}
    enc = chat_mask.encode(tok, msgs, 1024)
    assert masked_runs(tok, enc.input_ids, enc.loss_mask)[-1] == (
        "<think>\n\n</think>\n\n48<|im_end|>")


def test_mask_rejects_a_template_that_rewrites_content(tok):
    tok.chat_template = tok.chat_template.replace("message['content']",
                                                  "message['content'] | upper")
    with pytest.raises(DraftkitError, match="chat template check failed"):
        chat_mask.encode(tok, [{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "hello"}], 256)


def test_fit_turns_and_truncation(tok):
    long = "word " * 300
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": long}, {"role": "assistant", "content": "ok"}]
    kept, cut = chat_mask.fit_turns(tok, msgs, 64)
    assert kept == msgs[:2] and cut == 1
    with pytest.raises(Dropped, match="prompt_too_long"):
        chat_mask.fit_turns(tok, [{"role": "user", "content": long},
                                  {"role": "assistant", "content": "x"}], 64)
    enc = chat_mask.encode(tok, [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": long}], 64)
    assert enc.truncated and len(enc.input_ids) == len(enc.loss_mask) == 64


def _local_run(tmp_path, rows, extra=()):
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("name: mine\neval_samples: 1\nsources:\n  - name: mine\n"
                      "    format: messages\n    fields: {messages: messages}\n"
                      "    files: [rows.parquet]\n")
    return init_run("tiny-llama", str(recipe), runs_dir=tmp_path, name="mine", overrides=[
        "data.source=local", "data.max_seq_len=64", "data.regenerate=false", *extra])


def test_truncation_and_drops_are_counted(tmp_path):
    long = "apples " * 200

    def conv(*turns):
        return {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                             for i, t in enumerate(turns)]}
    rows = [conv("eval me", "ok")] + [conv(f"q{i}", f"a{i}") for i in range(3)] + [
        conv("long answer", long),  # truncated
        conv(long, "x"),  # prompt alone too long: dropped
        conv("hi", "hello", long, "y"),  # second turn does not fit: trimmed
        conv("no answer yet"),  # nothing to learn without regeneration: dropped
    ]
    out = prepare.prepare(_local_run(tmp_path, rows))
    st = json.loads((out / "stats.json").read_text())
    assert st["train"]["truncated"] + st["eval"]["truncated"] == 1
    dropped = Counter(st["train"]["dropped"]) + Counter(st["eval"]["dropped"])
    assert dropped == {"prompt_too_long": 1, "empty_response": 1}
    assert st["train"]["trimmed_turns"] + st["eval"]["trimmed_turns"] == 1
    assert st["train"]["samples"] + st["eval"]["samples"] == 6
    ds = prepared_data.load_split(out, "train")
    assert max(ds["length"]) <= 64 and all(
        r == len(i) for r, i in zip(ds["length"], ds["input_ids"], strict=True))


def test_prepare_errors(tmp_path, tiny_target):
    run = _local_run(tmp_path, [{"messages": [{"role": "user", "content": f"hi {i}"}]}
                                for i in range(3)])
    with pytest.raises(DraftkitError, match="no train conversation survived.*empty_response"):
        prepare.prepare(run)
    with pytest.raises(DraftkitError, match="recipe 'mine' has no self_instruct section"):
        prepare.prepare(run, ["data.self_instruct=4", "data.regenerate=true"])
    with pytest.raises(DraftkitError, match="no prepared data"):
        prepared_data.load_split(RunPaths(run).data, "train")
    bare = tmp_path / "no-template"
    shutil.copytree(tiny_target.path, bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    run2 = init_run(str(bare), "math", runs_dir=tmp_path, name="bare", overrides=SMALL)
    with pytest.raises(DraftkitError, match="has no chat template"):
        prepare.prepare(run2)
    with pytest.raises(DraftkitError, match="data.self_instruct needs data.regenerate=true"):
        prepare.prepare(run2, ["data.self_instruct=4", "data.regenerate=false"])


def test_hf_regeneration_end_to_end(tmp_path, tiny_target):
    run = init_run("tiny-llama", "chat", runs_dir=tmp_path, overrides=SMALL)
    out = prepare.prepare(run)
    tok = prepare.load_tokenizer(tiny_target.path)
    ds = prepared_data.load_split(RunPaths(run).data, "train")
    assert set(ds.column_names) >= {"id", "messages", "prompt_ids", "input_ids", "loss_mask",
                                    "length"}
    assert len(ds) == 8 and len(prepared_data.load_split(RunPaths(run).data, "eval")) == 2
    cached = {}
    for f in (out / ".regen").glob("train-*/*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            cached.setdefault(rec["id"], []).append(rec["text"].strip())
    multi = 0
    for row in ds:
        msgs = json.loads(row["messages"])
        answers = [m["content"] for m in msgs if m["role"] == "assistant"]
        multi += len(answers) > 1
        assert answers == cached[row["id"]]  # every assistant turn is the target's, in order
        assert masked_runs(tok, row["input_ids"], row["loss_mask"]) == [
            a + "<|im_end|>" for a in answers]
        assert row["input_ids"][:len(row["prompt_ids"])] == row["prompt_ids"]
        assert row["length"] == len(row["input_ids"]) == len(row["loss_mask"])
    assert multi >= 1
    # token frequencies equal a brute-force count over the masked train tokens
    brute = Counter(t for r in ds for t, m in zip(r["input_ids"], r["loss_mask"], strict=True)
                    if m)
    counts = prepared_data.load_token_counts(RunPaths(run).data)
    assert counts.dtype.is_floating_point is False and counts.shape == (512,)
    assert {i: int(c) for i, c in enumerate(counts.tolist()) if c} == dict(brute)
    meta = json.loads((out / "meta.json").read_text())
    st = json.loads((out / "stats.json").read_text())
    assert meta["stage"] == "prepare" and meta["data_fingerprint"]
    assert st["regenerate"]["train"]["turns"] > 8 and st["regenerate"]["generated_tokens"] > 0


def test_regeneration_resumes_without_redoing_batches(tmp_path, monkeypatch):
    calls = {"n": 0, "fail_after": 2}
    real = regen.Generator._hf

    def counted(self, reqs):
        if calls["n"] == calls["fail_after"]:
            raise KeyboardInterrupt("simulated crash")
        calls["n"] += 1
        return real(self, reqs)

    monkeypatch.setattr(regen.Generator, "_hf", counted)
    run = init_run("tiny-llama", "math", runs_dir=tmp_path, overrides=SMALL)
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(run)  # 2 train batches + 1 eval batch (sampled, T=1); dies after 2
    assert not (Path(run) / "data" / "meta.json").exists()
    calls.update(n=0, fail_after=-1)
    out = prepare.prepare(run)
    assert calls["n"] == 1  # only the unfinished (eval) batch ran
    resumed = [dict(r) for r in prepared_data.load_split(RunPaths(run).data, "train")]
    st = json.loads((out / "stats.json").read_text())["regenerate"]
    assert st["train"]["cached_batches"] == 2 and st["eval"]["cached_batches"] == 0
    shutil.rmtree(out / ".regen")  # an uninterrupted run from scratch gives the same data
    calls["n"] = 0
    prepare.prepare(run)
    assert calls["n"] == 3
    assert [dict(r) for r in prepared_data.load_split(RunPaths(run).data, "train")] == resumed


@pytest.mark.parametrize("method", ["instruct", "magpie"])
def test_self_instruct_with_hf_target_is_resumable(tmp_path, tiny_target, method):
    spec = recipes.SelfInstructSpec(
        method=method, instruction="Write a problem about {topic}." if method == "instruct"
        else "{topic}", topics=["apples", "books"], max_new_tokens=6, min_chars=1,
        keep_unfinished=True, oversample=1.5)
    cfg = config.load(init_run("tiny-llama", "math", runs_dir=tmp_path, overrides=SMALL))
    tok = prepare.load_tokenizer(tiny_target.path)
    gen = regen.Generator(cfg, tok, tiny_target.path)
    convs, st = selfinstruct.self_instruct(spec, 3, gen, cfg, tmp_path / "si", set())
    assert len(convs) == 3 and st["asked"] == 5 and gen.calls == 2  # 5 asks in batches of 4
    for c in convs:
        assert c.source == "self-instruct" and c.messages[1] == {"role": "assistant",
                                                                 "content": ""}
        if method == "magpie":  # the opening words start the target-written user turn
            assert c.messages[0]["content"].startswith(("apples", "books"))
    again, st2 = selfinstruct.self_instruct(spec, 3, gen, cfg, tmp_path / "si", set())
    assert gen.calls == 2 and st2["cached_batches"] == 2  # all from the saved batches
    assert [c.messages for c in again] == [c.messages for c in convs]
