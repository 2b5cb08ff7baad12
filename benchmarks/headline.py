"""The README's headline table, derived from a `bench_goals` result (never typed by hand).

One row per method, one column per (temperature, batch size) on one prompt split; each cell is
the method's tokens/s over no speculation's in the same run, with its tokens per target step.
Cells under 1.00x (speculation that slows rollouts down) are bold, so the bad cells stand beside
the good ones. `tests/test_docs.py` regenerates the table from the results file the README
names and asserts the README's rows are these rows.

    python scripts/headline.py results/bench_goals.json            # prints the table
"""

from __future__ import annotations

import json
from pathlib import Path

SPLIT = "hand-written"  # problems in no template's wording: the split nothing was tuned on


def _key(row: dict) -> tuple:
    """A table row: a method's own rows per k; the exported choice's and its ranges' rows by
    label alone (their method and k may change with the batch)."""
    return (row["label"],) if row["label"].startswith("exported") else (row["label"], row["k"])


def _name(cells: list[dict]) -> str:
    if cells[0]["label"] == "none":
        return "no speculation (tok/s)"
    ks = {r.get("k") for r in cells}
    k = f", k={ks.pop()}" if len(ks) == 1 and None not in ks else ""
    return f"{cells[0]['label']}{k}"


def columns(rows: list[dict]) -> list[tuple[float, int]]:
    """(temperature, batch) pairs measured, T=0 first."""
    return sorted({(r["temperature"], r["batch_size"]) for r in rows})


def table(result: dict, split: str = SPLIT) -> list[str]:
    """Markdown lines: header, separator, one row per method of `result` on `split`."""
    rows = [r for r in result["rows"] if r["split"] == split]
    cols = columns(rows)
    base = {(r["temperature"], r["batch_size"]): r["tokens_per_s"]
            for r in rows if r["method"] == "none"}
    order: list[tuple] = []
    for r in rows:
        if _key(r) not in order:
            order.append(_key(r))
    head = ["method"] + [f"T={t:g} b{b}" for t, b in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in order:
        cells = {(r["temperature"], r["batch_size"]): r for r in rows if _key(r) == key}
        out = [_name(list(cells.values()))]
        for col in cols:
            r = cells.get(col)
            if r is None or r.get("unavailable"):
                out.append("–")
            elif r["label"] == "none":
                out.append(f"{r['tokens_per_s']:.1f}")
            else:
                ratio = r["tokens_per_s"] / base[col]
                cell = f"{ratio:.2f}x ({r['tokens_per_step']:.2f})"
                out.append(f"**{cell}**" if ratio < 1.0 else cell)
        lines.append("| " + " | ".join(out) + " |")
    return lines


def caption(result: dict, split: str = SPLIT) -> str:
    """What the table was measured on: prompts, tokens, dtype, CPU, commit."""
    hw = result.get("hardware", {})
    prompts = result.get("prompts", {})
    return (f"{result.get('target', '?')} target, split `{split}`, "
            f"{prompts.get('batch_1', '?')} prompts at batch 1 and {prompts.get('batch_gt_1', '?')} "
            f"above, {result.get('max_new_tokens', '?')} new tokens, {result.get('dtype', '?')}, "
            f"{hw.get('cpu_count', '?')} cores of an {hw.get('cpu_model', '?')} "
            f"(native bf16: {hw.get('cpu_native_bf16', '?')}), code "
            f"`{str(result.get('git_sha', '?'))[:7]}`")


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())
