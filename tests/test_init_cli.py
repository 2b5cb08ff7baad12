"""`draftkit init` / `config show` / CLI errors, and the embedded target's one-time conversion."""

from __future__ import annotations

import pytest
import yaml

from draftkit import cli
from draftkit.core import artifacts, config, registry
from draftkit.core.errors import DraftkitError
from draftkit.core.registry import draft_vocab_rule
from draftkit.init.stage import init_run, resolve


def _cli(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_init_qwen3_8b_offline_resolves_real_shapes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = _cli(capsys, "init", "--target", "Qwen3-8B", "--data", "math",
                          "--dir", str(tmp_path))
    assert code == 0, err
    run = tmp_path / "qwen3-8b-math-eagle3"
    data = yaml.safe_load((run / "draftkit.yaml").read_text())
    t = data["target"]
    assert (t["num_hidden_layers"], t["hidden_size"], t["vocab_size"]) == (36, 4096, 151936)
    assert t["hub_id"] == "Qwen/Qwen3-8B" and t["family"] == "qwen3"
    assert data["draft"]["aux_layer_ids"] == [2, 18, 33]
    assert data["draft"]["draft_vocab_size"] == 32000
    assert data["draft"]["hidden_size"] == 4096 and data["draft"]["num_key_value_heads"] == 8
    assert data["data"]["max_seq_len"] == 4096  # configs/eagle3-qwen3.yaml
    assert data["train"]["lr"] == pytest.approx(1e-4)
    # every default is present: the file round-trips to the same full config
    assert config.load(run).to_dict() == data
    assert "needs downloading before prepare: Qwen/Qwen3-8B" in out
    assert f"draftkit prepare {run}" in out and f"draftkit eval {run}" in out


def test_config_show_prints_resolved_config_with_overrides(tmp_path, capsys):
    run = init_run("Qwen3-0.6B", "math", runs_dir=tmp_path, name="q")
    code, out, _ = _cli(capsys, "config", "show", str(run), "train.lr=5e-5")
    assert code == 0
    shown = yaml.safe_load(out)
    assert shown["train"]["lr"] == 5e-5 and shown["draft"]["aux_layer_ids"] == [2, 14, 25]


def test_overrides_may_follow_options_and_strays_are_refused(tmp_path, capsys):
    code, _, _ = _cli(capsys, "init", "--target", "Qwen3-0.6B", "--data", "math", "--dir",
                      str(tmp_path), "--name", "q", "train.lr=5e-5", "--k", "4", "train.epochs=2")
    assert code == 0
    data = yaml.safe_load((tmp_path / "q" / "draftkit.yaml").read_text())
    assert (data["train"]["lr"], data["train"]["epochs"]) == (5e-5, 2)
    assert data["draft"]["num_speculative_tokens"] == 4
    code, _, err = _cli(capsys, "init", "--target", "Qwen3-0.6B", "--data", "math", "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in err
    code, _, err = _cli(capsys, "targets", "train.lr=1")
    assert code == 2 and "unrecognized arguments: train.lr=1" in err


def test_k_and_overrides_reach_the_config():
    cfg = resolve("Llama-3.1-8B-Instruct", "math", k=5, overrides=["train.epochs=1"])
    assert cfg.draft.num_speculative_tokens == 5 and cfg.train.epochs == 1
    assert cfg.target.rope_scaling["rope_type"] == "llama3"
    assert cfg.draft.aux_layer_ids == [2, 16, 29]


@pytest.mark.parametrize("vocab, expected", [(151936, 32000), (128256, 32000), (49152, 12288),
                                             (512, 512), (8192, 8192), (20000, 8192)])
def test_draft_vocab_rule(vocab, expected):
    assert draft_vocab_rule(vocab) == expected


@pytest.mark.parametrize("argv, message", [
    (["--target", "Qwen3-8b-chat", "--data", "math"], "unknown target 'Qwen3-8b-chat'. Did you mean"),
    (["--target", "Qwen3-8B", "--data", "maths"], "unknown data recipe 'maths'. Did you mean math"),
    (["--target", "Qwen3-8B", "--data", "math", "draft.draft_vocab_size=200000"],
     "draft vocab 200000 is larger than Qwen3-8B's vocab"),
    (["--target", "Qwen3-8B", "--data", "math", "draft.aux_layer_ids=[2,18,40]"],
     r"aux layer ids \[40\] are out of range for a target with 36 layers"),
    (["--target", "smollm2-135m", "--data", "math", "--draft", "draft-lm", "draft.init=sibling"],
     "no registered draft LM shares smollm2-135m's vocabulary"),
    (["--target", "Llama-3.1-8B-Instruct", "--data", "math", "--draft", "draft-lm",
      "draft.model=Qwen3-0.6B"], "draft LM Qwen3-0.6B has vocab 151936"),
    (["--target", "Qwen3-8B", "--data", "math", "train.lr=fast"], "'train.lr' must be a float"),
])
def test_init_bad_input_prints_clear_error(tmp_path, capsys, argv, message):
    code, _, err = _cli(capsys, "init", *argv, "--dir", str(tmp_path))
    assert code == 2
    assert err.startswith("error: ")
    assert __import__("re").search(message, err), err
    assert not any(tmp_path.iterdir()), "a failed init must not leave a run dir"


def test_init_refuses_existing_run_unless_force(tmp_path, capsys):
    init_run("Qwen3-8B", "math", runs_dir=tmp_path, name="r")
    code, _, err = _cli(capsys, "init", "--target", "Qwen3-8B", "--data", "math", "--name", "r",
                        "--dir", str(tmp_path))
    assert code == 2 and "already holds a run config; pass --force" in err
    code, _, _ = _cli(capsys, "init", "--target", "Qwen3-4B", "--data", "math", "--name", "r",
                      "--dir", str(tmp_path), "--force")
    assert code == 0
    assert config.load(tmp_path / "r").target.name == "Qwen3-4B"


def test_draft_lm_picks_the_family_small_model():
    cfg = resolve("Qwen3-8B", "math", kind="draft-lm")
    assert cfg.draft.model == "Qwen3-0.6B"


def test_stage_without_run_config_is_a_clear_error(tmp_path, capsys):
    code, _, err = _cli(capsys, "prepare", str(tmp_path / "nope"))
    assert code == 2 and "no run config at" in err and "draftkit init" in err


def test_hub_target_offline_says_what_to_download(monkeypatch, tmp_path):
    from draftkit.core.errors import TargetLoadError
    from draftkit.targets.load import target_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(TargetLoadError, match="huggingface-cli download Qwen/Qwen3-0.6B"):
        target_dir("Qwen3-0.6B")


@pytest.mark.slow
def test_smollm2_conversion_is_cached_and_matches_gguf_greedy(smollm2_target):
    import torch

    from draftkit.targets.gguf import load_gguf
    from draftkit.targets.load import target_dir

    info = registry.resolve("smollm2-135m")
    path = target_dir(info)
    stamp = (path / "meta.json").stat().st_mtime_ns
    assert target_dir(info) == path and (path / "meta.json").stat().st_mtime_ns == stamp
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    gguf_model, gguf_tok = load_gguf(info)
    tok = smollm2_target.tokenizer
    msgs = [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and "
             "then she sold half as many clips in May. How many clips did Natalia sell "
             "altogether in April and May?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    ref_ids = gguf_tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    ref_ids = ref_ids["input_ids"] if not torch.is_tensor(ref_ids) else ref_ids
    assert torch.equal(ids, ref_ids)
    out = smollm2_target.model.generate(ids, max_new_tokens=48, do_sample=False)
    ref = gguf_model.generate(ref_ids, max_new_tokens=48, do_sample=False)
    assert torch.equal(out, ref)
    assert "48" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.slow
def test_interrupted_conversion_leaves_nothing_trusted(monkeypatch, tmp_path):
    from transformers import PreTrainedModel

    from draftkit.targets.load import target_dir

    monkeypatch.setenv("DRAFTKIT_HOME", str(tmp_path))
    info = registry.resolve("smollm2-135m")

    def crash(self, *a, **k):
        raise KeyboardInterrupt("killed mid-save")

    with monkeypatch.context() as m:
        m.setattr(PreTrainedModel, "save_pretrained", crash)
        with pytest.raises(KeyboardInterrupt):
            target_dir(info)
    targets = tmp_path / "targets"
    assert not (targets / "smollm2-135m").exists()
    assert not list(targets.glob(".*tmp*")), "temp dir left behind"
    path = target_dir(info)
    assert (path / "meta.json").is_file() and path == artifacts.home() / "targets" / "smollm2-135m"


def test_draftkit_error_is_the_cli_contract():
    assert issubclass(config.ConfigError, DraftkitError)
    assert issubclass(registry.UnknownTargetError, DraftkitError)


def test_unsorted_or_repeated_aux_ids_are_refused():
    with pytest.raises(DraftkitError, match="must be distinct and ascending"):
        resolve("Qwen3-8B", "math", overrides=["draft.aux_layer_ids=[18,2,33]"])
    with pytest.raises(DraftkitError, match="must be distinct and ascending"):
        resolve("Qwen3-8B", "math", overrides=["draft.aux_layer_ids=[2,18,18]"])


def test_each_lifecycle_verb_calls_its_api_function(monkeypatch, tmp_path):
    """cli.py is a layer over api.py: a verb calls the api function of its name (eval:
    api.evaluate) with the run dir and its flags as config overrides, not a module by name."""
    from draftkit import api

    seen = []
    for name in ("prepare", "harvest", "train", "export", "evaluate"):
        monkeypatch.setattr(api, name, lambda run, overrides, _n=name: seen.append(
            (_n, str(run), overrides)))
    run = str(tmp_path / "r")
    for verb in ("prepare", "harvest", "train"):
        assert cli.run([verb, run, "a.b=1"]) == 0
    assert cli.run(["export", run, "--no-check"]) == 0
    assert cli.run(["eval", run, "--k", "1,3", "x=2"]) == 0
    assert seen == [("prepare", run, ["a.b=1"]), ("harvest", run, ["a.b=1"]),
                    ("train", run, ["a.b=1"]), ("export", run, ["export.check=false"]),
                    ("evaluate", run, ["x=2", "eval.k_values=[1, 3]"])]
