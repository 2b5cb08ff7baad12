"""The speculators/vLLM EAGLE-3 checkpoint format: config.json <-> `DraftSpec`, and the checks
that a state dict is exactly what vLLM's `Eagle3LlamaForCausalLM`/`Eagle3Qwen3ForCausalLM` load.

What vLLM 0.32 reads (transformers_utils/configs/speculators/algos.py, models/*_eagle3.py):
- top level: `speculators_model_type`, `speculators_config.proposal_methods[0].speculative_tokens`,
  `speculators_config.verifier.name_or_path`, `transformer_layer_config` (becomes the draft's HF
  config; `model_type` llama|qwen3 picks the class), `draft_vocab_size`, `target_hidden_size`,
  `eagle_aux_hidden_state_layer_ids` and the norm flags. A missing `norm_before_residual`
  defaults to TRUE there, so every flag is written explicitly.
- RoPE: `transformer_layer_config.rope_parameters` (transformers 5); `rope_theta` and, for
  scaled RoPE, `rope_scaling` are written too for older readers.
- weights: `d2t` only when draft vocab < target vocab (vLLM has no slot for it otherwise and
  fails on the unexpected tensor), `t2d` is skipped by vLLM, `embed_tokens.weight` is optional:
  when absent vLLM shares the target's embedding (draftkit's choice: not exported, the draft
  keeps a frozen copy of the target's embedding, so both are identical at serving time).
`draftkit` adds one extra top-level key (`draftkit`: registry name of the target) that vLLM
ignores; it lets `from_pretrained` find the target offline.
The decoder fields of the config (written, read back, taken from a run) and the state dict's
shape check are shared with the DFlash format (drafts/dflash/format.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from draftkit.core import registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family.vocab import validate

FORMAT_VERSION = 1
NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
FAMILIES = ("llama", "qwen3")


@dataclass
class DraftSpec:
    """Everything that fixes the draft's shapes, numerics and its target."""

    family: str  # llama | qwen3 (decoder layer of the target's family)
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # None = plain RoPE; else e.g. {"rope_type": "llama3", ...}
    max_position_embeddings: int
    target_vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    num_speculative_tokens: int
    verifier_name_or_path: str  # hub id, or the local HF dir the draft was trained against
    verifier_architecture: str
    target_name: str = ""  # draftkit registry name ('' for foreign checkpoints)
    num_layers: int = 1  # decoder layers (`num_hidden_layers`); EAGLE-3 has one

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)


def check_aux_ids(ids: list[int]) -> None:
    """vLLM feeds the draft each aux layer once, in ascending order (it sorts a set of the ids,
    models/interfaces.py), so only strictly increasing ids train what vLLM serves."""
    if not ids or any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        raise DraftkitError(
            f"aux layer ids {list(ids)} must be non-empty, distinct and ascending: vLLM collects "
            f"each target layer once in ascending order, so it would feed the draft "
            f"{sorted(set(ids))}. Set draft.aux_layer_ids to distinct ascending ids "
            "(e.g. [1, 3, 5] for a 6-layer target).")


def spec_from_run_config(cfg, draft_vocab_size: int, verifier_name_or_path: str) -> DraftSpec:
    """DraftSpec for a run (`cfg` is a config.RunConfig)."""
    t, d = cfg.target, cfg.draft
    if t.family not in FAMILIES:
        raise DraftkitError(f"target family {t.family!r} has no EAGLE-3 layer in vLLM; "
                            f"target.family must be one of {', '.join(FAMILIES)}")
    hidden = d.hidden_size or t.hidden_size
    if hidden != t.hidden_size:
        raise DraftkitError(
            f"draft.hidden_size={hidden} differs from the target's hidden size {t.hidden_size}: "
            "vLLM's EAGLE-3 layer consumes the target's token embeddings, so they must match; "
            f"set draft.hidden_size={t.hidden_size}")
    if d.draft_vocab_size and d.draft_vocab_size != draft_vocab_size:
        raise DraftkitError(f"the draft vocab has {draft_vocab_size} tokens but the run config "
                            f"says draft.draft_vocab_size={d.draft_vocab_size}; rebuild the vocab "
                            "from the config value")
    aux = registry.aux_layer_ids(cfg)
    check_aux_ids(aux)
    if d.num_layers < 0:
        raise DraftkitError(f"draft.num_layers={d.num_layers}: an EAGLE-3 head has 1 or more "
                            "decoder layers (0 = 1)")
    return DraftSpec(
        family=t.family, **decoder_from_run(cfg), draft_vocab_size=draft_vocab_size,
        aux_layer_ids=aux, norm_before_residual=d.norm_before_residual,
        norm_before_fc=d.norm_before_fc, fc_norm=d.fc_norm, norm_output=d.norm_output,
        num_speculative_tokens=d.num_speculative_tokens,
        verifier_name_or_path=verifier_name_or_path, verifier_architecture=t.architecture,
        target_name=t.name, num_layers=d.num_layers or 1)


