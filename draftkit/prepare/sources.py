"""Load a recipe's sources with `datasets`, turn rows into conversations, mix them by weight
and set a held-out eval split aside.

Every source goes through `load_dataset`: hub ids when `data.source=hub`; the shipped JSONL/
Parquet sample (or mathgen's generated GSM8K-schema file) through `load_dataset("json"|
"parquet", data_files=...)` when `data.source=local`, with the same field mapping. Local
`files:` sources load the same way in both modes. Rows that cannot become a conversation
(empty prompt, unknown role, turns out of order, duplicate prompt, prompt also in eval) are
dropped and counted by reason; a column the recipe maps but the data lacks is an error.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftkit.core.config import DataConfig
from draftkit.core.errors import DraftkitError
from draftkit.prepare import mathgen
from draftkit.prepare.recipes import Recipe, RecipeError, SourceSpec

SOURCES = ("hub", "local")
DEFAULT_ROLES = {"system": "system", "user": "user", "assistant": "assistant",
                 "human": "user", "gpt": "assistant", "model": "assistant"}
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass
class Conversation:
    id: str  # stable: '<source>-<row index in the loaded source>'
    source: str
    messages: list[dict]  # [{role, content}], ends with an assistant turn ('' = to generate)


@dataclass
class Mix:
    train: list[Conversation]
    eval: list[Conversation]
    stats: dict = field(default_factory=dict)


class Dropped(Exception):
    """A row or conversation left out of the data; `reason` is counted in stats.json."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def seed_for(*parts) -> int:
    return int(hashlib.sha256("-".join(map(str, parts)).encode()).hexdigest()[:8], 16)


# ----------------------------------------------------------------------------- loading


def load_files(files: list[Path], cache_dir: Path | None = None):
    """JSONL/JSON/Parquet/CSV files as one `datasets.Dataset` (one builder per call)."""
    import datasets

    missing = [str(f) for f in files if not Path(f).is_file()]
    if missing:
        raise DraftkitError(f"data files not found: {missing}; fix the paths in the recipe "
                            "(relative paths are relative to the recipe file)")
    kinds = {_BUILDERS.get(Path(f).suffix.lower()) for f in files}
    if None in kinds or len(kinds) != 1:
        raise DraftkitError(f"data files {[str(f) for f in files]} must all be one of "
                            f"{', '.join(_BUILDERS)}")
    return datasets.load_dataset(kinds.pop(), data_files=[str(f) for f in files], split="train",
                                 cache_dir=str(cache_dir) if cache_dir else None)


def load_hub(src: SourceSpec, recipe: str, want: int):
    """The source's hub split (configs concatenated; streamed sets cut to `max_rows`)."""
    import datasets

    hub = src.hub
    kw = {"split": hub.split, "revision": hub.revision or None,
          "data_files": hub.data_files or None}
    try:
        if hub.streaming:
            stream = datasets.load_dataset(hub.path, hub.name or None, streaming=True, **kw)
            rows = hub.max_rows or 20 * max(want, 1)
            stream = stream.shuffle(seed=seed_for(recipe, src.name), buffer_size=10_000)
            return datasets.Dataset.from_list(list(stream.take(rows)))
        names = hub.configs or [hub.name or None]
        parts = [datasets.load_dataset(hub.path, n, **kw) for n in names]
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except Exception as e:  # offline, missing, gated: one clear message
        which = ",".join(hub.configs) or hub.name or "default"
        raise DraftkitError(
            f"could not load Hugging Face dataset {hub.path} (config {which}, split {hub.split}) "
            f"for source {src.name!r} of recipe {recipe!r}: "
            f"{type(e).__name__}: {e}. Without internet use data.source=local (the recipe's "
            f"shipped sample), or pre-download it on a machine with access "
            f"(`huggingface-cli download --repo-type dataset {hub.path}`) and copy the HF cache."
        ) from e


def load_source(src: SourceSpec, recipe: Recipe, mode: str, work_dir: Path, seed: int,
                want: int):
    """The source's rows as a `datasets.Dataset`, or None when it has nothing for `mode`."""
    cache = work_dir / "hf-cache"
    if src.files:
        return load_files([recipe.resolve(f) for f in src.files], cache)
    if mode == "hub" and src.hub is not None:
        return load_hub(src, recipe.name, want)
    off = src.local
    if mode == "local" and off is not None:
        if off.mathgen:
            path = work_dir / f"mathgen-{off.mathgen}-seed{seed}-n{off.count}.jsonl"
            return load_files([mathgen.write_jsonl(path, off.mathgen, off.count, seed)], cache)
        return load_files([recipe.resolve(f) for f in off.files], cache)
    return None


