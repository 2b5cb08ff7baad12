"""Chat templating and the assistant loss mask, taken from what the template actually renders.

The whole conversation is rendered once with the target's chat template and tokenized with
character offsets. Assistant turn `i` starts where the render of `messages[:i]` plus the
generation prompt ends (that render must be a prefix of the full one) and ends after the first
end-of-turn token that follows (`<|im_end|>`, `<|eot_id|>`, the eos token, ...). Tokens whose
characters overlap that span get mask 1, so the mask covers exactly the text the target would
generate for the turn, plus its end-of-turn token. Templates that rewrite assistant turns are
followed, not fought: Qwen3's drops the `<think>` block of turns before the last user message,
so those reasoning tokens are neither rendered nor masked. Each span is checked against the
message content (the visible answer must match; a rendered reasoning block must be the
message's own, or empty), so a template that renders something else fails loudly.

Worked example (ChatML, one turn): rendered text
`<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n`; the prefix render
ends after `assistant\\n`, so the span is `Hello!<|im_end|>` and the final `\\n` stays 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from draftkit.core.errors import DraftkitError
from draftkit.prepare.sources import Dropped
from draftkit.targets.tokens import end_of_turn_tokens


@dataclass
class Encoded:
    input_ids: list[int]  # the templated conversation (truncated to max_seq_len)
    loss_mask: list[int]  # 1 on assistant content + end-of-turn tokens
    prompt_ids: list[int]  # templated prompt up to the last assistant turn's generation prompt
    truncated: bool


def render(tok, messages: list[dict], add_generation_prompt: bool = False) -> str:
    try:
        return tok.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - jinja raises many types
        raise DraftkitError(f"the target's chat template failed on a conversation with roles "
                            f"{[m['role'] for m in messages]}: {type(e).__name__}: {e}") from e


def token_ids(tok, text: str) -> list[int]:
    """Tokens of already-templated text (the template writes BOS etc. itself)."""
    return tok(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tok, messages: list[dict], i: int) -> list[int]:
    """Tokens the target sees before generating assistant message `i`."""
    return token_ids(tok, render(tok, messages[:i], add_generation_prompt=True))


def fit_turns(tok, messages: list[dict], max_seq_len: int) -> tuple[list[dict], int]:
    """Cut trailing turns until the last assistant turn's prompt is shorter than max_seq_len.

    Returns (messages ending on an assistant turn, number of assistant turns cut); raises
    Dropped('prompt_too_long') when even the first assistant turn's prompt does not fit."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k in range(len(turns) - 1, -1, -1):  # prompt lengths grow with k: try the longest first
        if len(prompt_ids(tok, messages, turns[k])) < max_seq_len:
            return messages[:turns[k] + 1], len(turns) - 1 - k
    raise Dropped("prompt_too_long")


def _visible(s: str) -> str:
    return "".join(s.split("</think>")[-1].split())


def _reasoning(s: str) -> str | None:
    if "</think>" not in s:
        return None
    return "".join(s.split("</think>")[0].split("<think>")[-1].split())


def check_rendered(shown: str, content: str, turn: int) -> None:
    """The rendered span must show the message: same answer (whitespace aside); a reasoning
    block, if rendered, is the message's own or empty (templates may drop or add one)."""
    same_answer = _visible(shown) == _visible(content)
    reasoning = _reasoning(shown)
    same_reasoning = not reasoning or reasoning == (_reasoning(content) or "")
    if not (same_answer and same_reasoning):
        raise DraftkitError(
            f"chat template check failed for assistant message {turn}: the template renders "
            f"{shown[:120]!r} where the message says {content[:120]!r}, so draftkit cannot tell "
            "which tokens are the assistant's. Use a target whose template renders assistant "
            "content verbatim (optionally dropping <think> blocks), or fix its chat_template.")


def assistant_spans(tok, messages: list[dict], text: str) -> list[tuple[int, int]]:
    """[start, end) character spans of each assistant turn in `text` (content + end token)."""
    eots = end_of_turn_tokens(tok)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = render(tok, messages[:i], add_generation_prompt=True)
        if not text.startswith(prefix):
            raise DraftkitError(
                f"the chat template is not prefix-stable at assistant message {i}: rendering the "
                "conversation up to it with add_generation_prompt=True does not give the start "
                "of the full render, so its span cannot be located. Fix the target's template.")
        start = len(prefix)
        hits = [(pos, e) for e in eots if (pos := text.find(e, start)) >= 0]
        if not hits:
            raise DraftkitError(f"no end-of-turn token ({', '.join(eots)}) after assistant "
                                f"message {i} in the rendered chat; set the tokenizer's eos_token")
        pos, eot = min(hits)
        check_rendered(text[start:pos], m["content"], i)
        spans.append((start, pos + len(eot)))
    return spans


def encode(tok, messages: list[dict], max_seq_len: int) -> Encoded:
    """Template, tokenize and mask one conversation (which ends on an assistant turn)."""
    text = render(tok, messages)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offs = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)  # [T, 2] char spans
    mask = np.zeros(len(ids), dtype=bool)  # [T]
    for start, end in assistant_spans(tok, messages, text):
        mask |= (offs[:, 1] > start) & (offs[:, 0] < end)  # token overlaps the span
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    truncated = len(ids) > max_seq_len
    ids, mask = ids[:max_seq_len], mask[:max_seq_len]
    if not mask.any():
        raise Dropped("no_assistant_tokens")
    return Encoded(input_ids=ids, loss_mask=mask.astype(np.int64).tolist(),
                   prompt_ids=prompt_ids(tok, messages, last), truncated=truncated)
