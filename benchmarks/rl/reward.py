"""Rewards for RL on math problems with known answers (the offline `math` recipe's mathgen
problems, GSM8K's `#### N` answer format).

    r = correct + format_weight * formatted
    correct    1 if the response's answer equals the reference number, else 0
    formatted  1 if the response states its answer as `#### N` (the format the prompt asks for)

The response's answer is the number after its last `####`, else its last number at all (a
135M policy rarely follows the format at first; the small format term is what teaches it).
Numbers compare as values: "1,200", "1200.0" and "$1200" all equal 1200.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
_MARKED = re.compile(r"####\s*(" + _NUMBER.pattern + ")")

INSTRUCTION = "Solve step by step, then give the final answer on its own line as '#### N'."


def parse_number(text: str) -> float | None:
    try:
        return float(text.replace("$", "").replace(",", ""))
    except ValueError:
        return None


def reference_answer(answer: str) -> float:
    """The number after `####` in a GSM8K-format reference answer."""
    m = _MARKED.findall(answer)
    if not m or (value := parse_number(m[-1])) is None:
        raise ValueError(f"reference answer has no '#### N' line: {answer[-80:]!r}")
    return value


def response_answer(response: str) -> tuple[float | None, bool]:
    """(the number the response answers with or None, whether it used the `#### N` format)."""
    marked = _MARKED.findall(response)
    if marked:
        return parse_number(marked[-1]), True
    numbers = _NUMBER.findall(response)
    return (parse_number(numbers[-1]) if numbers else None), False


def math_reward(response: str, reference: float, format_weight: float = 0.1) -> dict:
    """{"reward", "correct", "formatted"} for one response."""
    value, formatted = response_answer(response)
    correct = value is not None and abs(value - reference) < 1e-6
    return {"reward": float(correct) + format_weight * float(formatted),
            "correct": float(correct), "formatted": float(formatted)}
