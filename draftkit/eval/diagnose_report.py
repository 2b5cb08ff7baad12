"""The `draftkit diagnose` report: causes ranked by what they cost, then Markdown, JSON, PNG.

A cause's cost is the first-position acceptance it takes away (a share of draft starts, 0 to
1): what every later position multiplies, so the ranking reads the same at any k.
    settings       run, export and engine disagree (taps, method, k): the measure is not what
                   vLLM serves; cost 1 (listed first)
    vocabulary     the policy's sampled (or argmax) tokens outside the draft vocab: never
                   accepted, so the share itself is lost
    temperature    acceptance at the served temperature below T=0's (trained for T=0 answers?)
    token class    share of a class x how far its acceptance trails the other tokens'
    chat template  rows whose prompt lacks the run's generation prompt x what they lose
    drift          held-out acceptance (the draft's own kind of data) minus the rollouts'
    depth          a last position that is rarely reached and accepted (cost 0: it only costs
                   draft compute; the fix is a smaller k)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftkit.core import artifacts

FIXES = {
    "digits": "numbers are drafted worse than the rest: add data whose answers carry numbers "
              "(data.max_samples, data.self_instruct) or train longer (train.epochs)",
    "whitespace": "whitespace and newlines trail: train on answers formatted as the policy "
                  "formats them (data.regenerate=true, the target's own answers)",
    "template": "template/special tokens (end of turn) trail: keep the answers' template ends "
                "in training (data.regenerate=true) and in the draft vocab",
    "other": "word tokens trail the rest: more (and more varied) training data, or more epochs",
}


def rank(rep: dict, cfg) -> list[dict]:
    """Every cause with its cost, figure and fix; worst first."""
    fp = rep["first_position"]
    causes = [_settings(rep), _vocab(fp, cfg), _temperature(rep), _token_class(fp),
              _template(rep), _drift(rep), _depth(rep)]
    causes = [c for c in causes if c is not None]
    return sorted(causes, key=lambda c: -c["cost"])


def _cause(name: str, cost: float, figure: str, fix: str) -> dict:
    return {"cause": name, "cost": round(max(0.0, cost), 4), "figure": figure, "fix": fix}


def _settings(rep: dict) -> dict | None:
    problems = rep["consistency"]["problems"]
    if not problems:
        return _cause("settings", 0.0, "run, export and engine config agree (aux layer ids "
                      f"{rep['consistency']['aux_layer_ids']['export']}, k, method)", "none")
    return _cause("settings", 1.0, "; ".join(problems), "see each mismatch")


def _vocab(fp: dict, cfg) -> dict:
    v = fp["vocab"]
    cost = max(v["sampled_outside"], v["argmax_outside"])
    top = ", ".join(f"{t['text']!r} ({t['count']})" for t in v["top_missing"][:5])
    size = v.get("draft_vocab_size")
    want = size + v["distinct_missing"] if size else None
    figure = (f"{v['sampled_outside']:.1%} of the policy's sampled tokens, {v['argmax_outside']:.1%}"
              f" of its argmax tokens and {v['mass_outside']:.1%} of its probability mass at "
              f"T={fp['temperature']:g} lie outside the {size}-token draft vocab"
              + (f"; most missed: {top}" if top else ""))
    fix = ("none" if cost == 0 else
           f"raise draft.draft_vocab_size to at least {want} ({v['distinct_missing']} missing "
           "tokens) and retrain, or rebuild the vocab from data like these rows "
           "(`draftkit refresh` counts the rollouts' tokens)")
    return _cause("vocabulary", cost, figure, fix)


def _temperature(rep: dict) -> dict:
    fp, served, trained = rep["first_position"], rep["served_temperature"], \
        rep["trained_temperature"]
    gap = fp["a0"] - fp["at"]
    made = "the dataset's own answers" if trained is None else f"answers made at T={trained:g}"
    figure = (f"first-position acceptance {fp['a0']:.3f} at T=0, {fp['at']:.3f} at the served "
              f"T={served:g} ({rep['draft_sample_method']} drafting); trained on {made}")
    if served == 0:
        fix = "none (served greedily)"
    elif trained != served:
        fix = (f"regenerate the answers at the served temperature (data.regen_temperature="
               f"{served:g}) and retrain; a loss aligned with sum min(p, q) closes more")
    else:
        fix = ("the answers already match the served temperature: train with a loss aligned "
               "with acceptance under sampling (total variation, sum min(p, q))")
    return _cause("temperature", gap, figure, fix)


def _token_class(fp: dict) -> dict | None:
    scored = [(c["share"] * max(0.0, (c["a0_rest"] or 0.0) - c["a0"]), name, c)
              for name, c in fp["classes"].items() if c["a0_rest"] is not None]
    if not scored:
        return None
    cost, name, c = max(scored)
    table = "; ".join(f"{n} {x['share']:.0%} of starts at {x['a0']:.3f}"
                      for n, x in fp["classes"].items())
    return _cause(f"token class ({name})", cost,
                  f"first-position acceptance at T=0 by drafted token: {table}",
                  FIXES[name] if cost > 0 else "none")


def _template(rep: dict) -> dict:
    t = rep["first_position"]["templated"]
    share = t["untemplated_rows"] / t["rows"] if t["rows"] else 0.0
    if share == 0:
        return _cause("chat template", 0.0, f"all {t['rows']} rows end their prompt with the "
                      "run's generation prompt", "none")
    if t["a0_templated"] is not None and t["a0_untemplated"] is not None:
        cost = share * (t["a0_templated"] - t["a0_untemplated"])
    else:
        held = rep.get("held_out")
        cost = (held["a0"] - rep["first_position"]["a0"]) if held else share
    return _cause("chat template", cost,
                  f"{t['untemplated_rows']} of {t['rows']} rows' prompts lack the run's "
                  f"generation prompt (first-position acceptance at T=0 "
                  f"{report_fmt(t['a0_untemplated'])} on them, "
                  f"{report_fmt(t['a0_templated'])} on templated rows)",
                  "apply the target's chat template to the prompts as training did "
                  "(tokenizer.apply_chat_template(..., add_generation_prompt=True)), or train "
                  "on prompts formatted as the policy sees them")


def _drift(rep: dict) -> dict:
    held = rep.get("held_out")
    if held is None:
        return _cause("drift", 0.0, "no rollouts given: measured on the run's own held-out "
                      "rows (pass --rollouts [--policy] to measure drift)", "none")
    fp = rep["first_position"]
    return _cause("drift", held["a0"] - fp["a0"],
                  f"first-position acceptance at T=0 {fp['a0']:.3f} on the rollouts against "
                  f"{held['a0']:.3f} on the run's held-out rows",
                  f"refresh the draft on these rollouts: `draftkit refresh {rep['run_dir']} "
                  "--policy CKPT --rollouts PATH`")


def _depth(rep: dict) -> dict | None:
    key = f"T={rep['served_temperature']:g}"
    pos = rep["per_position"][key]["per_position"]
    if len(pos) < 2 or pos[-2] <= 0:
        return None
    cond = pos[-1] / pos[-2]
    if cond >= 0.3:
        return None
    return _cause("depth", 0.0, f"at {key} position {len(pos)} is accepted in {cond:.0%} of "
                  f"the steps that reach it (per position {_fmt(pos)})",
                  f"serve k={len(pos) - 1} (draft.num_speculative_tokens): the last draft "
                  "step costs more than it returns")


def report_fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _fmt(xs: list[float]) -> str:
    return " / ".join(f"{x:.3f}" for x in xs)


# ----------------------------------------------------------------------------- files


def markdown(rep: dict) -> str:
    rows = rep["rows"]
    lines = [f"# Why draft `{rep['run']}` ({rep['kind']}, k={rep['k']}) accepts what it does",
             "", f"{rows['count']} {rows['source']} rows (policy {rows['policy']}), "
             f"teacher-forced in torch; served at T={rep['served_temperature']:g}, "
             f"{rep['draft_sample_method']} drafting.", "",
             "| rank | cause | cost (first-position acceptance) | figure | fix |",
             "|---|---|---|---|---|"]
    for i, c in enumerate(rep["causes"], 1):
        lines.append(f"| {i} | {c['cause']} | {c['cost']:.3f} | {c['figure']} | {c['fix']} |")
    lines += ["", "| temperature | AL (tokens per target step) | per-position acceptance |",
              "|---|---|---|"]
    for key, e in rep["per_position"].items():
        lines.append(f"| {key} | {e['al']:.3f} | {_fmt(e['per_position'])} |")
    if rep.get("engine"):
        lines += ["", f"vLLM (`draftkit eval`, {rep['engine']['report']}):", ""]
        lines += [f"- T={r['temperature']:g} batch {r['batch_size']}: AL "
                  f"{r['acceptance_length']:.3f}" for r in rep["engine"]["rows"]]
    return "\n".join(lines) + "\n"


def plot(rep: dict, path: Path) -> None:
    import matplotlib  # on use: plotting is optional for the numbers

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(rep["per_position"]))
    for i, (key, e) in enumerate(rep["per_position"].items()):
        xs = [j + 1 + i * width for j in range(len(e["per_position"]))]
        a.bar(xs, e["per_position"], width, label=f"{key} (AL {e['al']:.2f})")
    a.set(xlabel="draft position", ylabel="acceptance", title="per-position acceptance",
          ylim=(0, 1))
    a.legend()
    causes = rep["causes"][::-1]
    b.barh([c["cause"] for c in causes], [c["cost"] for c in causes])
    b.set(xlabel="first-position acceptance lost", title="causes, worst on top", xlim=(0, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(rep: dict, out_dir: Path) -> dict:
    """diagnose-<time>.{json,md,png} in out_dir; returns {kind: path}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"diagnose-{time.strftime('%Y%m%d-%H%M%S')}"
    files = {"json": str(base.with_suffix(".json")), "md": str(base.with_suffix(".md")),
             "png": str(base.with_suffix(".png"))}
    tmp_png = base.with_name(f".{base.name}.png")
    plot(rep, tmp_png)
    tmp_png.replace(files["png"])
    artifacts.write_text_atomic(files["md"], markdown(rep))
    artifacts.write_text_atomic(files["json"], json.dumps({**rep, "files": files}, indent=2,
                                                          default=str))
    return files
