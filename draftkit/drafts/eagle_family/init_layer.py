"""Start the EAGLE-3 decoder layer from one of the target's decoder layers (`draft.init_layer_from`).

A new head's layer is random except for what the target gives it (embedding, lm_head rows:
model.py). This copies target layer n into it, so training starts from a layer that already
turns a residual stream into the next one. The EAGLE-3 layer differs from a target layer in
one place: q/k/v read [input_layernorm(embed(token)) | hidden_norm(h)], width 2H. The mapping:

    q/k/v_proj.weight[:, H:]   <- target q/k/v_proj.weight      (the hidden half)
    q/k/v_proj.weight[:, :H]   kept at the random init          (the token half: no counterpart)
    o_proj, mlp.{gate,up,down}  <- target's, exactly
    hidden_norm                 <- target input_layernorm        (it normalises the hidden stream
                                                                  before q/k/v, as that one does)
    post_attention_layernorm    <- target's;  qwen3 q_norm/k_norm <- target's
    input_layernorm             kept at ones (normalises the token embedding)
    fc (aux fusion)             when the hidden state entering layer n is one of the aux states
                                (aux id n, vLLM's convention), the identity on that aux block and
                                zeros on the others, so fuse(aux) = h_n, the input layer n was
                                trained on; else kept at the random init.

A head with `draft.num_layers` > 1 starts layer i > 0 from target layer n+i, every tensor
copied as it is (those layers read the hidden stream alone, as the target's do; their unused
hidden_norm stays at ones): at init the stack is target layers n..n+L-1 on h_n.

Why the token half stays random rather than a (scaled) copy: the target layer never saw a
token embedding beside its residual, so a copy would only add the embedding to the hidden
stream's queries; the small random init (std 0.02, the baseline's) leaves the token's way in
exactly as the baseline has it, so this lever changes only the hidden path it claims to.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError

# target layer tensor (under model.layers.{n}.) -> draft tensor (under layers.0.)
_COPIED = {
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
    "input_layernorm.weight": "hidden_norm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
}
_HIDDEN_HALF = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_QK_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def resolve_layer(index: int, num_layers: int) -> int:
    """draft.init_layer_from -> a target layer id in [0, N); negatives count from the end."""
    layer = index + num_layers if index < 0 else index
    if not 0 <= layer < num_layers:
        raise DraftkitError(f"draft.init_layer_from={index} names no layer of a target with "
                            f"{num_layers} layers; use 0..{num_layers - 1} or -1..-{num_layers}")
    return layer


def target_layer_tensors(layer: int, target_model=None,
                         path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """Target layer `layer`'s tensors, named as under `model.layers.{layer}.`: from a loaded
    HF *ForCausalLM, else read from the HF dir's safetensors (no full model load)."""
    if target_model is not None:
        base = getattr(target_model, "model", target_model)
        return {k: v.detach() for k, v in base.layers[layer].state_dict().items()}
    from safetensors import safe_open

    path = Path(path)
    prefix = f"model.layers.{layer}."
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({path / f for k, f in json.loads(index.read_text())["weight_map"].items()
                        if k.startswith(prefix)})
    else:
        files = sorted(path.glob("*.safetensors"))
    out = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            out.update({k[len(prefix):]: sf.get_tensor(k).float()
                        for k in sf.keys() if k.startswith(prefix)})
    if not out:
        raise DraftkitError(f"{path} holds no {prefix}* weights; pass a plain HF *ForCausalLM "
                            "dir as the target")
    return out


def layers_to_copy(index: int, num_layers: int, draft_layers: int) -> list[int]:
    """draft.init_layer_from and draft.num_layers -> the target layer of each draft layer."""
    first = resolve_layer(index, num_layers)
    if first + draft_layers > num_layers:
        raise DraftkitError(
            f"draft.init_layer_from={index} starts {draft_layers} draft layers at target layer "
            f"{first}, past the target's last layer {num_layers - 1}; use draft.init_layer_from "
            f"<= {num_layers - draft_layers} (<= -{draft_layers} counting from the end) or fewer "
            "draft.num_layers")
    return [first + i for i in range(draft_layers)]


@torch.no_grad()
def init_from_target_layer(draft, tensors: dict[str, torch.Tensor], layer: int,
                           index: int = 0) -> None:
    """Copy target layer `layer` (`tensors`, see target_layer_tensors) into draft.layers[index];
    for index 0 also set fc as the module docstring says."""
    h = draft.spec.hidden_size
    own = draft.layers[index].state_dict()  # shares storage with the parameters
    pairs = dict(_COPIED)
    if draft.spec.family == "qwen3":
        pairs.update({n: n for n in _QK_NORMS})
    if index > 0:  # a plain decoder layer: q/k/v whole, input_layernorm on the hidden stream
        pairs.update({n: n for n in _HIDDEN_HALF})
        pairs["input_layernorm.weight"] = "input_layernorm.weight"
    for src, dst in pairs.items():
        _copy(own[dst], _need(tensors, src, layer), dst)
    if index > 0:
        return
    for name in _HIDDEN_HALF:
        _copy(own[name][:, h:], _need(tensors, name, layer), name)  # [out, H] of [out, 2H]
    aux = list(draft.spec.aux_layer_ids)
    if layer in aux:
        ht, i = draft.spec.target_hidden_size, aux.index(layer)
        if ht != h:
            raise DraftkitError(f"fc cannot pass aux state {layer} through: the target hidden "
                                f"size {ht} differs from the draft's {h}")
        fc = draft.fc.weight  # [H, A*Ht]
        fc.zero_()
        fc[:, i * ht:(i + 1) * ht] = torch.eye(h, dtype=fc.dtype, device=fc.device)


def _need(tensors: dict[str, torch.Tensor], name: str, layer: int) -> torch.Tensor:
    if name not in tensors:
        raise DraftkitError(f"target layer {layer} has no {name}; draft.init_layer_from needs "
                            f"a llama/qwen3-style decoder layer")
    return tensors[name]


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise DraftkitError(f"draft.init_layer_from: the draft's {name} is {tuple(dst.shape)} "
                            f"but the target layer's is {tuple(src.shape)}; the draft layer must "
                            "have the target's shapes (leave draft.hidden_size, heads, head_dim "
                            "and intermediate_size at 0 = the target's)")
    dst.copy_(src.to(dst.dtype))
