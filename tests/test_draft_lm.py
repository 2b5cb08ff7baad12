"""Draft LMs (drafts/draft_lm): init modes, the tokenizer check, the full-vocab distillation
loss against hand-computed values and a direct HF computation, and training through the real
stages on tiny-llama (offline = online, exact resume)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from _runs import copy_run, one_thread, train_history
from safetensors.torch import load_file

from draftkit import api
from draftkit.core import artifacts
from draftkit.core.config import ConfigError
from draftkit.core.errors import DraftkitError
from draftkit.drafts.lm_family import build, losses
from draftkit.drafts.lm_family.model import DraftLM
from draftkit.init.stage import resolve

# ----------------------------------------------------------------------------- init modes


@pytest.mark.parametrize("target, init, model, layers", [
    ("Qwen3-8B", "sibling", "Qwen3-0.6B", 0),
    ("Qwen3-32B", "sibling", "Qwen3-0.6B", 0),
    ("Llama-3.1-70B-Instruct", "sibling", "Llama-3.2-1B-Instruct", 0),
    ("smollm2-135m", "truncate", "", 6),
    ("tiny-llama", "truncate", "", 2),
])
def test_init_picks_sibling_or_truncation(target, init, model, layers):
    cfg = resolve(target, "math", kind="draft-lm")
    assert (cfg.draft.init, cfg.draft.model, cfg.draft.num_layers) == (init, model, layers)
    # a draft LM needs only the target's last state (id N): harvest captures nothing else
    assert cfg.draft.aux_layer_ids == [cfg.target.num_hidden_layers]


def test_init_says_where_the_draft_lm_starts(tmp_path, capsys):
    from draftkit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["init", "--target", "Qwen3-8B", "--data", "math", "--draft", "draft-lm",
              "--dir", str(tmp_path)])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "draft LM Qwen3-0.6B: needs downloading before train: Qwen/Qwen3-0.6B" in out
    cfg = resolve("tiny-llama", "math", kind="draft-lm")
    assert build.describe_init(cfg) == "draft LM: the target's first 2 layers (copied at train)"


def test_init_modes_refuse_what_cannot_work(tmp_path, tiny_target):
    with pytest.raises(DraftkitError, match="no registered draft LM shares smollm2-135m's"):
        resolve("smollm2-135m", "math", kind="draft-lm", overrides=["draft.init=sibling"])
    with pytest.raises(ConfigError, match="draft.init='prune'; choose one of sibling"):
        resolve("tiny-llama", "math", kind="draft-lm", overrides=["draft.init=prune"])
    with pytest.raises(ConfigError, match="keeps 1..7 of tiny-llama's 8 layers"):
        resolve("tiny-llama", "math", kind="draft-lm", overrides=["draft.num_layers=8"])
    with pytest.raises(ConfigError, match="names a sibling LM but draft.init=truncate"):
        resolve("Qwen3-8B", "math", kind="draft-lm",
                overrides=["draft.init=truncate", "draft.model=Qwen3-0.6B"])
    with pytest.raises(DraftkitError, match="Qwen3-0.6B has vocab 151936 but the target"):
        resolve("Llama-3.1-8B-Instruct", "math", kind="draft-lm", overrides=["draft.model=Qwen3-0.6B"])
    # a local sibling dir is read from its config.json (no download)
    cfg = resolve("tiny-llama", "math", kind="draft-lm", overrides=[f"draft.model={tiny_target.path}"])
    assert cfg.draft.init == "sibling"


def test_truncated_draft_is_exactly_the_targets_first_layers(tiny_target):
    lm = build.truncate(tiny_target.path, 3)
    assert lm.config.num_hidden_layers == 3 and len(lm.model.layers) == 3
    ours, theirs = lm.state_dict(), tiny_target.model.state_dict()
    kept = [k for k in theirs if not k.startswith("model.layers.") or int(k.split(".")[2]) < 3]
    assert set(ours) == set(kept)
    for name in kept:  # layers 0-2, embedding, final norm, lm_head: bit-identical
        assert torch.equal(ours[name], theirs[name]), name
    assert any(k.startswith("model.layers.2.") for k in ours)


def test_scratch_draft_has_the_targets_architecture(tiny_target):
    cfg = resolve("tiny-llama", "math", kind="draft-lm",
                  overrides=["draft.init=scratch", "draft.num_layers=3", "draft.hidden_size=64",
                             "draft.intermediate_size=96"])
    lm = build.build_lm(cfg, tiny_target)
    assert type(lm) is type(tiny_target.model)
    assert (lm.config.num_hidden_layers, lm.config.hidden_size, lm.config.vocab_size) == (3, 64, 512)
    assert not torch.equal(lm.model.embed_tokens.weight[:, :64],
                           tiny_target.model.model.embed_tokens.weight[:, :64])


# ----------------------------------------------------------------------------- tokenizer check


def _edited_tokenizer(tmp_path, tiny_target, edit):
    """The tiny target's tokenizer saved, its tokenizer.json edited by `edit`, reloaded."""
    from transformers import AutoTokenizer

    tiny_target.tokenizer.save_pretrained(tmp_path)
    path = tmp_path / "tokenizer.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return AutoTokenizer.from_pretrained(tmp_path)


