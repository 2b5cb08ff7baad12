"""What the benchmarks share: bench runs that reuse a finished run's data and harvest, serving
every prompt split from one vLLM engine, the vLLM results table and AL/speedup-vs-k plot, and
writing <out>/<name>.{json,md,png} (the files under results/ that the docs cite).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from draftkit.core import artifacts, config, provenance
from draftkit.core.artifacts import RunPaths
from draftkit.eval import stage
from draftkit.harvest.shards import HarvestSet, open_harvest
from draftkit.serving import vllm_engine


def provenance_line(meta: dict) -> str:
    """"Command: `python ...` at code `sha`; CPU: ... (native bf16: ...)." from a `meta`."""
    hw = meta.get("hardware") or {}
    return (f"Command: `python {' '.join(meta.get('argv') or ['?'])}` at code "
            f"`{(meta.get('git_sha') or '?')[:7]}`; CPU: {hw.get('cpu_model', '?')} (native bf16: "
            f"{hw.get('cpu_native_bf16', '?')}).")


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link (or copy) a finished stage dir into a bench run: no second harvest, and the
    source stays untouched."""
    if dst.exists():
        return
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.copytree(src, dst)


def link_run(src: Path, run: Path, edit: Callable | None = None) -> None:
    """`run` as a bench run of `src`: the source's config named `run.name` (then changed by
    `edit(cfg)`, if given), its data/ and harvest/ linked in (link_tree)."""
    cfg = config.load(src)
    cfg.name = run.name
    if edit is not None:
        edit(cfg)
    run.mkdir(parents=True, exist_ok=True)
    artifacts.write_text_atomic(run / config.CONFIG_NAME, config.dump(cfg))
    for part in ("data", "harvest"):
        link_tree(src / part, run / part)


def prepared_run(path: str) -> Path | None:
    """`path` as a run dir whose data/ is prepared, else None after an error naming the fix."""
    run = Path(path)
    if not (run / "data" / "meta.json").is_file():
        print(f"error: {run} has no prepared data; run `make demo` first", file=sys.stderr)
        return None
    return run


def harvest_of(cfg, paths: RunPaths, split: str) -> HarvestSet:
    """The run's verified harvest of `split` ("train" or "eval"), as train opens it: checked
    against the run's target and aux layer ids."""
    hdir = paths.harvest / "eval" if split == "eval" else paths.harvest
    return open_harvest(hdir, target_name=cfg.target.name, aux_layer_ids=cfg.draft.aux_layer_ids)


def add_grid_args(p: argparse.ArgumentParser) -> None:
    """The vLLM grid of a bench (--k, --temperature, --batch: comma lists), its prompts and
    new tokens, and the results dir (--out)."""
    p.add_argument("--k", default="1,2,3,4,5")
    p.add_argument("--temperature", default="0,1")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default="results")


def serve_splits(cfg, method: str, k: int | None, spec: dict | None,
                 prompts: dict[str, list[list[int]]], temps: list[float], batch: int
                 ) -> list[dict]:
    """One vLLM engine (speculative config `spec`, sized for every prompt) serving every split
    at every temperature (T > 0 seeded by eval.seed) at `batch`: eval/stage.row's rows, each
    with its split."""
    e = cfg.eval
    every = [q for qs in prompts.values() for q in qs]
    rows = []
    es = vllm_engine.run_engine_spec(cfg, spec, every, batch_size=batch)
    with stage.started(es) as llm:
        vllm_engine.generate(llm, every[:1], vllm_engine.sampling(0.0, 8))  # warm-up
        for temp in temps:
            params = vllm_engine.sampling(temp, e.max_new_tokens,
                                          seed=e.seed if temp > 0 else None)
            for split, qs in prompts.items():
                m = vllm_engine.measure(llm, qs, params, batch_size=batch)
                m.pop("outputs")
                rows.append({"split": split, **stage.row(method, k, temp, m)})
    return rows


def fmt(x, spec: str = ".2f") -> str:
    """A table cell: `x` formatted, "–" where it was not measured."""
    return "–" if x is None else format(x, spec)


def vllm_table(rows: list[dict]) -> list[str]:
    """Markdown lines of eval rows (eval/stage.row plus "speedup"): one per (method, k, T, batch)."""
    lines = ["| method | k | T | batch | AL | acceptance per position | tok/s | speedup |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("unavailable"):  # a method this machine cannot serve (eval/stage.unavailable)
            lines.append(f"| {r['method']} | {r['k'] or '–'} | {r['temperature']:g} | "
                         f"{r['batch_size']} | not measured: {r['unavailable']} | – | – | – |")
            continue
        pos = " / ".join(f"{v:.2f}" for v in r.get("per_position") or []) or "–"
        al = f"{r['acceptance_length']:.2f}" if r.get("acceptance_length") else "–"
        lines.append(f"| {r['method']} | {r['k'] or '–'} | {r['temperature']:g} | "
                     f"{r['batch_size']} | {al} | {pos} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x |")
    return lines


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    # deferred: the backend must be chosen before pyplot's first import, and only plots need it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_vs_k(rows: list[dict], path: Path, styles: Sequence[tuple[str, str]]) -> None:
    """AL and speedup against k, a curve per (method, T, batch); `styles` is (method, matplotlib
    format) in drawing order, methods not listed are left out."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method, style in styles:
        for (temp, batch) in sorted({(r["temperature"], r["batch_size"]) for r in rows}):
            pts = sorted((r["k"], r.get("acceptance_length"), r["speedup"]) for r in rows
                         if r["method"] == method and r["temperature"] == temp
                         and r["batch_size"] == batch)
            if not pts:
                continue
            label = f"{method} T={temp:g} b={batch}"
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
            axes[1].plot([p[0] for p in pts], [p[2] for p in pts], style, label=label)
    axes[0].set(xlabel="k", ylabel="acceptance length", title="AL vs k (vLLM)")
    axes[1].set(xlabel="k", ylabel="speedup vs no speculation", title="speedup vs k (vLLM)")
    axes[1].axhline(1.0, color="gray", lw=0.8)
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(out: Path, name: str, data: dict, md: str,
                 plot: Callable[[Path], None] | None = None) -> None:
    """<out>/<name>.json (atomic), <name>.md (atomic) and, with `plot(path)`, <name>.png. Each
    names its command, machine and commit: `data` gains a provenance `meta` where the bench
    gave none, and the Markdown a closing line with them where it names no command itself."""
    data.setdefault("meta", provenance.make_meta(name, None))
    if "Command:" not in md:
        md = md.rstrip("\n") + "\n\n" + provenance_line(data["meta"]) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    artifacts.write_json_atomic(out / f"{name}.json", data)
    artifacts.write_text_atomic(out / f"{name}.md", md)
    if plot is not None:
        plot(out / f"{name}.png")
