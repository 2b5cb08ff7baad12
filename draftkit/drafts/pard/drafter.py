"""The reference decoder's drafter for a PARD export (eval/spec_decode.py's `begin/extend`).

`begin(ids)` runs the draft once on ids + (n-1) mask tokens, positions 0..L+n-2, plain causal
attention: vLLM's parallel-drafting input (layout.py), and returns the logits at the last real
token; `extend(token)` returns the next mask slot's logits from the same forward. The drafted
token is not fed back: in parallel drafting slot j never sees drafts 0..j-1. n starts at
`slots` and doubles when a decode asks for more (extra masks after a slot do not change it:
attention is causal).
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError


class PardDrafter:
    def __init__(self, model: torch.nn.Module, slots: int = 4):
        token = getattr(model.config, "pard_token", None)
        if token is None:
            raise DraftkitError("this draft LM has no pard_token in its config.json: it is not "
                                "a PARD export (serve it as draft.kind=draft-lm)")
        self.model, self.pard_token, self.slots = model, int(token), max(1, slots)
        self._ids: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None  # [n, V] slots 0..n-1
        self._j = 0

    def _run(self, n: int) -> None:
        device = next(self.model.parameters()).device
        x = torch.cat([self._ids, torch.full((n - 1,), self.pard_token, dtype=torch.long)])
        logits = self.model(input_ids=x.to(device)[None], use_cache=False).logits  # [1, L+n-1, V]
        self._logits = logits[0, self._ids.numel() - 1:].float().cpu()  # [n, V]

    def begin(self, ids: torch.Tensor) -> torch.Tensor:
        self._ids, self._j = ids.clone(), 0
        self._run(self.slots)
        return self._logits[0]

    def extend(self, token: int) -> torch.Tensor:
        self._j += 1
        if self._j >= self._logits.shape[0]:
            self._run(2 * self._logits.shape[0])
        return self._logits[self._j]
