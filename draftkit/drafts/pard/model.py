"""A PARD draft LM: the LM family's `DraftLM` (same batch, same frozen target norm/lm_head,
same distillation: drafts/lm_family/losses.py) trained to propose all k tokens in one forward.

Each batch row is packed with k-1 mask slots per anchor (layout.py) and run through the LM once.
Slot j of anchor a (j = 0 is the real token x_a itself) predicts x_{a+1+j}; its distillation
target is the target's distribution at a+j, lm_head(norm(last[a+j])): what the target would
say given the real x_0..x_{a+j}, and at T=0 the token it verifies. An anchor is every position
whose next token is learned (an assistant token): step 0 scores the positions DraftLM scores.

Loss = (1/k) sum_j mean D_j, D = train.loss's divergence (drafts/divergence.py), over the slots
of step j whose label x_{a+1+j} is learned (plus train.ce_weight of hard-label CE), one
`linear_distill` pass per step. Metrics use the
EAGLE-3/draft-lm keys (acceptance.aggregate sums them): a chain of k drafts from anchor a
is slot 0..k-1 of that anchor, and step j counts in cond_acc_j only where steps < j were correct.
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError
from draftkit.core.hardware import autocast_dtype
from draftkit.drafts.acceptance import DeviceMetrics, shift
from draftkit.drafts.lm_family import losses
from draftkit.drafts.lm_family.model import DraftLM
from draftkit.drafts.pard import layout


class PardLM(DraftLM):
    """`DraftLM` whose `lm.config.pard_token` names the mask token (build.choose_mask_token)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        token = getattr(self.lm.config, "pard_token", None)
        if token is None or not 0 <= int(token) < self.target_lm_head.shape[0]:
            raise DraftkitError(f"a PARD draft needs lm.config.pard_token, an id of the target's "
                                f"vocab (got {token!r}); build it with the pard kind")
        self.pard_token = int(token)
        embed = self.lm.get_input_embeddings()
        if embed.padding_idx == self.pard_token:  # HF zeroes the pad row's gradient: the mask
            embed.padding_idx = None  # row must learn (vLLM's embedding has no padding_idx)

    # ----------------------------------------------------------------- the packed forward

    def packed_hidden(self, input_ids: torch.Tensor, valid: torch.Tensor,
                      anchors: torch.Tensor) -> tuple[torch.Tensor, layout.Packed]:
        """The decoder's normed output over the packed sequence: [B, L, Hd], and the layout."""
        if (input_ids[valid] == self.pard_token).any():
            raise DraftkitError(f"the data holds the PARD mask token {self.pard_token} as a real "
                                "token: the draft could not tell a mask slot from it. Rebuild "
                                "the draft from a draft-lm run (train.init_from) with a token "
                                "the data never uses")
        p = layout.pack(input_ids, valid, anchors, self.k, self.pard_token)
        dtype = next(self.lm.parameters()).dtype
        mask = layout.attention_mask(p.allowed, self.lm, dtype)  # [B, 1, L, L]
        hidden = self.lm.get_decoder()(input_ids=p.input_ids, position_ids=p.position_ids,
                                       attention_mask=mask, use_cache=False).last_hidden_state
        return hidden, p  # [B, L, Hd]

    @staticmethod
    def slot_rows(hidden: torch.Tensor, p: layout.Packed, j: int) -> torch.Tensor:
        """[B, M, Hd]: the hidden state of slot j of each anchor (j = 0: the real token)."""
        idx = p.anchors.clamp_min(0) if j == 0 else layout.slot_index(p, j)  # [B, M]
        return hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Distillation loss of all k parallel drafts over a right-padded batch."""
        ids, valid = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        learn = valid & batch["loss_mask"].bool()  # [B, T]
        hidden, p = self.packed_hidden(ids, valid, valid & shift(learn, 1))
        dtype = autocast_dtype(hidden.device.type)
        head = self.lm.get_output_embeddings().weight  # [V, Hd]
        rows = torch.arange(ids.shape[0], device=ids.device)[:, None]  # [B, 1]
        loss = hidden.new_zeros((), dtype=torch.float32)
        counts, chain_ok, ce_total = {}, p.anchors >= 0, 0.0  # chain_ok [B, M]
        # no host sync: the counts stay on the device until a metric is read
        for j in range(self.k):
            label_at, state_at, scored = layout.step_targets(ids, learn, p.anchors, j)  # [B, M]
            loss_sum, kl_sum, ce_sum, hits = losses.linear_distill(
                self.slot_rows(hidden, p, j)[scored], head,  # [N, Hd]
                batch["last"][rows, state_at][scored], ids[rows, label_at][scored],  # [N, H], [N]
                self.target_norm, self.target_lm_head, self.eps, self.ce_weight, self.divergence,
                self.chunk, dtype)
            n = scored.sum()
            loss = loss + loss_sum / n.clamp(min=1) / self.k
            correct = torch.zeros_like(scored)
            correct[scored] = hits
            cond = scored & chain_ok
            counts.update({f"n_{j}": n, f"correct_{j}": correct.sum(), f"cond_n_{j}": cond.sum(),
                           f"cond_correct_{j}": (cond & correct).sum(), f"kl_sum_{j}": kl_sum,
                           f"w_{j}": 1.0 / self.k})
            chain_ok = chain_ok & correct
            ce_total = ce_total + ce_sum
        return loss, DeviceMetrics({**counts, "ce_sum": ce_total}, losses.with_ce)

    # ----------------------------------------------------------------- refresh

    def step_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                    ) -> list[torch.Tensor]:
        """k x [B, T, V]: step j at index t is slot j of anchor t+1, the draft of x_{t+2+j}
        (zeros where no anchor t+1 exists), every valid position an anchor."""
        valid = attention_mask.bool()
        hidden, p = self.packed_hidden(input_ids, valid, valid)
        head = self.lm.get_output_embeddings()
        b, t = input_ids.shape
        out = []
        for j in range(self.k):
            logits = head(self.slot_rows(hidden, p, j)).float()  # [B, M, V]
            full = logits.new_zeros(b, t + 1, logits.shape[-1])  # [B, T+1, V], T = no anchor
            at = torch.where(p.anchors >= 0, p.anchors, t)  # [B, M]
            full.scatter_(1, at[..., None].expand_as(logits), logits)
            out.append(shift(full[:, :t], 1))  # anchor t+1 -> index t
        return out
