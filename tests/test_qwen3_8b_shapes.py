"""Qwen3-8B's real shapes through the lifecycle on a CPU: `random:Qwen3-8B@layers=2` (hidden
4096, vocab 151,936, the Qwen3 <think> chat template, seeded random weights, its first 2 decoder
layers) through init -> prepare (offline sample) -> harvest -> train (2 steps) -> export, and the
export read by vLLM's own speculators-config parser as a Qwen3 EAGLE-3 draft.

Cost on the 2-core AVX2 Xeon (fp32, a box shared with other jobs): 7.5 minutes and 12.3 GiB
peak RSS (the target's 1.6B random parameters in fp32, 1.2B of them the two 151,936 x 4096
embedding tables, loaded by harvest and again by train). The head is kept small
beside them (draft vocab 4096, MLP width 1024); its fc, decoder layer and lm_head keep the 4096
width vLLM checks."""

from __future__ import annotations

import json

import pytest
import torch
from _runs import one_thread
from safetensors import safe_open

from draftkit import api
from draftkit.core import artifacts, config
from draftkit.harvest.shards import open_harvest

pytestmark = pytest.mark.slow

TARGET = "random:Qwen3-8B@layers=2"
OVERRIDES = [
    "data.source=local", "data.max_samples=6", "data.eval_samples=2", "data.max_seq_len=192",
    "data.regenerate=false", "draft.draft_vocab_size=4096", "draft.intermediate_size=1024",
    "harvest.dtype=bfloat16", "harvest.shard_tokens=512", "harvest.batch_tokens=512",
    "harvest.eval_sequences=2", "train.mode=stored", "train.max_steps=2", "train.eval_every=2",
    "train.save_every=2", "train.batch_tokens=256", "train.pad_multiple=16",
    "train.num_workers=0", "train.device=cpu", "tracking.backend=none", "export.check=false",
]


def test_qwen3_8b_shapes_lifecycle_and_vllm_reads_the_export(tmp_path):
    with one_thread():
        run = api.init(TARGET, "math", name="q8", runs_dir=tmp_path, overrides=OVERRIDES)
        cfg = config.load(run)
        t = cfg.target
        assert (t.family, t.hidden_size, t.vocab_size, t.num_hidden_layers) == (
            "qwen3", 4096, 151936, 2)
        assert cfg.draft.aux_layer_ids == [0, 1, 2]  # taps within the 2 kept layers
        assert cfg.draft.hidden_size == 4096 and cfg.draft.num_key_value_heads == 8

        api.prepare(run)
        row = json.loads(__import__("datasets").load_from_disk(
            str(artifacts.RunPaths(run).data / "train"))[0]["messages"])
        api.harvest(run)
        hs = open_harvest(artifacts.RunPaths(run).harvest, target_name=TARGET,
                          aux_layer_ids=[0, 1, 2])
        seq = hs[0]
        assert seq["aux"].shape[1] == 3 * 4096 and seq["last"].shape[1] == 4096
        assert seq["aux"].dtype == torch.bfloat16 and hs.manifest["bytes_per_token"] == 32768
        assert int(seq["input_ids"][0]) == 151644  # <|im_start|>: Qwen3's template rendered
        assert 151667 in seq["input_ids"].tolist()  # <think> in the assistant turn
        assert row[-1]["role"] == "assistant"

        out = api.train(run)
        assert (out / "best" / "model.safetensors").is_file()
        export = api.export(run)
    check_export_for_vllm_qwen3(export, cfg)


def check_export_for_vllm_qwen3(export, cfg) -> None:
    """The export as vLLM's Qwen3 EAGLE-3 loader reads it: vLLM's speculators parser
    (transformers_utils/configs/speculators) builds the draft config, llama_eagle3.py's
    Eagle3Qwen3ForCausalLM sizes fc from target_hidden_size x the number of aux ids, lm_head
    from draft_vocab_size, and maps draft ids to target ids through d2t (offsets)."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    raw = json.loads((export / "config.json").read_text())
    assert "model_type" not in raw and raw["speculators_model_type"] == "eagle3"
    assert raw["transformer_layer_config"]["model_type"] == "qwen3"
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        assert flag in raw, flag  # vLLM defaults norm_before_residual to true
    parsed = SpeculatorsConfig.from_pretrained(str(export))
    assert parsed.architectures == ["Eagle3Qwen3ForCausalLM"]
    assert (parsed.target_hidden_size, parsed.hidden_size, parsed.vocab_size) == (
        4096, 4096, 151936)
    assert parsed.draft_vocab_size == 4096 and parsed.num_hidden_layers == 1
    assert list(parsed.eagle_aux_hidden_state_layer_ids) == [0, 1, 2]
    spec = SpeculatorsConfig.extract_vllm_speculative_config(raw)
    assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 3
    with safe_open(str(export / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        d2t = f.get_tensor("d2t")
    assert shapes["fc.weight"] == (4096, 3 * 4096)
    assert shapes["lm_head.weight"] == (4096, 4096) and shapes["t2d"] == (151936,)
    assert shapes["layers.0.mlp.gate_proj.weight"] == (1024, 4096)
    # EAGLE-3's layer attends over [token embedding | fc(taps)]: 2 x 4096 inputs; 8 kv heads x 128
    assert shapes["layers.0.self_attn.k_proj.weight"] == (8 * 128, 2 * 4096)
    assert shapes["layers.0.self_attn.q_proj.weight"] == (32 * 128, 2 * 4096)
    assert d2t.dtype == torch.int64 and d2t.shape == (4096,)
    target_ids = d2t + torch.arange(4096)  # d2t[i] = selected[i] - i
    assert bool((target_ids[1:] > target_ids[:-1]).all()) and int(target_ids.max()) < 151936
