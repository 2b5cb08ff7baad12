"""The reference decoder's drafter for a P-EAGLE head (eval/spec_decode.py's begin/extend).

vLLM drafts all k tokens in one forward: context slots, then slot 0 and k-1 mask slots
(model.py). Attention is causal, so slot j's logits do not depend on the slots after it:
`begin` runs the context and slot 0, each `extend` appends one more mask slot and reruns, and
the j-th logits equal the one-forward k-slot pass at every j. The drafted token passed to
`extend` is ignored: no slot reads an earlier draft, which is what makes the drafting parallel.

Worked example, verified ids x_0..x_4 (L=5), target features h_0..h_4:
    index:     0         1         2         3         4           5
    token:     x_1       x_2       x_3       x_4       MASK        MASK
    hidden:  fuse(h_0) fuse(h_1) fuse(h_2) fuse(h_3) fuse(mask)  fuse(mask)   position = index
row 3 drafts d_1 (begin), row 4 d_2 (first extend), row 5 d_3 (second extend).
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family.drafter import Eagle3Drafter


class PEagleDrafter(Eagle3Drafter):
    """Eagle3Drafter's context (begin), mask slots instead of fed-back states (extend)."""

    def __init__(self, draft, target):
        if not hasattr(draft, "mask_hidden"):
            raise DraftkitError("a P-EAGLE drafter needs a PEagleDraft (mask_hidden, mask "
                                "token); load the export with the peagle kind's load_export")
        super().__init__(draft, target)

    def extend(self, token: int) -> torch.Tensor:
        del token  # parallel drafting: slot j never sees the drafts before it
        device = self._ids.device
        embed_id = torch.tensor([[self.draft.mask_token_id]], device=device)  # [1, 1]
        _, mask_hidden = self.draft.mask_inputs(1, 1)  # [1, 1, H]
        self._ids = torch.cat([self._ids, embed_id], 1)  # [1, S+1]
        self._hidden = torch.cat([self._hidden, mask_hidden.to(self._hidden.dtype)], 1)
        self._pos = torch.cat([self._pos, self._pos[:, -1:] + 1], 1)  # [1, S+1]
        return self._run()