def check_columns(ds, src: SourceSpec, recipe: str) -> None:
    columns = ["prompt", "response", "system"] if src.format == "qa" else ["messages"]
    for role in columns:
        col = src.fields.get(role)
        if col and col not in ds.column_names:
            raise RecipeError(
                f"recipe {recipe!r}, source {src.name!r}: field {role} -> column {col!r} is not in "
                f"the data (columns: {', '.join(ds.column_names)}); fix `fields:` in the recipe")


# ----------------------------------------------------------------------------- rows


def _qa(row: dict, src: SourceSpec) -> list[dict]:
    prompt = row[src.fields["prompt"]]
    if not isinstance(prompt, str) or not prompt.strip():
        raise Dropped("empty_prompt")
    response = row[src.fields["response"]] if src.fields.get("response") else ""
    response = response if isinstance(response, str) else ""
    for pat in src.remove_patterns:
        response = re.sub(pat, "", response)
    msgs = []
    if src.fields.get("system") and row[src.fields["system"]]:
        msgs.append({"role": "system", "content": str(row[src.fields["system"]])})
    msgs.append({"role": "user", "content": src.prompt_template.format(prompt=prompt.strip())})
    msgs.append({"role": "assistant", "content": response.strip()})
    return msgs


def _messages(row: dict, src: SourceSpec, recipe: str) -> list[dict]:
    turns = row[src.fields["messages"]]
    rkey, ckey = src.fields.get("role", "role"), src.fields.get("content", "content")
    roles = {**DEFAULT_ROLES, **src.roles}
    if not isinstance(turns, list) or not turns:
        raise Dropped("no_messages")
    msgs = []
    for t in turns:
        if not isinstance(t, dict) or rkey not in t or ckey not in t:
            raise RecipeError(f"recipe {recipe!r}, source {src.name!r}: a message lacks key "
                              f"{rkey!r} or {ckey!r} (fields.role / fields.content); got "
                              f"{sorted(t) if isinstance(t, dict) else type(t).__name__}")
        role = roles.get(str(t[rkey]))
        if role is None:
            raise Dropped(f"unknown_role:{t[rkey]}")
        if not isinstance(t[ckey], str):
            raise Dropped("non_text_content")
        msgs.append({"role": role, "content": t[ckey].strip()})
    return normalize_turns(msgs)


def normalize_turns(msgs: list[dict]) -> list[dict]:
    """Optional system first, then user/assistant alternating from user; ends on assistant."""
    body = msgs[1:] if msgs and msgs[0]["role"] == "system" else msgs
    if not body or any(m["role"] == "system" for m in body):
        raise Dropped("bad_turn_order")
    for i, m in enumerate(body):
        if m["role"] != ("user" if i % 2 == 0 else "assistant"):
            raise Dropped("bad_turn_order")
        if m["role"] == "user" and not m["content"]:
            raise Dropped("empty_prompt")
    if body[-1]["role"] == "user":
        msgs = msgs + [{"role": "assistant", "content": ""}]
    return msgs


def to_messages(row: dict, src: SourceSpec, recipe: str) -> list[dict]:
    return _qa(row, src) if src.format == "qa" else _messages(row, src, recipe)


def prompt_key(messages: list[dict]) -> str:
    """Dedupe key: the first user turn, lowercased, whitespace-collapsed."""
    first = next(m["content"] for m in messages if m["role"] == "user")
    return " ".join(first.lower().split())


def iter_conversations(ds, src: SourceSpec, recipe: str, seed: int, drops: Counter,
                       seen: set[str], exclude: set[str] = frozenset()
                       ) -> Iterator[Conversation]:
    """Rows in a seeded random order as conversations; drops counted, prompts deduped and
    kept apart from `exclude` (the eval prompts)."""
    for idx in np.random.default_rng(seed_for(seed, src.name)).permutation(len(ds)):
        try:
            msgs = to_messages(ds[int(idx)], src, recipe)
            key = prompt_key(msgs)
            if key in exclude:
                raise Dropped("prompt_in_eval")
            if key in seen:
                raise Dropped("duplicate_prompt")
        except Dropped as d:
            drops[d.reason] += 1
            continue
        seen.add(key)
        yield Conversation(id=f"{src.name}-{int(idx)}", source=src.name, messages=msgs)


# ----------------------------------------------------------------------------- mixing


def allocate(total: int, weights: list[float]) -> list[int]:
    """Split `total` by `weights` (largest remainder): allocate(10, [1, 1, 1]) -> [4, 3, 3]."""
    raw = [total * w / sum(weights) for w in weights]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: out[i] - raw[i])[:total - sum(out)]:
        out[i] += 1
    return out


