"""`draftkit prepare RUN`: recipe -> chat-templated conversations, rewritten by the target,
with the assistant loss mask and the token frequencies the draft vocabulary is chosen from.

    draftkit prepare runs/demo
    draftkit prepare runs/tiny data.source=local data.max_samples=32 data.regen_engine=hf

Steps: load and mix the recipe's sources (sources.py) -> add the system prompt -> drop
conversations whose first prompt does not fit `data.max_seq_len` -> optionally ask the target for new train prompts
(selfinstruct.py) -> regenerate every assistant turn with the target (regen.py; resumable) ->
optionally add word-substituted copies of the train conversations (substitute.py) ->
cut turns whose prompt does not fit, template, tokenize and mask (chat_mask.py; longer
conversations truncated) -> count masked
train tokens -> write `data/{train,eval}` (Arrow), `token_freqs.safetensors`, `stats.json`,
`meta.json` (written last: a data dir without it is incomplete). Only the tokenizer is loaded
unless HF regeneration needs the model.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from draftkit.core import artifacts, config, provenance
from draftkit.core.errors import DraftkitError
from draftkit.core.prepared_data import COUNTS_FILE, SPLITS
from draftkit.prepare import chat_mask, recipes, regen, selfinstruct, sources, substitute
from draftkit.prepare.sources import Conversation, Dropped
from draftkit.targets.load import run_target_dir

COLUMNS = ("id", "source", "messages", "prompt_ids", "input_ids", "loss_mask", "length")


def load_tokenizer(path: str | Path):
    """The target's tokenizer; it must carry a chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if not tok.chat_template:
        raise DraftkitError(f"the tokenizer at {path} has no chat template, so conversations "
                            "cannot be templated; add `chat_template` to its "
                            "tokenizer_config.json (or a chat_template.jinja file) or use the "
                            "instruct version of the model")
    return tok


def _add_system(convs: list[Conversation], system: str) -> None:
    if system:
        for c in convs:
            if c.messages[0]["role"] != "system":
                c.messages.insert(0, {"role": "system", "content": system})


def _first_prompt_fits(convs: list[Conversation], tok, max_seq_len: int,
                       st: dict) -> list[Conversation]:
    """Drop conversations whose first prompt alone reaches max_seq_len (before generation;
    later turns depend on regenerated answers and are fitted after)."""
    kept = []
    for c in tqdm(convs, desc="check prompts", unit="conv", leave=False):
        first = next(i for i, m in enumerate(c.messages) if m["role"] == "assistant")
        if len(chat_mask.prompt_ids(tok, c.messages, first)) >= max_seq_len:
            st["dropped"]["prompt_too_long"] += 1
        else:
            kept.append(c)
    return kept


def _encode(convs: list[Conversation], tok, max_seq_len: int, st: dict) -> dict[str, list]:
    """Columns of one split; drops and truncations counted in `st`."""
    cols: dict[str, list] = {k: [] for k in COLUMNS}
    for c in tqdm(convs, desc="template + mask", unit="conv"):
        try:
            msgs, trimmed = chat_mask.fit_turns(tok, c.messages, max_seq_len)
            if any(m["role"] == "assistant" and not m["content"].strip() for m in msgs):
                raise Dropped("empty_response")
            enc = chat_mask.encode(tok, msgs, max_seq_len)
        except Dropped as d:
            st["dropped"][d.reason] += 1
            continue
        st["trimmed_turns"] += trimmed
        st["truncated"] += enc.truncated
        for k, v in (("id", c.id), ("source", c.source), ("messages", json.dumps(msgs)),
                     ("prompt_ids", enc.prompt_ids), ("input_ids", enc.input_ids),
                     ("loss_mask", enc.loss_mask), ("length", len(enc.input_ids))):
            cols[k].append(v)
    st.update(samples=len(cols["id"]), tokens=sum(cols["length"]),
              loss_tokens=int(sum(map(sum, cols["loss_mask"]))),
              by_source=dict(Counter(cols["source"])))
    return cols


def token_counts(cols: dict[str, list], vocab_size: int) -> torch.Tensor:
    """counts[v] = number of loss-masked positions holding token v.  # [vocab] int64"""
    ids = np.concatenate([np.asarray(i, dtype=np.int64) for i in cols["input_ids"]] or [[]])
    mask = np.concatenate([np.asarray(m, dtype=bool) for m in cols["loss_mask"]] or [[]])
    return torch.bincount(torch.from_numpy(ids[mask].astype(np.int64)), minlength=vocab_size)


def _write_split(path: Path, cols: dict[str, list]) -> None:
    import datasets

    feats = datasets.Features({
        "id": datasets.Value("string"), "source": datasets.Value("string"),
        "messages": datasets.Value("string"),
        "prompt_ids": datasets.Sequence(datasets.Value("int32")),
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "loss_mask": datasets.Sequence(datasets.Value("int8")),
        "length": datasets.Value("int64")})
    with artifacts.atomic_dir(path, overwrite=True) as tmp:
        datasets.Dataset.from_dict(cols, features=feats).save_to_disk(str(tmp))


def fingerprint(splits: dict[str, dict[str, list]]) -> str:
    """sha256 over every split's ids, input_ids and loss_mask (what later stages consume)."""
    def chunks():
        for name, cols in splits.items():
            yield name.encode()
            for i, ids, mask in zip(cols["id"], cols["input_ids"], cols["loss_mask"],
                                    strict=True):
                yield i.encode()
                yield np.asarray(ids, dtype=np.int64).tobytes()
                yield np.asarray(mask, dtype=np.int8).tobytes()
    return artifacts.fingerprint(sorted(splits), chunks())


