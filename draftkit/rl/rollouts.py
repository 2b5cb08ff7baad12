"""Rollouts as RL frameworks write them (JSONL), turned into token ids with a loss mask on the
response tokens only: what a refresh trains on and what the drift estimate scores.

One JSON object per line, in one of three shapes (extra keys are kept out of the way):
    {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}   chat; the last
                                   assistant turn is the response (masked via the chat template)
    {"prompt": "...", "response": "..."}                 text; prompt is used as it is (already
                                   templated, as NeMo-RL/verl/TRL log it), response appended
    {"prompt_ids": [...], "response_ids": [...]}         token ids of the policy's tokenizer
optional: "policy_step" (int), "reward" (float), "temperature" (float).
A bad row (not UTF-8, not JSON, nested too deeply, a wrong shape) raises DraftkitError naming
file:line and what to fix; nothing is read half-way.
Rows longer than refresh.max_seq_len are cut and counted (`ReadStats`); the same file under two
names (a `latest.jsonl` symlink, a copy) counts once (`unique_files`), identical rows once
(`dedupe_rows`), and a GRPO group (rows of one prompt) is one `prompt_key`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.prepare import chat_mask


@dataclass
class Rollout:
    input_ids: list[int]  # prompt + response tokens
    loss_mask: list[int]  # 1 on response tokens
    prompt_len: int  # tokens before the response (the whole prompt for text/ids rows)
    source: str  # "file:line"
    policy_step: int | None = None
    reward: float | None = None
    temperature: float | None = None


@dataclass
class ReadStats:
    """What `read_rollouts(..., stats=)` saw besides the rows it returns."""
    rows: int = 0  # rows read
    cut: int = 0  # rows cut to max_seq_len (their tail past it is not trained on or scored)
    cut_tokens: int = 0  # tokens dropped by those cuts
    cut_sources: list[str] = field(default_factory=list)  # file:line of the first 10 cut rows


def prompt_key(row: Rollout) -> str:
    """sha256 of the prompt token ids: GRPO siblings (one prompt, G samples) share it."""
    return hashlib.sha256(json.dumps(row.input_ids[: row.prompt_len]).encode()).hexdigest()


def rollout_files(paths: list[str | Path]) -> list[Path]:
    """Files named, or every *.jsonl of a named directory (sorted); missing paths are errors."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():  # hidden files (.NAME.jsonl) are a writer's temp files
            out += sorted(f for f in p.glob("*.jsonl") if not f.name.startswith("."))
        elif p.is_file():
            out.append(p)
        else:
            raise DraftkitError(f"rollout path {p} does not exist; pass JSONL files or a "
                                "directory holding *.jsonl")
    if not out:
        raise DraftkitError(f"no rollout files in {', '.join(map(str, paths))}; refresh needs "
                            "recent rollouts (*.jsonl)")
    return out


def file_digests(files: list[Path]) -> list[dict]:
    return [{"path": str(Path(f).resolve()), "sha256": artifacts.sha256_file(f)} for f in files]


def unique_files(files: list[Path]) -> tuple[list[dict], list[dict]]:
    """(digests of the files to read, dropped): a file met again under another name (the same
    resolved path: a symlink; or the same content: a copy) is read once, in first-seen order.
    dropped = [{"path", "same_as", "why"}]."""
    kept, dropped, by_sha, by_path = [], [], {}, {}
    for d in file_digests(files):
        if d["path"] in by_path:
            dropped.append({"path": d["path"], "same_as": d["path"], "why": "same file"})
        elif d["sha256"] in by_sha:
            dropped.append({"path": d["path"], "same_as": by_sha[d["sha256"]],
                            "why": "same content"})
        else:
            kept.append(d)
            by_sha[d["sha256"]] = d["path"]
        by_path[d["path"]] = True
    return kept, dropped


def dedupe_rows(rows: list[Rollout]) -> tuple[list[Rollout], int]:
    """(rows, n dropped): a row identical to an earlier one (same tokens, same prompt/response
    split) is dropped; it would count twice in the held-out AL and weigh twice in training."""
    seen, out = set(), []
    for r in rows:
        key = (r.prompt_len, tuple(r.input_ids), tuple(r.loss_mask))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out, len(rows) - len(out)


def _bad(where: str, problem: str) -> DraftkitError:
    return DraftkitError(f"rollout {where}: {problem}. Each line must hold `messages`, or "
                         "`prompt` + `response`, or `prompt_ids` + `response_ids` (see "
                         "draftkit/rl/rollouts.py); fix or drop the row")


def _ids(where: str, key: str, value, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                              for i in value):
        raise _bad(where, f"`{key}` must be a list of integer token ids")
    bad = [i for i in value if not 0 <= i < vocab_size]
    if bad:
        raise _bad(where, f"`{key}` holds ids {bad[:5]} outside the policy vocab [0, "
                          f"{vocab_size}): written with a different tokenizer?")
    return list(value)


