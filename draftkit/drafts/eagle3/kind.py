"""The EAGLE-3 head as a draft kind (drafts/kind.py): one decoder layer over the target's
token embedding and fused aux hidden states, served by vLLM as `method: eagle3` from a
speculators-format dir. Its harvest needs: the aux states `draft.aux_layer_ids` (default
[2, N//2, N-3], vLLM's convention) and the last pre-norm state.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core import registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle3 import draft_argmax
from draftkit.drafts.eagle3 import format as fmt
from draftkit.drafts.eagle3.build import build
from draftkit.drafts.eagle3.drafter import Eagle3Drafter
from draftkit.drafts.eagle3.export import export_run, write_files
from draftkit.drafts.eagle3.model import Eagle3Draft
from draftkit.drafts.kind import (
    SERVED_TARGET_DIFFERS,
    KindDefaults,
    device_of,
    draft_sampling,
    fuse_projections,
    register,
)
from draftkit.target.capture import capture


class Eagle3Kind(KindDefaults):
    name, method = "eagle3", "eagle3"
    likely_causes = (
        "norm flags (norm_before_residual/norm_before_fc/fc_norm/norm_output) differ between "
        "training and config.json",
        "eagle_aux_hidden_state_layer_ids do not name the layers the draft was trained on "
        "(vLLM convention: id k = hidden entering layer k)",
        "vocab map: d2t missing/wrong, or the draft vocab built from another tokenizer",
        "RoPE: rope_theta/rope scaling of transformer_layer_config differs from the target's",
        SERVED_TARGET_DIFFERS,
    )

    # ----------------------------------------------------------------- init, train

    def resolve(self, cfg, info) -> None:
        d = cfg.draft
        if not d.aux_layer_ids:
            d.aux_layer_ids = info.default_aux_layer_ids
        if d.draft_vocab_size > info.vocab_size:
            raise DraftkitError(
                f"draft vocab {d.draft_vocab_size} is larger than {info.name}'s vocab "
                f"({info.vocab_size}); set draft.draft_vocab_size <= {info.vocab_size} "
                f"(default rule gives {registry.draft_vocab_rule(info.vocab_size)})")

    def describe(self, cfg) -> str | None:
        return None

    def check_train(self, cfg) -> None:
        return None  # every train.* setting applies to a head

    def build(self, cfg, data_runs: list, target) -> torch.nn.Module:
        return build(cfg, data_runs, target)

    # ----------------------------------------------------------------- export, eval

    def export_run(self, run) -> Path:
        return export_run(run)

    def speculative_config(self, directory: str | Path, k: int | None,
                           sample: str = "greedy") -> dict:
        return {"method": "eagle3", "model": str(directory), "num_speculative_tokens": k,
                **draft_sampling(sample)}

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

    def draft_step_call(self, draft, batch: int, position: int):
        """`draft.step` on one new row per sequence (no KV cache: eval/costs.py's c_draft)."""
        p = next(draft.parameters())
        ids = torch.zeros(batch, 1, dtype=torch.long, device=p.device)  # [b, 1]
        hidden = torch.randn(batch, 1, draft.spec.hidden_size, dtype=p.dtype, device=p.device)
        pos = torch.full((batch, 1), position, dtype=torch.long, device=p.device)  # [b, 1]
        return lambda: draft.step(ids, hidden, pos)

    def aux_layer_ids(self, draft) -> list[int] | None:
        return list(draft.spec.aux_layer_ids)

    # ----------------------------------------------------------------- refresh

    def load(self, directory: Path, policy_model, k: int):
        return Eagle3Draft.from_pretrained(directory, policy_model, ttt_steps=k).float().to(
            device_of(policy_model))

    def features(self, model, policy_model, input_ids, attention_mask):
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

    # ----------------------------------------------------------------- inside vLLM

    def vllm_patches(self) -> list:
        return [draft_argmax.install]  # greedy drafts: argmax over the draft vocab (CPU only)


KIND = register(Eagle3Kind())
