"""Capture the target's hidden states in the vLLM/speculators aux-layer convention, with forward
hooks (one decoder pass, no lm_head): the harvest's tensors, and the same in memory for online
training (`OnlineCapture`).

Capture convention (docs/design.md): aux id `k` is the hidden state *entering* decoder layer `k`
(the output of layer `k-1`, residual added); id `N` is the last decoder output *before* the
final norm. With N=30: id 2 = output of layers[1], id 15 = output of layers[14], id 30 = output
of layers[29] (pre-norm). HF's `hidden_states[k]` equals id `k` for k < N; HF's last entry is
post-norm unless `config.tie_last_hidden_states=False`.
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError
from draftkit.core.registry import default_aux_layer_ids


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = getattr(model, "model", model)
    return base.layers


def check_layer_ids(layer_ids: list[int], num_layers: int) -> None:
    bad = [i for i in layer_ids if not 0 <= i <= num_layers]
    if layer_ids != sorted(set(layer_ids)):
        raise DraftkitError(
            f"aux layer ids {layer_ids} must be distinct and ascending: vLLM sorts and "
            "deduplicates them, so any other order trains a different fc input than vLLM "
            f"serves. Use e.g. {sorted(set(layer_ids))}.")
    if bad:
        raise DraftkitError(
            f"aux layer ids {bad} are out of range for a target with {num_layers} layers: ids "
            f"follow the vLLM convention (0 = embeddings, k = entering layer k, {num_layers} = last "
            f"output before the final norm). Default: {default_aux_layer_ids(num_layers)}. "
            "SpecForge/ModelOpt ids are one lower (layer outputs): add 1 when importing them."
        )


@torch.no_grad()
def capture(model: torch.nn.Module, input_ids: torch.Tensor, aux_layer_ids: list[int],
            attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the target's decoder (no lm_head) and return (aux, last).

    aux:  [B, T, len(aux_layer_ids) * H]  hidden states at the aux ids, concatenated in order
    last: [B, T, H]                       output of the last layer before the final norm (id N)
    The final norm + lm_head applied to `last` reproduce the target's logits.
    """
    layers = decoder_layers(model)
    n = len(layers)
    check_layer_ids(aux_layer_ids, n)
    wanted = sorted(set(aux_layer_ids) | {n})
    got: dict[int, torch.Tensor] = {}
    hooks = []
    base = getattr(model, "model", model)
    if 0 in wanted:
        hooks.append(base.embed_tokens.register_forward_hook(
            lambda _m, _i, out: got.__setitem__(0, out)))
    for k in wanted:
        if k == 0:
            continue
        # id k = output of layers[k-1]
        hooks.append(layers[k - 1].register_forward_hook(
            lambda _m, _i, out, k=k: got.__setitem__(k, out[0] if isinstance(out, tuple) else out)))
    try:
        base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
             use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    aux = torch.cat([got[k] for k in aux_layer_ids], dim=-1)  # [B, T, A*H]
    return aux, got[n]


def logits_from_last(model: torch.nn.Module, last: torch.Tensor) -> torch.Tensor:
    """Target logits from the stored pre-norm last state: lm_head(norm(last))."""
    base = getattr(model, "model", model)
    return model.lm_head(base.norm(last.to(model.lm_head.weight.dtype)))


class OnlineCapture:
    """The harvest's capture in memory, for online training: same tensors, no disk.

    `OnlineCapture(model, [2, 15, 27])(input_ids [B, T], attention_mask [B, T])` ->
    `{"aux": [B, T, 3*H], "last": [B, T, H]}` in the model's dtype, on its device. Right padding
    only: positions run 0..T-1 in every row.
    """

    def __init__(self, model: torch.nn.Module, aux_layer_ids: list[int]):
        check_layer_ids(list(aux_layer_ids), len(decoder_layers(model)))
        self.model = model
        self.aux_layer_ids = list(aux_layer_ids)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """position_ids [B, T] restarting at 0 mark sequences packed back to back in one row
        (attention_mask None): transformers then keeps attention within each."""
        device = self.model.get_input_embeddings().weight.device
        mask = None if attention_mask is None else attention_mask.to(device)
        pos = None if position_ids is None else position_ids.to(device)
        aux, last = capture(self.model, input_ids.to(device), self.aux_layer_ids,
                            attention_mask=mask, position_ids=pos)
        return {"aux": aux, "last": last}  # [B, T, A*H], [B, T, H] on the model's device
