"""The draft LM as a refreshable draft kind (the `DraftKind` protocol of draftkit/rl/kinds.py):
what refresh, drift, publish and the live swap need, registered on import.

    load(dir, policy_model, k)   the published HF dir as a `DraftLM`, its frozen target parts
                                 (final norm, lm_head) copied from the current policy
    features(...)                {"last": [B, T, H]}: the policy's pre-norm last state, the only
                                 tensor the distillation loss needs
    step_logits(model, batch)    k x [B, T, V]: step j at index t drafts x_{t+2+j} teacher-
                                 forced, i.e. the draft's logits at position t+1+j; full vocab
    export(model, tmp, final, cfg)   the same plain HF dir `draftkit export` writes
    engine_view(dir)             the published tensors under vLLM's names (fused qkv/gate_up),
                                 what a swap into a live engine is checked against
Fine-tuning calls `DraftLM.forward(batch) -> (loss, metrics)` like the trainer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.drafts.draft_lm.model import DraftLM
from draftkit.drafts.eagle3.losses import shift
from draftkit.rl.kinds import device_of, fuse_projections, register


class DraftLMKind:
    name, method = "draft-lm", "draft_model"

    def load(self, directory: Path, policy_model, k: int) -> DraftLM:
        from draftkit.drafts.draft_lm.build import load_lm

        lm, _ = load_lm(Path(directory))
        base = getattr(policy_model, "model", policy_model)
        return DraftLM(lm, base.norm.weight, policy_model.lm_head.weight,
                       float(policy_model.config.rms_norm_eps), k).float().to(
                           device_of(policy_model))

    def features(self, model, policy_model, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        from draftkit.target.capture import capture

        device = device_of(policy_model)
        n = policy_model.config.num_hidden_layers
        _, last = capture(policy_model, input_ids.to(device), [n],
                          attention_mask=attention_mask.to(device))
        return {"last": last.float()}  # [B, T, H]

    def step_logits(self, model: DraftLM, batch: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
        logits = model.lm(input_ids=batch["input_ids"],
                          attention_mask=batch["attention_mask"]).logits  # [B, T, V]
        vocab = logits.shape[-1]
        # step j at index t is the draft's prediction at t+1+j (zeros past the end)
        steps = [shift(logits, 1 + j) for j in range(model.k)]  # k x [B, T, V]
        return steps, torch.arange(vocab, device=logits.device)  # [V]: draft id = target id

    def export(self, model: DraftLM, tmp: Path, final: Path, cfg) -> None:
        from transformers import AutoTokenizer

        from draftkit.drafts.draft_lm.export import write_files
        from draftkit.target.load import run_target_dir

        write_files(tmp, final, model.lm, AutoTokenizer.from_pretrained(run_target_dir(cfg.target)), cfg)

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]:
        """HF names are vLLM's for a plain *ForCausalLM draft once q/k/v and gate/up are
        fused; a tied lm_head is not stored (vLLM ties it to the embedding)."""
        from safetensors.torch import load_file

        return fuse_projections(load_file(str(Path(directory) / "model.safetensors")))


register(DraftLMKind())
