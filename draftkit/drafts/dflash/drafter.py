"""The reference decoder's drafter for a DFlash draft (eval/spec_decode.py's begin/extend).

vLLM drafts the whole block in one forward (model.py): `begin` runs it once and returns slot
1's logits, each `extend` returns the next slot's from the same pass. The drafted token passed
to `extend` is ignored: no slot reads another slot's draft, only its mask embedding.

Worked example, verified ids x_0..x_4 (L=5; x_4 is the token the target just sampled), taps
h_0..h_3 from the last verification pass, k=3:
    context:  c_0..c_3 = fc(h_0..h_3) at positions 0..3
    block:    x_4    MASK   MASK   MASK        positions 4..7, bidirectional
    drafts:          d_1    d_2    d_3         (begin, extend, extend)
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError


class DFlashDrafter:
    def __init__(self, draft, target):
        if not hasattr(draft, "draft_logits"):
            raise DraftkitError("a DFlash drafter needs a DFlashDraft; load the export with the "
                                "dflash kind's load_export")
        if list(getattr(target, "aux_layer_ids", [])) != list(draft.spec.aux_layer_ids):
            raise DraftkitError(f"the target captures aux ids {getattr(target, 'aux_layer_ids', None)}"
                                f", the DFlash draft taps {draft.spec.aux_layer_ids}: build "
                                "HFTarget(model, kind.aux_layer_ids(draft))")
        self.draft, self.target = draft, target
        self._logits: torch.Tensor | None = None  # [k, V] of the current block
        self._next = 0

    def begin(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() < 2:
            raise DraftkitError("DFlash drafting needs at least 2 verified tokens")
        p = next(self.draft.parameters())
        aux = self.target.features(ids[:-1]).to(p.device, p.dtype)  # [L-1, A*H]
        with torch.no_grad():
            logits_d = self.draft.draft_logits(aux, int(ids[-1]))  # [k, Vd]
            self._logits = self.draft.target_logits(logits_d).float().cpu()  # [k, V]
        self._next = 1
        return self._logits[0]

    def extend(self, token: int) -> torch.Tensor:
        del token  # parallel drafting: slot j never reads the drafts before it
        if self._logits is None or self._next >= self._logits.shape[0]:
            raise DraftkitError(f"the DFlash block drafts {self.draft.num_slots} tokens; the "
                                "decoder asked for more (k above draft.num_speculative_tokens)")
        self._next += 1
        return self._logits[self._next - 1]
