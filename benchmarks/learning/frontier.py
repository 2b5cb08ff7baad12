"""vLLM AL against the whole CPU cost of a head, over every bench_learning run already measured.
Each setting's cost is its data (prepare: the target regenerating answers, then harvest),
counted as every core busy for the stages' wall time, plus its training CPU-seconds. Per eval
split: the Pareto frontier (the best AL any measured recipe reached at that cost or less), a
log-linear fit of the frontier (AL gained per doubling of compute), and the compute the fit puts
at n-gram's AL and at the issue's goal. No model runs here: it reads bench_learning JSONs.

Only runs measured on the same eval prompts are comparable: a file is used when its n-gram rows
match the `like` file's. A data setting that reused the source's regenerated answers (`source +
copies`) is charged the source's prepare too (from the record, or from a `source`-data setting
of the same source in another file).
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import report

SPLITS = ("unseen-templates", "seen-templates", "hand-written")


def ngram_key(bench: dict, temperature: float) -> tuple:
    """What identifies the eval prompts of a bench: its n-gram rows (n-gram is deterministic at
    T=0, so equal output tokens on equal prompt counts mean the same prompts)."""
    return tuple(sorted((r["split"], r["prompts"], r["output_tokens"])
                        for r in bench["vllm"]["rows"]
                        if r["method"] == "ngram" and r["temperature"] == temperature))


def source_prepare(benches: dict[str, dict]) -> dict[str, float]:
    """Source run -> its prepare seconds, from any setting that used the source's data as is."""
    out = {}
    for b in benches.values():
        for s in b["settings"].values():
            if s.get("data") == "source":
                out.setdefault(b["source"], s["prepare_s"])
    return out


def cost(setting: dict, source: str, prepared: dict[str, float], cores: int) -> dict | None:
    """{data_wall_s, train_cpu_s, total_cpu_s} of one setting; None if a reused source's
    prepare time is nowhere on record."""
    data_wall = setting["prepare_s"] + setting["harvest_s"]
    if setting.get("data") == "source + copies":
        reused = setting.get("source_prepare_s", prepared.get(source))
        if reused is None:
            return None
        data_wall += reused
    return {"data_wall_s": round(data_wall, 1), "train_cpu_s": setting["cpu_s"],
            "total_cpu_s": round(cores * data_wall + setting["cpu_s"], 1)}


def pareto(points: list[dict], split: str) -> list[dict]:
    """The points no cheaper-or-equal point beats on `split`'s AL, by increasing cost."""
    out, best = [], -math.inf
    for p in sorted(points, key=lambda p: (p["total_cpu_s"], -p["al"][split])):
        if p["al"][split] > best:
            out.append(p)
            best = p["al"][split]
    return out


def fit(points: list[dict], split: str) -> dict | None:
    """Least squares AL = a + b * log2(total CPU-s) over `points`: b is AL per doubling."""
    xs = [math.log2(p["total_cpu_s"]) for p in points]
    ys = [p["al"][split] for p in points]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"a": my - b * mx, "per_doubling": b, "points": len(xs)}


def cpu_for(f: dict | None, al: float) -> float | None:
    """The total CPU-s at which the fit reaches `al` (None if it never rises)."""
    if f is None or f["per_doubling"] <= 0:
        return None
    return 2 ** ((al - f["a"]) / f["per_doubling"])


def reruns_once(points: list[dict]) -> list[dict]:
    """One point per (setting, AL on every split): a deterministic rerun of the same training
    (several files re-measure the baseline) is kept once, at its lowest measured cost."""
    best = {}
    for p in sorted(points, key=lambda p: p["total_cpu_s"]):
        best.setdefault((p["setting"], tuple(sorted(p["al"].items()))), p)
    return list(best.values())


def frontier(benches: dict[str, dict], like: str, temperature: float, goal: float,
             demo: str) -> dict:
    """Every comparable setting's cost and AL, and per split its frontier, fit and projections."""
    key = ngram_key(benches[like], temperature)
    prepared = source_prepare(benches)
    points, skipped, ngram = [], {}, {}
    for name, b in benches.items():
        if ngram_key(b, temperature) != key or not key:
            skipped[name] = "other eval prompts or temperature"
            continue
        rows = [r for r in b["vllm"]["rows"] if r["temperature"] == temperature]
        ngram |= {r["split"]: r["acceptance_length"] for r in rows if r["method"] == "ngram"}
        cores = b.get("hardware", {}).get("cpu_count") or 1
        for setting, s in b["settings"].items():
            al = {r["split"]: r["acceptance_length"] for r in rows if r["setting"] == setting}
            c = cost(s, b["source"], prepared, cores)
            if c is None:
                skipped[f"{name}:{setting}"] = "its source's prepare time is not on record"
            elif al:
                points.append({"setting": setting, "file": name, "run": s["run"],
                               "conversations": s["conversations"], **c, "al": al,
                               "cpu": b.get("hardware", {}).get("cpu_model")})
    points = reruns_once(points)
    demo_cost = min((p["total_cpu_s"] for p in points if p["setting"] == demo), default=None)
    splits = {}
    for split in [s for s in SPLITS if points and all(s in p["al"] for p in points)]:
        front = pareto(points, split)
        f = fit([p for p in front if p["total_cpu_s"] >= (demo_cost or 0)], split)
        splits[split] = {"frontier": [(f"{p['setting']} ({p['conversations']})",
                                       p["total_cpu_s"], p["al"][split]) for p in front],
                         "fit": f, "ngram_al": ngram.get(split),
                         "cpu_s_at_ngram": cpu_for(f, ngram[split]) if split in ngram else None,
                         "cpu_s_at_goal": cpu_for(f, goal)}
    return {"like": like, "temperature": temperature, "goal": goal, "demo": demo,
            "demo_cpu_s": demo_cost, "points": points, "skipped": skipped, "splits": splits}


