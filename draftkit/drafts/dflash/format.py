"""The DFlash checkpoint vLLM 0.32 serves with `method: "dflash"`: config.json <-> `DFlashSpec`,
the tensors it loads, and the learned mask embedding file.

What vLLM reads (model_executor/models/qwen3_dflash.py, config/speculative.py,
v1/spec_decode/llm_base_proposer.py, v1/worker/gpu/spec_decode/eagle/eagle3_utils.py):
- config.json: `architectures: ["DFlashDraftModel"]` (registry -> DFlashQwen3ForCausalLM),
  `model_type: "qwen3"` (a Qwen3 decoder config: widths, heads, `head_dim`, `rms_norm_eps`,
  `num_hidden_layers` = the draft's layers), `dflash_config: {mask_token_id,
  target_layer_ids}`. `target_layer_ids` are 0-based layer OUTPUTS: vLLM adds 1 to get the aux
  ids it captures, so draftkit's aux id a (vLLM convention, id k = state entering layer k) is
  written as a - 1; a top-level `target_layer_ids` is ignored for DFlash. RoPE: vLLM defaults
  theta to 1e6 when the config has none, so `rope_theta` and `rope_parameters` are written
  from the target's (SmolLM2: 1e5). `draft_vocab_size` and `target_hidden_size` as EAGLE-3.
  `block_size` (k + 1) is informative: vLLM takes k from the speculative config.
- model.safetensors, names without a `model.` prefix: `layers.{i}.self_attn.{q,k,v,o}_proj`,
  `layers.{i}.self_attn.{q,k}_norm`, `layers.{i}.mlp.{gate,up,down}_proj`,
  `layers.{i}.{input,post_attention}_layernorm`, `fc.weight` [H, A*Ht], `hidden_norm`, `norm`,
  `lm_head` [Vd, H], and `d2t`/`t2d` for a reduced vocab (vLLM skips t2d). `embed_tokens` is
  left out: vLLM then shares the target's (the widths match).
- mask_embedding.pt beside them: {"mask_token_id": m, "embedding": [H]}. A full target vocab
  (SmolLM2, tiny-llama) has no spare id, so the mask token is an existing id (`mask_token_for`)
  whose query-slot embedding vLLM replaces by this learned vector wherever the id appears.
The decoder fields (written, read back, taken from a run) and the shape check of the state dict
are the EAGLE-3 format's (drafts/eagle_family/format.py).
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path

import torch

from draftkit.core import artifacts, registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import format as eagle3_fmt
from draftkit.drafts.eagle_family.vocab import validate

FORMAT_VERSION = 1
ARCHITECTURE = "DFlashDraftModel"
CONFIG_FILE, WEIGHTS_FILE, MASK_FILE = "config.json", "model.safetensors", "mask_embedding.pt"
DEFAULT_LAYERS = 2  # draft.num_layers = 0; >1 also exercises vLLM's per-layer context k_norm


@dataclass
class DFlashSpec:
    """Shapes, numerics, taps and target of a DFlash draft (`family` is always qwen3: the
    draft's layers have per-head q/k norms whatever the target's family)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    target_vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]  # vLLM convention (target_layer_ids + 1)
    num_layers: int
    mask_token_id: int
    num_speculative_tokens: int
    target_num_layers: int
    verifier_name_or_path: str = ""
    target_name: str = ""
    family: str = "qwen3"

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    @property
    def block_size(self) -> int:
        return self.num_speculative_tokens + 1


def check_taps(aux: list[int], num_layers: int) -> None:
    """Taps are distinct ascending aux ids in [1, N-1]: id 0 (the embeddings) has no
    target_layer_id, and id N (the last layer's output) is what HF returns after the final
    norm while vLLM captures it before: a tap there trains on other features than it serves."""
    if not aux or any(b <= a for a, b in zip(aux, aux[1:], strict=False)):
        raise DraftkitError(f"DFlash taps {list(aux)} must be non-empty, distinct and ascending "
                            "(vLLM collects each target layer once, in ascending order)")
    if aux[0] < 1 or aux[-1] > num_layers - 1:
        raise DraftkitError(
            f"DFlash taps {list(aux)} (draft.aux_layer_ids, vLLM convention) must lie in "
            f"[1, {num_layers - 1}]: id 0 has no target layer id and id {num_layers} is the "
            "last layer's output, which HF returns normed and vLLM does not. Set "
            f"draft.aux_layer_ids, e.g. {registry.default_aux_layer_ids(num_layers)}")


def spec_from_run_config(cfg, draft_vocab_size: int, mask_token_id: int,
                         verifier_name_or_path: str = "") -> DFlashSpec:
    """DFlashSpec for a run (`cfg` is a config.RunConfig): widths from the target."""
    t, d = cfg.target, cfg.draft
    if (d.hidden_size or t.hidden_size) != t.hidden_size:
        raise DraftkitError(f"draft.hidden_size={d.hidden_size} differs from the target's "
                            f"{t.hidden_size}: the DFlash draft reads the target's token "
                            f"embeddings; set draft.hidden_size={t.hidden_size} (or 0)")
    aux = registry.aux_layer_ids(cfg)
    check_taps(aux, t.num_hidden_layers)
    if d.num_layers < 0:
        raise DraftkitError(f"draft.num_layers={d.num_layers}: a DFlash draft has 1 or more "
                            f"layers (0 = {DEFAULT_LAYERS})")
    return DFlashSpec(
        **eagle3_fmt.decoder_from_run(cfg), draft_vocab_size=draft_vocab_size, aux_layer_ids=aux,
        num_layers=d.num_layers or DEFAULT_LAYERS, mask_token_id=int(mask_token_id),
        num_speculative_tokens=d.num_speculative_tokens, target_num_layers=t.num_hidden_layers,
        verifier_name_or_path=verifier_name_or_path, target_name=t.name)


