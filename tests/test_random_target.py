"""`random:<name>` targets (targets/random_init.py): a registry target's shapes with seeded
random weights drawn on the device, through the registry, `draftkit init`, load_target and the
stages; Qwen3-8B itself is built on the `meta` device (real shapes, no memory)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _runs import one_thread

from draftkit import api
from draftkit.core import artifacts, config, registry
from draftkit.core.registry import UnknownTargetError
from draftkit.targets import random_init
from draftkit.targets.load import load_target, target_dir

SAME = ("family", "architecture", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta",
        "rope_scaling", "rms_norm_eps", "tie_word_embeddings")


def test_random_name_resolves_to_the_named_targets_shapes():
    real = registry.resolve("Qwen3-8B")
    for name in ("random:Qwen3-8B", "random:qwen/qwen3-8b", "RANDOM:Qwen3-8B@layers=36"):
        info = registry.resolve(name)
        assert info.name == "random:Qwen3-8B" and info.source == registry.SOURCE_RANDOM_INIT
        assert info.hub_id == "" and info.num_hidden_layers == 36 and info.params_b == 8.2
        assert all(getattr(info, k) == getattr(real, k) for k in SAME)
    small = registry.resolve("random:Qwen3-8B@layers=8")
    assert small.name == "random:Qwen3-8B@layers=8" and small.num_hidden_layers == 8
    assert registry.resolve(small.name) == small  # a run config resolves to the same shapes
    assert 2.5 < small.params_b < 3.0  # embeddings + lm_head (1.24B) + 8 of 36 layers
    assert registry.resolve("random:Llama-3.1-8B").rope_scaling["rope_type"] == "llama3"
    with pytest.raises(UnknownTargetError, match="mixture of experts"):
        registry.resolve("random:Qwen3-30B-A3B")
    with pytest.raises(UnknownTargetError, match=r"@layers=N with 1 <= N <= 36"):
        registry.resolve("random:Qwen3-8B@layers=40")
    with pytest.raises(UnknownTargetError, match="got @depth=4"):
        registry.resolve("random:Qwen3-8B@depth=4")
    with pytest.raises(UnknownTargetError, match="Did you mean: Qwen3-8B"):
        registry.resolve("random:Qwen3-9B")


def test_init_of_random_qwen3_8b_is_offline_and_its_model_has_the_real_architecture(
        tmp_path, capsys):
    from draftkit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["init", "--target", "random:Qwen3-8B", "--data", "math", "--dir", str(tmp_path)])
    assert e.value.code == 0 and "needs downloading" not in capsys.readouterr().out
    cfg = config.load(tmp_path / "random:qwen3-8b-math-eagle3")
    assert (cfg.target.name, cfg.target.num_hidden_layers, cfg.target.vocab_size) == \
        ("random:Qwen3-8B", 36, 151936)
    assert cfg.draft.aux_layer_ids == [2, 18, 33] and cfg.draft.draft_vocab_size == 32000
    assert cfg.train.batch_tokens == 16384  # derived as for the real 8B target
    path = target_dir(cfg.target.name)
    assert not list(path.glob("*.safetensors"))  # config + tokenizer only
    model = random_init.build_model(path, "meta", torch.bfloat16)
    assert type(model).__name__ == "Qwen3ForCausalLM" and len(model.model.layers) == 36
    assert sum(p.numel() for p in model.parameters()) == 8_190_735_360  # Qwen3-8B's count
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # untied, as Qwen3-8B
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.filterwarnings("ignore::draftkit.core.hardware.DtypeWarning")
def test_weights_are_seeded_drawn_in_the_requested_dtype_and_never_written():
    a = load_target("random:tiny-llama", device="cpu", dtype="float32")
    b = load_target("random:tiny-llama", device="cpu", dtype="float32")
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    other = random_init.build_model(a.path, "cpu", torch.float32, seed=1)
    assert not torch.equal(other.lm_head.weight, a.model.lm_head.weight)
    w = a.model.model.layers[0].mlp.up_proj.weight
    assert w.std().item() == pytest.approx(0.02, rel=0.05) and not w.requires_grad
    assert torch.equal(a.model.model.norm.weight, torch.ones(128))
    assert len(a.tokenizer) <= a.model.config.vocab_size == 512
    bf16 = load_target("random:tiny-llama", device="cpu", dtype="bfloat16")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert not list(a.path.glob("*.safetensors"))
    meta = artifacts.read_json(a.path / "meta.json")
    assert meta["target"] == "random:tiny-llama" and meta[random_init.META_KEY]["std"] == 0.02


def test_a_random_target_runs_the_stages_and_harvest_is_the_loaded_model(tmp_path):
    """init -> prepare -> harvest -> train on random:tiny-llama; the harvested states are the
    ones a later load_target computes: the same seeded weights in every process and load."""
    from draftkit.harvest.shards import open_harvest
    from draftkit.targets.capture import capture
    from draftkit.train.data import HarvestSource

    with one_thread():
        run = api.init("random:tiny-llama", "math", runs_dir=tmp_path, overrides=[
            "data.source=local", "data.max_samples=8", "data.eval_samples=2",
            "data.regenerate=false", "draft.draft_vocab_size=256", "harvest.dtype=float32",
            "train.max_steps=2", "train.eval_every=2", "train.save_every=2",
            "train.batch_tokens=1024", "train.num_workers=0", "tracking.backend=none",
            "train.device=cpu"])
        api.prepare(run)
        api.harvest(run)
        out = api.train(run)
        assert (out / "best" / "model.safetensors").is_file()
        source = HarvestSource([open_harvest(artifacts.RunPaths(run).harvest)])
        row = source.gather([0])[0]
        target = load_target("random:tiny-llama", device="cpu", dtype="float32")
        aux, last = capture(target.model, row["input_ids"][None], [2, 4, 5])
    torch.testing.assert_close(row["last"].float(), last[0])
    torch.testing.assert_close(row["aux"].float(), aux[0])


def test_dataclass_replace_keeps_every_field():
    """random_target copies every TargetInfo field it does not set (a new field would be kept)."""
    info, real = registry.resolve("random:tiny-qwen3"), registry.resolve("tiny-qwen3")
    changed = {f.name for f in dataclasses.fields(info) if getattr(info, f.name) !=
               getattr(real, f.name)}
    assert changed == {"name", "source"}