def _swap_two_tokens(data):
    """Tokens 300 and 301 trade ids."""
    vocab = data["model"]["vocab"]
    a, b = (next(t for t, i in vocab.items() if i == n) for n in (300, 301))
    vocab[a], vocab[b] = 301, 300


def test_tokenizer_mismatch_names_the_difference(tmp_path, tiny_target):
    tok = tiny_target.tokenizer
    build.check_tokenizers(tok, tok, 512, 512)  # same tokenizer: fine
    with pytest.raises(DraftkitError, match="has vocab size 640 .embedding rows. but the target has 512"):
        build.check_tokenizers(tok, tok, 512, 640)
    swapped = _edited_tokenizer(tmp_path / "swap", tiny_target, _swap_two_tokens)
    token = tok.convert_ids_to_tokens(300)
    want = f"token {re.escape(repr(token))} maps to id 300 in the target but to 301 in the draft"
    with pytest.raises(DraftkitError, match=want):
        build.check_tokenizers(tok, swapped, 512, 512)
    other_eos = _edited_tokenizer(tmp_path / "eos", tiny_target, lambda d: None)
    other_eos.eos_token = "<|im_start|>"
    with pytest.raises(DraftkitError, match="special tokens differ: eos_token_id is 1 in the draft"):
        build.check_tokenizers(tok, other_eos, 512, 512)


def test_sibling_with_another_tokenizer_is_refused_at_build(tmp_path, tiny_target):
    sib = tmp_path / "sib"
    build.truncate(tiny_target.path, 2).save_pretrained(sib)
    _edited_tokenizer(sib, tiny_target, _swap_two_tokens)
    cfg = resolve("tiny-llama", "math", kind="draft-lm", overrides=[f"draft.model={sib}"])
    with pytest.raises(DraftkitError, match=r"maps to id \d+ in the target but to \d+ in draft LM"):
        build.build_lm(cfg, tiny_target)


# ----------------------------------------------------------------------------- loss


def test_distillation_loss_hand_computed():
    # target p = softmax([0, ln 2, 0]) = [1/4, 1/2, 1/4]; draft q = softmax([0, 0, 0]) = 1/3 each
    target = torch.tensor([[0.0, math.log(2.0), 0.0]])
    draft = torch.zeros(1, 3, requires_grad=True)
    kl = 0.25 * math.log(0.75) + 0.5 * math.log(1.5) + 0.25 * math.log(0.75)  # = ln(9/8) / 2
    assert kl == pytest.approx(0.5 * math.log(9 / 8))
    assert losses.kl_full_vocab(draft, target).item() == pytest.approx(kl, abs=1e-6)
    loss, kl_sum, ce_sum, correct = losses.distill_terms(draft, target, torch.tensor([2]), 0.25)
    assert ce_sum.item() == pytest.approx(math.log(3.0), abs=1e-6)  # -log q_2
    assert loss.item() == pytest.approx(0.75 * kl + 0.25 * math.log(3.0), abs=1e-6)
    assert kl_sum.item() == pytest.approx(kl, abs=1e-6)
    assert not correct.item()  # draft argmax 0 (ties: first), target argmax 1
    loss.backward()  # d/dz KL = q - p; d/dz CE = q - onehot(2)
    q, p, onehot = torch.full((3,), 1 / 3), torch.tensor([0.25, 0.5, 0.25]), torch.tensor([0, 0, 1.0])
    torch.testing.assert_close(draft.grad[0], 0.75 * (q - p) + 0.25 * (q - onehot))


