"""Rollout JSONL in the three shapes RL frameworks write, response-only loss masks, bad rows
named by file:line, and the lineage rule (shapes + tokenizer, never names). A file under two
names and identical rows count once; rows cut by max_seq_len are counted; a sharded checkpoint
needs its index."""

from __future__ import annotations

import json
import shutil

import pytest

from draftkit.core import config
from draftkit.core.errors import DraftkitError
from draftkit.rl import policy as pol
from draftkit.rl.rollouts import read_rollouts
from draftkit.targets import lineage


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_three_shapes_mask_only_the_response(tmp_path, tiny_target):
    tok, v = tiny_target.tokenizer, tiny_target.model.config.vocab_size
    prompt = tok.apply_chat_template([{"role": "user", "content": "what is 2+3?"}],
                                     add_generation_prompt=True, tokenize=False)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    r_ids = tok("2+3 = 5<|im_end|>", add_special_tokens=False)["input_ids"]
    f = _write(tmp_path / "a.jsonl", [
        {"messages": [{"role": "user", "content": "what is 2+3?"},
                      {"role": "assistant", "content": "2+3 = 5"}], "policy_step": 7},
        {"prompt": prompt, "response": "2+3 = 5<|im_end|>", "reward": 1.0},
        {"prompt_ids": p_ids, "response_ids": r_ids, "temperature": 1.0}])
    rows = read_rollouts([f], tok, v)
    assert [r.source for r in rows] == [f"{f}:1", f"{f}:2", f"{f}:3"]
    for r in rows:
        assert r.input_ids == p_ids + r_ids
        assert r.loss_mask == [0] * len(p_ids) + [1] * len(r_ids)
    assert (rows[0].policy_step, rows[1].reward, rows[2].temperature) == (7, 1.0, 1.0)


@pytest.mark.parametrize("row, needle", [
    ({"prompt": "hi"}, "text rows need"),
    ({"prompt": "hi", "response": "  "}, "`response` is empty"),
    ({"prompt_ids": [1, 2], "response_ids": []}, "`response_ids` is empty"),
    ({"prompt_ids": [1, 2], "response_ids": [3, 99999]}, "outside the policy vocab"),
    ({"prompt_ids": [1, 2]}, "need both"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
    ({"foo": 1}, "no known fields"),
    ({"prompt_ids": [1], "response_ids": [2, 3], "policy_step": "x"}, "policy_step"),
    ("{not json", "not valid JSON"),
])
def test_bad_rows_name_file_and_line(tmp_path, tiny_target, row, needle):
    good = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5]}
    f = _write(tmp_path / "r.jsonl", [good, row])
    with pytest.raises(DraftkitError, match=needle) as e:
        read_rollouts([tmp_path], tiny_target.tokenizer, tiny_target.model.config.vocab_size)
    assert f"{f}:2" in str(e.value)


def test_lineage_checks_shapes_and_tokenizer_not_names(tmp_path, tiny_target):
    from draftkit.init.stage import init_run

    run = init_run("tiny-llama", "math", name="lin", runs_dir=tmp_path / "runs")
    cfg = config.load(run)
    ckpt = tmp_path / "policy-step-3"  # a new directory name: same lineage
    tiny_target.model.save_pretrained(ckpt)
    tiny_target.tokenizer.save_pretrained(ckpt)
    p = pol.load_policy(ckpt, step=3)
    pol.check_lineage(p, cfg)
    assert lineage.same_lineage(str(ckpt), "tiny-llama") == []
    assert p.digest == pol.load_policy(ckpt).digest
    other = tmp_path / "other-tok"  # same shapes, another tokenizer
    shutil.copytree(ckpt, other)
    tok = pol.load_policy(ckpt).tokenizer
    tok.add_tokens(["<tool_call_x>"])
    tok.save_pretrained(other)
    with pytest.raises(DraftkitError, match="tokenizer"):
        pol.check_lineage(pol.load_policy(other), cfg)
    assert lineage.same_lineage(str(other), "tiny-llama") == ["the tokenizers differ"]
    cfg.target.hidden_size += 8
    with pytest.raises(DraftkitError, match="hidden_size"):
        pol.check_lineage(p, cfg)


