"""The DFlash draft as a draft kind (drafts/kind.py): a block-diffusion draft whose ONE forward
proposes all k tokens (model.py), served by vLLM 0.32 as `method: "dflash"` (format.py). Its
harvest is EAGLE-3's: the tap states `draft.aux_layer_ids` (vLLM convention; default EAGLE-3's
[2, N//2, N-3], never the last layer) and the last pre-norm state for the verifier's targets.
The block is k+1 slots (k = draft.num_speculative_tokens), trained and served the same.
Its vLLM patch is the CPU context k_norm fix (vllm_patch.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from draftkit.core import artifacts, registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts.dflash import format as fmt
from draftkit.drafts.dflash import vllm_patch
from draftkit.drafts.dflash.build import build
from draftkit.drafts.dflash.drafter import DFlashDrafter
from draftkit.drafts.dflash.export import export_run, write_files
from draftkit.drafts.dflash.model import DFlashDraft
from draftkit.drafts.eagle_family.export import portable
from draftkit.drafts.eagle_family.kind_base import capture_features, draft_vocab_ids, vllm_names
from draftkit.drafts.kind import KindDefaults, device_of, draft_sampling, fuse_projections, register


class DFlashKind(KindDefaults):
    name, method = "dflash", "dflash"

    # ----------------------------------------------------------------- init, train

    def resolve(self, cfg, info) -> None:
        d = cfg.draft
        if not d.aux_layer_ids:
            d.aux_layer_ids = info.default_aux_layer_ids
        fmt.check_taps(list(d.aux_layer_ids), info.num_hidden_layers)
        if d.draft_vocab_size > info.vocab_size:
            raise DraftkitError(
                f"draft vocab {d.draft_vocab_size} is larger than {info.name}'s vocab "
                f"({info.vocab_size}); set draft.draft_vocab_size <= {info.vocab_size} "
                f"(default rule gives {registry.draft_vocab_rule(info.vocab_size)})")

    def describe(self, cfg) -> str | None:
        k = cfg.draft.num_speculative_tokens
        return (f"DFlash: one draft forward proposes a block of k={k} tokens (vLLM method "
                f"dflash), conditioned on target layers {list(cfg.draft.aux_layer_ids)}")

    def check_train(self, cfg) -> None:
        k, steps = cfg.draft.num_speculative_tokens, cfg.train.ttt_steps
        if steps != k:
            raise DraftkitError(
                f"train.ttt_steps={steps} but draft.num_speculative_tokens={k}: a DFlash block "
                f"is bidirectional, so it serves exactly the k it was trained with. Set "
                f"train.ttt_steps={k}")

    def build(self, cfg, data_runs: list, target) -> torch.nn.Module:
        return build(cfg, data_runs, target)

    # ----------------------------------------------------------------- export, eval

    def export_run(self, run) -> Path:
        return export_run(run)

    def speculative_config(self, directory: str | Path, k: int | None,
                           sample: str = "greedy") -> dict:
        return {"method": "dflash", "model": str(directory), "num_speculative_tokens": k,
                **draft_sampling(sample)}

    def export_shapes(self, conf: dict, cfg) -> dict[str, tuple]:
        spec = fmt.from_config(conf)
        t = cfg.target
        return {"hidden size": (spec.hidden_size, t.hidden_size),
                "target hidden size": (spec.target_hidden_size, t.hidden_size),
                "vocab": (spec.target_vocab_size, t.vocab_size)}

    def load_export(self, directory: Path, target_model) -> torch.nn.Module:
        return DFlashDraft.from_pretrained(directory, target_model)

    def reference_drafter(self, draft, target):
        return DFlashDrafter(draft, target)

    @torch.no_grad()
    def draft_step_call(self, draft, batch: int, position: int):
        """One vLLM DFlash step of `batch` sequences at `position` (eval/costs.py's c_draft):
        context K/V of the k+1 newest verified tokens beside `position` cached ones, then the
        block of k+1 queries and the lm_head on its k mask slots."""
        p = next(draft.parameters())
        s, spec = draft.num_slots + 1, draft.spec
        like = {"dtype": p.dtype, "device": p.device}
        aux = torch.randn(batch, s, spec.num_aux * spec.target_hidden_size, **like)
        new_pos = torch.arange(position - s, position, device=p.device).clamp(min=0)
        shape = (batch, spec.num_key_value_heads, max(position - s, 0), spec.head_dim)
        cached = [(torch.randn(shape, **like), torch.randn(shape, **like)) for _ in draft.layers]
        first = torch.zeros(batch, 1, dtype=torch.long, device=p.device)
        first_pos = torch.full((batch, 1), position, dtype=torch.long, device=p.device)
        see = torch.ones(batch, 1, shape[2] + s, dtype=torch.bool, device=p.device)

        def call():
            new = draft.context_kv(aux, new_pos.expand(batch, -1))
            kv = [(torch.cat([ck, nk], 2), torch.cat([cv, nv], 2))
                  for (ck, cv), (nk, nv) in zip(cached, new, strict=True)]
            return draft.lm_head(draft.run_blocks(kv, see, first, first_pos)[:, 0, 1:])
        return call

    def aux_layer_ids(self, draft) -> list[int] | None:
        return list(draft.spec.aux_layer_ids)

    # ----------------------------------------------------------------- refresh

    def load(self, directory: Path, policy_model, k: int):
        """The published draft for a refresh, its mask embedding frozen: vLLM reads
        mask_embedding.pt only when it loads a draft, from the engine's first draft dir (an
        in-place reload re-reads that file), so a refreshed version keeps the embedding the
        running engine holds and a swap serves it whole."""

        model = DFlashDraft.from_pretrained(directory, policy_model)
        if model.num_slots != k:
            raise DraftkitError(f"{directory} drafts blocks of {model.num_slots} tokens, the "
                                f"refresh asks for k={k}: a DFlash draft serves the k it was "
                                "trained with")
        model.mask_embedding.requires_grad_(False)
        return model.float().to(device_of(policy_model))

    def features(self, model, policy_model, input_ids, attention_mask):
        return capture_features(model, policy_model, input_ids, attention_mask)

    def step_logits(self, model, batch):
        states = model.block_states(batch["aux"], batch["input_ids"], batch["attention_mask"])
        steps = [model.lm_head(s) for s in states]  # k x [B, T, Vd]
        return steps, draft_vocab_ids(model)

    def export(self, model, tmp: Path, final: Path, cfg) -> None:
        spec = portable(fmt.with_k(model.spec, cfg.draft.num_speculative_tokens), cfg)
        tensors = model.export_state_dict()
        fmt.check_state_dict(spec, tensors)
        write_files(tmp, final, spec, tensors, model.mask_embedding, cfg)

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]:
        """vLLM's DFlashQwen3ForCausalLM names: `model.` prefix (lm_head and d2t ->
        draft_id_to_target_id excepted), fused qkv/gate_up, t2d dropped, and the mask
        embedding file as `model.mask_embedding`."""
        directory = Path(directory)
        out = vllm_names(load_file(str(directory / fmt.WEIGHTS_FILE)), drop_embed=False)
        conf = fmt.from_config(artifacts.read_json(directory / fmt.CONFIG_FILE))
        out["model.mask_embedding"] = fmt.read_mask_embedding(directory / fmt.MASK_FILE,
                                                              conf.mask_token_id)
        return fuse_projections(out)

    # ----------------------------------------------------------------- inside vLLM

    def vllm_patches(self) -> list:
        return [vllm_patch.install]  # the CPU context k_norm (vllm_patch.py)

    @torch.no_grad()
    def after_load(self, drafter) -> bool:
        """vLLM stacks the layers' context-KV weights, k_norm rows and RoPE cache once, at load
        (`_build_fused_kv_buffers`, also run inside the reload's load_weights while vLLM's
        layerwise reload holds the tensors on the meta device). Rebuild them from the reloaded
        modules; where vLLM-CPU repacked the linear weights and emptied `weight`, the fused KV
        weight comes from the layers applied to the identity. False where the drafter is no
        DFlash model."""
        inner = getattr(getattr(drafter, "model", None), "model", None)
        if inner is None or not hasattr(inner, "_build_fused_kv_buffers"):
            return False
        inner._build_fused_kv_buffers()
        if getattr(inner, "_fused_kv_weight", None) is not None:  # else vLLM runs the modules
            attns = [layer.self_attn for layer in inner.layers]
            inner._fused_kv_weight = torch.cat([_weight(a.qkv_proj)[a.q_size:] for a in attns])
        return True


def _weight(linear) -> torch.Tensor:
    """A vLLM linear's [out, in] weight; vLLM-CPU empties `weight` when it repacks it, then
    it is the layer applied to the identity (as serving/drafter_swap.py's hashes read it)."""
    if linear.weight.numel():
        return linear.weight.data
    eye = torch.eye(linear.input_size, dtype=linear.weight.dtype, device=linear.weight.device)
    return linear.quant_method.apply(linear, eye, None).t().contiguous()


KIND = register(DFlashKind())
