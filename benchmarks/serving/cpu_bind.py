"""vLLM's CPU thread binding for draftkit's offline engines. vLLM's default
(`VLLM_CPU_OMP_THREADS_BIND=auto`) keeps one core for its frontend, so on a 2-core machine the
engine computes on one; `engine.cpu_threads_bind=all` binds every core to it (the frontend then
shares them). Optionally (--compiled) the same engine compiled (`enforce_eager=False`) against
eager.

Each setting runs in a fresh process (`python -m benchmarks.serving.cpu_bind`: the binding is
read when vLLM spawns its engine), one after another on the same prompts, with the loads
draftkit's engines carry: batch 1 (eval's latency rows), batch 8 (eval), batch 64 (prepare's
regeneration). Output: tokens/s per setting and batch, the engine's start time, and the faster
setting; `--record` stores the choice in $DRAFTKIT_HOME/hardware.json for this CPU, where
`engine.cpu_threads_bind=auto` (and `engine.enforce_eager=auto`) read it
(draftkit/core/engine_settings.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import report
from draftkit.core import config, engine_settings, hardware, provenance
from draftkit.core.registry import resolve as resolve_target
from draftkit.serving import vllm_engine
from draftkit.targets.load import target_dir

ROOT = Path(__file__).resolve().parents[2]  # the repo root: where `-m benchmarks...` imports


def child(args: argparse.Namespace) -> dict:
    """One engine with one setting: its start time and tokens/s per batch size."""
    ec = config.EngineConfig(cpu_threads_bind=args.bind, enforce_eager=args.eager)
    settings = engine_settings.resolve(ec, dtype=args.dtype)
    model = str(target_dir(resolve_target(args.target)))
    batches = [int(b) for b in args.batches.split(",")]
    spec = vllm_engine.EngineSpec(model=model, dtype=args.dtype, max_model_len=512,
                                  max_num_seqs=max(batches), settings=settings)
    t0 = time.perf_counter()
    llm = vllm_engine.start(spec)
    start_s = time.perf_counter() - t0
    prompts = [[1 + (7 * i + j) % 400 for j in range(32)] for i in range(max(batches) * 2)]
    params = vllm_engine.sampling(0.0, args.tokens, ignore_eos=True)
    rows = {}
    for b in batches:
        vllm_engine.generate(llm, prompts[:b], params, batch_size=b)  # warm this shape
        n = b * 2 if b > 1 else 4
        gen = vllm_engine.generate(llm, prompts[:n], params, batch_size=b)
        rows[str(b)] = gen.num_tokens / gen.seconds
    vllm_engine.stop(llm)
    return {"bind": args.bind, "eager": args.eager, "resolved": settings.env(),
            "start_s": start_s, "tokens_per_s": rows}


def run_setting(args, bind: str, eager: bool) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.serving.cpu_bind", "--bind", bind, "--eager",
           str(eager).lower(), "--target", args.target, "--dtype", args.dtype, "--tokens",
           str(args.tokens), "--batches", args.batches]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"setting bind={bind} eager={eager} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def markdown(res: dict) -> str:
    batches = res["batches"]
    md = [f"# vLLM CPU thread binding on {res['hardware']['cpu_model']} "
          f"({res['hardware']['cpu_count']} cores)", "",
          f"Target `{res['target']}`, dtype {res['dtype']}, greedy, {res['tokens']} new tokens per "
          f"prompt, each setting in a fresh process, one after another; commit "
          f"{res['git_sha'][:10]}.", "",
          "| setting | engine start s | " + " | ".join(f"b{b} tok/s" for b in batches)
          + " | geomean |", "|---|---|" + "---|" * (len(batches) + 1)]
    for r in res["rows"]:
        name = f"bind={r['bind']} eager={r['eager']}"
        md.append(f"| {name} | {r['start_s']:.1f} | "
                  + " | ".join(f"{r['tokens_per_s'][str(b)]:,.0f}" for b in batches)
                  + f" | {r['geomean']:,.0f} |")
    md += ["", f"Faster binding: `{res['choice']['cpu_threads_bind']}`"
           + (f"; compiled faster than eager: {not res['choice']['enforce_eager']}"
              if "enforce_eager" in res["choice"] else "")
           + (" (recorded for this CPU)" if res["recorded"] else "")]
    return "\n".join(md) + "\n"


def run(args: argparse.Namespace) -> int:
    """The bench as scripts/bench_cpu_bind.py's flags ask: every setting in its own process,
    the faster one chosen (and recorded with --record), <out>/<name>.{json,md} written."""
    rows = [run_setting(args, bind, True) for bind in ("vllm", "all")]
    for r in rows:
        r["geomean"] = geomean(r["tokens_per_s"].values())
    best = max(rows, key=lambda r: r["geomean"])
    choice = {"cpu_threads_bind": best["bind"]}
    if args.compiled:
        compiled = run_setting(args, best["bind"], False)
        compiled["geomean"] = geomean(compiled["tokens_per_s"].values())
        rows.append(compiled)
        choice["enforce_eager"] = compiled["geomean"] <= best["geomean"]
    res = {"target": args.target, "dtype": hardware.resolve(args.dtype), "tokens": args.tokens,
           "batches": [int(b) for b in args.batches.split(",")], "rows": rows,
           "choice": choice, "recorded": args.record, "hardware": hardware.summary(),
           "git_sha": os.environ.get("DRAFTKIT_COMMIT") or provenance.git_sha(),
           "versions": provenance.versions()}
    if args.record:
        figures = {f"{r['bind']}|eager={r['eager']}": r["geomean"] for r in rows}
        engine_settings.record("cpu_threads_bind", choice["cpu_threads_bind"], figures)
        if "enforce_eager" in choice:
            engine_settings.record("cpu_enforce_eager", choice["enforce_eager"], figures)
    md = markdown(res)
    report.write_report(args.out, args.name, res, md, None)
    print(md)
    return 0



if __name__ == "__main__":  # one setting's engine: python -m benchmarks.serving.cpu_bind ...
    p = argparse.ArgumentParser()
    for flag in ("--bind", "--eager", "--target", "--dtype", "--tokens", "--batches"):
        p.add_argument(flag, required=True)
    ns = p.parse_args()
    ns.eager, ns.tokens = ns.eager == "true", int(ns.tokens)
    print(json.dumps(child(ns)))