def decoder_from_run(cfg) -> dict:
    """The decoder spec fields of a run's draft: draft.* widths where set, else the target's;
    the target's hidden size (the draft reads its embeddings), norm eps, RoPE and vocab."""
    t, d = cfg.target, cfg.draft
    return dict(
        hidden_size=t.hidden_size, intermediate_size=d.intermediate_size or t.intermediate_size,
        num_attention_heads=d.num_attention_heads or t.num_attention_heads,
        num_key_value_heads=d.num_key_value_heads or t.num_key_value_heads,
        head_dim=d.head_dim or t.head_dim, rms_norm_eps=t.rms_norm_eps,
        rope_theta=float(t.rope_theta),
        rope_scaling=dict(t.rope_scaling) if t.rope_scaling else None,
        max_position_embeddings=t.max_position_embeddings, target_vocab_size=t.vocab_size,
        target_hidden_size=t.hidden_size)


def rope_parameters(spec: DraftSpec) -> dict:
    """transformers-5 `rope_parameters`: {"rope_type", "rope_theta", scaling keys...}."""
    params = {"rope_type": "default"}
    if spec.rope_scaling:
        params.update({k: v for k, v in spec.rope_scaling.items() if k != "type"})
        params.setdefault("rope_type", spec.rope_scaling.get("type", "default"))
    params["rope_theta"] = spec.rope_theta
    return params


def decoder_config(spec) -> dict:
    """The decoder fields of an HF config a draft's config.json carries (EAGLE-3's
    transformer_layer_config, DFlash's top level): widths, heads, norm eps, RoPE, the TARGET
    vocab (embedding + mapped logits)."""
    return {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": rope_parameters(spec),
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": spec.target_vocab_size,
    }


def rope_scaling_config(spec) -> dict:
    """`rope_scaling` for older readers of a scaled RoPE, else nothing."""
    if not spec.rope_scaling:
        return {}
    return {"rope_scaling": {k: v for k, v in rope_parameters(spec).items() if k != "rope_theta"}}


def transformer_layer_config(spec: DraftSpec) -> dict:
    return {"model_type": spec.family, **decoder_config(spec), "num_hidden_layers": spec.num_layers,
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            **rope_scaling_config(spec)}


def to_config(spec: DraftSpec) -> dict:
    """The speculators-format config.json (no top-level model_type)."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": spec.num_speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": spec.verifier_name_or_path,
                         "architectures": [spec.verifier_architecture]},
        },
        "transformer_layer_config": transformer_layer_config(spec),
        "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        **{flag: bool(getattr(spec, flag)) for flag in NORM_FLAGS},
        "embed_requires_grad": False,
        "draftkit": {"format_version": FORMAT_VERSION, "target": spec.target_name},
    }


def from_config(d: dict) -> DraftSpec:
    """Parse a speculators EAGLE-3 config.json, with vLLM's defaults for absent keys."""
    if d.get("speculators_model_type") != "eagle3":
        raise DraftkitError("config.json is not a speculators EAGLE-3 config "
                            f"(speculators_model_type={d.get('speculators_model_type')!r})")
    layer = dict(d["transformer_layer_config"])
    if (layer.get("num_hidden_layers", 1) < 1 or layer.get("hidden_act", "silu") != "silu"
            or layer.get("attention_bias") or "sliding_attention" in (layer.get("layer_types") or [])):
        raise DraftkitError("draftkit loads EAGLE-3 heads with full-attention silu decoder "
                            "layers without biases; this checkpoint is a different variant")
    decoder = decoder_from_config(layer, d, 10000.0)
    spec_cfg = d["speculators_config"]
    verifier = spec_cfg.get("verifier", {})
    aux = d.get("eagle_aux_hidden_state_layer_ids") or []
    return DraftSpec(
        family=layer.get("model_type", "llama"), **decoder,
        aux_layer_ids=list(aux) if aux else [],
        norm_before_residual=bool(d.get("norm_before_residual", True)),  # vLLM's default
        norm_before_fc=bool(d.get("norm_before_fc", False)),
        fc_norm=bool(d.get("fc_norm", False)), norm_output=bool(d.get("norm_output", False)),
        num_speculative_tokens=spec_cfg["proposal_methods"][0]["speculative_tokens"],
        verifier_name_or_path=verifier.get("name_or_path") or "",
        verifier_architecture=(verifier.get("architectures") or [""])[0],
        target_name=(d.get("draftkit") or {}).get("target", ""),
        num_layers=int(layer.get("num_hidden_layers", 1)))


