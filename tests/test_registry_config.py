"""Target registry, run-config schema, overrides and the templates in configs/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from draftkit.core import config, registry
from draftkit.core.config import ConfigError, RunConfig

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("name, layers, hidden, vocab, aux", [
    ("Qwen3-8B", 36, 4096, 151936, [2, 18, 33]),
    ("Qwen/Qwen3-8B", 36, 4096, 151936, [2, 18, 33]),
    ("qwen3-0.6b", 28, 1024, 151936, [2, 14, 25]),
    ("meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 128256, [2, 16, 29]),
    ("smollm2-135m", 30, 576, 49152, [2, 15, 27]),
    ("tiny-llama", 8, 128, 512, [2, 4, 5]),
])
def test_registry_shapes_and_default_aux_ids(name, layers, hidden, vocab, aux):
    info = registry.resolve(name)
    assert (info.num_hidden_layers, info.hidden_size, info.vocab_size) == (layers, hidden, vocab)
    assert info.default_aux_layer_ids == aux


def test_every_registered_target_has_consistent_shapes():
    for name in registry.names():
        info = registry.resolve(name)
        assert info.num_attention_heads % info.num_key_value_heads == 0, name
        assert info.head_dim > 0 and info.vocab_size > 0, name
        assert info.family in ("llama", "qwen3"), name


def test_unknown_target_suggests_near_names():
    with pytest.raises(registry.UnknownTargetError, match="Did you mean: .*Qwen3-8B"):
        registry.resolve("Qwen3-8b-instruct")
    with pytest.raises(registry.UnknownTargetError, match="local Hugging Face model directory"):
        registry.resolve("no-such-model-xyz")


def test_local_hf_dir_resolves_shapes(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 4,'
        ' "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,'
        ' "intermediate_size": 128, "vocab_size": 1000, "rope_theta": 1000000.0}')
    info = registry.resolve(str(tmp_path))
    assert info.family == "qwen3" and info.head_dim == 16 and info.source == "local"


def test_overrides_are_typed_and_nested():
    cfg = RunConfig()
    config.merge(cfg, config.parse_overrides(
        ["train.lr=1e-4", "eval.k_values=[1,3]", "data.regenerate=false", "train.epochs=2",
         "data.system_prompt=Be brief."]))
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)
    assert cfg.eval.k_values == [1, 3]
    assert cfg.data.regenerate is False and cfg.train.epochs == 2
    assert cfg.data.system_prompt == "Be brief."


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", "unknown config key 'train.lrr'"),
    ("nope.x=1", "unknown config key 'nope'"),
    ("train.epochs=two", "'train.epochs' must be an integer"),
    ("data.regenerate=maybe", "'data.regenerate' must be true/false"),
    ("eval.k_values=3", "'eval.k_values' must be a list"),
    ("eval.k_values=[1,x]", r"'eval.k_values\[1\]' must be an integer"),
    ("train.lr", "is not key=value"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        config.merge(RunConfig(), config.parse_overrides([override]))


def test_round_trip_through_yaml(tmp_path):
    cfg = RunConfig()
    cfg.draft.aux_layer_ids = [2, 15, 27]
    path = tmp_path / "draftkit.yaml"
    path.write_text(config.dump(cfg))
    assert config.load(path) == cfg
    assert config.load(tmp_path) == cfg


def test_load_reports_unknown_key_in_file(tmp_path):
    (tmp_path / "draftkit.yaml").write_text("train:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match="unknown config key 'train.bogus'"):
        config.load(tmp_path)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_template_loads_and_validates(path):
    data = yaml.safe_load(path.read_text()) or {}
    cfg = config.merge(RunConfig(), data)  # raises on unknown keys / wrong types
    from draftkit.drafts import kind as kinds

    assert cfg.draft.kind in kinds.names()
    assert CONFIGS, "configs/ must hold templates"
