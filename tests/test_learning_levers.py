"""Training levers of #15: the decoder layer(s) copied from target layers (draft.init_layer_from,
draft.num_layers),
loss on every harvested position (train.loss_on=all), a CPU-second budget
(train.max_cpu_seconds), noise on the target features (train.feature_noise) and the head's norm
from the target (draft.init_norm_from_target)."""

from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
from _eagle3_helpers import H, make_batch, make_model, make_spec

from draftkit.core.config import TrackingConfig, TrainConfig
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import init_layer
from draftkit.drafts.eagle_family.model import Eagle3Draft, add_feature_noise
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.train.data import BatchBuilder, TokenSource
from draftkit.train.loop import fit

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from toy_fit import Toy, make_eval, toy_batches  # noqa: E402


def _tiny_cfg(*overrides: str):
    from draftkit.init.stage import resolve

    return resolve("tiny-llama", "math", overrides=["draft.draft_vocab_size=256",
                                                    "draft.aux_layer_ids=[1,3,5]", *overrides])


@pytest.fixture(scope="module")
def vocab():
    return DraftVocab.build(torch.arange(512) % 97, 256, must_include=[2])


@pytest.mark.parametrize("index,layer", [(-3, 5), (3, 3), (4, 4)])
def test_layer_copied_from_the_target(index, layer, vocab, tiny_target):
    torch.manual_seed(0)
    base = Eagle3Draft.from_run_config(_tiny_cfg(), vocab, target_model=tiny_target.model)
    torch.manual_seed(0)
    cfg = _tiny_cfg(f"draft.init_layer_from={index}")
    model = Eagle3Draft.from_run_config(cfg, vocab, target_model=tiny_target.model)
    torch.manual_seed(0)
    from_files = Eagle3Draft.from_run_config(cfg, vocab)  # read from the target's safetensors
    t = tiny_target.model.model.layers[layer]
    d, h = model.layers[0], cfg.target.hidden_size
    for name in ("q_proj", "k_proj", "v_proj"):
        w = getattr(d.self_attn, name).weight  # [out, 2H]
        assert torch.equal(w[:, h:], getattr(t.self_attn, name).weight)  # hidden half: copied
        assert torch.equal(w[:, :h], getattr(base.layers[0].self_attn, name).weight[:, :h])
    assert torch.equal(d.self_attn.o_proj.weight, t.self_attn.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert torch.equal(getattr(d.mlp, name).weight, getattr(t.mlp, name).weight)
    assert torch.equal(d.hidden_norm.weight, t.input_layernorm.weight)
    assert torch.equal(d.post_attention_layernorm.weight, t.post_attention_layernorm.weight)
    assert torch.equal(d.input_layernorm.weight, torch.ones(h))
    fc = model.fc.weight  # [H, 3H]
    if layer in (1, 3, 5):  # the state entering the layer is an aux state: fc passes it through
        i = [1, 3, 5].index(layer)
        expect = torch.zeros_like(fc)
        expect[:, i * h:(i + 1) * h] = torch.eye(h)
        assert torch.equal(fc, expect)
    else:
        assert torch.equal(fc, base.fc.weight)
    for a, b in zip(model.state_dict().values(), from_files.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_norm_from_target_matches_the_copied_lm_head_rows(vocab, tiny_target):
    """draft.init_norm_from_target: the head's final norm is the target's, so at init the
    head's norm + lm_head compute the target's own logits (restricted to the draft vocab) from
    a final hidden state; without it the norm starts at ones."""
    target = copy.deepcopy(tiny_target.model)  # the tiny target's norm is ones: perturb it
    base = target.model
    with torch.no_grad():
        base.norm.weight.normal_(1.8, 0.3)  # like SmolLM2-135M's final norm
    plain = Eagle3Draft.from_run_config(_tiny_cfg(), vocab, target_model=target)
    model = Eagle3Draft.from_run_config(_tiny_cfg("draft.init_norm_from_target=true"), vocab,
                                        target_model=target)
    assert torch.equal(model.norm.weight, base.norm.weight)
    assert torch.equal(plain.norm.weight, torch.ones_like(plain.norm.weight))
    h = torch.randn(2, 5, base.norm.weight.shape[0])
    logits, _ = model._head(h)
    with torch.no_grad():
        want = target.lm_head(base.norm(h))[..., vocab.t2d]
    torch.testing.assert_close(logits, want)


def test_stacked_layers_start_as_the_target_layers(vocab, tiny_target):
    """draft.num_layers=2 from layer 3: layer 0 as above from target layer 3, layer 1 is target
    layer 4 whole, and runs as it: on the state entering target layer 4, it returns the state
    entering layer 5 (transformers' own forward is the reference)."""
    from draftkit.drafts.eagle_family.layer import causal_mask

    cfg = _tiny_cfg("draft.init_layer_from=3", "draft.num_layers=2")
    model = Eagle3Draft.from_run_config(cfg, vocab, target_model=tiny_target.model)
    t = tiny_target.model.model.layers
    assert torch.equal(model.layers[0].self_attn.q_proj.weight[:, cfg.target.hidden_size:],
                       t[3].self_attn.q_proj.weight)
    ours, theirs = model.layers[1].state_dict(), t[4].state_dict()
    assert set(ours) - set(theirs) == {"hidden_norm.weight"}  # vLLM's, unused after layer 0
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    ids = torch.randint(0, 512, (2, 12))
    with torch.no_grad():
        states = tiny_target.model(ids, output_hidden_states=True).hidden_states
        x, pos = states[4], torch.arange(12).expand(2, 12)
        cos, sin = model.rotary(pos, x.dtype)
        q, k, v, residual = model.layers[1].begin(None, x, cos, sin)
        out = model.layers[1].end(model.layers[1].self_attn.attend(q, k, v, causal_mask(12, x.device)),
                                  residual)
    torch.testing.assert_close(out, states[5], atol=1e-5, rtol=1e-5)
    with pytest.raises(DraftkitError, match="past the target's last layer"):
        Eagle3Draft.from_run_config(_tiny_cfg("draft.init_layer_from=-1", "draft.num_layers=2"),
                                    vocab, target_model=tiny_target.model)
    with pytest.raises(DraftkitError, match="num_layers=-1"):
        Eagle3Draft.from_run_config(_tiny_cfg("draft.num_layers=-1"), vocab,
                                    target_model=tiny_target.model)


def test_qwen3_norms_copied_and_bad_layers_refused():
    spec = make_spec(family="qwen3")
    model = make_model(spec)
    g = torch.Generator().manual_seed(3)
    hd, nh, nkv, inter = spec.head_dim, spec.num_attention_heads, spec.num_key_value_heads, 48
    shapes = {"self_attn.q_proj.weight": (nh * hd, H), "self_attn.k_proj.weight": (nkv * hd, H),
              "self_attn.v_proj.weight": (nkv * hd, H), "self_attn.o_proj.weight": (H, nh * hd),
              "mlp.gate_proj.weight": (inter, H), "mlp.up_proj.weight": (inter, H),
              "mlp.down_proj.weight": (H, inter), "input_layernorm.weight": (H,),
              "post_attention_layernorm.weight": (H,), "self_attn.q_norm.weight": (hd,),
              "self_attn.k_norm.weight": (hd,)}
    tensors = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    init_layer.init_from_target_layer(model, tensors, 0)  # layer 0: not an aux state
    attn = model.layers[0].self_attn
    assert torch.equal(attn.q_norm.weight, tensors["self_attn.q_norm.weight"])
    assert torch.equal(attn.k_norm.weight, tensors["self_attn.k_norm.weight"])
    with pytest.raises(DraftkitError, match="shapes"):
        init_layer.init_from_target_layer(
            model, {**tensors, "mlp.up_proj.weight": torch.zeros(49, H)}, 0)
    assert init_layer.resolve_layer(-1, 30) == 29
    with pytest.raises(DraftkitError, match="init_layer_from=30"):
        init_layer.resolve_layer(30, 30)


def test_loss_on_all_counts_every_position_with_a_known_target():
    spec = make_spec()
    model = make_model(spec)
    lengths = [10, 7, 3]
    seqs = []
    for n, row in zip(lengths, make_batch(spec, lengths, 10)["input_ids"], strict=True):
        seqs.append({"input_ids": row[:n], "loss_mask": (torch.arange(n) >= n - 2).long(),
                     "aux": torch.randn(n, spec.num_aux * H), "last": torch.randn(n, H)})
    assistant = BatchBuilder(TokenSource(seqs), torch.float32)(list(range(3)))
    every = BatchBuilder(TokenSource(seqs), torch.float32, loss_on="all")(list(range(3)))
    assert torch.equal(every["loss_mask"], every["attention_mask"])
    assert torch.equal(assistant["loss_mask"][0], torch.tensor([0] * 8 + [1, 1]))
    _, m = model(every)
    _, m_assistant = model(assistant)
    for j in range(3):  # index t predicts x_{t+2+j}: every t with t+2+j < length counts
        assert m[f"n_{j}"] == sum(max(0, n - 2 - j) for n in lengths)
        assert m_assistant[f"n_{j}"] == sum(min(2, max(0, n - 2 - j)) for n in lengths)
    with pytest.raises(DraftkitError, match="train.loss_on"):
        BatchBuilder(TokenSource(seqs), torch.float32, loss_on="prompt")


def test_cpu_budget_stops_training_with_a_final_eval(tmp_path):
    cfg = TrainConfig(max_steps=100000, lr=0.05, eval_every=1000, save_every=1000, device="cpu",
                      max_cpu_seconds=0.3)
    res = fit(Toy(), toy_batches, make_eval(), cfg, tmp_path, TrackingConfig(backend="none"))
    hist = res.history
    assert 1 < res.state.step < 100000
    assert hist[-1]["cpu_s"] >= 0.3 > hist[-2]["cpu_s"]
    assert all(a["cpu_s"] < b["cpu_s"] for a, b in itertools.pairwise(hist))
    assert "eval/sim_al" in hist[-1]  # the stop step is evaluated and checkpointed
    assert (tmp_path / "checkpoints" / f"step-{res.state.step:07d}").is_dir()
    assert json.loads((tmp_path / "history.json").read_text()) == json.loads(json.dumps(hist))
    again = fit(Toy(), toy_batches, make_eval(), cfg, tmp_path, TrackingConfig(backend="none"))
    assert again.state.step == res.state.step  # the budget is spent: a resume does not train


def test_feature_noise_is_relative_per_aux_layer_and_training_only():
    torch.manual_seed(0)
    aux = torch.randn(4, 64, 3 * 256) * torch.tensor([1.0, 10.0, 300.0]).repeat_interleave(256)
    noisy = add_feature_noise(aux, 0.1, 3)
    rel = ((noisy - aux).unflatten(-1, (3, -1)).std(dim=(0, 1, 3))
           / aux.unflatten(-1, (3, -1)).pow(2).mean(dim=(0, 1, 3)).sqrt())
    assert torch.allclose(rel, torch.full((3,), 0.1), rtol=0.05)  # each layer at its own scale

    spec = make_spec()
    model = make_model(spec)
    batch = make_batch(spec, [12, 9], 12)
    loss_plain, _ = model(batch)
    model.feature_noise = 0.2
    loss_eval, _ = model(batch)  # eval mode: no noise, bit for bit
    assert torch.equal(loss_eval, loss_plain)
    model.train()
    torch.manual_seed(1)
    loss_a, _ = model(batch)
    torch.manual_seed(1)
    loss_b, _ = model(batch)  # the global RNG decides it: a resumed run replays it
    assert torch.equal(loss_a, loss_b) and not torch.equal(loss_a, loss_plain)
    model.feature_noise = 0.0
    assert torch.equal(model(batch)[0], model.eval()(batch)[0])  # 0 = off in training too
