"""`draftkit init --from-draft`: drafts saved by the speculators package (0.9, its own classes)
and a SpecForge-layout head become a run's `drafts/current` (v0000 with its lineage), then
drift, refresh, export and eval with no prepare, harvest or train; the export loads again with the
speculators package's own loader with equal tensors. A hub id resolves from a fake cache in the
hub layout (never the network). Each bad input gives one error and leaves no run dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _speculators as S
import pytest
import torch
from _rl_helpers import save_policy, write_rollouts
from safetensors.torch import load_file, save_file

from draftkit import api, cli
from draftkit.core import config, registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.init.stage import init_run
from draftkit.rl.publish import DraftStore
from draftkit.targets.load import target_dir

REFRESH = ["refresh.budget_steps=6", "refresh.lr=3e-3", "refresh.gate=false",
           "refresh.batch_tokens=1024"]


@pytest.fixture(scope="module")
def tdir():
    return target_dir(registry.resolve("tiny-llama"))


@pytest.fixture(scope="module")
def spec_draft(tmp_path_factory, tdir):
    return S.save_eagle3(tmp_path_factory.mktemp("speculators") / "eagle3", tdir)


def _import(src, tmp: Path, name: str = "imp", target: str = "tiny-llama", **kw) -> Path:
    return init_run(target, None, runs_dir=tmp / "runs", from_draft=str(src), name=name, **kw)


def _copy(src: Path, tmp: Path) -> Path:
    out = tmp / "draft"
    shutil.copytree(src, out)
    return out


def _edit_config(d: Path, **changes) -> None:
    conf = json.loads((d / "config.json").read_text())
    conf.update(changes)
    (d / "config.json").write_text(json.dumps(conf))


def _edit_tensors(d: Path, fn) -> None:
    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"))


def _refused(src, tmp: Path, match: str, **kw) -> str:
    with pytest.raises(DraftkitError, match=match) as e:
        _import(src, tmp, **kw)
    runs = tmp / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a refused import wrote a run dir"
    return str(e.value)


# ----------------------------------------------------------------------------- the round trip


def test_speculators_draft_imports_drifts_refreshes_and_exports(tmp_path, spec_draft, tdir,
                                                                tiny_target, one_thread):
    run = _import(spec_draft, tmp_path)
    store = DraftStore(run)
    assert store.current() == "v0000"
    lin = store.lineage("v0000")
    assert lin["source"] == str(spec_draft) and lin["format"] == "speculators eagle3"
    assert len(lin["sha256"]) == 64 and lin["revision"] is None
    cfg = config.load(run)
    assert (cfg.draft.kind, cfg.draft.aux_layer_ids, cfg.draft.draft_vocab_size) == (
        "eagle3", S.AUX, S.DRAFT_VOCAB)
    theirs = load_file(str(spec_draft / "model.safetensors"))
    v0 = load_file(str(run / "drafts/v0000/model.safetensors"))
    assert set(theirs) - set(v0) == {"embed_tokens.weight"}  # vLLM shares the target's
    assert all(torch.equal(v0[k], theirs[k]) for k in v0)
    # the package reads v0000 back, tensors equal
    back = S.load_with_speculators(run / "drafts/v0000", tdir).state_dict()
    assert all(torch.equal(back[k], v) for k, v in v0.items())

    policy = save_policy(tiny_target, tmp_path / "policy")
    rollouts = write_rollouts(tiny_target, tmp_path / "r" / "r1.jsonl", 16, gen=16)
    drift = api.drift(run, str(policy), [rollouts])
    assert drift["draft"] == "v0000" and drift["estimate"]["T=0"]["starts"] > 0
    res = api.refresh(run, str(policy), [rollouts], REFRESH)
    assert res["status"] == "published" and res["version"] == "v0001"
    assert store.lineage("v0001")["parent"] == "v0000" and store.current() == "v0001"
    out = api.export(run)
    # eval needs no prepare either: the recipe's held-out prompts (torch's reference decoder
    # here; tests/test_from_draft_vllm.py runs the vLLM eval of the docs' flow)
    rep = api.evaluate(run, ["eval.engine=reference", "eval.k_values=[3]", "data.source=local",
                             "eval.temperatures=[0]", "eval.num_prompts=2", "eval.max_new_tokens=8",
                             "eval.reference_prompts=2"])
    [row] = rep["reference"]["rows"]
    assert row["prompts"] == 2 and row["drafts"] > 0
    assert not (run / "data" / "eval").exists()
    ours = load_file(str(out / "model.safetensors"))
    assert ours.keys() == v0.keys() and not torch.equal(ours["fc.weight"], v0["fc.weight"])
    model = S.load_with_speculators(out, tdir)
    assert type(model).__name__ == "Eagle3DraftModel"
    sd = model.state_dict()
    for name, value in ours.items():
        assert torch.equal(sd[name], value), name
    # embed_tokens is not in the export (vLLM shares the target's); speculators 0.9.0's loader
    # then leaves its embedding uninitialised (not NaN, so load_verifier_weights skips it):
    # docs/coming-from-speculators.md says how to fill it before training on in the package


def test_cli_init_from_draft_prints_the_first_day(tmp_path, spec_draft, capsys):
    assert cli.run(["init", "--target", "tiny-llama", "--from-draft", str(spec_draft),
                     "--dir", str(tmp_path / "runs"), "--name", "cli"]) == 0
    text = capsys.readouterr().out
    assert "imported" in text and "speculators eagle3" in text
    assert "draftkit drift" in text and "draftkit refresh" in text and "draftkit prepare" not in text
    assert (tmp_path / "runs/cli/drafts/current").is_symlink()


def test_speculators_peagle_imports_and_loads_back(tmp_path, tdir, tiny_target):
    src = S.save_peagle(tmp_path / "peagle", tdir, mask_token_id=7)
    run = _import(src, tmp_path)
    cfg = config.load(run)
    assert cfg.draft.kind == "peagle"
    conf = json.loads((run / "drafts/v0000/config.json").read_text())
    assert conf["speculators_model_type"] == "peagle" and conf["mask_token_id"] == 7
    v0 = load_file(str(run / "drafts/v0000/model.safetensors"))
    assert v0["mask_hidden"].shape == (1, 1, len(S.AUX) * 128)  # the package's shape
    back = S.load_with_speculators(run / "drafts/v0000", tdir)
    assert type(back).__name__ == "PEagleDraftModel"
    sd = back.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in v0.items())
    # draftkit's P-EAGLE writer (a refresh's publish) loads in the package too
    kind = kinds.get("peagle")
    model = kind.load(run / "drafts/v0000", tiny_target.model, 3)
    out = tmp_path / "written"
    out.mkdir()
    kind.export(model, out, out, cfg)
    sd = S.load_with_speculators(out, tdir).state_dict()
    assert all(torch.equal(sd[k], v) for k, v in load_file(str(out / "model.safetensors")).items())


def test_specforge_head_moves_aux_ids_up_by_one(tmp_path, spec_draft):
    """A SpecForge LlamaForCausalLMEagle3 dir: plain Llama config, aux ids as layer outputs,
    `midlayer.*` weights; the import gives vLLM's ids and names, the same tensors."""
    theirs = load_file(str(spec_draft / "model.safetensors"))
    sf = tmp_path / "specforge"
    sf.mkdir()
    layer = json.loads((spec_draft / "config.json").read_text())["transformer_layer_config"]
    conf = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": S.DRAFT_VOCAB,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in S.AUX]}}
    (sf / "config.json").write_text(json.dumps(conf))
    save_file({k.replace("layers.0.", "midlayer.") : v for k, v in theirs.items()},
              str(sf / "model.safetensors"))
    run = _import(sf, tmp_path)
    assert config.load(run).draft.aux_layer_ids == S.AUX
    lin = DraftStore(run).lineage("v0000")
    assert lin["format"].startswith("SpecForge") and any("-> [1, 3, 5]" in n
                                                         for n in lin["converted"])
    v0 = load_file(str(run / "drafts/v0000/model.safetensors"))
    assert all(torch.equal(v0[k], theirs[k]) for k in v0)
    # no ids in the config: SpecForge's default [1, N//2-1, N-4] = vLLM's [2, N//2, N-3]
    del conf["eagle_config"]
    (sf / "config.json").write_text(json.dumps(conf))
    run = _import(sf, tmp_path, name="default-ids")
    assert config.load(run).draft.aux_layer_ids == [2, 4, 5]


