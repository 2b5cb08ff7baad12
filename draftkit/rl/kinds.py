"""What refresh, publish and swap need from a draft kind, and the EAGLE-3 implementation.

A kind answers five questions (the draft-LM kind registers itself the same way):
    load(dir, policy_model, k)          the published draft, its frozen target parts from the policy,
                                        in fp32 on the policy's device
    features(model, policy_model, ids, mask)   the policy's tensors the draft's batch needs
                                        (always "last" [B, T, H], the policy's pre-norm state),
                                        fp32 on the policy's device
    step_logits(model, batch)           k x [B, T, Vd]: step j at index t drafts x_{t+2+j}
                                        (teacher-forced), plus vocab_ids [Vd] -> target ids
    export(model, tmp, final, cfg)      write a dir vLLM loads as it is into `tmp`
    engine_view(dir)                    the published tensors as vLLM's drafter holds them
                                        (names, fused qkv/gate_up): what the swap check hashes
The model's `forward(batch) -> (loss, metrics)` is what fine-tuning calls, for every kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from draftkit.core.errors import DraftkitError


class DraftKind(Protocol):
    name: str
    method: str  # vLLM speculative_config method

    def load(self, directory: Path, policy_model, k: int) -> torch.nn.Module: ...

    def features(self, model, policy_model, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def step_logits(self, model, batch: dict) -> tuple[list[torch.Tensor], torch.Tensor]: ...

    def export(self, model, tmp: Path, final: Path, cfg) -> None: ...

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]: ...


class Eagle3Kind:
    name, method = "eagle3", "eagle3"

    def load(self, directory: Path, policy_model, k: int):
        from draftkit.drafts.eagle3.model import Eagle3Draft

        return Eagle3Draft.from_pretrained(directory, policy_model, ttt_steps=k).float().to(
            device_of(policy_model))

    def features(self, model, policy_model, input_ids, attention_mask):
        from draftkit.target.capture import capture

        device = device_of(policy_model)
        aux, last = capture(policy_model, input_ids.to(device), model.spec.aux_layer_ids,
                            attention_mask=attention_mask.to(device))
        return {"aux": aux.float(), "last": last.float()}  # [B, T, A*H], [B, T, H]

    def step_logits(self, model, batch):
        steps = model.ttt_unroll(batch["aux"], batch["input_ids"],
                                 batch["attention_mask"])  # k x [B, T, Vd]
        vocab_ids = model.draft_to_target(torch.arange(model.spec.draft_vocab_size,
                                                       device=model.d2t.device))  # [Vd]
        return steps, vocab_ids

    def export(self, model, tmp: Path, final: Path, cfg) -> None:
        from draftkit.drafts.eagle3 import format as fmt
        from draftkit.export.stage import write_files

        spec = fmt.with_k(model.spec, cfg.draft.num_speculative_tokens)
        tensors = model.export_state_dict()
        fmt.check_state_dict(spec, tensors)
        write_files(tmp, final, spec, tensors, cfg)

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]:
        """vLLM's Eagle3LlamaForCausalLM names: `model.` prefix, fused qkv and gate_up,
        d2t -> draft_id_to_target_id, t2d dropped (embed_tokens is the target's, not ours)."""
        from safetensors.torch import load_file

        t = load_file(str(Path(directory) / "model.safetensors"))
        out = {}
        for name, value in t.items():
            if name == "t2d" or "embed_tokens" in name:
                continue
            if name == "d2t":
                out["draft_id_to_target_id"] = value
            elif name.startswith("lm_head"):
                out[name] = value
            else:
                out["model." + name] = value
        return fuse_projections(out)


def device_of(model: torch.nn.Module) -> torch.device:
    """Where a model's weights are (the policy's: where refresh runs the draft too)."""
    return next(model.parameters()).device


def fuse_projections(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """q/k/v_proj -> qkv_proj and gate/up_proj -> gate_up_proj, as vLLM stores them."""
    out = dict(t)
    for parts, fused in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"),
                         (("gate_proj", "up_proj"), "gate_up_proj")):
        for name in [n for n in t if f".{parts[0]}." in n]:
            names = [name.replace(f".{parts[0]}.", f".{p}.") for p in parts]
            if all(n in t for n in names):
                out[name.replace(f".{parts[0]}.", f".{fused}.")] = torch.cat([t[n] for n in names])
                for n in names:
                    out.pop(n)
    return out


KINDS: dict[str, DraftKind] = {"eagle3": Eagle3Kind()}
# kinds defined beside their model: importing the module registers the kind
_MODULES = {"draft-lm": "draftkit.drafts.draft_lm.kind"}


def register(kind: DraftKind) -> None:
    KINDS[kind.name] = kind


def get(name: str) -> DraftKind:
    if name not in KINDS and name in _MODULES:
        import importlib

        try:
            importlib.import_module(_MODULES[name])
        except ImportError:
            pass
    if name not in KINDS:
        raise DraftkitError(f"draft kind {name!r} cannot be refreshed yet; refreshable kinds: "
                            f"{', '.join(sorted(KINDS))}")
    return KINDS[name]