def test_chain_metrics_hand_computed():
    # one row, positions 0..5 valid; correct at 0, 1, 3, 4 -> chains of k=3 drafts from t:
    # t=0: c c x  t=1: c x -  t=2: x - -  t=3: c c (5 wrong)  t=4: c x  t=5: x
    correct = torch.tensor([[1, 1, 0, 1, 1, 0]], dtype=torch.bool)
    valid = torch.ones_like(correct)
    m = losses.metrics(correct, valid, 3, kl_sum=3.0, ce_sum=0.0)
    assert m["cond_acc_0"] == pytest.approx(4 / 6)
    assert (m["cond_n_1"], m["cond_correct_1"]) == (4, 2)  # t=0,1,3,4 -> t+1 in {1, 4} correct
    assert (m["cond_n_2"], m["cond_correct_2"]) == (2, 0)  # t=0 (->2), t=3 (->5)
    assert m["sim_al"] == pytest.approx(1 + 4 / 6 + 4 / 6 * 2 / 4)
    assert m["loss"] == pytest.approx(3.0 / 6)


def test_forward_equals_a_direct_full_vocab_computation(tiny_target):
    torch.manual_seed(0)
    lm = build.truncate(tiny_target.path, 2)
    cfg = resolve("tiny-llama", "math", kind="draft-lm", overrides=["train.ce_weight=0.3"])
    model = DraftLM.for_target(lm, tiny_target.model, cfg)
    model.chunk = 5  # several checkpointed chunks
    from draftkit.targets.capture import capture

    ids = torch.randint(0, 512, (2, 12))
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0
    loss_mask = attn.clone()
    loss_mask[:, :4] = 0
    _, last = capture(tiny_target.model, ids, [8], attention_mask=attn)
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask, "last": last}
    loss, metrics = model(batch)  # fused lm_head + loss + gradient (losses.linear_distill)
    loss.backward()
    fused = {n: p.grad.clone() for n, p in lm.named_parameters()}
    lm.zero_grad()
    # direct: HF logits, positions p with x_{p+1} learned: row 0 p=3..10, row 1 p=3..7
    with torch.no_grad():
        tl = tiny_target.model(input_ids=ids, attention_mask=attn).logits  # [2, 12, V]
    dl = lm(input_ids=ids, attention_mask=attn).logits  # [2, 12, V]
    pos = [(0, p) for p in range(3, 11)] + [(1, p) for p in range(3, 8)]
    d = torch.stack([dl[b, p] for b, p in pos])
    t = torch.stack([tl[b, p] for b, p in pos])
    labels = torch.tensor([int(ids[b, p + 1]) for b, p in pos])
    _, kl_sum, ce_sum, _ = losses.distill_terms(d, t, labels, 0.3)
    direct = (0.7 * losses.kl_full_vocab(d, t).mean()
              + 0.3 * torch.nn.functional.cross_entropy(d, labels))
    direct.backward()
    assert loss.item() == pytest.approx(direct.item(), rel=1e-5)
    assert metrics["n_0"] == len(pos)
    assert metrics["loss"] == pytest.approx(kl_sum.item() / len(pos), rel=1e-5)
    assert metrics["ce"] == pytest.approx(ce_sum.item() / len(pos), rel=1e-5)
    for name, p in lm.named_parameters():  # the gradient computed in the forward is exact
        torch.testing.assert_close(fused[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert model.target_lm_head.grad is None  # the target's parts stay frozen


def test_the_target_as_its_own_draft_has_zero_kl_and_full_acceptance(tiny_target):
    import copy

    cfg = resolve("tiny-llama", "math", kind="draft-lm")
    model = DraftLM.for_target(copy.deepcopy(tiny_target.model).float(), tiny_target.model, cfg)
    ids = torch.randint(0, 512, (1, 16))
    attn, loss_mask = torch.ones_like(ids), torch.ones_like(ids)
    from draftkit.targets.capture import capture

    _, last = capture(tiny_target.model, ids, [8])
    with torch.no_grad():
        loss, m = model({"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask,
                         "last": last})
    assert loss.item() == pytest.approx(0.0, abs=1e-5)
    assert m["acc_0"] == 1.0 and m["sim_al"] == pytest.approx(1 + cfg.draft.num_speculative_tokens)


# ----------------------------------------------------------------------------- the stages


OVERRIDES = [
    "data.source=local", "data.max_samples=24", "data.eval_samples=4",
    "data.regen_engine=hf", "data.regen_max_new_tokens=24", "data.regen_temperature=0.0",
    "harvest.dtype=float32", "train.max_steps=6", "train.eval_every=3", "train.save_every=2",
    "train.batch_tokens=512", "tracking.backend=none", "train.ce_weight=0.1",
]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    with one_thread():
        root = tmp_path_factory.mktemp("dlm")
        run = api.init("tiny-llama", "math", kind="draft-lm", name="dlm", runs_dir=root,
                       overrides=OVERRIDES)
        api.prepare(run)
        api.harvest(run)
        yield run


def test_offline_and_online_distillation_agree(lm_run):
    out = api.train(lm_run)
    offline = train_history(out)
    best = json.loads((out / "best" / "meta.json").read_text())
    assert "sim_al" in best["eval"] and (out / "best" / "config.json").is_file()
    online_run = copy_run(lm_run, "dlm-online", subs=("data",))
    online = train_history(api.train(online_run, overrides=["train.mode=online"]))
    assert len(online) == len(offline) == 6
    torch.testing.assert_close(torch.tensor([h["loss"] for h in online]),
                               torch.tensor([h["loss"] for h in offline]), rtol=1e-5, atol=1e-6)
    assert offline[-1]["loss"] < offline[0]["loss"]


def test_resume_gives_the_weights_of_an_uninterrupted_run(lm_run):
    full = artifacts.RunPaths(lm_run).train
    if not (full / "meta.json").is_file():
        api.train(lm_run)
    other = copy_run(lm_run, "dlm-resume")
    api.train(other, stop_after=3)  # "crash" after step 3; the last checkpoint is step 2
    assert not (artifacts.RunPaths(other).train / "meta.json").exists()
    resumed = api.train(other)
    a = load_file(str(full / "checkpoints" / "step-0000006" / "trainable.safetensors"))
    b = load_file(str(resumed / "checkpoints" / "step-0000006" / "trainable.safetensors"))
    assert set(a) == set(b) and any("layers.1." in k for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [h["loss"] for h in train_history(full)] == [h["loss"] for h in train_history(resumed)]


def test_warm_start_from_a_trained_draft_lm(lm_run):
    src = artifacts.RunPaths(lm_run).train / "best"
    if not src.is_dir():
        api.train(lm_run)
    other = copy_run(lm_run, "dlm-warm")
    from draftkit.core import config
    from draftkit.targets.load import load_target

    cfg = config.load(other, [f"train.init_from={lm_run}"])
    lm = build.build_lm(cfg, load_target("tiny-llama", device="cpu", dtype="float32"))
    trained = load_file(str(src / "model.safetensors"))
    for name, value in lm.state_dict().items():
        assert torch.equal(value, trained[name]), name


def test_export_then_reference_eval(lm_run, tmp_path):
    if not (artifacts.RunPaths(lm_run).train / "best").is_dir():
        api.train(lm_run)
    out = api.export(lm_run, ["export.check=false"])
    assert json.loads((out / "speculative_config.json").read_text())["method"] == "draft_model"
    rep = api.evaluate(lm_run, ["eval.engine=reference", "eval.k_values=[2]",
                                "eval.temperatures=[0,1]", "eval.max_new_tokens=12",
                                "eval.reference_prompts=2", f"eval.results_dir={tmp_path}"])
    rows = rep["reference"]["rows"]
    assert [(r["method"], r["k"], r["temperature"]) for r in rows] == [
        ("reference-draft-lm", 2, 0.0), ("reference-draft-lm", 2, 1.0)]
    for r in rows:
        assert r["drafts"] > 0 and r["acceptance_length"] >= 1.0
        assert r["acceptance_length"] == pytest.approx(1 + sum(r["per_position"]))