def test_hub_id_resolves_from_the_cache_offline(tmp_path, spec_draft, monkeypatch):
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-eagle3"
    shutil.copytree(spec_draft, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    run = _import("someone/tiny-eagle3", tmp_path)
    lin = DraftStore(run).lineage("v0000")
    assert lin["source"] == "someone/tiny-eagle3" and lin["revision"] == commit
    msg = _refused("someone/not-cached", tmp_path / "other", "not in the Hugging Face cache")
    assert "huggingface-cli download someone/not-cached" in msg


# ----------------------------------------------------------------------------- bad input


def test_refuses_a_dir_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    _refused(tmp_path / "empty", tmp_path, "has no config.json")


def test_refuses_an_unknown_format(tmp_path, spec_draft):
    d = _copy(spec_draft, tmp_path)
    _edit_config(d, speculators_model_type="mtp")
    _refused(d, tmp_path, "speculators 'mtp' draft, a format draftkit does not import")
    _edit_config(d, speculators_model_type=None, architectures=["GPT2LMHeadModel"])
    _refused(d, tmp_path, "names no format draftkit knows")


def test_refuses_a_draft_for_another_target(tmp_path, spec_draft):
    msg = _refused(spec_draft, tmp_path, "does not fit target smollm2-135m", target="smollm2-135m")
    assert "hidden_size: draft 128, target smollm2-135m 576" in msg
    assert "vocab_size: draft 512, target smollm2-135m 49152" in msg
    assert "verifier num_hidden_layers" in msg  # its verifier has other shapes too


def test_refuses_a_draft_built_for_another_tokenizer(tmp_path, spec_draft, tiny_target):
    """Same shapes, another vocabulary: the tokenizer shipped with the draft is compared with
    the target's, token by token."""
    d = _copy(spec_draft, tmp_path)
    tok = tiny_target.tokenizer.__class__.from_pretrained(tiny_target.path)
    vocab = tok.get_vocab()
    a, b = sorted(vocab, key=vocab.get)[10:12]
    tok.save_pretrained(d)
    spec = json.loads((d / "tokenizer.json").read_text())
    model_vocab = spec["model"]["vocab"]
    model_vocab[a], model_vocab[b] = model_vocab[b], model_vocab[a]  # two ids swapped
    (d / "tokenizer.json").write_text(json.dumps(spec))
    _refused(d, tmp_path, "tokenizer: the draft's .* differ in 2 of 512 tokens")


def test_refuses_aux_ids_out_of_range(tmp_path, spec_draft):
    d = _copy(spec_draft, tmp_path)
    _edit_config(d, eagle_aux_hidden_state_layer_ids=[1, 3, 9])
    msg = _refused(d, tmp_path, "eagle_aux_hidden_state_layer_ids: draft")
    assert "within [0, 8]" in msg and "ids [9]" in msg


def test_refuses_a_d2t_outside_the_vocab(tmp_path, spec_draft):
    d = _copy(spec_draft, tmp_path)

    def shift(t):
        t["d2t"][-1] += 1000

    _edit_tensors(d, shift)
    _refused(d, tmp_path, r"d2t maps 1 draft ids outside the target vocab 0..511")


def test_refuses_missing_or_extra_tensors(tmp_path, spec_draft):
    d = _copy(spec_draft, tmp_path)
    _edit_tensors(d, lambda t: t.pop("norm.weight"))
    _refused(d, tmp_path, r"missing=\['norm.weight'\]")
    shutil.rmtree(d)
    d = _copy(spec_draft, tmp_path)
    _edit_tensors(d, lambda t: t.update({"extra.weight": torch.zeros(2)}))
    _refused(d, tmp_path, r"unexpected=\['extra.weight'\]")


def test_refuses_a_trained_embedding(tmp_path, spec_draft):
    d = _copy(spec_draft, tmp_path)
    _edit_config(d, embed_requires_grad=True)
    _refused(d, tmp_path, "trains its own token embedding")


def test_init_needs_data_or_a_draft(tmp_path):
    with pytest.raises(DraftkitError, match="init needs --data RECIPE"):
        cli.run(["init", "--target", "tiny-llama", "--dir", str(tmp_path)])


def test_refuses_another_draft_kind(tmp_path, spec_draft):
    _refused(spec_draft, tmp_path, "--draft dflash: the draft at .* is a eagle3 draft", kind="dflash")


def test_cli_takes_the_kind_from_the_draft_and_refuses_an_explicit_mismatch(tmp_path, tdir):
    """--draft has no default of its own: without it the import takes the draft's kind, a
    --draft naming another kind (eagle3, the kind a run without --from-draft gets) is refused
    with both kinds and the fix, and a plain init still gets the default kind."""
    src = S.save_peagle(tmp_path / "peagle", tdir, mask_token_id=7)
    runs = tmp_path / "runs"
    with pytest.raises(DraftkitError) as e:
        cli.run(["init", "--target", "tiny-llama", "--from-draft", str(src), "--draft", "eagle3",
                 "--dir", str(runs), "--name", "wrong"])
    msg = str(e.value)
    assert "--draft eagle3" in msg and "is a peagle draft" in msg
    assert "drop --draft, or pass --draft peagle" in msg
    assert not (runs / "wrong").exists()
    for name, flags in (("own", []), ("same", ["--draft", "peagle"])):
        assert cli.run(["init", "--target", "tiny-llama", "--from-draft", str(src), *flags,
                        "--dir", str(runs), "--name", name]) == 0
        assert config.load(runs / name).draft.kind == "peagle"
    assert cli.run(["init", "--target", "tiny-llama", "--data", "math", "--dir", str(runs),
                    "--name", "plain"]) == 0
    assert config.load(runs / "plain").draft.kind == config.DEFAULT_KIND == "eagle3"