def _hours(s: float | None) -> str:
    return "–" if s is None else f"{s:,.0f} CPU-s ({s / 3600:.1f} CPU-h)"


def markdown(bench: dict) -> str:
    cpus = sorted({p["cpu"] for p in bench["points"] if p["cpu"]})
    lines = ["# AL against the whole CPU cost of a head (bench_learning runs)", "",
             f"Eval prompts of `{bench['like']}`, T={bench['temperature']:g}; CPU: "
             f"{', '.join(cpus) or 'unknown'}. Cost = cores x (prepare + harvest wall s) + "
             "training CPU-s: an upper bound for the data, as if every core were busy.", "",
             "| setting | file | conversations | data wall s | train CPU-s | total CPU-s | "
             + " | ".join(f"AL {s}" for s in bench["splits"]) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(bench["splits"])]
    for p in sorted(bench["points"], key=lambda p: p["total_cpu_s"]):
        lines.append(f"| {p['setting']} | {Path(p['file']).stem} | {p['conversations']} | "
                     f"{p['data_wall_s']:.0f} | {p['train_cpu_s']:.0f} | {p['total_cpu_s']:.0f} | "
                     + " | ".join(report.fmt(p["al"].get(s)) for s in bench["splits"]) + " |")
    lines += ["", f"Per split: the frontier, its fit AL = a + b log2(CPU-s) from `make demo`'s "
              f"recipe (`{bench['demo']}`, {_hours(bench['demo_cpu_s'])}) up (cheaper recipes "
              "that are worse than the demo's would only steepen it), and the compute the fit "
              f"puts at n-gram's AL and at AL {bench['goal']:g}.", "",
              "| split | frontier (setting (conversations): CPU-s, AL) | AL per doubling | n-gram AL | "
              "CPU at n-gram's AL | CPU at the goal |", "|---|---|---|---|---|---|"]
    for split, s in bench["splits"].items():
        front = "; ".join(f"{n}: {c:.0f}, {al:.2f}" for n, c, al in s["frontier"])
        per = report.fmt(s["fit"] and s["fit"]["per_doubling"], "+.3f")
        lines.append(f"| {split} | {front} | {per} | {report.fmt(s['ngram_al'])} | "
                     f"{_hours(s['cpu_s_at_ngram'])} | {_hours(s['cpu_s_at_goal'])} |")
    if bench["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"`{k}` ({v})" for k, v in bench["skipped"].items())]
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    plt = report.pyplot()
    splits = list(bench["splits"])
    fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 4.5), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        s = bench["splits"][split]
        xs = [p["total_cpu_s"] for p in bench["points"]]
        ax.scatter(xs, [p["al"][split] for p in bench["points"]], s=14, color="tab:gray",
                   label="measured settings")
        ax.plot([c for _, c, _ in s["frontier"]], [al for _, _, al in s["frontier"]], "o-",
                color="tab:blue", label="frontier")
        for name, c, al in s["frontier"]:
            ax.annotate(name, (c, al), fontsize=7, xytext=(3, -9), textcoords="offset points")
        if s["fit"]:
            left = bench["demo_cpu_s"] or min(xs)  # where the fit starts
            right = max([*xs, s["cpu_s_at_ngram"] or 0]) * 1.2
            grid = [left * (right / left) ** (i / 50) for i in range(51)]
            ax.plot(grid, [s["fit"]["a"] + s["fit"]["per_doubling"] * math.log2(x) for x in grid],
                    "--", color="tab:blue", alpha=0.6,
                    label=f"fit: {s['fit']['per_doubling']:+.3f} AL per doubling")
        if s["ngram_al"]:
            ax.axhline(s["ngram_al"], color="tab:red", ls=":", label=f"n-gram {s['ngram_al']:.2f}")
        if bench["demo_cpu_s"]:
            ax.axvline(bench["demo_cpu_s"], color="tab:green", ls=":", label="make demo's recipe")
        ax.axvline(3600, color="black", ls=":", alpha=0.5, label="one CPU-hour")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="total CPU-s (data + training)", ylabel="vLLM AL (k=3)", title=split)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"AL against compute, T={bench['temperature']:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