def _encode_messages(where: str, row: dict, tok) -> tuple[list[int], list[int], int]:
    msgs = row["messages"]
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m
                                             and isinstance(m.get("content"), str) for m in msgs):
        raise _bad(where, "`messages` must be a list of {role, content} objects")
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last is None or not msgs[last]["content"].strip():
        raise _bad(where, "no assistant message with content (the response is empty)")
    msgs = msgs[: last + 1]
    try:
        enc = chat_mask.encode(tok, msgs, 1 << 30)
    except DraftkitError as e:
        raise _bad(where, str(e)) from e
    prompt = chat_mask.prompt_ids(tok, msgs, last)
    mask = [m if i >= len(prompt) else 0 for i, m in enumerate(enc.loss_mask)]  # last turn only
    end = max(i for i, m in enumerate(mask) if m) + 1 if any(mask) else len(mask)
    return enc.input_ids[:end], mask[:end], len(prompt)  # generation stops at end of turn


def encode_row(where: str, row, tok, vocab_size: int) -> Rollout:
    """One JSONL object -> Rollout (response-only loss mask)."""
    if not isinstance(row, dict):
        raise _bad(where, "the line is not a JSON object")
    if "messages" in row:
        ids, mask, plen = _encode_messages(where, row, tok)
    elif "prompt_ids" in row or "response_ids" in row:
        if "prompt_ids" not in row or "response_ids" not in row:
            raise _bad(where, "token-id rows need both `prompt_ids` and `response_ids`")
        prompt = _ids(where, "prompt_ids", row["prompt_ids"], vocab_size)
        resp = _ids(where, "response_ids", row["response_ids"], vocab_size)
        if not resp:
            raise _bad(where, "`response_ids` is empty")
        ids, mask, plen = prompt + resp, [0] * len(prompt) + [1] * len(resp), len(prompt)
    elif "prompt" in row or "response" in row:
        if not isinstance(row.get("prompt"), str) or not isinstance(row.get("response"), str):
            raise _bad(where, "text rows need string `prompt` and `response`")
        if not row["response"].strip():
            raise _bad(where, "`response` is empty")
        prompt = tok(row["prompt"], add_special_tokens=False)["input_ids"]
        full = tok(row["prompt"] + row["response"], add_special_tokens=False)["input_ids"]
        plen = len(prompt) if full[: len(prompt)] == prompt else _common_prefix(prompt, full)
        ids, mask = full, [0] * plen + [1] * (len(full) - plen)
    else:
        raise _bad(where, f"no known fields (got keys {sorted(row)[:6]})")
    if len(ids) < 3 or sum(mask) == 0:
        raise _bad(where, "too short: a rollout needs a prompt and at least one response token")
    return Rollout(ids, mask, plen, where, _opt(where, row, "policy_step", int),
                   _opt(where, row, "reward", float), _opt(where, row, "temperature", float))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _opt(where: str, row: dict, key: str, kind: type):
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            kind is int and not isinstance(value, int)):
        raise _bad(where, f"`{key}` must be a {kind.__name__}, got {value!r}")
    return kind(value)


def _parse(where: str, raw: bytes):
    """One line's JSON value (None for a blank line); text that is not UTF-8, not JSON, or
    nested past Python's recursion limit is a bad row (DraftkitError naming file:line)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad(where, f"not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 4]!r}); "
                          "write rollouts as UTF-8") from e
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise _bad(where, f"not valid JSON ({e.msg})") from e
    except RecursionError as e:
        raise _bad(where, "JSON nested too deeply to read") from e


MAX_LINE_BYTES = 16 << 20  # a longer rollout line is a bad row: memory stays bounded per row


def iter_rollouts(paths: list[str | Path], tok, vocab_size: int,
                  max_seq_len: int = 1 << 30, stats: ReadStats | None = None
                  ) -> Iterator[Rollout]:
    """Every row of every file (in order), encoded and checked, one at a time (a file is never
    held whole: lines are read up to MAX_LINE_BYTES); rows longer than max_seq_len are cut (a
    cut that leaves no response token is an error), counted in `stats` if given."""
    stats = ReadStats() if stats is None else stats
    for f in rollout_files(paths):
        with open(f, "rb") as fh:
            n = 0
            while raw := fh.readline(MAX_LINE_BYTES + 1):
                n += 1
                where = f"{f}:{n}"
                if len(raw) > MAX_LINE_BYTES:
                    raise _bad(where, f"a line longer than {MAX_LINE_BYTES} bytes; write one "
                                      "rollout per line")
                row = _parse(where, raw)
                if row is None:
                    continue
                r = encode_row(where, row, tok, vocab_size)
                if len(r.input_ids) > max_seq_len:
                    stats.cut += 1
                    stats.cut_tokens += len(r.input_ids) - max_seq_len
                    stats.cut_sources += [where] if len(stats.cut_sources) < 10 else []
                r.input_ids, r.loss_mask = r.input_ids[:max_seq_len], r.loss_mask[:max_seq_len]
                if sum(r.loss_mask) == 0:
                    raise _bad(where, f"no response token within refresh.max_seq_len="
                                      f"{max_seq_len}")
                stats.rows += 1
                yield r


def read_rollouts(paths: list[str | Path], tok, vocab_size: int,
                  max_seq_len: int = 1 << 30, stats: ReadStats | None = None) -> list[Rollout]:
    """`iter_rollouts` as a list (the rows a refresh trains on)."""
    return list(iter_rollouts(paths, tok, vocab_size, max_seq_len, stats))
