"""The loss options (train.loss: kl | tv | mix, train.loss_mix) as pure functions: values by
hand, gradients against autograd, the fused LM-family loss against its reference, the EAGLE
family's step terms, and the config's refusals."""

from __future__ import annotations

import math

import pytest
import torch

from draftkit.core import config
from draftkit.core.config import ConfigError
from draftkit.drafts import divergence
from draftkit.drafts.divergence import Divergence
from draftkit.drafts.eagle_family import losses as family_losses
from draftkit.drafts.lm_family import losses as lm_losses

OPTIONS = [Divergence("kl"), Divergence("tv"), Divergence("mix", 0.3)]


def _probs(logits):
    z = sum(math.exp(x) for x in logits)
    return [math.exp(x) / z for x in logits]


def test_tv_by_hand_is_one_minus_the_acceptance_sum_min():
    # p = [1/4, 1/2, 1/4], q = 1/3 each: 1/2 (1/12 + 1/6 + 1/12) = 1/6 = 1 - (1/4 + 1/3 + 1/4)
    target, draft = torch.tensor([[0.0, math.log(2.0), 0.0]]), torch.zeros(1, 3)
    tv = divergence.rows(draft, target, Divergence("tv")).item()
    assert tv == pytest.approx(1 / 6, abs=1e-6)
    p, q = _probs([0.0, math.log(2.0), 0.0]), _probs([0.0, 0.0, 0.0])
    assert tv == pytest.approx(1 - sum(min(a, b) for a, b in zip(p, q, strict=True)), abs=1e-6)
    kl = 0.5 * math.log(9 / 8)
    mix = divergence.rows(draft, target, Divergence("mix", 0.25)).item()
    assert mix == pytest.approx(0.75 * kl + 0.25 / 6, abs=1e-6)


@pytest.mark.parametrize("div", OPTIONS, ids=lambda d: d.name)
def test_identical_distributions_score_zero(div):
    x = torch.randn(5, 11)
    assert divergence.rows(x, x.clone(), div).abs().max().item() < 1e-6
    assert divergence.rows(x + 3.0, x, div).abs().max().item() < 1e-5  # softmax ignores shifts


def test_mix_at_zero_and_one_is_kl_and_tv_exactly():
    d, t = torch.randn(6, 9), torch.randn(6, 9)
    kl, tv = divergence.rows(d, t, Divergence("kl")), divergence.rows(d, t, Divergence("tv"))
    assert torch.equal(divergence.rows(d, t, Divergence("mix", 0.0)), kl)
    assert torch.equal(divergence.rows(d, t, Divergence("mix", 1.0)), tv)
    assert torch.equal(kl, family_losses.kl_per_position(d, t))  # the old name, same numbers
    assert torch.all(tv <= torch.sqrt(kl / 2) + 1e-6)  # Pinsker


@pytest.mark.parametrize("div", OPTIONS, ids=lambda d: d.name)
def test_written_out_gradient_equals_autograd(div):
    torch.manual_seed(0)
    d = torch.randn(7, 13, requires_grad=True)
    t = torch.randn(7, 13)
    divergence.rows(d, t, div).sum().backward()
    log_p = torch.log_softmax(t, -1)
    log_q = torch.log_softmax(d.detach(), -1)
    total, grad = divergence.sum_and_grad(log_p.clone(), log_q.clone(), div, want_grad=True)
    assert total.item() == pytest.approx(divergence.rows(d, t, div).sum().item(), rel=1e-5)
    torch.testing.assert_close(grad, d.grad, rtol=1e-4, atol=1e-6)
    no_grad_total, none = divergence.sum_and_grad(log_p.clone(), log_q.clone(), div, False)
    assert none is None and no_grad_total.item() == total.item()


def test_tv_gradient_passes_gradcheck():
    torch.manual_seed(1)
    d = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(3, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: divergence.rows(x, t, Divergence("tv")), (d,))


