"""Eval report files: JSON, a Markdown table and PNG plots (matplotlib Agg), all from one report
dict (eval/stage.py). Written to `<run>/eval/eval-<run>-<time>.*` with a meta.json; with
`eval.results_dir` set, to that dir, and the JSON and Markdown are copied into `<run>/eval/`."""

from __future__ import annotations

import math
import time
from pathlib import Path

from draftkit.core import artifacts, provenance

PLOTS = ("per_position", "al_vs_k", "speedup_vs_k")


def write(rep: dict, cfg, paths) -> dict:
    """Write every file; returns {kind: path} (also stored in rep["files"])."""
    out_dir = Path(cfg.eval.results_dir).expanduser() if cfg.eval.results_dir else paths.eval
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"eval-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    files = {"json": str(base.with_suffix(".json")), "md": str(base.with_suffix(".md"))}
    files.update(plots(rep, base))
    rep["files"] = files
    md = markdown(rep)
    artifacts.write_json_atomic(files["json"], rep)
    artifacts.write_text_atomic(files["md"], md)
    if out_dir.resolve() != paths.eval.resolve():  # eval.results_dir: the run keeps a copy
        artifacts.write_json_atomic(paths.eval / Path(files["json"]).name, rep)
        artifacts.write_text_atomic(paths.eval / Path(files["md"]).name, md)
    provenance.write_meta(paths.eval, "eval", cfg.to_dict(), rep.get("timings"), files=files)
    return files


# ----------------------------------------------------------------------------- markdown


