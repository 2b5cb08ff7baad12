"""What the draft-LM family's kinds share as a draft kind (drafts/kind.py), the draft-lm kind's
behaviour that PARD inherits: a small HF causal LM that shares the target's tokenizer, served by
vLLM as `method: draft_model` from a plain HF dir; its harvest needs only the target's last
pre-norm state (draft.aux_layer_ids = [N]), the distillation target; `draft.init` and its
checks (build.py); refresh's `load` (the published LM wrapped in `model_cls` with the policy's
final norm and lm_head) and `features` ({"last"}); the `engine_view` vLLM holds once q/k/v and
gate/up are fused. Not a kind itself (no kind.py here, nothing registered):
drafts/draft_lm/kind.py and drafts/pard/kind.py subclass it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError
from draftkit.drafts.kind import (
    SERVED_TARGET_DIFFERS,
    KindDefaults,
    device_of,
    draft_sampling,
    fuse_projections,
)
from draftkit.drafts.lm_family.build import describe_init, load_lm, resolve_init
from draftkit.drafts.lm_family.model import DraftLM
from draftkit.targets.capture import capture


class LMFamilyKind(KindDefaults):
    likely_causes = ("the draft's tokenizer or vocab differs from the target's",
                     SERVED_TARGET_DIFFERS)
    model_cls = DraftLM  # what `load` wraps the published LM in (PARD: PardLM)

    # ----------------------------------------------------------------- init, train

    def resolve(self, cfg, info) -> None:
        if not cfg.draft.aux_layer_ids:  # the last state (id N) only: harvest no more
            cfg.draft.aux_layer_ids = [info.num_hidden_layers]
        resolve_init(cfg, info)  # sibling | truncate | scratch, checked against the target

    def describe(self, cfg) -> str | None:
        return describe_init(cfg)

    def check_train(self, cfg) -> None:
        if cfg.train.feature_noise:
            raise DraftkitError("train.feature_noise is for EAGLE-3 heads (noise on the "
                                "target's features); set train.feature_noise=0 for "
                                f"draft.kind={self.name}")
        if cfg.train.freeze_head:
            raise DraftkitError("train.freeze_head fixes an EAGLE-3 head's norm and lm_head; "
                                f"set train.freeze_head=false for draft.kind={self.name}")

    # ----------------------------------------------------------------- export, eval

    def speculative_config(self, directory: str | Path, k: int | None,
                           sample: str = "greedy") -> dict:
        return {"method": "draft_model", "model": str(directory), "num_speculative_tokens": k,
                **draft_sampling(sample)}

    def export_shapes(self, conf: dict, cfg) -> dict[str, tuple]:
        return {"vocab": (conf.get("vocab_size"), cfg.target.vocab_size)}

    def load_export(self, directory: Path, target_model) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(directory)

    def aux_layer_ids(self, draft) -> list[int] | None:
        return None  # the target's plain logits suffice

    # ----------------------------------------------------------------- refresh

    def load(self, directory: Path, policy_model, k: int) -> DraftLM:
        lm, _ = load_lm(Path(directory))
        base = getattr(policy_model, "model", policy_model)
        return self.model_cls(lm, base.norm.weight, policy_model.lm_head.weight,
                              float(policy_model.config.rms_norm_eps), k).float().to(
                                  device_of(policy_model))

    def features(self, model, policy_model, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        device = device_of(policy_model)
        n = policy_model.config.num_hidden_layers
        _, last = capture(policy_model, input_ids.to(device), [n],
                          attention_mask=attention_mask.to(device))
        return {"last": last.float()}  # [B, T, H]

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]:
        """HF names are vLLM's for a plain *ForCausalLM draft once q/k/v and gate/up are
        fused; a tied lm_head is not stored (vLLM ties it to the embedding)."""
        from safetensors.torch import load_file

        return fuse_projections(load_file(str(Path(directory) / "model.safetensors")))
