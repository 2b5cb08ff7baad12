"""The lineage rule: two targets (a registry name, an HF dir, a policy checkpoint) are one
lineage when their architecture shapes and tokenizer match. Names never decide: every RL step
writes a new checkpoint directory of the same policy. Warm starts (train.init_from), extra
runs' harvests and refreshes accept exactly what this rule accepts.
"""

from __future__ import annotations

import hashlib
import json

from draftkit.core import registry
from draftkit.targets.load import target_dir

SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")


def shapes_of(hf_config) -> dict:
    d = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    out = {k: d.get(k) for k in SHAPE_KEYS}
    heads = d.get("num_attention_heads")
    out["head_dim"] = d.get("head_dim") or (d["hidden_size"] // heads if heads else None)
    out["num_key_value_heads"] = out["num_key_value_heads"] or heads
    return out


def tokenizer_digest(tok) -> str:
    """sha256 of the vocabulary (token -> id), the special tokens and the chat template."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tok.get_vocab().items()), ensure_ascii=False).encode())
    h.update(json.dumps([tok.bos_token, tok.eos_token, tok.pad_token,
                         getattr(tok, "chat_template", None)], default=str).encode())
    return h.hexdigest()


def target_shapes(cfg) -> dict:
    t = cfg.target
    return {"num_hidden_layers": t.num_hidden_layers, "hidden_size": t.hidden_size,
            "num_attention_heads": t.num_attention_heads,
            "num_key_value_heads": t.num_key_value_heads,
            "intermediate_size": t.intermediate_size, "vocab_size": t.vocab_size,
            "head_dim": t.head_dim}


def shape_mismatches(a: dict, b: dict) -> list[str]:
    return [f"{k} {a.get(k)} vs {b.get(k)}" for k in b if a.get(k) != b.get(k)]


def run_tokenizer_digest(target_name: str, revision: str = "main") -> str:
    from transformers import AutoTokenizer


    return tokenizer_digest(AutoTokenizer.from_pretrained(target_dir(target_name, revision)))


def same_lineage(name_a: str, name_b: str) -> list[str]:
    """Problems that keep two targets (registry names or HF dirs) apart; [] = same lineage."""
    if name_a == name_b:
        return []
    a, b = registry.resolve(name_a), registry.resolve(name_b)
    keys = (*SHAPE_KEYS, "head_dim", "family")
    problems = [f"{k} {getattr(a, k)} vs {getattr(b, k)}" for k in keys
                if getattr(a, k) != getattr(b, k)]
    if not problems and run_tokenizer_digest(name_a) != run_tokenizer_digest(name_b):
        problems.append("the tokenizers differ")
    return problems
