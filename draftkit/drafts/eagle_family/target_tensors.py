"""The target's embedding [V, H], final norm [H] and lm_head [V, H], the frozen parts an
EAGLE-family draft (EAGLE-3, P-EAGLE, DFlash) copies: from a loaded HF *ForCausalLM, or read
straight from an HF dir's safetensors (no full model load)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError


def module_tensors(model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(embed [V,H], final norm [H], lm_head [V,H]) of a loaded HF *ForCausalLM."""
    base = getattr(model, "model", model)
    return base.embed_tokens.weight, base.norm.weight, model.lm_head.weight


def read_target_tensors(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same three tensors read straight from an HF dir's safetensors (tied lm_head ->
    the embedding)."""
    from safetensors import safe_open

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        where = {k: path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    else:
        files = sorted(path.glob("*.safetensors"))
        where = {}
        for f in files:
            with safe_open(str(f), "pt") as sf:
                where.update({k: f for k in sf.keys()})
    names = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
             "lm_head": "lm_head.weight"}
    if names["embed"] not in where or names["norm"] not in where:
        raise DraftkitError(f"{path} holds no model.embed_tokens/model.norm weights; pass a "
                            "plain HF *ForCausalLM dir as the target")

    def get(name: str) -> torch.Tensor:
        with safe_open(str(where[name]), "pt") as sf:
            return sf.get_tensor(name).float()

    embed = get(names["embed"])
    lm_head = get(names["lm_head"]) if names["lm_head"] in where else embed
    return embed, get(names["norm"]), lm_head