def decoder_from_config(layer: dict, top: dict, default_theta: float) -> dict:
    """The spec fields `decoder_config` wrote, read from `layer` (the decoder's HF config) with
    vLLM's defaults for absent keys (RoPE theta: `default_theta`); the draft vocab and target
    hidden size from `top` (config.json's top level), else the layer's."""
    rope = dict(layer.get("rope_parameters") or layer.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", layer.get("rope_theta", default_theta)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    heads = layer["num_attention_heads"]
    return dict(
        hidden_size=layer["hidden_size"], intermediate_size=layer["intermediate_size"],
        num_attention_heads=heads, num_key_value_heads=layer.get("num_key_value_heads", heads),
        head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_scaling=None if rope_type == "default" else rope,
        max_position_embeddings=layer.get("max_position_embeddings", 4096),
        target_vocab_size=layer["vocab_size"],
        draft_vocab_size=top.get("draft_vocab_size") or layer["vocab_size"],
        target_hidden_size=top.get("target_hidden_size") or layer["hidden_size"])


def with_k(spec: DraftSpec, k: int) -> DraftSpec:
    return dataclasses.replace(spec, num_speculative_tokens=k)


# ----------------------------------------------------------------------------- state dict


def expected_shapes(spec: DraftSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor vLLM loads for this spec (embed_tokens excluded: optional)."""
    h, ht, a = spec.hidden_size, spec.target_hidden_size, spec.num_aux
    q, kv, inter = spec.num_attention_heads * spec.head_dim, \
        spec.num_key_value_heads * spec.head_dim, spec.intermediate_size
    shapes = {"fc.weight": (h, a * ht), "norm.weight": (h,),
              "lm_head.weight": (spec.draft_vocab_size, h)}
    for i in range(spec.num_layers):
        p, width = f"layers.{i}.", (2 if i == 0 else 1) * h  # layer 0 reads [embed | hidden]
        shapes.update({
            f"{p}self_attn.q_proj.weight": (q, width),
            f"{p}self_attn.k_proj.weight": (kv, width),
            f"{p}self_attn.v_proj.weight": (kv, width),
            f"{p}self_attn.o_proj.weight": (h, q),
            f"{p}mlp.gate_proj.weight": (inter, h),
            f"{p}mlp.up_proj.weight": (inter, h),
            f"{p}mlp.down_proj.weight": (h, inter),
            f"{p}input_layernorm.weight": (h,),
            f"{p}hidden_norm.weight": (h,),  # vLLM builds it in every layer (used by layer 0)
            f"{p}post_attention_layernorm.weight": (h,),
        })
        if spec.family == "qwen3":
            shapes[f"{p}self_attn.q_norm.weight"] = (spec.head_dim,)
            shapes[f"{p}self_attn.k_norm.weight"] = (spec.head_dim,)
    if spec.norm_before_fc:
        shapes["input_norm.weight"] = (a * ht,)
    if spec.fc_norm:
        shapes.update({f"fc_norm.{i}.weight": (ht,) for i in range(a)})
    if spec.draft_vocab_size < spec.target_vocab_size:
        shapes["d2t"] = (spec.draft_vocab_size,)
        shapes["t2d"] = (spec.target_vocab_size,)
    return shapes


def check_state_dict(spec: DraftSpec, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse anything vLLM would load wrongly: missing d2t, stray tensors, wrong shapes."""
    check_aux_ids(spec.aux_layer_ids)
    reduced = spec.draft_vocab_size < spec.target_vocab_size
    if reduced and "d2t" not in tensors:
        raise DraftkitError(
            f"refusing a reduced-vocab draft ({spec.draft_vocab_size} of "
            f"{spec.target_vocab_size} tokens) without `d2t`: vLLM would read draft id i as "
            "target id i and acceptance collapses. Save the model with Eagle3Draft."
            "save_pretrained, which writes d2t/t2d from its DraftVocab.")
    check_shapes(tensors, expected_shapes(spec), "EAGLE-3",
                 optional={"embed_tokens.weight": (spec.target_vocab_size, spec.hidden_size)},
                 fix=". Re-save the checkpoint with the draftkit version that trained it, or fix "
                     "config.json.")
    if reduced:
        t2d = tensors.get("t2d")
        if t2d is None or t2d.dtype != torch.bool:
            raise DraftkitError("t2d must be a bool tensor over the target vocab")
        validate(tensors["d2t"].to(torch.int64), t2d)
        if tensors["d2t"].dtype != torch.int64:
            raise DraftkitError(f"d2t must be int64 (vLLM loads it into a long tensor), got "
                                f"{tensors['d2t'].dtype}")


def check_shapes(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]],
                 draft: str, optional: dict[str, tuple[int, ...]] | None = None,
                 fix: str = "") -> None:
    """Refuse a state dict whose tensors are not exactly `expected` (plus any of `optional`)
    with those shapes; `draft` names the kind of draft, `fix` ends the message."""
    allowed = expected | (optional or {})
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(allowed))
    wrong = [f"{k}: {tuple(v.shape)} != {allowed[k]}" for k, v in tensors.items()
             if k in allowed and tuple(v.shape) != allowed[k]]
    if missing or unexpected or wrong:
        raise DraftkitError(
            f"the {draft} state dict does not match its config (vLLM would fail or load it "
            f"wrongly): missing={missing} unexpected={unexpected} wrong_shape={wrong}{fix}")