def with_k(spec: DFlashSpec, k: int) -> DFlashSpec:
    return dataclasses.replace(spec, num_speculative_tokens=k)


def to_config(spec: DFlashSpec) -> dict:
    """config.json as vLLM's DFlash loader reads it (module docstring)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        **eagle3_fmt.decoder_config(spec),
        "draft_vocab_size": spec.draft_vocab_size,
        "num_hidden_layers": spec.num_layers,
        "num_target_layers": spec.target_num_layers,
        "target_hidden_size": spec.target_hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "block_size": spec.block_size,
        "dflash_config": {"mask_token_id": spec.mask_token_id,
                          "target_layer_ids": [a - 1 for a in spec.aux_layer_ids]},
        "draftkit": {"format_version": FORMAT_VERSION, "target": spec.target_name,
                     "verifier": spec.verifier_name_or_path},
        **eagle3_fmt.rope_scaling_config(spec),
    }


def from_config(d: dict) -> DFlashSpec:
    """Parse a DFlash config.json (draftkit's or a foreign one with the same layout)."""
    if ARCHITECTURE not in (d.get("architectures") or []) or "dflash_config" not in d:
        raise DraftkitError(f"config.json is not a DFlash draft (architectures="
                            f"{d.get('architectures')}, needs {ARCHITECTURE!r} and dflash_config)")
    dc = d["dflash_config"]
    if dc.get("mask_token_id") is None or not dc.get("target_layer_ids"):
        raise DraftkitError("dflash_config needs mask_token_id and target_layer_ids (vLLM "
                            "refuses a DFlash draft without them)")
    if d.get("layer_types") and "sliding_attention" in d["layer_types"]:
        raise DraftkitError("draftkit loads DFlash drafts with full attention only")
    decoder = eagle3_fmt.decoder_from_config(d, d, 1e6)  # vLLM's default RoPE theta: 1e6
    extra = d.get("draftkit") or {}
    block = int(d.get("block_size") or 4)
    return DFlashSpec(
        **decoder, aux_layer_ids=[int(i) + 1 for i in dc["target_layer_ids"]],
        num_layers=int(d.get("num_hidden_layers", 1)), mask_token_id=int(dc["mask_token_id"]),
        num_speculative_tokens=block - 1,
        target_num_layers=int(d.get("num_target_layers") or 0),
        verifier_name_or_path=extra.get("verifier", ""), target_name=extra.get("target", ""))


# ----------------------------------------------------------------------------- tensors


def expected_shapes(spec: DFlashSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor vLLM loads for this spec (embed_tokens left out: shared from the target)."""
    h, ht, inter = spec.hidden_size, spec.target_hidden_size, spec.intermediate_size
    q, kv = spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
    shapes = {"fc.weight": (h, spec.num_aux * ht), "hidden_norm.weight": (h,),
              "norm.weight": (h,), "lm_head.weight": (spec.draft_vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        shapes.update({
            f"{p}self_attn.q_proj.weight": (q, h), f"{p}self_attn.k_proj.weight": (kv, h),
            f"{p}self_attn.v_proj.weight": (kv, h), f"{p}self_attn.o_proj.weight": (h, q),
            f"{p}self_attn.q_norm.weight": (spec.head_dim,),
            f"{p}self_attn.k_norm.weight": (spec.head_dim,),
            f"{p}mlp.gate_proj.weight": (inter, h), f"{p}mlp.up_proj.weight": (inter, h),
            f"{p}mlp.down_proj.weight": (h, inter), f"{p}input_layernorm.weight": (h,),
            f"{p}post_attention_layernorm.weight": (h,)})
    if spec.draft_vocab_size < spec.target_vocab_size:
        shapes["d2t"] = (spec.draft_vocab_size,)
        shapes["t2d"] = (spec.target_vocab_size,)
    return shapes


def check_state_dict(spec: DFlashSpec, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse what vLLM would load wrongly: a missing d2t, stray or missing tensors, shapes."""
    if not 0 <= spec.mask_token_id < spec.target_vocab_size:
        raise DraftkitError(f"mask_token_id={spec.mask_token_id} is outside the target vocab "
                            f"(0..{spec.target_vocab_size - 1})")
    eagle3_fmt.check_shapes(tensors, expected_shapes(spec), "DFlash")
    if "d2t" in tensors:
        if tensors["d2t"].dtype != torch.int64:
            raise DraftkitError("d2t must be int64 (vLLM loads it into a long tensor)")
        validate(tensors["d2t"], tensors["t2d"].bool())


def write_mask_embedding(path: Path, mask_token_id: int, embedding: torch.Tensor) -> None:
    """mask_embedding.pt as vLLM's `_read_mask_embedding` reads it (atomic write)."""
    buf = io.BytesIO()
    torch.save({"mask_token_id": int(mask_token_id),
                "embedding": embedding.detach().float().cpu().reshape(-1).clone()}, buf)
    artifacts.write_bytes_atomic(path, buf.getvalue())


def read_mask_embedding(path: Path, mask_token_id: int) -> torch.Tensor:
    """The [H] mask embedding of `path`, checked against the config's mask token."""
    if not path.is_file():
        raise DraftkitError(f"{path} is missing: a DFlash draft over a vocab with no spare id "
                            "needs its learned mask embedding (vLLM would embed the mask slots "
                            "as the plain token)")
    state = torch.load(path, weights_only=True)
    if isinstance(state, dict):
        if state.get("mask_token_id", mask_token_id) != mask_token_id:
            raise DraftkitError(f"{path} is for mask token {state.get('mask_token_id')}, the "
                                f"config says {mask_token_id}")
        state = state["embedding"]
    return state.reshape(-1).float()
