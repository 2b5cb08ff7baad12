"""An export's serving file: the measured method and k as `serving.json` beside its
`speculative_config.json`, a README section with serving snippets that use them, and
`meta.json["serving"]`.

`draftkit eval` picks them (eval/choice.py -> <run>/eval/choice.json); `draftkit export` copies
them into the export it writes when its weights are the ones eval measured (export, eval, then
export again puts the choice in; a retrained draft drops it and says to re-run eval). With no
measurement the export is as before: `speculative_config.json` and the README's snippets serve
the draft at draft.num_speculative_tokens. speculative_config.json is
never changed: it stays the draft's own config (the parity check, refresh and swaps read it).

    serving.json: its format is serving/speculative.py's (`serving_json`), which every reader
    of it (`speculative.served`) shares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from draftkit.core import artifacts, registry
from draftkit.eval import choice as choices
from draftkit.serving.speculative import SERVING_FILE, SPEC_FILE, serving_json

BEGIN, END = "<!-- draftkit:measured -->", "<!-- /draftkit:measured -->"


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
    own = artifacts.read_json(out / SPEC_FILE)  # the draft's, "model": "."
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
