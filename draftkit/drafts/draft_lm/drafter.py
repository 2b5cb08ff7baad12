"""The reference decoder's drafter for a draft LM (eval/spec_decode.py's begin/extend): any HF
causal LM that shares the target's vocabulary.
"""

from __future__ import annotations

import torch


class HFDraftLM:
    """A small HF causal LM sharing the target's vocabulary as the drafter (recomputes each call)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._ids: torch.Tensor | None = None

    def _next_logits(self) -> torch.Tensor:
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=self._ids.to(device)[None], use_cache=False).logits
        return logits[0, -1].float().cpu()  # [V]

    def begin(self, ids: torch.Tensor) -> torch.Tensor:
        self._ids = ids.clone()
        return self._next_logits()

    def extend(self, token: int) -> torch.Tensor:
        self._ids = torch.cat([self._ids, torch.tensor([token])])
        return self._next_logits()
