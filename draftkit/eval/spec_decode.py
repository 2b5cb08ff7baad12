"""Reference speculative decoder (one sequence, plain torch): the yardstick for acceptance.

    from draftkit.drafts.eagle_family.drafter import Eagle3Drafter
    from draftkit.eval.spec_decode import HFTarget, speculative_decode
    target = HFTarget(model, aux_layer_ids=[2, 15, 27])
    out = speculative_decode(target, Eagle3Drafter(draft, target), prompt_ids, k=3,
                             max_new_tokens=128, temperature=0.0)
    out.tokens, out.counters.acceptance_length, out.counters.per_position

The core (`speculative_decode`) sees the target as a callable `ids [L] -> logits [L, V]` and the
drafter as a `begin(ids) / extend(token)` pair returning next-token logits [V], so toy
distributions drive it in tests and thin adapters wrap HF models (`HFTarget` here) and each kind's
draft (its `reference_drafter`, drafts/<kind>/drafter.py). The
acceptance rule is Leviathan et al. / Chen et al. rejection sampling as written in gpt-fast,
with gpt-fast's naming (q = target probability, p = draft probability of a token):
accept a draft token with probability min(1, q/p), on rejection resample from
norm(max(0, q - p)), after k accepted drafts sample a bonus token from the target. T=0 is the
same rule on one-hot (argmax) distributions, so greedy needs no separate path.

Departures from the papers / vLLM: no KV cache (every target and draft call recomputes the whole
sequence, which is fine for a reference), no tree drafting (one chain of k tokens), and the
first token after the prompt comes from a plain target pass (vLLM's prefill), so acceptance
counters cover only verification steps, like vLLM's `spec_decode_*` counters. A step always
drafts k tokens; tokens past `max_new_tokens` or after EOS are cut from the output, while the
counters keep the whole verification step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from draftkit.core.errors import DraftkitError
from draftkit.serving.counters import SpecCounters
from draftkit.targets.capture import capture, logits_from_last

# ----------------------------------------------------------------------------- the rule


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] logits -> [..., V] probabilities: softmax(logits / T), or one-hot argmax at T=0."""
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a [V] distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Where to resample after rejecting a draft token: norm(max(0, q - p)), both [V]."""
    r = (q - p).clamp_min(0.0)  # [V]
    return r / r.sum()


def verify(draft_tokens: list[int], p: torch.Tensor, q: torch.Tensor,
           generator: torch.Generator | None) -> tuple[int, int]:
    """Accept a prefix of `draft_tokens` and choose the token after it.

    p: [k, V]    draft probabilities the drafts were sampled from
    q: [k+1, V]  target probabilities at the same positions, plus one after the last draft
    Returns (number accepted m, next token): the output gains drafts[:m] + [next token].
    """
    k = len(draft_tokens)
    idx = torch.arange(k)
    p_x = p[idx, draft_tokens]  # [k] draft prob of each drafted token
    q_x = q[idx, draft_tokens]  # [k] target prob of the same token
    # q >= p: always accept the draft token.
    # q <  p: accept it with probability q / p.
    accept_prob = torch.minimum(torch.ones(()), q_x / p_x)  # [k]
    u = torch.rand(k, generator=generator)  # [k] in [0, 1): u < 1 always, u < 0 never
    rejected = (u >= accept_prob).nonzero()
    if rejected.numel() == 0:
        # All k drafts accepted: the target's distribution after the last draft gives a bonus.
        return k, sample(q[k], generator)
    m = int(rejected[0].item())
    # First rejection at m: resample from what q has and p lacks, norm(max(0, q - p)).
    return m, sample(residual(q[m], p[m]), generator)


# ----------------------------------------------------------------------------- the loop


class Drafter(Protocol):
    def begin(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [L] (all verified) -> next-token logits [V] over the target vocab."""

    def extend(self, token: int) -> torch.Tensor:
        """Append a drafted token -> logits [V] for the token after it."""


@dataclass
class SpecResult:
    tokens: list[int]  # generated ids, prompt excluded, cut at max_new_tokens / after EOS
    counters: SpecCounters  # drafts (= verification steps), draft_tokens, accepted, per pos

    @property
    def steps(self) -> int:
        return self.counters.drafts


