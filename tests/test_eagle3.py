"""EAGLE-3 head: TTT == step-by-step inference, masks, counts, target copies, save/load."""

from __future__ import annotations

import json

import pytest
import torch
from _eagle3_helpers import make_batch, make_model, make_spec

from draftkit.core.errors import DraftkitError
from draftkit.drafts import acceptance
from draftkit.drafts.eagle_family.layer import Rotary, apply_rope, ttt_mask
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.eagle_family.target_tensors import read_target_tensors
from draftkit.drafts.eagle_family.vocab import DraftVocab

FLAGS = [(False, False, False, False), (True, False, False, False), (False, True, False, True),
         (True, False, True, True), (False, True, True, False)]


def brute_force(model, fused, ids, length, t, steps):
    """Step-j logits at index t rebuilt the way vLLM drafts: context rows 0..t (token x_{s+1},
    feature fuse(h_s), position s), then one appended row per step (token x_{t+1+i}, the
    previous row's hidden_out, position t+i), one causal pass per step."""
    seq_ids, seq_h, pos = ids[1:t + 2], fused[: t + 1], torch.arange(t + 1)
    out = []
    for j in range(steps):
        if t + 1 + j >= length:
            break
        logits, hidden_out = model.step(seq_ids[None], seq_h[None], pos[None])
        out.append(logits[0, -1])
        if t + 2 + j < length:
            seq_ids = torch.cat([seq_ids, ids[t + 2 + j: t + 3 + j]])
            seq_h = torch.cat([seq_h, hidden_out[0, -1:]])
            pos = torch.cat([pos, torch.tensor([t + 1 + j])])
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join("1" if x else "0" for x in f))
@pytest.mark.parametrize("layers", [1, 2])
def test_ttt_unroll_matches_step_by_step_inference(family, flags, layers):
    spec = make_spec(family, flags, num_layers=layers)
    model = make_model(spec)
    lengths, t_max = [9, 6], 9
    batch = make_batch(spec, lengths, t_max)
    with torch.no_grad():
        steps = model.ttt_unroll(batch["aux"], batch["input_ids"], batch["attention_mask"])
        fused = model.fuse(batch["aux"])
        checked = 0
        for b, length in enumerate(lengths):
            for t in range(length - 1):
                ref = brute_force(model, fused[b], batch["input_ids"][b], length, t, 3)
                for j, logits in enumerate(ref):
                    torch.testing.assert_close(steps[j][b, t], logits, atol=2e-5, rtol=1e-5)
                    checked += 1
    assert checked == sum(sum(min(3, n - 1 - t) for t in range(n - 1)) for n in lengths)


def test_left_padding_gives_the_same_logits():
    spec = make_spec("qwen3", (True, False, False, True))
    model = make_model(spec)
    right = make_batch(spec, [8, 5], 8)
    left = {k: v.clone() for k, v in right.items()}
    for key in ("aux", "input_ids", "attention_mask"):  # row 1: move the 5 tokens to the end
        left[key][1] = torch.roll(right[key][1], shifts=3, dims=0)
    with torch.no_grad():
        a = model.ttt_unroll(right["aux"], right["input_ids"], right["attention_mask"])
        b = model.ttt_unroll(left["aux"], left["input_ids"], left["attention_mask"])
    for j in range(3):
        n = 5 - 1 - j  # indices whose input token x_{t+1+j} exists
        torch.testing.assert_close(a[j][1, :n], b[j][1, 3:3 + n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a[j][0], b[j][0])


def test_ttt_mask_worked_example():
    mask = ttt_mask(torch.ones(1, 5, dtype=torch.bool), 3)[0, 0]  # [5, 15]
    row = mask[2].int().view(3, 5)  # query t=2 at step 2: K0 | K1 | K2
    assert row.tolist() == [[1, 1, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0]]
    padded = ttt_mask(torch.tensor([[0, 1, 1, 1, 0]], dtype=torch.bool), 1)[0, 0]
    assert padded[3].int().tolist() == [0, 1, 1, 1, 0]  # no padding keys
    assert padded[0].int().tolist() == [1, 0, 0, 0, 0]  # padded query keeps its diagonal


def test_forward_counts_only_predicted_assistant_tokens():
    spec = make_spec()
    model = make_model(spec)
    batch = make_batch(spec, [10, 7], 10)
    batch["loss_mask"] = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0, 1, 1],
                                       [0, 0, 1, 1, 1, 1, 1, 0, 0, 0]])
    _, m = model(batch)
    # step j, index t counts iff t+2+j < length and loss_mask[t+2+j] == 1
    for j in range(3):
        expected = sum(int(batch["loss_mask"][b, t + 2 + j])
                       for b, n in enumerate([10, 7]) for t in range(n) if t + 2 + j < n)
        assert m[f"n_{j}"] == expected
    # padded positions do not change anything
    noisy = {k: v.clone() for k, v in batch.items()}
    noisy["aux"][1, 7:] = 100.0
    noisy["last"][1, 7:] = -50.0
    noisy["input_ids"][1, 7:] = 3
    _, m2 = model(noisy)
    assert m2["loss"] == pytest.approx(m["loss"], rel=1e-6)


