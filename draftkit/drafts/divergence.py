"""The divergences a draft learns the target's distribution by (`train.loss`, `train.loss_mix`),
once for every kind: the EAGLE family's loss (eagle_family/losses.py: EAGLE-3, P-EAGLE, DFlash)
and the LM family's distillation (lm_family/losses.py: draft-lm, PARD) both call this module.

Per position, p = the target's distribution (softmax of its logits), q = the draft's:
    kl(p, q) = sum_v p_v (log p_v - log q_v)                  forward KL (EAGLE-3, DistillSpec)
    tv(p, q) = 1/2 sum_v |p_v - q_v| = 1 - sum_v min(p_v, q_v)
    mix      = (1 - w) kl + w tv                               w = train.loss_mix
At T=1 with probabilistic drafting vLLM accepts a drafted x with probability min(1, p(x)/q(x)),
so a position's expected acceptance is sum_v min(p_v, q_v) = 1 - tv(p, q): tv is the
acceptance itself, kl only a proxy for it (kl bounds tv by Pinsker: tv <= sqrt(kl / 2)).
For the EAGLE family p is the target's distribution restricted to the draft vocab and
renormalised (as for its kl), so tv counts only what the draft vocab can accept.

Gradients with respect to the draft's logits z (q = softmax(z)), written out for the fused
lm_head + loss of the LM family (`sum_and_grad`), and checked against autograd in the tests:
    d kl / d z = q - p
    d tv / d z_i = q_i (s_i - sum_v q_v s_v),   s = 1/2 sign(q - p)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftkit.core.config import TrainConfig, check_loss

_TRAIN = TrainConfig()


@dataclass(frozen=True)
class Divergence:
    """A draft's loss option: `name` in core/config.py LOSSES, `mix` the weight of tv in mix.
    Every trainable draft module holds one as `.divergence` (kl unless the train stage or a
    refresh sets the run's: `from_config`)."""
    name: str = _TRAIN.loss
    mix: float = _TRAIN.loss_mix

    def __post_init__(self):
        check_loss(self.name, self.mix)

    @classmethod
    def from_config(cls, train_cfg) -> Divergence:
        return cls(train_cfg.loss, train_cfg.loss_mix)

    @property
    def weights(self) -> tuple[float, float]:
        """(weight of kl, weight of tv)."""
        return {"kl": (1.0, 0.0), "tv": (0.0, 1.0)}.get(self.name, (1.0 - self.mix, self.mix))


KL = Divergence("kl")


def kl_rows(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row from log-probabilities: [..., V] x2 -> [...]."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def tv_rows(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Total variation 1/2 sum |p - q| per row: [..., V] x2 -> [...]."""
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)


def rows(draft_logits: torch.Tensor, target_logits: torch.Tensor,
         div: Divergence = KL) -> torch.Tensor:
    """The divergence of softmax(draft) from softmax(target) per row, with autograd:
    [..., V] x2 -> [...] (float32; float64 inputs stay float64)."""
    log_p = F.log_softmax(_at_least_fp32(target_logits), dim=-1)  # [..., V]
    log_q = F.log_softmax(_at_least_fp32(draft_logits), dim=-1)  # [..., V]
    w_kl, w_tv = div.weights
    if w_tv == 0.0:
        return kl_rows(log_p, log_q)
    if w_kl == 0.0:
        return tv_rows(log_p, log_q)
    return w_kl * kl_rows(log_p, log_q) + w_tv * tv_rows(log_p, log_q)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def sum_and_grad(log_p: torch.Tensor, log_q: torch.Tensor, div: Divergence,
                 want_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The divergence summed over n rows and its gradient with respect to the draft logits
    (module docstring), without autograd: log_p, log_q [n, V] float32 -> (scalar,
    [n, V] or None). Overwrites log_p (the fused loss keeps few [n, V] buffers alive)."""
    w_kl, w_tv = div.weights
    p = log_p.exp()  # [n, V]
    total = log_p.new_zeros(())
    if w_kl:
        total = total + w_kl * torch.dot(p.flatten(), log_p.sub_(log_q).flatten())
    del log_p
    if not (w_tv or want_grad):
        return total, None
    q = log_q.exp()  # [n, V]
    grad = None
    if w_tv:
        s = (q - p).sign_().mul_(0.5)  # [n, V]
        total = total + w_tv * s.flatten().dot((q - p).flatten())  # sum 1/2 |q - p|
        if want_grad:
            s.sub_((q * s).sum(-1, keepdim=True)).mul_(q)  # q (s - <q, s>)
            grad = s.mul_(w_tv) if w_kl == 0.0 else s.mul_(w_tv).add_(q - p, alpha=w_kl)
    elif want_grad:
        grad = q.sub_(p) if w_kl == 1.0 else q.sub_(p).mul_(w_kl)
    return total, grad
