"""The target's end tokens, in one place: which tokens end a turn (the loss mask keeps them,
the draft vocab must hold them) and which ids stop generation (regeneration).

    end_of_turn_tokens(tok)   known end-of-turn markers in tok's vocab, then its eos token
    end_of_turn_ids(tok)      their ids plus the tokenizer's eos id(s), sorted
    eos_ids(tok, target_dir)  the tokenizer's eos id(s) plus generation_config.json's eos_token_id
"""

from __future__ import annotations

import json
from pathlib import Path

# Token strings that end a turn or a document in the chat templates draftkit meets.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>",
               "<|end_of_text|>")


def _in_vocab(tok, token: str) -> bool:
    i = tok.convert_tokens_to_ids(token)  # unknown tokens map to the unk id (or None)
    return i is not None and tok.convert_ids_to_tokens(i) == token


def _as_ids(value) -> set[int]:
    """An eos_token_id setting (None, an int or a list of ints) as a set."""
    if value is None:
        return set()
    return {int(i) for i in value} if isinstance(value, list) else {int(value)}


def end_of_turn_tokens(tok) -> list[str]:
    """The END_OF_TURN markers `tok` knows, in that order, then its eos token if not among them."""
    found = [t for t in END_OF_TURN if _in_vocab(tok, t)]
    if tok.eos_token and tok.eos_token not in found:
        found.append(tok.eos_token)
    return found


def end_of_turn_ids(tok) -> list[int]:
    """Ids the draft vocab must always hold: the end-of-turn tokens plus the eos id(s)."""
    ids = _as_ids(getattr(tok, "eos_token_id", None))
    ids.update(int(tok.convert_tokens_to_ids(t)) for t in end_of_turn_tokens(tok))
    return sorted(ids)


def eos_ids(tok, target_dir: str | Path | None = None) -> set[int]:
    """Ids that end generation: the tokenizer's eos and generation_config.json's eos_token_id
    (int or list) in `target_dir`."""
    ids = _as_ids(tok.eos_token_id)
    gen_cfg = Path(target_dir) / "generation_config.json" if target_dir is not None else None
    if gen_cfg is not None and gen_cfg.is_file():
        ids |= _as_ids(json.loads(gen_cfg.read_text()).get("eos_token_id"))
    return ids