def test_metrics_aggregate_exactly_over_batches():
    spec = make_spec()
    model = make_model(spec)
    batch = make_batch(spec, [10, 8, 9, 5], 10)
    with torch.no_grad():  # verifier states that agree with the draft's step-0 guesses
        steps = model.ttt_unroll(batch["aux"], batch["input_ids"], batch["attention_mask"])
        guess = model.draft_to_target(steps[0].argmax(-1))  # [B, T]: guess for x_{t+2}
        batch["last"][:, 1:] = model.verifier_lm_head[guess[:, :-1]] * 5  # judged by last[t+1]
        _, whole = model(batch)
        parts = [model({k: v[i:i + 2] for k, v in batch.items()})[1] for i in (0, 2)]
    agg = acceptance.aggregate(parts)
    assert whole["correct_0"] > 0
    for key in ("n_0", "correct_1", "cond_n_2", "cond_correct_2"):
        assert agg[key] == whole[key]
    for key in ("loss", "acc_1", "cond_acc_2", "sim_al"):
        assert agg[key] == pytest.approx(whole[key], rel=1e-6)


def test_training_steps_lower_the_loss():
    spec = make_spec(flags=(False, False, False, True))
    model = make_model(spec).train()
    batch = make_batch(spec, [12, 12], 12)
    opt = torch.optim.Adam(model.trainable_parameters(), lr=3e-3)
    assert all(not p.requires_grad for p in model.embed_tokens.parameters())
    first = None
    for _ in range(30):
        loss, m = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else m["loss"]
    assert m["loss"] < 0.7 * first


def test_target_logits_and_draft_to_target():
    model = make_model(make_spec())
    logits_d = torch.randn(2, 3, model.spec.draft_vocab_size)
    full = model.target_logits(logits_d)  # [2, 3, V]
    selected = torch.nonzero(model.t2d).flatten()
    assert torch.equal(full[..., selected], logits_d)
    assert torch.isneginf(full[..., ~model.t2d]).all()
    assert torch.equal(model.draft_to_target(logits_d.argmax(-1)), full.argmax(-1))


def test_rope_matches_transformers_llama3():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    spec = make_spec(rope_scaling=scaling)
    ours = Rotary(spec)
    hf = LlamaRotaryEmbedding(LlamaConfig(
        hidden_size=32, num_attention_heads=4, head_dim=8, max_position_embeddings=256,
        rope_parameters={**scaling, "rope_theta": 10000.0}))
    pos = torch.arange(200)[None]
    x = torch.randn(1, 4, 200, 8)
    cos, sin = ours(pos, torch.float32)
    hcos, hsin = hf(x, pos)
    torch.testing.assert_close(cos, hcos)
    torch.testing.assert_close(apply_rope(x, cos, sin), hf_apply(x, x, hcos, hsin)[0])
    assert not torch.allclose(ours.inv_freq, Rotary(make_spec()).inv_freq)  # scaling applied


# ------------------------------------------------------------------ tiny-llama target


@pytest.fixture(scope="module")
def tiny_cfg():
    from draftkit.init.stage import resolve

    return resolve("tiny-llama", "math", overrides=["draft.draft_vocab_size=256",
                                                    "draft.aux_layer_ids=[1,3,5]"])


@pytest.fixture(scope="module")
def tiny_vocab():
    return DraftVocab.build(torch.arange(512) % 97, 256, must_include=[2])


