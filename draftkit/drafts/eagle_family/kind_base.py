"""What the EAGLE-family kinds share as a draft kind (drafts/kind.py), EAGLE-3's behaviour that
P-EAGLE inherits: the harvest (the aux states `draft.aux_layer_ids`, default [2, N//2, N-3],
vLLM's convention, and the last pre-norm state), vLLM's `method: eagle3` speculative config,
refresh's features and teacher-forced step logits, the engine view of a speculators-format dir
and the draft-vocab argmax patch; DFlash's kind takes the refresh features, vocab ids and the
engine's tensor names from here. Not a kind itself (no kind.py here, nothing registered):
drafts/eagle3/kind.py and drafts/peagle/kind.py subclass it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core import registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import draft_argmax
from draftkit.drafts.kind import (
    SERVED_TARGET_DIFFERS,
    KindDefaults,
    device_of,
    draft_sampling,
    fuse_projections,
)
from draftkit.targets.capture import capture


class EagleFamilyKind(KindDefaults):
    likely_causes = (
        "norm flags (norm_before_residual/norm_before_fc/fc_norm/norm_output) differ between "
        "training and config.json",
        "eagle_aux_hidden_state_layer_ids do not name the layers the draft was trained on "
        "(vLLM convention: id k = hidden entering layer k)",
        "vocab map: d2t missing/wrong, or the draft vocab built from another tokenizer",
        "RoPE: rope_theta/rope scaling of transformer_layer_config differs from the target's",
        SERVED_TARGET_DIFFERS,
    )

    # ----------------------------------------------------------------- init

    def resolve(self, cfg, info) -> None:
        d = cfg.draft
        if not d.aux_layer_ids:
            d.aux_layer_ids = info.default_aux_layer_ids
        if d.draft_vocab_size > info.vocab_size:
            raise DraftkitError(
                f"draft vocab {d.draft_vocab_size} is larger than {info.name}'s vocab "
                f"({info.vocab_size}); set draft.draft_vocab_size <= {info.vocab_size} "
                f"(default rule gives {registry.draft_vocab_rule(info.vocab_size)})")

    # ----------------------------------------------------------------- export, eval

    def speculative_config(self, directory: str | Path, k: int | None,
                           sample: str = "greedy") -> dict:
        return {"method": "eagle3", "model": str(directory), "num_speculative_tokens": k,
                **draft_sampling(sample)}

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

    def features(self, model, policy_model, input_ids, attention_mask):
        return capture_features(model, policy_model, input_ids, attention_mask)

    def step_logits(self, model, batch):
        steps = model.ttt_unroll(batch["aux"], batch["input_ids"],
                                 batch["attention_mask"])  # k x [B, T, Vd]
        return steps, draft_vocab_ids(model)

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]:
        """vLLM's Eagle3LlamaForCausalLM names: `model.` prefix, fused qkv and gate_up,
        d2t -> draft_id_to_target_id, t2d dropped (embed_tokens is the target's, not ours)."""
        from safetensors.torch import load_file

        return fuse_projections(vllm_names(load_file(str(Path(directory) / "model.safetensors"))))

    # ----------------------------------------------------------------- inside vLLM

    def vllm_patches(self) -> list:
        return [draft_argmax.install]  # greedy drafts: argmax over the draft vocab (CPU only)


def capture_features(model, policy_model, input_ids, attention_mask) -> dict[str, torch.Tensor]:
    """A batch's harvest features under `policy_model` (refresh), captured by hooks: the
    states of the draft's `spec.aux_layer_ids` and the last pre-norm state, fp32."""
    device = device_of(policy_model)
    aux, last = capture(policy_model, input_ids.to(device), model.spec.aux_layer_ids,
                        attention_mask=attention_mask.to(device))
    return {"aux": aux.float(), "last": last.float()}  # [B, T, A*H], [B, T, H]


def draft_vocab_ids(model) -> torch.Tensor:
    """The target id of every draft-vocab id [Vd] (step_logits' vocab ids)."""
    return model.draft_to_target(torch.arange(model.spec.draft_vocab_size,
                                              device=model.d2t.device))


def vllm_names(tensors: dict[str, torch.Tensor],
               drop_embed: bool = True) -> dict[str, torch.Tensor]:
    """A draft dir's tensors under the names vLLM's model holds them: a `model.` prefix, but
    lm_head as it is and d2t as draft_id_to_target_id; t2d dropped (vLLM skips it), and with
    `drop_embed` any embed_tokens (vLLM shares the target's)."""
    out = {}
    for name, value in tensors.items():
        if name == "t2d" or (drop_embed and "embed_tokens" in name):
            continue
        if name == "d2t":
            out["draft_id_to_target_id"] = value
        elif name.startswith("lm_head"):
            out[name] = value
        else:
            out["model." + name] = value
    return out