def test_warm_start_accepts_a_new_checkpoint_dir_of_the_same_lineage(tmp_path, tiny_target):
    from _rl_helpers import OVERRIDES, make_run

    from draftkit.drafts.eagle_family.build import warm_start
    from draftkit.init.stage import init_run
    from draftkit.rl.publish import DraftStore

    head = DraftStore(make_run(tmp_path / "runs", tiny_target)).current_dir()  # tiny-llama's
    ckpt = tiny_target.model.save_pretrained(tmp_path / "step_9") or tmp_path / "step_9"
    tiny_target.tokenizer.save_pretrained(ckpt)
    run = init_run(str(ckpt), "math", name="step9", runs_dir=tmp_path / "runs",
                   overrides=[*OVERRIDES, f"train.init_from={head}"])
    cfg = config.load(run)
    assert cfg.target.name != "tiny-llama"
    assert warm_start(cfg, tiny_target.model).spec.draft_vocab_size == 256
    tok = pol.load_policy(ckpt).tokenizer
    tok.add_tokens(["<tool_call_x>"])
    tok.save_pretrained(ckpt)
    with pytest.raises(DraftkitError, match="tokenizers differ"):
        warm_start(cfg, tiny_target.model)


def test_a_file_under_two_names_and_identical_rows_count_once(tmp_path, tiny_target):
    from draftkit.rl.rollouts import dedupe_rows, unique_files

    rows = [{"prompt_ids": [1, 2, 3], "response_ids": [4, 5]},
            {"prompt_ids": [1, 2, 3], "response_ids": [4, 6]}]
    f = _write(tmp_path / "step_1.jsonl", [*rows, rows[0]])  # the last row repeats the first
    (tmp_path / "latest.jsonl").symlink_to(f)  # what trainers point at the newest file
    (tmp_path / "backup").mkdir()
    copy = shutil.copy(f, tmp_path / "backup" / "step_1.jsonl")  # the same rows, another file
    kept, dropped = unique_files([f, tmp_path / "latest.jsonl", copy])
    assert [d["path"] for d in kept] == [str(f.resolve())]
    assert [d["why"] for d in dropped] == ["same file", "same content"]
    read = read_rollouts([d["path"] for d in kept], tiny_target.tokenizer,
                         tiny_target.model.config.vocab_size)
    unique, n = dedupe_rows(read)
    assert n == 1 and [r.source for r in unique] == [f"{f.resolve()}:1", f"{f.resolve()}:2"]


def test_rows_cut_by_max_seq_len_are_counted(tmp_path, tiny_target):
    from draftkit.rl.rollouts import ReadStats

    f = _write(tmp_path / "r.jsonl", [{"prompt_ids": [1, 2, 3], "response_ids": [4] * 10},
                                      {"prompt_ids": [1, 2, 3], "response_ids": [5, 6]}])
    stats = ReadStats()
    rows = read_rollouts([f], tiny_target.tokenizer, tiny_target.model.config.vocab_size, 8,
                         stats=stats)
    assert [len(r.input_ids) for r in rows] == [8, 5]
    assert (stats.rows, stats.cut, stats.cut_tokens, stats.cut_sources) == (2, 1, 5, [f"{f}:1"])


def test_a_sharded_checkpoint_needs_its_index(tmp_path, tiny_target):
    import torch
    from safetensors.torch import save_file

    ckpt = tmp_path / "step_4"
    tiny_target.model.save_pretrained(ckpt)
    tiny_target.tokenizer.save_pretrained(ckpt)
    tensors = {k: v.clone() for k, v in tiny_target.model.state_dict().items()}
    (ckpt / "model.safetensors").unlink()
    names = sorted(tensors)
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:]), 1):
        save_file({k: tensors[k] for k in part}, ckpt / f"model-0000{i}-of-00002.safetensors")
    with pytest.raises(pol.CheckpointError, match="no model.safetensors.index.json"):
        pol.load_policy(ckpt)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    (ckpt / pol.INDEX).write_text(json.dumps({"metadata": {"total_size": size}, "weight_map": {
        k: f"model-0000{1 + (k in names[len(names) // 2:])}-of-00002.safetensors"
        for k in names}}))
    assert pol.shard_problems(ckpt) == []
    p = pol.load_policy(ckpt)
    assert torch.equal(p.model.lm_head.weight, tiny_target.model.lm_head.weight)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    assert pol.shard_problems(ckpt) == ["missing shard(s) model-00002-of-00002.safetensors"]
    with pytest.raises(pol.CheckpointError, match="missing shard"):
        pol.load_policy(ckpt)