@pytest.mark.parametrize("div", OPTIONS, ids=lambda d: d.name)
@pytest.mark.parametrize("ce_weight", [0.0, 0.3])
def test_fused_lm_loss_equals_its_reference(div, ce_weight):
    """linear_distill (lm_head + loss + gradient in one chunked pass: draft-lm, PARD) against
    autograd through distill_terms, for every loss option."""
    torch.manual_seed(2)
    n, hd, h, v = 9, 6, 5, 17
    hidden = torch.randn(n, hd, requires_grad=True)
    weight = torch.randn(v, hd, requires_grad=True)
    last, labels = torch.randn(n, h), torch.randint(0, v, (n,))
    norm, head = torch.rand(h) + 0.5, torch.randn(v, h)
    loss, d_sum, ce_sum, correct = lm_losses.linear_distill(
        hidden, weight, last, labels, norm, head, 1e-6, ce_weight, div, 4, torch.float32)
    loss.backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    tgt = lm_losses.target_logits_from_last(last, norm, head, 1e-6)
    ref, ref_d, ref_ce, ref_correct = lm_losses.distill_terms(hidden @ weight.t(), tgt, labels,
                                                              ce_weight, div)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert d_sum.item() == pytest.approx(ref_d.item(), rel=1e-5)
    assert ce_sum.item() == pytest.approx(ref_ce.item(), rel=1e-5) or ce_weight == 0
    assert torch.equal(correct, ref_correct)
    torch.testing.assert_close(got[0], hidden.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1], weight.grad, rtol=1e-4, atol=1e-6)


def test_family_step_terms_use_the_divergence():
    torch.manual_seed(3)
    rows, t = torch.randn(3, 6), torch.randn(3, 6)  # lm_head = identity: rows are the logits
    valid = torch.tensor([[True, True, False, True]])
    args = (torch.eye(6), t, torch.zeros(3, dtype=torch.long), torch.arange(3), torch.arange(6),
            valid, torch.ones_like(valid))
    tv_sum, counts, _ = family_losses.step_terms(rows, *args, Divergence("tv"))
    want = divergence.rows(rows, t, Divergence("tv")).sum()
    assert tv_sum.item() == pytest.approx(want.item(), rel=1e-6)
    assert counts["kl_sum"].item() == pytest.approx(want.item(), rel=1e-6)  # the loss trained
    kl_sum, _, _ = family_losses.step_terms(rows, *args)  # default: kl, as before
    assert kl_sum.item() == pytest.approx(family_losses.kl_per_position(rows, t).sum().item(),
                                          rel=1e-6)


# ----------------------------------------------------------------------------- config


def test_defaults_and_the_config_keys(tmp_path):
    cfg = config.RunConfig()
    assert (cfg.train.loss, cfg.train.loss_mix) == ("kl", 0.5)
    assert Divergence.from_config(cfg.train) == Divergence("kl")
    path = tmp_path / config.CONFIG_NAME
    path.write_text(config.dump(cfg))
    got = config.load(path, ["train.loss=mix", "train.loss_mix=0.25"])
    assert Divergence.from_config(got.train).weights == (0.75, 0.25)


def test_an_unknown_loss_lists_the_known_ones(tmp_path):
    path = tmp_path / config.CONFIG_NAME
    path.write_text(config.dump(config.RunConfig()))
    with pytest.raises(ConfigError, match=r"train.loss='jsd' is not a known loss; choose one of "
                                          r"kl, tv, mix"):
        config.load(path, ["train.loss=jsd"])
    with pytest.raises(ConfigError, match="choose one of kl, tv, mix"):
        Divergence("KL")


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_a_mix_weight_outside_0_1_is_refused_in_one_line(tmp_path, weight):
    path = tmp_path / config.CONFIG_NAME
    path.write_text(config.dump(config.RunConfig()))
    with pytest.raises(ConfigError) as err:
        config.load(path, ["train.loss=mix", f"train.loss_mix={weight}"])
    assert str(err.value) == (f"train.loss_mix={weight} must be in [0, 1] (the weight of tv in "
                              "train.loss=mix)")
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the flow


@pytest.mark.parametrize("kind", ["eagle3", "draft-lm"])
def test_train_loss_reaches_every_kinds_loss(kind, tmp_path, tiny_target, monkeypatch):
    """`draftkit train RUN train.loss=mix train.loss_mix=0.4` trains with that divergence (the
    EAGLE family's autograd rows, the LM family's fused gradient)."""
    from _runs import DRAFT, make_run, one_thread, write_token_counts

    from draftkit import api

    seen = []
    for name in ("rows", "sum_and_grad"):
        real = getattr(divergence, name)
        monkeypatch.setattr(divergence, name, lambda *a, _real=real, **k: (
            seen.append(a[2]), _real(*a, **k))[1])
    with one_thread():
        run = make_run(tmp_path, tiny_target.tokenizer, kind=kind, n_train=4, n_eval=2,
                       overrides=[*(DRAFT if kind == "eagle3" else []), "train.max_steps=1",
                                  "train.batch_tokens=256", "train.num_workers=0",
                                  "tracking.backend=none", "harvest.dtype=float32"])
        write_token_counts(run)
        api.harvest(run)
        api.train(run, ["train.loss=mix", "train.loss_mix=0.4"])
    assert seen and set(seen) == {Divergence("mix", 0.4)}