def _f(x, fmt: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _pos(values: list[float] | None) -> str:
    return " / ".join(f"{v:.2f}" for v in values or []) or "–"


def markdown(rep: dict) -> str:
    s = rep["settings"]
    lines = [f"# draftkit eval: {rep['run']}", "",
             f"target `{rep['target']['name']}`, draft `{rep['draft']['kind']}` "
             f"({rep['draft']['dir']}; {rep['draft'].get('sample_method', 'greedy')} drafting "
             f"at T > 0), {s['prompts']} eval prompts (mean "
             f"{s['mean_prompt_tokens']:.0f} tokens), max_new_tokens {s['max_new_tokens']}, "
             f"vLLM dtype {s['dtype']} (reference decoder and costs: torch fp32), seed "
             f"{s['seed']}, {rep['created']}", ""]
    if "hardware" in rep:
        h = rep["hardware"]
        lines[-1:-1] = [f"Ran on: {h['device']}, CPU {h['cpu_model']} ({h['cpu_count']} cores; "
                        f"flags {' '.join(h['cpu_flags'])})"
                        + (f", code {rep['git_sha'][:7]}" if rep.get("git_sha") else "")]
    if "vllm" in rep:
        lines += ["## vLLM", "",
                  "| method | k | T | batch | prompts | AL | tok/step | acceptance per position "
                  "| tok/s | speedup | projected |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rep["vllm"]["rows"]:
            lines.append(f"| {_method(r)} | {r['k'] or '–'} | {r['temperature']:g} | "
                         f"{r['batch_size']} | {r['prompts']} | {_f(r.get('acceptance_length'))} | "
                         f"{_f(r.get('tokens_per_step'))} | "
                         f"{_pos(r.get('per_position'))} | {_f(r['tokens_per_s'], '.1f')} | "
                         f"{_f(r['speedup'])}x | {_f(r.get('projected_speedup'))} |")
        lines += ["", "AL = 1 + accepted / drafts (vLLM's counter: steps that carried a "
                  "draft); tok/step = output tokens / target forward steps, every step counted "
                  "(n-gram's steps without a match included); acceptance at position i = "
                  "accepted_i / drafts; speedup = tok/s over no speculation at the same T and batch. "
                  "projected = (1 + Σ a_i) · c_target / (c_verify(k) + k · c_draft), costs timed "
                  f"in torch at context {rep['costs']['context_tokens']} tokens (costs.py).", ""]
        compared = rep["vllm"].get("compared_runs", {})
        if compared:
            named = ", ".join(f"`{m}` ({d})" for m, d in compared.items())
            lines += [f"Compared beside this run's draft (eval.compare_runs; not a serving "
                      f"candidate, no projection): {named}", ""]
        lines += _unavailable(rep["vllm"]["rows"])
        lines += _choice(rep.get("choice"))
        if "splits" in rep["vllm"]:
            lines += _splits(rep["vllm"]["splits"])
        lines += _lossless(rep["lossless_vllm"])
    if "reference" in rep:
        lines += ["## Reference decoder (torch)", "",
                  "| k | T | prompts | AL | acceptance per position | tokens |",
                  "|---|---|---|---|---|---|"]
        for r in rep["reference"]["rows"]:
            lines.append(f"| {r['k']} | {r['temperature']:g} | {r['prompts']} | "
                         f"{_f(r['acceptance_length'])} | {_pos(r['per_position'])} | "
                         f"{r['output_tokens']} |")
        lines.append("")
    if rep.get("diagnose"):  # eval/stage.py's diagnose_link: the draft's AL below the threshold
        d = rep["diagnose"]
        lines += ["## Why is acceptance low?", "", f"{d['why']}: `{d['command']}` ranks the "
                  "causes (settings, vocabulary, temperature, token class, chat template, drift, "
                  "depth), each with its fix.", ""]
    return "\n".join(lines)


SPLIT_MEANS = {"seen-templates": "new problems of the training templates (what RL rollouts see)",
               "hand-written": "problems written by hand, no template (data_recipes/eval/)"}


def _splits(x: dict) -> list[str]:
    """The eval.splits table: each split measured by the same engines at one batch size."""
    b = x["rows"][0]["batch_size"] if x["rows"] else "–"
    what = "; ".join(f"{s}: {SPLIT_MEANS[s]}" for s in x["prompts"] if s in SPLIT_MEANS)
    lines = [f"## Other prompt splits (batch {b})", "",
             f"{what}. Prompts: {x['prompts']}." if what else f"Prompts: {x['prompts']}.", "",
             "| split | method | k | T | AL | tok/step | acceptance per position | tok/s | "
             "speedup |", "|---|---|---|---|---|---|---|---|---|"]
    for r in x["rows"]:
        lines.append(f"| {r['split']} | {_method(r)} | {r['k'] or '–'} | {r['temperature']:g} "
                     f"| {_f(r.get('acceptance_length'))} | {_f(r.get('tokens_per_step'))} | "
                     f"{_pos(r.get('per_position'))} | {_f(r['tokens_per_s'], '.1f')} | "
                     f"{_f(r['speedup'])}x |")
    return [*lines, ""]


def _choice(c: dict | None) -> list[str]:
    """The method and k to serve per batch range (choice.py), and the one-engine k schedule."""
    if not c or not c["ranges"]:
        return []
    lines = ["## Chosen method and k per batch size", "",
             "Among the (method, k) no slower than no speculation at every T (one engine serves "
             f"every temperature), the fastest at T={c.get('temperature', 1.0):g}; within "
             f"{c['margin']:.0%} of it the simplest (none, ngram, suffix, the draft; smaller k). "
             "Written to <run>/eval/choice.json; `draftkit export` copies it into the export "
             "(serving.json).", "",
             "| batches | method | k | score | speedup per T |", "|---|---|---|---|---|"]
    for p in c["ranges"]:
        hi = "+" if p["batch_to"] is None else f"–{p['batch_to']}"
        per_t = ", ".join(f"T={float(t):g}: {x['speedup']:.2f}x"
                          for t, x in p["by_temperature"].items())
        lines.append(f"| {p['batch_from']}{hi} | {p['method']} | {p['k'] or '–'} | "
                     f"{p['score']:.2f}x ({p.get('decided_by', '')}) | {per_t} |")
    d = c.get("dynamic")
    lines += ["", f"One engine (vLLM `num_speculative_tokens_per_batch_size`): "
              f"{d['method']} {d['num_speculative_tokens_per_batch_size']}" if d else
              _no_schedule(c["ranges"]), ""]
    return lines


def _no_schedule(ranges: list[dict]) -> str:
    """Why one engine serves no speculation: nothing wins, or no method wins everywhere (a
    range it loses would need k 0, which vLLM still drafts: eval/choice.py)."""
    if all(p["method"] == "none" for p in ranges):
        return "One engine: no method beats no speculation at any batch size."
    return ("One engine: no speculation (no method is no slower than it at every batch size, "
            "and k 0 is not no speculation in vLLM); the table's method per range needs one "
            "engine per range.")


def _method(r: dict) -> str:
    return f"{r['method']} (not measured)" if r.get("unavailable") else r["method"]


def _unavailable(rows: list[dict]) -> list[str]:
    """One line per method that could not be measured here, with the reason."""
    why = {r["method"]: r["unavailable"] for r in rows if r.get("unavailable")}
    return [*(f"{m} not measured: {reason}" for m, reason in why.items()), ""] if why else []


def _lossless(x: dict) -> list[str]:
    div = x["first_divergence"]
    where = (f"; mismatching sequences first diverge at token {div['min']} (min), "
             f"{div['median']} (median), {div['mean']:.1f} (mean)") if div else ""
    free = "".join(f" {m}: {c['exact']}/{c['sequences']} token-exact."
                   for m, c in (x.get("free_methods") or {}).items())
    return ["## Lossless check (vLLM, fp32, greedy)", "",
            f"{x['exact']}/{x['sequences']} sequences token-exact ({x['match_rate']:.0%}) with "
            f"the draft at k={x['k']} vs no speculation, batch {x['batch_size']} "
            f"({x['source']}){where}.{free}", ""]


# ----------------------------------------------------------------------------- plots


def _series(rep: dict) -> dict[str, list[dict]]:
    """Rows grouped per curve label (method, T, batch), speculative rows only."""
    rows = [r for r in rep.get("vllm", {}).get("rows", [])
            if r["method"] != "none" and not r.get("unavailable")]
    rows += rep.get("reference", {}).get("rows", [])
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(f"{r['method']} T={r['temperature']:g} b={r['batch_size']}", []).append(r)
    return {k: sorted(v, key=lambda r: r["k"]) for k, v in out.items()}


def plots(rep: dict, base: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    series = _series(rep)
    files = {}
    for kind in PLOTS:
        if kind == "speedup_vs_k" and "vllm" not in rep:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for label, rows in series.items():
            _draw(ax, kind, label, rows)
        ax.set_title(f"{rep['run']}: {kind.replace('_', ' ')}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        path = base.parent / f"{base.name}-{kind}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files[kind] = str(path)
    return files


def _draw(ax, kind: str, label: str, rows: list[dict]) -> None:
    ks = [r["k"] for r in rows]
    if kind == "per_position":  # the largest k of the curve: a_1..a_k
        r = rows[-1]
        ax.plot(range(1, len(r["per_position"]) + 1), r["per_position"], "o-",
                label=f"{label} k={r['k']}")
        ax.set(xlabel="draft position", ylabel="accepted / drafts", ylim=(0, 1.05))
    elif kind == "al_vs_k":
        ax.plot(ks, [r["acceptance_length"] for r in rows], "o-", label=label)
        ax.set(xlabel="k (draft tokens per step)", ylabel="acceptance length")
    elif "speedup" in rows[0]:
        line = ax.plot(ks, [r["speedup"] for r in rows], "o-", label=f"{label} measured")[0]
        ax.plot(ks, [r.get("projected_speedup") or float("nan") for r in rows], "x--",
                color=line.get_color(), label=f"{label} projected")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="k (draft tokens per step)", ylabel="speedup vs no speculation")
