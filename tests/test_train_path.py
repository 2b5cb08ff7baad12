"""The training path near the hardware against the one it replaced: the EAGLE family's fused,
row-compacted loss (no [B, T, Vd] tensor) gives the old loss, gradients and counts, for every
kind of the family and every loss option. The old code is kept here as the reference."""

from __future__ import annotations

import pytest
import torch
from _eagle3_helpers import make_batch, make_model, make_spec
from test_dflash import make_batch as dflash_batch
from test_dflash import make_draft
from test_peagle import make_head

from draftkit.drafts import acceptance, divergence
from draftkit.drafts.divergence import Divergence
from draftkit.drafts.eagle_family import losses

OPTIONS = [Divergence("kl"), Divergence("tv"), Divergence("mix", 0.3)]


# ----------------------------------------------------------------------------- the old path


def old_step_terms(draft_logits, target_logits, target_ids, draft_to_target, valid, chain_ok,
                   div):
    """The old losses.step_terms: autograd over [B, T, Vd] logits."""
    kl_sum = divergence.rows(draft_logits[valid], target_logits[valid], div).sum()
    pred = draft_to_target[draft_logits.detach().argmax(-1)]  # [B, T]
    correct = (pred == target_ids) & valid
    cond = valid & chain_ok
    counts = {"n": valid.sum(), "correct": correct.sum(), "cond_n": cond.sum(),
              "cond_correct": (cond & correct).sum(), "kl_sum": kl_sum.detach()}
    return kl_sum, counts, correct


def old_forward(model, batch):
    """The old FamilyDraft.forward: verifier logits as [B, T, Vd] fp32, shifted per step, the
    step's logits scattered into [B, T, Vd]."""
    valid = batch["attention_mask"].bool()
    learn = valid & batch["loss_mask"].bool()
    need = valid & acceptance.shift(learn, 1)
    tgt_logits, tgt_ids = model.verifier_targets(batch["last"], where=need,
                                                 full_vocab=not model.training)
    states = model.train_states(batch, valid)
    to_target = model.draft_to_target(torch.arange(model.spec.draft_vocab_size))
    sums, counts, chain_ok = [], [], torch.ones_like(valid)
    for j, post in enumerate(states):
        step_valid = valid & acceptance.shift(learn, 2 + j)
        picked = model.lm_head(post[step_valid])
        logits = picked.new_zeros(*step_valid.shape, model.spec.draft_vocab_size)
        logits = logits.index_put((step_valid,), picked)
        s, c, correct = old_step_terms(logits, acceptance.shift(tgt_logits, 1 + j),
                                       acceptance.shift(tgt_ids, 1 + j), to_target, step_valid,
                                       chain_ok, model.divergence)
        chain_ok = chain_ok & correct
        sums.append(s)
        counts.append(c)
    return losses.combine(sums, counts, model.ttt_decay)


# ----------------------------------------------------------------------------- equivalence


def _eagle3():
    spec = make_spec("qwen3", (True, False, False, True), num_layers=2)
    return make_model(spec), make_batch(spec, [9, 6, 11], 12)


def _peagle():
    return make_head(), make_batch(make_spec(), [9, 6, 11], 12)


def _dflash():
    return make_draft(), dflash_batch([9, 6, 11], 12)


def _grads(model, fn, batch):
    model.zero_grad(set_to_none=True)
    loss, metrics = fn(model, batch)
    loss.backward()
    return loss.detach(), metrics, {n: p.grad.clone() for n, p in model.named_parameters()
                                    if p.grad is not None}


@pytest.mark.parametrize("div", OPTIONS, ids=lambda d: d.name)
@pytest.mark.parametrize("make", [_eagle3, _peagle, _dflash], ids=["eagle3", "peagle", "dflash"])
def test_fused_loss_equals_the_old_path(make, div, one_thread):
    """Tolerance: loss within 1e-5 relative, gradients within 1e-4 relative / 1e-6 absolute
    (fp32: the written-out gradient and chunked sums round differently from autograd's);
    counts exactly, in training mode (draft-vocab argmax) and eval mode (full-vocab argmax)."""
    model, batch = make()
    model.divergence = div
    model.train()
    new_loss, new_m, new_g = _grads(model, type(model).__call__, batch)
    old_loss, old_m, old_g = _grads(model, old_forward, batch)
    assert new_loss.item() == pytest.approx(old_loss.item(), rel=1e-5)
    assert new_g.keys() == old_g.keys() and new_g
    for name in old_g:
        torch.testing.assert_close(new_g[name], old_g[name], rtol=1e-4, atol=1e-6, msg=name)
    counts = [k for k in old_m if k.split("_")[0] in ("n", "correct", "cond")]
    assert {k: new_m[k] for k in counts} == {k: old_m[k] for k in counts}
    assert new_m["loss"] == pytest.approx(old_m["loss"], rel=1e-5)
    model.eval()
    with torch.no_grad():
        (_, new_e), (_, old_e) = model(batch), old_forward(model, batch)
    assert {k: new_e[k] for k in counts} == {k: old_e[k] for k in counts}
    assert new_e["sim_al"] == old_e["sim_al"]