@torch.no_grad()
def speculative_decode(target: Callable[[torch.Tensor], torch.Tensor], drafter: Drafter,
                       prompt: list[int] | torch.Tensor, k: int, max_new_tokens: int,
                       temperature: float = 0.0, eos_id: int | None = None,
                       generator: torch.Generator | None = None) -> SpecResult:
    """Generate up to `max_new_tokens` after `prompt` with k drafts per verification step.

    target(ids [L]) -> logits [L, V], row i = logits of the token after ids[i].
    The output has the target's distribution whatever the drafter proposes (lossless).
    """
    if k < 1:
        raise DraftkitError(f"k={k}: speculative decoding needs k >= 1 draft tokens per step")
    ids = torch.as_tensor(prompt, dtype=torch.long).flatten()  # [L]
    n_prompt = ids.numel()
    c = SpecCounters(accepted_per_pos=[0] * k)
    first = sample(probs_from_logits(target(ids)[-1], temperature), generator)  # prefill
    ids = torch.cat([ids, torch.tensor([first])])
    while not _done(ids, n_prompt, max_new_tokens, eos_id):
        drafts, p = _draft(drafter, ids, k, temperature, generator)  # k ids, [k, V]
        logits = target(torch.cat([ids, torch.tensor(drafts)]))  # [L+k, V]
        # Row L-1 scores the token after ids[-1] = draft 0; row L-1+k scores the bonus.
        q = probs_from_logits(logits[ids.numel() - 1:], temperature)  # [k+1, V]
        if q.shape != (k + 1, p.shape[-1]):
            raise DraftkitError(f"draft vocab ({p.shape[-1]}) != target vocab ({q.shape[-1]}): "
                                "a drafter must return logits over the target's vocabulary")
        m, nxt = verify(drafts, p, q, generator)
        c.drafts += 1
        c.draft_tokens += k
        c.accepted += m
        for i in range(m):
            c.accepted_per_pos[i] += 1
        ids = torch.cat([ids, torch.tensor(drafts[:m] + [nxt])])
    return SpecResult(_cut(ids[n_prompt:].tolist(), max_new_tokens, eos_id), c)


def _draft(drafter: Drafter, ids: torch.Tensor, k: int, temperature: float,
           generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
    """k draft tokens sampled from the drafter, and the [k, V] distributions they came from."""
    tokens, probs = [], []
    logits = drafter.begin(ids)  # [V]
    for j in range(k):
        probs.append(probs_from_logits(logits, temperature))
        tokens.append(sample(probs[-1], generator))
        if j + 1 < k:
            logits = drafter.extend(tokens[-1])
    return tokens, torch.stack(probs)


def _done(ids: torch.Tensor, n_prompt: int, max_new: int, eos_id: int | None) -> bool:
    new = ids[n_prompt:]
    return new.numel() >= max_new or (eos_id is not None and bool((new == eos_id).any()))


def _cut(tokens: list[int], max_new: int, eos_id: int | None) -> list[int]:
    tokens = tokens[:max_new]
    if eos_id is not None and eos_id in tokens:
        tokens = tokens[:tokens.index(eos_id) + 1]
    return tokens


@torch.no_grad()
def greedy_decode(target: Callable[[torch.Tensor], torch.Tensor], prompt: list[int],
                  max_new_tokens: int, eos_id: int | None = None) -> list[int]:
    """Plain autoregressive argmax decoding with the same target callable (the lossless reference)."""
    ids = torch.as_tensor(prompt, dtype=torch.long).flatten()
    out: list[int] = []
    while len(out) < max_new_tokens and (eos_id is None or eos_id not in out):
        out.append(int(target(torch.cat([ids, torch.tensor(out, dtype=torch.long)]))[-1]
                       .argmax().item()))
    return out


# ----------------------------------------------------------------------------- adapters


class HFTarget:
    """An HF causal LM as the decoder's target: ids [L] -> logits [L, V] in fp32.

    With `aux_layer_ids` every pass also keeps the aux features (vLLM convention, see
    target.capture) of the sequence it saw, so an EAGLE-3 drafter reads the features of the
    verified prefix from the last verification pass instead of running the target again.
    """

    def __init__(self, model: torch.nn.Module, aux_layer_ids: list[int] | None = None):
        self.model = model
        self.aux_layer_ids = list(aux_layer_ids or [])
        self._seen: torch.Tensor | None = None  # [L] ids of the last pass
        self._aux: torch.Tensor | None = None  # [L, A*H] their aux features

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        x = ids.to(self._device())[None]  # [1, L]
        if not self.aux_layer_ids:
            return self.model(input_ids=x, use_cache=False).logits[0].float().cpu()  # [L, V]

        aux, last = capture(self.model, x, self.aux_layer_ids)  # [1, L, A*H], [1, L, H]
        self._seen, self._aux = ids.clone(), aux[0]
        return logits_from_last(self.model, last)[0].float().cpu()  # [L, V]

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """Aux features [L, A*H] of `ids`: a prefix of the last pass if it was, else a new pass."""
        n = ids.numel()
        if self._seen is None or self._seen.numel() < n or not torch.equal(self._seen[:n], ids):
            self(ids)
        return self._aux[:n]
