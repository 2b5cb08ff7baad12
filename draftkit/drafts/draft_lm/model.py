"""A small HF causal LM as a trainable draft: `forward(batch) -> (loss, metrics)` for the
generic loop (train/loop.py), distilled from the target's full-vocabulary distribution.

The batch is the EAGLE-3 trainer's (train/stage.py): input_ids, loss_mask, attention_mask
[B, T] and `last` [B, T, H_target], the target's last decoder output before its final norm,
either read from harvest shards (offline) or computed by the target in the loop (online).
The target's logits are `lm_head(norm(last))` (target/capture.py `logits_from_last`),
computed here from frozen copies of the target's final norm and lm_head (`target_norm`,
`target_lm_head`, never saved with the draft). Alignment needs no shift: the draft at
position p has read x_0..x_p, like the target's `last[p]`, and both score x_{p+1}.

Memory: logits are [N, V] over the full vocab (49k-152k). Only positions whose next token is
an assistant token are scored, in chunks of `chunk` rows, each chunk under activation
checkpointing, so one chunk's logits are alive at a time, in the backward pass too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftkit.core.errors import DraftkitError
from draftkit.drafts.draft_lm import losses


class DraftLM(nn.Module):
    def __init__(self, lm: nn.Module, target_norm: torch.Tensor, target_lm_head: torch.Tensor,
                 rms_norm_eps: float, num_speculative_tokens: int = 3, ce_weight: float = 0.0,
                 chunk: int = 1024):
        super().__init__()
        vocab, hidden = target_lm_head.shape
        if lm.get_output_embeddings().weight.shape[0] != vocab:
            raise DraftkitError(f"draft LM vocab {lm.get_output_embeddings().weight.shape[0]} != "
                                f"target vocab {vocab}: the draft needs the target's tokenizer")
        if not 0.0 <= ce_weight <= 1.0:
            raise DraftkitError(f"train.ce_weight={ce_weight} must be in [0, 1]")
        self.lm = lm
        self.k, self.ce_weight, self.chunk, self.eps = num_speculative_tokens, ce_weight, chunk, \
            rms_norm_eps
        # Frozen parameters rather than buffers: DDP would re-broadcast a [V, H] buffer each step.
        self.target_norm = nn.Parameter(target_norm.detach().float().clone(), requires_grad=False)
        self.target_lm_head = nn.Parameter(target_lm_head.detach().float().clone(),
                                           requires_grad=False)

    @classmethod
    def for_target(cls, lm: nn.Module, target_model: nn.Module, cfg) -> DraftLM:
        """Wrap `lm` with the norm/lm_head of a loaded HF target and the run's settings."""
        base = getattr(target_model, "model", target_model)
        return cls(lm, base.norm.weight, target_model.lm_head.weight,
                   float(target_model.config.rms_norm_eps), cfg.draft.num_speculative_tokens,
                   cfg.train.ce_weight)

    # ----------------------------------------------------------------- training

    def target_logits(self, last: torch.Tensor) -> torch.Tensor:
        """last [N, H] (target pre-norm) -> target logits [N, V] (fp32, no grad)."""
        x = last.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # RMSNorm
        return torch.nn.functional.linear(x * self.target_norm, self.target_lm_head)

    def _chunk_terms(self, hidden: torch.Tensor, last: torch.Tensor, labels: torch.Tensor):
        """hidden [n, Hd] draft final states, last [n, H], labels [n] -> distill_terms."""
        with torch.no_grad():
            tgt = self.target_logits(last)  # [n, V]
        logits = self.lm.get_output_embeddings()(hidden)  # [n, V]
        return losses.distill_terms(logits, tgt, labels, self.ce_weight)

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Distillation loss over a right-padded batch (see the module docstring)."""
        ids, valid = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        learn = valid & batch["loss_mask"].bool()  # [B, T] tokens the draft must predict
        need = valid & _next(learn)  # [B, T] positions p whose x_{p+1} is learned
        base = self.lm.get_decoder()
        hidden = base(input_ids=ids, attention_mask=batch["attention_mask"],
                      use_cache=False).last_hidden_state  # [B, T, Hd], after the final norm
        h, last, labels = hidden[need], batch["last"][need], _next(ids)[need]  # [N, Hd], [N, H], [N]
        loss_sum, kl_sum, ce_sum = hidden.sum() * 0.0, 0.0, 0.0  # keeps a graph if N == 0
        correct = torch.zeros_like(need)  # [B, T]
        hits = []
        for s in range(0, h.shape[0], self.chunk):
            piece = (h[s:s + self.chunk], last[s:s + self.chunk], labels[s:s + self.chunk])
            if torch.is_grad_enabled():
                terms = checkpoint(self._chunk_terms, *piece, use_reentrant=False)
            else:
                terms = self._chunk_terms(*piece)
            loss_sum = loss_sum + terms[0]
            kl_sum, ce_sum = kl_sum + float(terms[1]), ce_sum + float(terms[2])
            hits.append(terms[3])
        if hits:
            correct[need] = torch.cat(hits)
        n = max(1, h.shape[0])
        return loss_sum / n, losses.metrics(correct, need, self.k, kl_sum, ce_sum)

    # ----------------------------------------------------------------- save

    def save_pretrained(self, directory: str | Path) -> Path:
        """The draft LM alone as an HF dir (config.json + model.safetensors); no target parts."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(directory, safe_serialization=True)
        return directory


def _next(x: torch.Tensor) -> torch.Tensor:
    """x[:, p] <- x[:, p+1], zero/False at the end: [B, T] -> [B, T]."""
    return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
