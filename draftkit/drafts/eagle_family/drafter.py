"""The reference decoder's drafter for an EAGLE-3 head (eval/spec_decode.py's begin/extend),
fed by the target's aux features from its last verification pass (`HFTarget.features`).
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError


class Eagle3Drafter:
    """An `Eagle3Draft` head fed by the target's aux features (vLLM's alignment).

    Worked example, verified ids x_0..x_4 (L=5), target features h_0..h_4 from the last
    verification pass. `begin` runs the head over
        index t:     0        1        2        3
        token:       x_1      x_2      x_3      x_4
        hidden:   fuse(h_0) fuse(h_1) fuse(h_2) fuse(h_3)      position t
    and row 3 predicts d_1 (the token after x_4). `extend(d_1)` appends token d_1 with the head's
    own hidden_out of row 3 at position 4, and row 4 predicts d_2; and so on. h_4 (the feature of
    the newest token) is not used: the head sees x_{t+1} next to the feature h_t.
    """

    def __init__(self, draft: torch.nn.Module, target):  # target: eval.spec_decode.HFTarget
        if not target.aux_layer_ids:
            raise DraftkitError("an EAGLE-3 drafter needs HFTarget(model, aux_layer_ids=...) with "
                                "the draft's eagle_aux_hidden_state_layer_ids")
        self.draft, self.target = draft, target
        self._ids = self._hidden = self._pos = self._last_hidden = None  # set by begin()

    def _device_dtype(self) -> tuple[torch.device, torch.dtype]:
        p = next(self.draft.parameters())
        return p.device, p.dtype

    def _run(self) -> torch.Tensor:
        logits_d, hidden_out = self.draft.step(self._ids, self._hidden, self._pos)  # [1,S,Vd], [1,S,H]
        self._last_hidden = hidden_out[:, -1:]  # [1, 1, H] fed back at the next draft step
        return self.draft.target_logits(logits_d[0, -1]).float().cpu()  # [V], -inf outside Vd

    def begin(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() < 2:
            raise DraftkitError("EAGLE-3 drafting needs at least 2 verified tokens")
        device, dtype = self._device_dtype()
        aux = self.target.features(ids[:-1]).to(device, dtype)  # [L-1, A*H]: h_0..h_{L-2}
        self._hidden = self.draft.fuse(aux[None])  # [1, L-1, H]
        self._ids = ids[1:].to(device)[None]  # [1, L-1]: x_1..x_{L-1}
        self._pos = torch.arange(ids.numel() - 1, device=device)[None]  # [1, L-1]
        return self._run()

    def extend(self, token: int) -> torch.Tensor:
        device = self._ids.device
        self._ids = torch.cat([self._ids, torch.tensor([[token]], device=device)], 1)  # [1, S+1]
        self._hidden = torch.cat([self._hidden, self._last_hidden], 1)  # [1, S+1, H]
        self._pos = torch.cat([self._pos, self._pos[:, -1:] + 1], 1)  # [1, S+1]
        return self._run()