def _take(it: Iterator, n: int) -> list:
    return [c for _, c in zip(range(n), it, strict=False)]


def _load_eval(recipe: Recipe, d: DataConfig, work_dir: Path, seed: int, n: int, stats: dict):
    """The recipe's eval source for this mode, or None (then eval is held out of the mix)."""
    if recipe.eval is None or n == 0:
        return None
    ds = load_source(recipe.eval, recipe, d.source, work_dir, seed, n)
    if ds is None:
        return None
    check_columns(ds, recipe.eval, recipe.name)
    drops: Counter = Counter()
    convs = _take(iter_conversations(ds, recipe.eval, recipe.name, seed, drops, set()), n)
    stats["eval_source"] = {"name": recipe.eval.name, "available": len(ds),
                            "selected": len(convs), "dropped": dict(drops)}
    return convs


def load_held_out(recipe: Recipe, d: DataConfig, work_dir: Path) -> list[Conversation]:
    """The eval conversations load_mix gives (the recipe's eval source, else the mix's seeded
    slice), loading the train sources only when the recipe has no eval source."""
    seed, n = recipe.seed + d.seed, d.eval_samples or recipe.eval_samples
    if d.source not in SOURCES:
        raise DraftkitError(f"data.source must be one of {', '.join(SOURCES)}, got {d.source!r}")
    convs = _load_eval(recipe, d, Path(work_dir), seed, n, {})
    return convs if convs is not None else load_mix(recipe, d, work_dir).eval


def load_mix(recipe: Recipe, d: DataConfig, work_dir: Path) -> Mix:
    """Train and eval conversations for `data.source`, mixed by weight, deterministic by seed.

    Each source gets its weight's share of the train size; a source short of rows leaves its
    shortfall to the others (one at a time, round-robin). Without a usable eval source, eval
    is a seeded slice of the mix, disjoint from train."""
    if d.source not in SOURCES:
        raise DraftkitError(f"data.source must be one of {', '.join(SOURCES)}, got {d.source!r}")
    seed, work_dir = recipe.seed + d.seed, Path(work_dir)
    n_train, n_eval = d.max_samples or recipe.max_samples, d.eval_samples or recipe.eval_samples
    stats: dict = {"recipe": recipe.name, "mode": d.source, "seed": seed, "sources": {}}
    eval_convs = _load_eval(recipe, d, work_dir, seed, n_eval, stats)
    held_out = eval_convs is None
    exclude = set() if held_out else {prompt_key(c.messages) for c in eval_convs}
    active = []
    for src in recipe.sources:
        ds = load_source(src, recipe, d.source, work_dir, seed, n_train)
        if ds is None:
            stats["sources"][src.name] = {"skipped": f"no {d.source} data for this source"}
            continue
        check_columns(ds, src, recipe.name)
        active.append((src, ds))
    if not active:
        raise DraftkitError(f"recipe {recipe.name!r} has no source with data for "
                            f"data.source={d.source}; use a recipe whose sources have "
                            f"{'a local sample' if d.source == 'local' else 'hub/files'}")
    total = n_train + (n_eval if held_out else 0)
    seen: set[str] = set()
    picked, iters, drops = {}, {}, {}
    for (src, ds), n in zip(active, allocate(total, [s.weight for s, _ in active]),
                            strict=True):
        drops[src.name] = Counter()
        iters[src.name] = iter_conversations(ds, src, recipe.name, seed, drops[src.name], seen,
                                             exclude)
        picked[src.name] = _take(iters[src.name], n)
        stats["sources"][src.name] = {"available": len(ds), "requested": n}
    live, short = list(picked), total - sum(map(len, picked.values()))
    while short > 0 and live:
        for name in list(live):
            if short == 0:
                break
            nxt = next(iters[name], None)
            if nxt is None:
                live.remove(name)
            else:
                picked[name].append(nxt)
                short -= 1
    for name, convs in picked.items():
        stats["sources"][name].update(selected=len(convs), dropped=dict(drops[name]))
    mixed = [c for convs in picked.values() for c in convs]
    mixed = [mixed[i] for i in np.random.default_rng(seed_for(seed, "mix")).permutation(len(mixed))]
    if held_out:
        eval_convs, mixed = mixed[:n_eval], mixed[n_eval:]
    stats["eval_held_out_of_mix"] = held_out
    if not mixed:
        raise DraftkitError(f"recipe {recipe.name!r} gave no train conversations with "
                            f"data.source={d.source} (per source: {stats['sources']}); check its "
                            "sources, fields and data.max_samples")
    return Mix(train=mixed, eval=eval_convs, stats=stats)