def test_small_chunks_give_the_same_loss_and_gradient():
    """The fused loss over chunks of 3 rows (padded to 4) equals one chunk."""
    torch.manual_seed(0)
    rows = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(12, 8, requires_grad=True)
    tgt, at = torch.randn(7, 12), torch.randint(0, 7, (10,))
    valid = torch.zeros(2, 6, dtype=torch.bool)
    valid.view(-1)[:10] = True
    args = (tgt, torch.randint(0, 12, (7,)), at, torch.arange(12), valid, torch.ones_like(valid),
            Divergence("mix", 0.5))
    out = []
    for chunk, multiple in ((0, 1), (3, 4)):
        rows.grad = weight.grad = None
        s, c, correct = losses.step_terms(rows, weight, *args, chunk=chunk, row_multiple=multiple)
        s.backward()
        out.append((s.detach(), rows.grad.clone(), weight.grad.clone(), correct))
    (s0, h0, w0, c0), (s1, h1, w1, c1) = out
    assert s1.item() == pytest.approx(s0.item(), rel=1e-6) and torch.equal(c0, c1)
    torch.testing.assert_close(h1, h0)
    torch.testing.assert_close(w1, w0)


def test_no_batch_by_vocab_tensor_is_built(one_thread):
    """Forward + backward of a training step create no [B, T, Vd] tensor (the old path built
    several per TTT step); the largest [*, Vd] tensor has at most the positions that count."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes = []

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    shapes.append(tuple(t.shape))
            return out

    model, batch = _eagle3()
    model.train()
    b, t = batch["input_ids"].shape
    vd = model.spec.draft_vocab_size
    with Shapes():
        loss, _ = model(batch)
        loss.backward()
    assert shapes and not [s for s in shapes if s[:2] == (b, t) and s[-1] == vd]
    counted = int((batch["attention_mask"].bool() & batch["loss_mask"].bool()).sum())
    assert max(s[0] for s in shapes if len(s) == 2 and s[1] == vd) <= counted + 64
    with Shapes():
        old_forward(model, batch)  # the check sees what the old path built
    assert [s for s in shapes if s[:2] == (b, t) and s[-1] == vd]


# ----------------------------------------------------------------------------- attention


def _ttt_inputs(device="cpu", seed=0):
    spec = make_spec("qwen3", (False, False, False, False))
    g = torch.Generator().manual_seed(seed)
    b, t, steps = 2, 11, 3
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 7:] = False
    q = torch.randn(b, spec.num_attention_heads, t, spec.head_dim, generator=g)
    k = torch.randn(b, spec.num_key_value_heads, steps * t, spec.head_dim, generator=g)
    v = torch.randn(b, spec.num_key_value_heads, steps * t, spec.head_dim, generator=g)
    return spec, *(x.to(device) for x in (valid, q, k, v)), t, steps


def test_flex_attention_sees_the_keys_the_dense_ttt_mask_gives():
    """The BlockMask rule (no dense [B, 1, T, 3T] mask) against SDPA under ttt_mask, every
    step, padded rows included (forward: flex attention has no CPU backward)."""
    from draftkit.drafts.eagle_family.layer import Attention, TTTAttention

    spec, valid, q, k, v, t, steps = _ttt_inputs()
    attn = Attention(spec, spec.hidden_size)
    dense, flex = TTTAttention(valid, steps, flex=False), TTTAttention(valid, steps, flex=True)
    assert dense.dense is not None and flex.dense is None
    with torch.no_grad():
        for j in range(steps):
            ks, vs = k[:, :, : (j + 1) * t], v[:, :, : (j + 1) * t]
            torch.testing.assert_close(flex(attn, q, ks, vs, j), dense(attn, q, ks, vs, j),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("make", [_eagle3, _peagle], ids=["eagle3", "peagle"])
def test_the_head_gives_the_same_states_with_flex_attention(make, monkeypatch):
    import functools

    from draftkit.drafts.eagle_family import layer
    from draftkit.drafts.eagle_family import model as family_model

    model, batch = make()
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = model.ttt_states(batch["aux"], batch["input_ids"], valid)
        monkeypatch.setattr(family_model, "TTTAttention",
                            functools.partial(layer.TTTAttention, flex=True))
        if make is _peagle:
            from draftkit.drafts.peagle import model as peagle_model

            monkeypatch.setattr(peagle_model, "TTTAttention",
                                functools.partial(layer.TTTAttention, flex=True))
        got = model.ttt_states(batch["aux"], batch["input_ids"], valid)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a[valid], b[valid], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_flex_attention_gives_the_dense_loss_and_gradients(monkeypatch):
    import functools

    from draftkit.drafts.eagle_family import layer
    from draftkit.drafts.eagle_family import model as family_model

    model, batch = _eagle3()
    model, batch = model.cuda().train(), {k: v.cuda() for k, v in batch.items()}
    new_loss, _, new_g = _grads(model, type(model).__call__, batch)  # flex on CUDA
    monkeypatch.setattr(family_model, "TTTAttention",
                        functools.partial(layer.TTTAttention, flex=False))
    old_loss, _, old_g = _grads(model, type(model).__call__, batch)
    assert new_loss.item() == pytest.approx(old_loss.item(), rel=1e-4)
    for name in old_g:
        torch.testing.assert_close(new_g[name], old_g[name], rtol=1e-3, atol=1e-5, msg=name)


# ------------------------------------------------------------ a refresh from a trainer's taps


def _trainer_taps(policy, prompts, completions, layer_ids):
    """LossTaps around a loss forward over a TRL-layout batch (prompts left-padded,
    completions right-padded), as TRL's GRPO compute_loss gives it."""
    from draftkit.rl.taps import LossTaps

    p_len, c_len = max(map(len, prompts)), max(map(len, completions))
    ids = torch.zeros(len(prompts), p_len + c_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[b, p_len - len(p): p_len + len(c)] = torch.tensor(p + c)
        mask[b, p_len - len(p): p_len + len(c)] = 1
    inputs = {"prompt_ids": ids[:, :p_len], "prompt_mask": mask[:, :p_len],
              "completion_ids": ids[:, p_len:], "completion_mask": mask[:, p_len:]}
    taps = LossTaps(policy, layer_ids)

    def loss_fn(model, batch):
        return model(input_ids=ids, attention_mask=mask).logits.float().mean()

    with torch.no_grad():
        taps.wrap(loss_fn)(policy, inputs)
    return taps.taps


def test_a_refresh_from_trainer_taps_trains_the_draft_as_the_old_path(tmp_path, tiny_target,
                                                                      one_thread):
    """The refresh fine-tune (rl/finetune.py) on batches read from a trainer's taps
    (rl/taps.py, rl/capture.TappedKind: TRL's layout, rows of different prompt and completion
    lengths) moves the draft as the old training path does: the same first and last loss and
    the same weights after the steps, to fp32 rounding (a mismatch 1000x below each weight's
    movement), and the frozen target parts untouched: the path of test_trl_vllm.py's refresh,
    whose failed swap probe was first laid on this path (its cause: confident_policy there)."""
    from _rl_helpers import AUX, make_run
    from _rl_helpers import prompts as chat

    from draftkit.drafts import kind as kinds
    from draftkit.rl import capture, finetune
    from draftkit.rl.publish import DraftStore
    from draftkit.rl.rollouts import Rollout

    run, kind, policy = make_run(tmp_path, tiny_target), kinds.get("eagle3"), tiny_target.model
    prompts = chat(tiny_target.tokenizer, 4)
    gen = torch.Generator().manual_seed(0)
    completions = [torch.randint(5, 500, (6 + 3 * i,), generator=gen).tolist() for i in range(4)]
    taps = capture.TappedKind(kind, _trainer_taps(policy, prompts, completions, AUX))
    rows = [Rollout(p + c, [0] * len(p) + [1] * len(c), len(p), f"trl:{i}")
            for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    out = {}
    for name in ("new", "old"):
        draft = kind.load(DraftStore(run).current_dir(), policy, 3)
        start = {n: p.detach().clone() for n, p in draft.named_parameters()}
        if name == "old":
            draft.forward = lambda batch, d=draft: old_forward(d, batch)
        batches = finetune.feature_batches(taps, draft, policy, rows, batch_tokens=96)
        res = finetune.finetune(draft, batches, steps=6, seconds=0, lr=1e-3, seed=0)
        out[name] = res, {n: p.detach().clone() for n, p in draft.named_parameters()}
    assert len(batches) > 1 and taps.stats["computed_rows"] == 0  # all rows from the taps
    (new, new_w), (old, old_w) = out["new"], out["old"]
    assert new.steps == old.steps == 6 and new.tokens == old.tokens
    assert new.first_loss == pytest.approx(old.first_loss, rel=1e-5)
    assert new.last_loss == pytest.approx(old.last_loss, rel=1e-5)
    assert new.last_loss < new.first_loss  # it trains
    for n, w in old_w.items():
        moved = (w - start[n]).abs().max().item()
        if n in draft.FROZEN_TARGET_PARTS or n in ("verifier_norm", "verifier_lm_head"):
            assert moved == 0 and torch.equal(new_w[n], w), n
            continue
        assert moved > 0, n
        assert (new_w[n] - w).abs().max().item() <= 1e-3 * moved, n
