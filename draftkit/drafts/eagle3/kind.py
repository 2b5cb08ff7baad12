"""The EAGLE-3 head as a draft kind (drafts/kind.py): one decoder layer over the target's
token embedding and fused aux hidden states, served by vLLM as `method: eagle3` from a
speculators-format dir. Its harvest needs: the aux states `draft.aux_layer_ids` (default
[2, N//2, N-3], vLLM's convention) and the last pre-norm state. What P-EAGLE shares with it
(harvest, speculative config, refresh features, engine view, vLLM patch) is the family's
(drafts/eagle_family/kind_base.py); here: where an EAGLE-3 head starts, its export and loading.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.drafts.eagle3.build import build
from draftkit.drafts.eagle3.export import export_run, write_files
from draftkit.drafts.eagle_family import format as fmt
from draftkit.drafts.eagle_family.drafter import Eagle3Drafter
from draftkit.drafts.eagle_family.kind_base import EagleFamilyKind
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.kind import device_of, register


class Eagle3Kind(EagleFamilyKind):
    name, method = "eagle3", "eagle3"

    # ----------------------------------------------------------------- init, train

    def describe(self, cfg) -> str | None:
        return None

    def check_train(self, cfg) -> None:
        return None  # every train.* setting applies to a head

    def build(self, cfg, data_runs: list, target) -> torch.nn.Module:
        return build(cfg, data_runs, target)

    # ----------------------------------------------------------------- export, eval

    def export_run(self, run) -> Path:
        return export_run(run)

    def export_shapes(self, conf: dict, cfg) -> dict[str, tuple]:
        spec = fmt.from_config(conf)
        t = cfg.target
        return {"hidden size": (spec.hidden_size, t.hidden_size),
                "target hidden size": (spec.target_hidden_size, t.hidden_size),
                "vocab": (spec.target_vocab_size, t.vocab_size)}

    def load_export(self, directory: Path, target_model) -> torch.nn.Module:
        return Eagle3Draft.from_pretrained(directory, target_model=target_model)

    def reference_drafter(self, draft, target):
        return Eagle3Drafter(draft, target)

    # ----------------------------------------------------------------- refresh

    def load(self, directory: Path, policy_model, k: int):
        return Eagle3Draft.from_pretrained(directory, policy_model, ttt_steps=k).float().to(
            device_of(policy_model))

    def export(self, model, tmp: Path, final: Path, cfg) -> None:
        spec = fmt.with_k(model.spec, cfg.draft.num_speculative_tokens)
        tensors = model.export_state_dict()
        fmt.check_state_dict(spec, tensors)
        write_files(tmp, final, spec, tensors, cfg)


KIND = register(Eagle3Kind())
