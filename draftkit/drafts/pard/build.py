"""Where a PARD draft starts, and its mask token.

The LM starts where a draft-lm run's does (drafts/lm_family/build.py: draft.init sibling |
truncate | scratch, or train.init_from = a trained draft-lm or PARD run/export: the warm start).
The mask token (`pard_token`, which vLLM reads from the draft's config.json) must be an id of the
target's vocabulary, since vLLM needs draft vocab == target vocab, and must never be a real
token of the text, or the draft could not tell a mask slot from it. `choose_mask_token` takes:
  1. the warm start's own `pard_token`, if it has one (a PARD draft keeps its mask);
  2. else the first embedding row no text maps to (id len(tokenizer), where the model's vocab
     is padded past the tokenizer: Qwen3 151669);
  3. else the highest special token that neither a chat-templated turn, bos/eos/unk nor the
     generation's eos uses, preferring one that is not the pad token (SmolLM2: 16,
     <empty_output>; tiny-llama: 0, its pad <|endoftext|>, its only special left).
Its embedding row starts as the warm start has it and is trained like every other weight. The
data is checked for it at every step (PardLM.packed_hidden): a real occurrence is an error.
"""

from __future__ import annotations

from draftkit.core.errors import DraftkitError
from draftkit.drafts.lm_family.build import build_lm
from draftkit.drafts.pard.model import PardLM


def choose_mask_token(tokenizer, vocab_rows: int, eos_ids: list[int] | tuple = ()) -> int:
    """The mask token id for a draft over `vocab_rows` embedding rows (rules 2 and 3 above)."""
    n = len(tokenizer)
    if vocab_rows > n:
        return n
    used = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id, *eos_ids}
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            tokenize=False)
        used |= set(tokenizer(text, add_special_tokens=False)["input_ids"])
    specials = set(tokenizer.all_special_ids) | {
        i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    free = sorted(i for i in specials if i not in used and 0 <= i < vocab_rows)
    preferred = [i for i in free if i != tokenizer.pad_token_id] or free
    if not preferred:
        raise DraftkitError(
            f"no token of the target's vocabulary ({vocab_rows} ids) can serve as PARD's mask "
            "token: every special token appears in chat text and no embedding row is spare. "
            "Use draft.kind=draft-lm, or a target whose tokenizer has an unused special token")
    return preferred[-1]


def _eos_ids(model) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [eos] if isinstance(eos, int) else list(eos or [])


def build_pard(cfg, target):
    """The trainable `PardLM` of a run: the LM family's `build_lm`, a mask token, the target's
    norm/lm_head."""
    lm = build_lm(cfg, target)
    if getattr(lm.config, "pard_token", None) is None:
        rows = lm.get_input_embeddings().weight.shape[0]
        lm.config.pard_token = choose_mask_token(target.tokenizer, rows, _eos_ids(target.model))
    return PardLM.for_target(lm, target.model, cfg)
