"""The draft's taps from an RL trainer's own loss forward: while a loss function runs, forward
hooks on the policy's decoder layers of the draft's tap ids keep their outputs; each row's
states (its prompt + completion positions, as the batch's masks say), detached and on the CPU,
then go into `Taps` (rl/capture.py) keyed by the row's token ids, so a refresh reads them
instead of running the policy over those rows again. Any framework whose loss takes a batch
with `prompt_ids`, `prompt_mask`, `completion_ids`, `completion_mask` (TRL's GRPO) can wrap it:

    taps = LossTaps(policy_model, aux_layer_ids(cfg))
    trainer.compute_loss = taps.wrap(trainer.compute_loss)   # (model, inputs, ...) -> loss
    refresher.refresh(policy_model, tok, taps=taps.taps)      # then taps.clear()

Layer ids follow targets/capture.py (id 0 = the embeddings' output, id k = the output of decoder
layer k-1); the last decoder output (id N) is always kept. A row the batch masked in the middle
(not one contiguous span) matches no rollout and is computed by the refresh.
"""

from __future__ import annotations

import contextlib
import time

import torch

from draftkit.rl.capture import Taps
from draftkit.targets.capture import check_layer_ids, decoder_layers

BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


class LossTaps:
    def __init__(self, model, layer_ids: list[int]):
        self.model = model
        n = len(decoder_layers(model))
        check_layer_ids(list(layer_ids), n)
        self.layer_ids = sorted(set(layer_ids) | {n})
        self.taps = Taps()
        self.seconds = 0.0  # spent copying taps out of the trainer's forwards

    def wrap(self, loss_fn):
        """`loss_fn(model, inputs, ...)` with the hooks on while it runs; its result unchanged."""

        def tapped(model, inputs, *args, **kwargs):
            with self.hooks() as got:
                loss = loss_fn(model, inputs, *args, **kwargs)
            self.keep(inputs, got)
            return loss

        return tapped

    @contextlib.contextmanager
    def hooks(self):
        """{layer id: [[B, T, H] per forward]} filled while the block runs (a trainer may chunk)."""
        got: dict[int, list[torch.Tensor]] = {k: [] for k in self.layer_ids}
        base, layers = getattr(self.model, "model", self.model), decoder_layers(self.model)

        def keep(k):
            return lambda _m, _i, out: got[k].append(
                (out[0] if isinstance(out, tuple) else out).detach())

        hooks = [(base.embed_tokens if k == 0 else layers[k - 1]).register_forward_hook(keep(k))
                 for k in self.layer_ids]
        try:
            yield got
        finally:
            for h in hooks:
                h.remove()

    def keep(self, inputs: dict, got: dict[int, list[torch.Tensor]]) -> None:
        t0 = time.perf_counter()
        if not set(BATCH_KEYS) <= set(inputs):
            return
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # [B, P+C]
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1).bool()
        states = {k: torch.cat(v) for k, v in got.items() if v}  # [B, P+C, H] each
        if len(states) != len(self.layer_ids) or any(s.shape[:2] != ids.shape
                                                     for s in states.values()):
            return  # not the text forward over prompt + completion this expects: no taps
        for b in range(ids.shape[0]):
            pos = mask[b].nonzero()[:, 0]  # left-padded prompt, right-padded completion
            if len(pos) == 0 or int(pos[-1] - pos[0]) + 1 != len(pos):
                continue  # not one contiguous row
            row = slice(int(pos[0]), int(pos[-1]) + 1)
            key = tuple(ids[b, row].tolist())
            self.taps.rows[key] = {k: s[b, row].to("cpu", copy=True) for k, s in states.items()}
        self.seconds += time.perf_counter() - t0

    def clear(self) -> None:
        self.taps.rows.clear()
