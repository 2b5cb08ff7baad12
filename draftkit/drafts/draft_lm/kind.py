"""The draft LM as a draft kind (drafts/kind.py): a small HF causal LM that shares the
target's tokenizer, served by vLLM as `method: draft_model` from a plain HF dir. Its harvest
needs: only the target's last pre-norm state (draft.aux_layer_ids = [N]), the distillation
target. Refresh: `load` wraps the published LM with the policy's final norm and lm_head,
`features` gives {"last"}, `step_logits` are the LM's own logits teacher-forced (draft id =
target id), `engine_view` the HF names vLLM holds once q/k/v and gate/up are fused. What PARD
shares with it (init, checks, speculative config, load, features, engine view) is the LM
family's (drafts/lm_family/kind_base.py); here: its build, export, drafter and step logits.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.drafts.acceptance import shift
from draftkit.drafts.draft_lm.build import build_draft_lm
from draftkit.drafts.draft_lm.drafter import HFDraftLM
from draftkit.drafts.draft_lm.export import export_run
from draftkit.drafts.kind import register
from draftkit.drafts.lm_family.export import write_files
from draftkit.drafts.lm_family.kind_base import LMFamilyKind
from draftkit.drafts.lm_family.model import DraftLM
from draftkit.targets.load import run_target_dir


class DraftLMKind(LMFamilyKind):
    name, method = "draft-lm", "draft_model"

    # ----------------------------------------------------------------- init, train

    def build(self, cfg, data_runs: list, target) -> torch.nn.Module:
        return build_draft_lm(cfg, target)

    # ----------------------------------------------------------------- export, eval

    def export_run(self, run) -> Path:
        return export_run(run)

    def reference_drafter(self, draft, target):
        return HFDraftLM(draft)

    # ----------------------------------------------------------------- refresh

    def step_logits(self, model: DraftLM, batch: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
        logits = model.lm(input_ids=batch["input_ids"],
                          attention_mask=batch["attention_mask"]).logits  # [B, T, V]
        vocab = logits.shape[-1]
        # step j at index t is the draft's prediction at t+1+j (zeros past the end)
        steps = [shift(logits, 1 + j) for j in range(model.k)]  # k x [B, T, V]
        return steps, torch.arange(vocab, device=logits.device)  # [V]: draft id = target id

    def export(self, model: DraftLM, tmp: Path, final: Path, cfg) -> None:
        from transformers import AutoTokenizer


        write_files(tmp, final, model.lm, AutoTokenizer.from_pretrained(run_target_dir(cfg.target)), cfg)


KIND = register(DraftLMKind())