def test_from_run_config_copies_the_target(tiny_cfg, tiny_vocab, tiny_target):
    from draftkit.targets.capture import capture, logits_from_last

    model = Eagle3Draft.from_run_config(tiny_cfg, tiny_vocab, target_model=tiny_target.model)
    from_files = Eagle3Draft.from_run_config(tiny_cfg, tiny_vocab)
    base = tiny_target.model.model
    assert torch.equal(model.embed_tokens.weight, base.embed_tokens.weight)
    assert torch.equal(model.lm_head.weight, tiny_target.model.lm_head.weight[tiny_vocab.t2d])
    for a, b in zip(read_target_tensors(tiny_target.path),
                    (base.embed_tokens.weight, base.norm.weight, tiny_target.model.lm_head.weight),
                    strict=True):
        assert torch.equal(a, b)
    assert torch.equal(from_files.verifier_lm_head, model.verifier_lm_head)
    ids = torch.randint(0, 512, (2, 16))
    _, last = capture(tiny_target.model, ids, [1, 3, 5])
    with torch.no_grad():
        ref = logits_from_last(tiny_target.model, last)  # [2, 16, 512]
        got_d, got_ids = model.verifier_targets(last, chunk=7)
    assert torch.equal(got_ids, ref.argmax(-1))
    torch.testing.assert_close(got_d, ref[..., tiny_vocab.t2d])


def test_save_then_load_gives_identical_logits(tmp_path, tiny_cfg, tiny_vocab):
    model = Eagle3Draft.from_run_config(tiny_cfg, tiny_vocab)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = Eagle3Draft.from_pretrained(tmp_path / "ckpt")
    ids, pos = torch.randint(0, 512, (2, 11)), torch.arange(11).expand(2, 11)
    hidden = torch.randn(2, 11, 128)
    with torch.no_grad():
        for a, b in zip(model.step(ids, hidden, pos), loaded.step(ids, hidden, pos), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(model.fuse(torch.randn(1, 3, 384).fill_(0.5)),
                           loaded.fuse(torch.randn(1, 3, 384).fill_(0.5)))
    assert torch.equal(loaded.d2t, tiny_vocab.d2t) and torch.equal(loaded.t2d, tiny_vocab.t2d)
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert "model_type" not in cfg and cfg["speculators_model_type"] == "eagle3"
    assert cfg["transformer_layer_config"]["vocab_size"] == 512
    assert cfg["draft_vocab_size"] == 256 and cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]


def test_full_vocab_checkpoint_has_no_d2t(tmp_path, tiny_target):
    from safetensors import safe_open

    from draftkit.init.stage import resolve

    cfg = resolve("tiny-llama", "math", overrides=["draft.aux_layer_ids=[1,3,5]"])
    model = Eagle3Draft.from_run_config(cfg, DraftVocab.full(512), target_model=tiny_target.model)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not keys & {"d2t", "t2d", "embed_tokens.weight", "verifier_lm_head", "verifier_norm"}
    loaded = Eagle3Draft.from_pretrained(tmp_path, target_model=tiny_target.model)
    assert loaded.spec.draft_vocab_size == 512 and not loaded.d2t.any()


def test_duplicate_or_unsorted_aux_ids_are_refused(tiny_vocab):
    from draftkit.init.stage import resolve

    for ids in ([2, 3, 3], [5, 1, 3]):  # init refuses these too; a hand-edited config may not
        cfg = resolve("tiny-llama", "math", overrides=["draft.draft_vocab_size=256"])
        cfg.draft.aux_layer_ids = ids
        with pytest.raises(DraftkitError, match="distinct and ascending"):
            Eagle3Draft.from_run_config(cfg, tiny_vocab)


def test_two_layer_head_round_trips_and_is_checked(tmp_path, tiny_vocab, tiny_target):
    from draftkit.drafts.eagle_family import format as fmt
    from draftkit.init.stage import resolve

    cfg = resolve("tiny-llama", "math", overrides=["draft.draft_vocab_size=256",
                                                   "draft.aux_layer_ids=[1,3,5]",
                                                   "draft.num_layers=2"])
    model = Eagle3Draft.from_run_config(cfg, tiny_vocab, target_model=tiny_target.model)
    model.save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    loaded = Eagle3Draft.from_pretrained(tmp_path / "ckpt", target_model=tiny_target.model)
    assert loaded.spec == model.spec and len(loaded.layers) == 2
    ids, pos = torch.randint(0, 512, (1, 9)), torch.arange(9)[None]
    hidden = torch.randn(1, 9, 128)
    with torch.no_grad():
        for a, b in zip(model.step(ids, hidden, pos), loaded.step(ids, hidden, pos), strict=True):
            assert torch.equal(a, b)
    tensors = model.export_state_dict()
    assert tensors["layers.1.self_attn.q_proj.weight"].shape == (128, 128)  # H inputs, not 2H
    one_layer = {k: v for k, v in tensors.items() if not k.startswith("layers.1.")}
    with pytest.raises(DraftkitError, match=r"missing=\['layers.1"):
        fmt.check_state_dict(model.spec, one_layer)
