"""Magpie-style self-instruct: the target writes new in-domain prompts for the TRAIN split.

Templated or scarce local data leaves the draft with a narrow prompt distribution (a draft
trained on 2,200 templated problems scored 2.4 AL on its own split and 1.7 on hand-written
ones). Here the target is asked, over many topics and styles, for new problems
(`self_instruct.instruction` of the recipe, sampled at `data.self_instruct_temperature`), and
the answers that pass the filters (length, must contain a question / a number, not a
duplicate of each other or of the recipe's prompts) become new user turns whose responses
`regenerate` then writes. Requests are made in rounds (`oversample` x n first, then the
missing prompts divided by the pass rate so far, at most 8x) until `data.self_instruct`
prompts pass or `max_rounds` is reached; every batch is
saved like regeneration batches, so an interrupted run resumes.

Two methods (recipe `self_instruct.method`): `instruct` asks the target, in a user turn, to
write a prompt about a topic; `magpie` renders the chat template up to where a user message
starts (Magpie's pre-query template) plus a few opening words ("A bakery sells") and lets the
target write the rest of the user turn, so prompts follow the target's own distribution of
user questions. Departure from Magpie: the opening words steer topics; plain Magpie starts
from an empty user turn. On SmolLM2-135M, `magpie` gave problem-shaped text far more often
than `instruct`, whose answers were mostly about the request instead of a problem.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from draftkit.core import artifacts, hardware
from draftkit.core.config import RunConfig
from draftkit.core.errors import DraftkitError
from draftkit.prepare import chat_mask
from draftkit.prepare.recipes import SelfInstructSpec
from draftkit.prepare.regen import BatchStore, Generator, Request
from draftkit.prepare.sources import Conversation, seed_for

_LABEL = re.compile(r"^\W*(new\s+)?(word\s+)?(math\s+)?(problem|question|task|prompt|request|"
                    r"instruction)\s*(\d+)?\s*[:.\-]\W*", re.IGNORECASE)


def instruction(spec: SelfInstructSpec, index: int, seed: int) -> str:
    """The request (instruct) or user-turn opening (magpie) for prompt number `index`: a
    seeded topic and style."""
    rng = random.Random(seed_for("self-instruct", seed, index))
    text = spec.instruction.format(topic=rng.choice(spec.topics), style=rng.choice(spec.styles))
    return " ".join(text.split())


def user_turn_prefix(tok) -> str:
    """The rendered text up to where a user message's content starts (Magpie's pre-query
    template), e.g. ChatML '...<|im_start|>user\\n'."""
    marker = "\u2063draftkit-user\u2063"
    text = chat_mask.render(tok, [{"role": "user", "content": marker}])
    if marker not in text:
        raise DraftkitError("the chat template does not render user content verbatim, so "
                            "self_instruct method 'magpie' cannot find where a user turn starts; "
                            "use method 'instruct' in the recipe")
    return text[:text.index(marker)]


def request_ids(tok, spec: SelfInstructSpec, text: str) -> list[int]:
    """instruct: the templated request + generation prompt; magpie: an open user turn."""
    if spec.method == "magpie":
        return chat_mask.token_ids(tok, user_turn_prefix(tok) + text)
    return chat_mask.token_ids(tok, chat_mask.render(
        tok, [{"role": "user", "content": text}], add_generation_prompt=True))


def clean(text: str, spec: SelfInstructSpec) -> tuple[str, bool]:
    """(the prompt inside the target's answer, whether anything after it was cut).

    Drops a preamble line ending in ':' ("Here's a new problem:"), cuts before a line starting
    with a `cut_at` marker ("Solution", ...) and, with `require_question`, after the last '?';
    strips a leading 'Problem:' label and wrapping quotes."""
    lines = text.strip().splitlines()
    if len(lines) > 1 and lines[0].rstrip().endswith(":"):
        lines = lines[1:]
    stops = tuple(s.lower() for s in spec.cut_at)
    cut = False
    for k, line in enumerate(lines):
        if k and stops and line.strip().lstrip("*#_ ").lower().startswith(stops):
            lines, cut = lines[:k], True
            break
    text = _LABEL.sub("", "\n".join(lines).strip(), count=1).strip()
    if spec.require_question and "?" in text and not text.rstrip('"').endswith("?"):
        text, cut = text[:text.rindex("?") + 1], True
    return text.strip('"').strip(), cut


def reject(text: str, spec: SelfInstructSpec, seen: set[str]) -> str | None:
    """Why `text` is not kept (None = keep)."""
    if len(text) < spec.min_chars:
        return "too_short"
    if len(text) > spec.max_chars:
        return "too_long"
    if spec.require_question and "?" not in text:
        return "no_question"
    if spec.require_number and not re.search(r"\d", text):
        return "no_number"
    if " ".join(text.lower().split()) in seen:
        return "duplicate"
    return None


def self_instruct(spec: SelfInstructSpec, n: int, gen: Generator, cfg: RunConfig, root: Path,
                  existing: set[str]) -> tuple[list[Conversation], dict]:
    """Up to `n` target-written prompts as conversations with an empty assistant turn."""
    tok, d = gen.tok, cfg.data
    seed = d.seed
    key = artifacts.fingerprint([spec.__dict__, cfg.target.name, cfg.target.revision,
                                 d.regen_engine, hardware.resolve(d.regen_dtype),
                                 d.self_instruct_temperature, seed, tok.chat_template])[:16]
    store = BatchStore(Path(root) / f"self-instruct-{key}")
    seen, kept, rejected = set(existing), [], Counter()
    next_index, rounds = 0, 0
    bar = tqdm(total=n, desc="self-instruct", unit="prompt")
    while len(kept) < n and rounds < spec.max_rounds:
        # round 0 asks `oversample` x n; later rounds divide by the pass rate seen so far
        factor = min(8.0, 1.1 * next_index / max(len(kept), 1e-9)) if rounds else spec.oversample
        count = math.ceil((n - len(kept)) * factor)
        indices = list(range(next_index, next_index + count))
        next_index += count
        for b in range(0, count, d.regen_batch_size):
            chunk = indices[b:b + d.regen_batch_size]
            asks = [instruction(spec, i, seed) for i in chunk]
            reqs = [Request(request_ids(tok, spec, a), spec.max_new_tokens,
                            d.self_instruct_temperature, 1.0, seed_for("si", seed, i))
                    for a, i in zip(asks, chunk, strict=True)]
            recs = store.run(f"r{rounds}-b{b // d.regen_batch_size:05d}",
                             [f"self-instruct-{i}" for i in chunk], reqs, gen)
            for ask, rec in zip(asks, recs, strict=True):
                raw = ask + rec["text"] if spec.method == "magpie" else rec["text"]
                text, cut = clean(raw, spec)
                done = rec["stopped"] or cut or spec.keep_unfinished
                why = reject(text, spec, seen) or (None if done else "unfinished")
                if why or len(kept) >= n:
                    rejected[why or "surplus"] += 1
                    continue
                seen.add(" ".join(text.lower().split()))
                kept.append(Conversation(id=rec["id"], source="self-instruct", messages=[
                    {"role": "user", "content": spec.prompt_template.format(prompt=text)},
                    {"role": "assistant", "content": ""}]))
                bar.update(1)
        rounds += 1
    bar.close()
    stats = {"requested": n, "asked": next_index, "accepted": len(kept), "rounds": rounds,
             "rejected": dict(rejected), "cached_batches": store.hits,
             "batches": store.hits + store.misses, "fingerprint": key}
    return kept, stats
