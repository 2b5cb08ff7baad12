"""The Qwen3 family end to end: `tiny-qwen3` (Qwen3 architecture with q/k norms, the real Qwen3
vocabulary, a Qwen3-style <think> chat template, random weights) through init -> prepare ->
harvest -> train -> export -> vLLM eval, with tiny budgets."""

from __future__ import annotations

import json

import pytest
import torch

from draftkit import api
from draftkit.core import artifacts, config
from draftkit.harvest.shards import open_harvest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen():
    from draftkit.targets.load import load_target

    return load_target("tiny-qwen3", device="cpu", dtype="float32")


def test_tiny_qwen3_is_qwen3(qwen):
    tok, model = qwen.tokenizer, qwen.model
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.vocab_size == 151936
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (64,)  # per-head q/k norms
    assert model.model.layers[0].self_attn.k_norm.weight.shape == (64,)
    assert len(tok) == 151669 and tok.eos_token == "<|im_end|>"
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                     "</think>"])
    assert ids == [151643, 151644, 151645, 151667, 151668]  # Qwen3's ids
    assert tok("Hello world!", add_special_tokens=False)["input_ids"] == [9707, 1879, 0]
    msgs = [{"role": "user", "content": "6*7?"},
            {"role": "assistant", "content": "<think>\nsix sevens\n</think>\n\n42"},
            {"role": "user", "content": "and 8*7?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "six sevens" not in text  # reasoning of turns before the last user message dropped
    assert text.endswith("<|im_start|>assistant\n")
    last = tok.apply_chat_template(msgs[:2], tokenize=False)
    assert last.endswith("<|im_start|>assistant\n<think>\nsix sevens\n</think>\n\n42<|im_end|>\n")
    off = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True,
                                  enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    think = tok("<think>\nx\n</think>", add_special_tokens=False)["input_ids"]
    assert think[0] == 151667 and think[-1] == 151668
    assert tok.decode([151667], skip_special_tokens=True) == "<think>"  # not special in Qwen3


OVERRIDES = [
    "data.source=local", "data.max_samples=24", "data.eval_samples=4", "data.max_seq_len=256",
    "data.regen_engine=hf", "data.regen_max_new_tokens=16", "data.regen_temperature=0.0",
    "draft.draft_vocab_size=1024", "harvest.dtype=float32",
    "train.max_steps=12", "train.eval_every=6", "train.save_every=6", "train.batch_tokens=1024",
    "train.lr=3e-3", "tracking.backend=none", "export.check=false",
    "eval.engine=vllm", "eval.k_values=[3]", "eval.temperatures=[0]", "eval.batch_sizes=[4]",
    "eval.num_prompts=4", "eval.max_new_tokens=16", "eval.dtype=float32",
]


@pytest.mark.vllm
def test_tiny_qwen3_lifecycle(tmp_path, one_thread):
    run = api.init("tiny-qwen3", "math", name="qwen", runs_dir=tmp_path,
                   overrides=[*OVERRIDES, f"eval.results_dir={tmp_path / 'results'}"])
    cfg = config.load(run)
    assert (cfg.target.family, cfg.target.vocab_size, cfg.draft.aux_layer_ids) == (
        "qwen3", 151936, [2, 4, 5])
    assert cfg.data.max_seq_len == 256 and cfg.eval.max_new_tokens == 16  # over eagle3-qwen3.yaml

    api.prepare(run)
    api.harvest(run)
    hs = open_harvest(artifacts.RunPaths(run).harvest, target_name="tiny-qwen3",
                      aux_layer_ids=[2, 4, 5])
    seq = hs[0]
    assert seq["aux"].shape[1] == 3 * 128 and int(seq["input_ids"].max()) < 151936
    assert int(seq["input_ids"][0]) == 151644  # <|im_start|>: the Qwen3 template rendered

    out = api.train(run)
    history = torch.load(sorted((out / "checkpoints").glob("step-*"))[-1] / "trainer.pt",
                         weights_only=False)["history"]
    assert len(history) == 12 and history[-1]["loss"] < history[0]["loss"]

    export = api.export(run)
    spec = json.loads((export / "config.json").read_text())
    assert spec["transformer_layer_config"]["model_type"] == "qwen3"
    assert spec["transformer_layer_config"]["vocab_size"] == 151936
    assert spec["speculators_config"]["verifier"] == {"name_or_path": "tiny-qwen3",
                                                      "architectures": ["Qwen3ForCausalLM"]}

    report = api.evaluate(run)
    rows = {r["method"]: r for r in report["vllm"]["rows"]}
    assert set(rows) == {"none", "ngram", "suffix", "eagle3"}  # the free methods beside it
    eagle = rows["eagle3"]
    assert eagle["drafts"] > 0 and eagle["output_tokens"] > 0  # vLLM ran the Qwen3 EAGLE-3 head
    lossless = report["lossless_vllm"]
    assert lossless["dtype"] == "float32" and lossless["match_rate"] == 1.0
