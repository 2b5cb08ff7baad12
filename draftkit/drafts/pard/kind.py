"""PARD (Parallel Draft, AMD 2025) as a draft kind (drafts/kind.py): a small draft LM, as the
draft-lm kind's, trained to propose all k tokens in one forward from k-1 appended mask tokens.
vLLM 0.32 serves it as `method: draft_model` with `parallel_drafting: true`, reading the mask
token id `pard_token` from the draft's config.json (v1/spec_decode/llm_base_proposer.py).

Everything the draft-lm kind does (init modes, tokenizer checks, its harvest of the target's
last state, the export dir, features, engine view) is reused as it is, from the LM family both
subclass (drafts/lm_family/kind_base.py); what differs: `build`
picks the mask token (build.py) and trains the packed parallel positions (layout.py, model.py),
the export says `parallel_drafting` (export.py), the reference decoder drafts k tokens from one
forward (drafter.py), and refresh's `step_logits` are the parallel slots, not shifted LM logits.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError
from draftkit.drafts.kind import register
from draftkit.drafts.lm_family.kind_base import LMFamilyKind
from draftkit.drafts.pard.build import build_pard
from draftkit.drafts.pard.drafter import PardDrafter
from draftkit.drafts.pard.export import export_run, write_files
from draftkit.drafts.pard.model import PardLM
from draftkit.targets.load import run_target_dir


class PardKind(LMFamilyKind):
    name, method = "pard", "draft_model"
    model_cls = PardLM  # `load` (LMFamilyKind's) wraps the published LM in it

    # ----------------------------------------------------------------- init, train

    def resolve(self, cfg, info) -> None:
        super().resolve(cfg, info)  # draft.init / model / num_layers, aux ids = [N]
        if cfg.draft.num_speculative_tokens < 1:
            raise DraftkitError(f"draft.num_speculative_tokens={cfg.draft.num_speculative_tokens}"
                                ": a PARD draft proposes k >= 1 tokens per forward")

    def describe(self, cfg) -> str | None:
        line = super().describe(cfg)
        return f"{line}; trained as PARD (k={cfg.draft.num_speculative_tokens} drafts per forward)"

    # check_train: the LM family's (no feature noise, no frozen head)

    def build(self, cfg, data_runs: list, target) -> torch.nn.Module:
        return build_pard(cfg, target)

    # ----------------------------------------------------------------- export, eval

    def export_run(self, run) -> Path:
        return export_run(run)

    def speculative_config(self, directory: str | Path, k: int | None,
                           sample: str = "greedy") -> dict:
        """The draft-lm config with `parallel_drafting`: vLLM 0.32 drafts a draft_model
        autoregressively unless told (it reads the mask token from config.json's pard_token)."""
        return {**super().speculative_config(directory, k, sample), "parallel_drafting": True}

    def export_shapes(self, conf: dict, cfg) -> dict[str, tuple]:
        token = conf.get("pard_token")
        ok = isinstance(token, int) and 0 <= token < cfg.target.vocab_size
        return {**super().export_shapes(conf, cfg),
                "pard_token": (token, token if ok else f"an id < {cfg.target.vocab_size}")}

    # load_export: the HF model (its config keeps pard_token)

    def reference_drafter(self, draft, target):
        return PardDrafter(draft)

    # aux_layer_ids: none (the target's plain logits suffice)

    # ----------------------------------------------------------------- refresh


    # features: the LM family's {"last"}

    def step_logits(self, model: PardLM, batch: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
        steps = model.step_logits(batch["input_ids"], batch["attention_mask"])  # k x [B, T, V]
        return steps, torch.arange(steps[0].shape[-1], device=steps[0].device)  # draft = target id

    def export(self, model: PardLM, tmp: Path, final: Path, cfg) -> None:
        from transformers import AutoTokenizer


        write_files(tmp, final, model.lm, AutoTokenizer.from_pretrained(run_target_dir(cfg.target)),
                    cfg)

    # engine_view: the LM family's (HF names, fused q/k/v and gate/up)


KIND = register(PardKind())
