"""GRPO's pieces as pure functions (tests call them with hand-computed numbers), and one policy
update over a step's rollouts.

For G samples per prompt with rewards r_1..r_G (DeepSeekMath's GRPO, outcome reward):
    A_i = (r_i - mean(r)) / (std(r) + eps)          std with Bessel's correction, as TRL
    ratio_t = exp(logp_t - logp_old_t)              per response token
    L_t = -min(ratio_t * A, clip(ratio_t, 1 - eps_clip, 1 + eps_clip) * A)
          + kl_coef * KL3_t                          KL3 = exp(ref - logp) - (ref - logp) - 1
and the loss averages L_t over every response token of the step ("token", as DAPO/TRL's
default) or over tokens per sequence, then sequences ("sequence", the GRPO paper). Departure
from the paper: with `epochs=1` there is one optimizer step per batch of rollouts, so
logp_old is logp detached (ratio 1, clipping never binds); clipping acts from epoch 2 on.
logp_old is taken from the policy in torch, not from vLLM's sampler: the engine runs the same
weights, and this keeps the ratio exactly 1 at the first epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6,
                     scale: bool = True) -> torch.Tensor:
    """[P, G] rewards -> [P, G] advantages, normalised within each prompt's group."""
    mean = rewards.mean(dim=-1, keepdim=True)  # [P, 1]
    centred = rewards - mean  # [P, G]
    if not scale:
        return centred
    std = rewards.std(dim=-1, keepdim=True) if rewards.shape[-1] > 1 else torch.zeros_like(mean)
    return centred / (std + eps)  # [P, G]; a group of equal rewards gets all zeros


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || ref) on tokens sampled from the policy (k3: >= 0,
    unbiased)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                       clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] log-probs, [B] advantages -> ([B, T] per-token loss, [B, T] bool clipped)."""
    ratio = torch.exp(logp - old_logp)  # [B, T]
    a = adv[:, None]  # [B, 1]
    unclipped = ratio * a
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * a
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: str, n_tokens: int,
              n_seqs: int) -> torch.Tensor:
    """Sum of a micro-batch's share of the step loss: micro-batches add up to the whole-batch
    mean (`n_tokens` / `n_seqs` count the whole batch)."""
    masked = per_token * mask  # [B, T]
    if agg == "token":
        return masked.sum() / n_tokens
    if agg == "sequence":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / n_seqs
    raise ValueError(f"loss aggregation {agg!r} is not 'token' or 'sequence'")


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] ids -> [B, T-1] log p(x_{t+1} | x_<=t) in fp32."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # [B,T-1,V]
    logits = logits.float()
    picked = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
    return picked - torch.logsumexp(logits, dim=-1)  # [B, T-1]


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float


def pad_batch(samples: list[Sample], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded (ids [B, T], attention [B, T], response mask [B, T-1] over predicted
    tokens: mask[b, t] = 1 when ids[b, t+1] is a response token, adv [B])."""
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(samples), width, dtype=torch.long)
    resp = torch.zeros(len(samples), width - 1)
    for b, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.prompt_ids) + len(s.response_ids)
        ids[b, :n] = torch.tensor(s.prompt_ids + s.response_ids)
        attn[b, :n] = 1
        resp[b, p - 1: n - 1] = 1  # position t predicts token t+1
    adv = torch.tensor([s.advantage for s in samples])
    return ids, attn, resp, adv


def informative(samples: list[Sample]) -> list[Sample]:
    """The samples that carry gradient without a KL term: advantage != 0 (a group whose
    rewards are all equal has none). Updating on these with the whole batch's `n_tokens` /
    `n_seqs` gives exactly the gradient of the whole batch, for less compute."""
    return [s for s in samples if s.advantage != 0.0]


def response_tokens(samples: list[Sample]) -> int:
    return sum(len(s.response_ids) for s in samples)


@torch.no_grad()
def mean_kl(model, ref_model, samples: list[Sample], pad_id: int) -> float:
    """Mean per-token k3 KL(model || ref) over the samples' response tokens."""
    ids, attn, mask, _ = pad_batch(samples, pad_id)
    kl = kl_k3(token_logprobs(model, ids, attn), token_logprobs(ref_model, ids, attn))
    return float((kl * mask).sum() / mask.sum().clamp(min=1))


def policy_update(model, optimizer, samples: list[Sample], pad_id: int, clip_eps: float,
                  kl_coef: float = 0.0, ref_model=None, epochs: int = 1, micro_batch: int = 4,
                  agg: str = "token", max_grad_norm: float = 1.0, n_tokens: int | None = None,
                  n_seqs: int | None = None) -> dict:
    """`epochs` optimizer steps on the step's samples (gradients accumulated over
    micro-batches). `n_tokens` / `n_seqs` normalise the loss (default: these samples'; pass
    the whole batch's when updating on `informative(...)` only). Returns loss, KL to
    `ref_model` before the update, clip fraction, grad norm."""
    chunks = [pad_batch(samples[i:i + micro_batch], pad_id)
              for i in range(0, len(samples), micro_batch)]
    n_tokens = n_tokens or int(sum(c[2].sum() for c in chunks))
    n_seqs = n_seqs or len(samples)
    old, ref, kl_sum = [], [], 0.0
    if ref_model is not None:
        with torch.no_grad():
            ref = [token_logprobs(ref_model, ids, attn) for ids, attn, _, _ in chunks]
    out = {}
    for epoch in range(epochs):
        optimizer.zero_grad(set_to_none=True)
        loss_sum, clipped_sum = 0.0, 0.0
        for i, (ids, attn, mask, adv) in enumerate(chunks):
            logp = token_logprobs(model, ids, attn)  # [B, T-1]
            if epoch == 0:
                old.append(logp.detach())
            per_tok, clipped = clipped_token_loss(logp, old[i], adv, clip_eps)
            if ref:
                kl = kl_k3(logp, ref[i])  # [B, T-1]
                if epoch == 0:
                    kl_sum += float((kl.detach() * mask).sum())
                if kl_coef:
                    per_tok = per_tok + kl_coef * kl
            loss = aggregate(per_tok, mask, agg, n_tokens, n_seqs)
            loss.backward()
            loss_sum += float(loss.detach())
            clipped_sum += float((clipped.float() * mask).sum())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        out = {"loss": loss_sum, "clip_frac": clipped_sum / max(n_tokens, 1),
               "grad_norm": float(norm)}
    optimizer.zero_grad(set_to_none=True)
    out.update({"kl_ref": kl_sum / max(n_tokens, 1) if ref else None,
                "response_tokens": n_tokens})
    return out