def _generate(mix: sources.Mix, recipe: recipes.Recipe, gen: regen.Generator, cfg, root: Path,
              stats: dict, timings: dict) -> None:
    """Self-instruct (train only), regeneration of both splits and word-substituted train
    copies, in place on `mix`."""
    d = cfg.data
    if d.self_instruct:
        t0 = time.perf_counter()
        existing = {sources.prompt_key(c.messages) for c in mix.train + mix.eval}
        extra, stats["self_instruct"] = selfinstruct.self_instruct(
            recipe.self_instruct, d.self_instruct, gen, cfg, root, existing)
        _add_system(extra, d.system_prompt or recipe.system_prompt)
        mix.train += extra
        timings["self_instruct_s"] = time.perf_counter() - t0
    if d.regenerate:
        t0, tokens0, seconds0 = time.perf_counter(), gen.tokens, gen.seconds
        stats["regenerate"] = {s: regen.regenerate(convs, gen, cfg, root, s)
                               for s, convs in (("train", mix.train), ("eval", mix.eval))}
        tokens, seconds = gen.tokens - tokens0, gen.seconds - seconds0
        stats["regenerate"].update(generated_tokens=tokens, engine_seconds=seconds,
                                   tokens_per_s=tokens / seconds if seconds else None)
        timings["regenerate_s"] = time.perf_counter() - t0
    if d.substitute_copies:
        extra = substitute.copies(mix.train, d.substitute_copies, d.substitute_max_df, d.seed)
        stats["substitute"] = {"copies": len(extra), "of": len(mix.train)}
        mix.train += extra


def _check(cfg, recipe: recipes.Recipe) -> None:
    d = cfg.data
    if d.self_instruct and recipe.self_instruct is None:
        raise DraftkitError(f"data.self_instruct={d.self_instruct} but recipe {recipe.name!r} has "
                            "no self_instruct section; add one or set data.self_instruct=0")
    if d.self_instruct and not d.regenerate:
        raise DraftkitError("data.self_instruct needs data.regenerate=true: target-written "
                            "prompts have no responses until the target answers them")
    if d.substitute_copies < 0 or not 0 < d.substitute_max_df <= 1:
        raise DraftkitError(f"data.substitute_copies={d.substitute_copies} / substitute_max_df="
                            f"{d.substitute_max_df}: copies must be >= 0 and max_df in (0, 1]")
    if d.max_seq_len < 16:
        raise DraftkitError(f"data.max_seq_len={d.max_seq_len} is too small; use >= 16")


def prepare(run_dir: str | Path, overrides: list[str] | None = None) -> Path:
    """Build the run's `data/` dir (see the module docstring) and return it."""
    run = config.open_run(run_dir, overrides)
    cfg = run.cfg
    d, out = cfg.data, run.paths.data
    timings, t0 = {}, time.perf_counter()
    recipe = recipes.load_recipe(d.recipe)
    _check(cfg, recipe)
    path = run_target_dir(cfg.target)
    tok = load_tokenizer(path)
    (out / "meta.json").unlink(missing_ok=True)  # incomplete until rewritten at the end
    mix = sources.load_mix(recipe, d, out / ".cache")
    stats = {"load": mix.stats}
    split_stats = {s: {"dropped": Counter(), "trimmed_turns": 0, "truncated": 0} for s in SPLITS}
    for name, convs in (("train", mix.train), ("eval", mix.eval)):
        _add_system(convs, d.system_prompt or recipe.system_prompt)
        setattr(mix, name, _first_prompt_fits(convs, tok, d.max_seq_len, split_stats[name]))
    timings["load_s"] = time.perf_counter() - t0
    gen = regen.Generator(cfg, tok, path)
    try:
        _generate(mix, recipe, gen, cfg, out / ".regen", stats, timings)
    finally:
        gen.close()
    t1 = time.perf_counter()
    cols = {s: _encode(getattr(mix, s), tok, d.max_seq_len, split_stats[s]) for s in SPLITS}
    if not cols["train"]["id"]:
        raise DraftkitError(f"no train conversation survived prepare (dropped: "
                            f"{dict(split_stats['train']['dropped'])}); raise data.max_seq_len, "
                            "check the recipe's fields, or regenerate with more max_new_tokens")
    counts = token_counts(cols["train"], max(cfg.target.vocab_size, len(tok)))
    timings["encode_s"] = time.perf_counter() - t1
    for s in SPLITS:
        _write_split(out / s, cols[s])
    artifacts.write_bytes_atomic(out / COUNTS_FILE, _safetensors(counts))
    stats.update({s: {**st, "dropped": dict(st["dropped"])} for s, st in split_stats.items()})
    timings["total_s"] = time.perf_counter() - t0
    stats["timings"] = timings
    artifacts.write_json_atomic(out / "stats.json", stats)
    provenance.write_meta(out, "prepare", cfg.to_dict(), timings, recipe=str(recipe.path),
                         data_fingerprint=fingerprint(cols),
                         samples={s: len(cols[s]["id"]) for s in SPLITS})
    return out


def _safetensors(counts: torch.Tensor) -> bytes:
    from safetensors.torch import save

    return save({"counts": counts.to(torch.int64).contiguous()})
