"""A small HF causal LM as a trainable draft: `forward(batch) -> (loss, metrics)` for the
generic loop (train/loop.py), distilled from the target's full-vocabulary distribution.

The batch is the EAGLE-3 trainer's (train/stage.py): input_ids, loss_mask, attention_mask
[B, T] and `last` [B, T, H_target], the target's last decoder output before its final norm,
either read from the stored harvest shards (train.mode=stored) or computed by the target in the
loop (online).
The target's logits are `lm_head(norm(last))` (targets/capture.py `logits_from_last`),
computed here from frozen copies of the target's final norm and lm_head (`target_norm`,
`target_lm_head`, never saved with the draft). Alignment needs no shift: the draft at
position p has read x_0..x_p, like the target's `last[p]`, and both score x_{p+1}.

Memory and time: logits are [N, V] over the full vocab (49k-152k). Only positions whose next
token is an assistant token are scored, in chunks of `chunk` rows (~2^26 logits), by
`losses.linear_distill`, which computes lm_head, loss and gradient chunk by chunk in one pass:
one chunk's logits alive at a time, and no second pass over [N, V] in the backward.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from draftkit.core.errors import DraftkitError
from draftkit.core.hardware import autocast_dtype
from draftkit.drafts.acceptance import shift
from draftkit.drafts.divergence import KL
from draftkit.drafts.lm_family import losses


class DraftLM(nn.Module):
    # frozen copies of the target's tensors: training holds them in its compute dtype
    FROZEN_TARGET_PARTS = ("target_norm", "target_lm_head")

    def __init__(self, lm: nn.Module, target_norm: torch.Tensor, target_lm_head: torch.Tensor,
                 rms_norm_eps: float, num_speculative_tokens: int = 3, ce_weight: float = 0.0,
                 chunk: int = 0):
        super().__init__()
        vocab = target_lm_head.shape[0]
        if lm.get_output_embeddings().weight.shape[0] != vocab:
            raise DraftkitError(f"draft LM vocab {lm.get_output_embeddings().weight.shape[0]} != "
                                f"target vocab {vocab}: the draft needs the target's tokenizer")
        if not 0.0 <= ce_weight <= 1.0:
            raise DraftkitError(f"train.ce_weight={ce_weight} must be in [0, 1]")
        self.lm = lm
        self.k, self.ce_weight, self.eps = num_speculative_tokens, ce_weight, rms_norm_eps
        self.chunk = chunk or max(128, (1 << 26) // vocab)  # rows per [rows, V] logits chunk
        self.divergence = KL  # train.loss: the train stage and refresh set the run's
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

    def compile_parts(self) -> list[nn.Module]:
        """What train.compile compiles: the small LM's decoder layers."""
        return list(self.lm.get_decoder().layers)

    # ----------------------------------------------------------------- training

    def target_logits(self, last: torch.Tensor) -> torch.Tensor:
        """last [N, H] (target pre-norm) -> target logits [N, V] (fp32, no grad)."""
        return losses.target_logits_from_last(last, self.target_norm, self.target_lm_head,
                                              self.eps)

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Distillation loss over a right-padded batch (see the module docstring)."""
        ids, valid = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        learn = valid & batch["loss_mask"].bool()  # [B, T] tokens the draft must predict
        need = valid & shift(learn, 1)  # [B, T] positions p whose x_{p+1} is learned
        hidden = self.lm.get_decoder()(input_ids=ids, attention_mask=batch["attention_mask"],
                                       use_cache=False).last_hidden_state  # [B, T, Hd] normed
        dtype = autocast_dtype(hidden.device.type)  # the lm_head matmuls follow train.dtype
        head = self.lm.get_output_embeddings().weight  # [V, Hd] (tied: the embedding)
        loss_sum, kl_sum, ce_sum, hits = losses.linear_distill(
            hidden[need], head, batch["last"][need], shift(ids, 1)[need],  # [N, Hd], [N, H], [N]
            self.target_norm, self.target_lm_head, self.eps, self.ce_weight, self.divergence,
            self.chunk, dtype)
        correct = torch.zeros_like(need)  # [B, T]
        correct[need] = hits
        n = need.sum().clamp(min=1)  # no host sync: metrics stay on the device until read
        return loss_sum / n, losses.metrics(correct, need, self.k, kl_sum, ce_sum)

    # ----------------------------------------------------------------- save

    def save_pretrained(self, directory: str | Path) -> Path:
        """The draft LM alone as an HF dir (config.json + model.safetensors); no target parts."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(directory, safe_serialization=True)
        return directory
