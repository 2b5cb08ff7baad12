"""TRL GRPO steps with draftkit in TRL's colocated vLLM engine (draftkit/integrations/trl.py):
no speculation, n-gram, suffix decoding, a run's draft frozen, and the draft refreshed every N
steps; per step the rollout tokens/s, the step time, AL and tokens per target step, and each
refresh's cost -> results/bench_trl.{json,md}.

    # the demo run's draft on the embedded target, TRL's defaults for T (1.0) and batch
    python scripts/bench_trl.py --run runs/demo21 --steps 20 --every 5
    # tiny smoke (a tiny-llama run with an export): 2 steps, 2 x 2 completions, 16 tokens
    python scripts/bench_trl.py --run runs/tiny --steps 2 --prompts 2 --generations 2 \
        --max-tokens 16 --every 1 --variants none,frozen,refresh --out /tmp/bench-trl

Each variant runs in its own process (TRL's colocated engine lives in the trainer's process),
on the same math problems (draftkit.prepare.mathgen, eval split) with the same seed. A refreshed
variant works on a copy of the run's config and export (`<out>/runs/`): the source run's drafts
are never moved. The reward is benchmarks/rl/reward.py's (the answer after `####`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/

VARIANTS = ("none", "ngram", "suffix", "frozen", "refresh")


def problems(n: int) -> tuple[list, list[float]]:
    from benchmarks.rl import reward
    from draftkit.prepare import mathgen

    probs = mathgen.generate("eval", n, seed=11)
    prompts = [[{"role": "user", "content": f"{p.question}\n{reward.INSTRUCTION}"}] for p in probs]
    return prompts, [reward.reference_answer(p.answer) for p in probs]


def bench_copy(run: Path, out: Path) -> Path:
    """A copy of `run`'s config and export under `out/runs/` (refreshes publish there)."""
    import shutil

    from draftkit.core import artifacts

    copy = out / "runs" / run.name
    if not copy.exists():
        copy.mkdir(parents=True)
        shutil.copy(run / "draftkit.yaml", copy / "draftkit.yaml")
        shutil.copytree(artifacts.RunPaths(run).export, artifacts.RunPaths(copy).export)
        if (run / "data").is_dir():
            shutil.copytree(run / "data", copy / "data")  # eval split: probe prompts fallback
    return copy


def one(args) -> dict:
    """Run one variant in this process; returns its per-step records."""
    from datasets import Dataset
    from trl import GRPOConfig

    from benchmarks.rl import reward
    from draftkit.core import config
    from draftkit.integrations.trl import DraftkitConfig, SpeculativeGRPOTrainer
    from draftkit.target.load import run_target_dir

    run = Path(args.run)
    prompts, answers = problems(args.prompts * args.steps)
    data = Dataset.from_dict({"prompt": prompts, "answer": answers})

    def math_reward(completions, answer, **kwargs):
        return [reward.math_reward(c[0]["content"], a)["reward"]
                for c, a in zip(completions, answer, strict=True)]

    v = args.one
    method = {"frozen": "draft", "refresh": "draft"}.get(v, v)
    dk = DraftkitConfig(run=str(run) if method == "draft" else None, method=method, k=args.k,
                        every=args.every if v == "refresh" else 0, refresh=v == "refresh",
                        overrides=args.refresh_overrides)
    gen = args.prompts * args.generations
    targs = GRPOConfig(output_dir=str(Path(args.out) / "bench_trl_runs" / "trainer" / v), use_vllm=True,
                       vllm_mode="colocate", use_cpu=True, bf16=False, seed=0,
                       per_device_train_batch_size=gen, num_generations=args.generations,
                       max_completion_length=args.max_tokens, max_steps=args.steps,
                       learning_rate=args.lr, logging_steps=1, report_to="none",
                       save_strategy="no", disable_tqdm=True,
                       vllm_max_model_length=args.max_model_len)
    t0 = time.perf_counter()
    trainer = SpeculativeGRPOTrainer(model=str(run_target_dir(config.load(run).target)),
                                     reward_funcs=math_reward, args=targs, train_dataset=data,
                                     draftkit=dk)
    start_s = time.perf_counter() - t0
    trainer.train()
    logs = {h["step"]: h for h in trainer.state.log_history if "step_time" in h}
    steps = []
    for g in trainer.draftkit.generations:
        h = logs.get(g["step"] + 1, {})
        steps.append({**{k: g[k] for k in ("step", "tokens", "seconds", "tokens_per_s", "drafts",
                                           "accepted")},
                      "al": g["acceptance_length"] if g["drafts"] else None,
                      "tokens_per_target_step": g["tokens"] / max(1, g["tokens"] - g["accepted"]),
                      "step_time": h.get("step_time"), "reward": h.get("reward")})
    return {"variant": v, "engine_start_s": start_s, "steps": steps,
            "events": trainer.draftkit.events, "syncs": trainer.draftkit.syncs}


def summary(res: dict) -> dict:
    s = res["steps"]
    tok, sec = sum(x["tokens"] for x in s), sum(x["seconds"] for x in s)
    acc = sum(x["accepted"] for x in s)
    refreshes = [e for e in res["events"] if e["event"] == "refresh"]
    step_times = [x["step_time"] for x in s if x["step_time"] is not None]
    return {"variant": res["variant"], "rollout_tokens": tok, "rollout_tokens_per_s": tok / sec,
            "tokens_per_target_step": tok / max(1, tok - acc),
            "mean_step_time": sum(step_times) / max(1, len(step_times)),
            "refreshes": len(refreshes), "refresh_s": sum(e["refresh_s"] for e in refreshes),
            "swaps_ok": sum(bool((e.get("swap") or {}).get("ok")) for e in res["events"])}


def table(summaries: list[dict], none_tps: float | None) -> list[str]:
    lines = ["| variant | rollout tok/s | vs none | tokens per target step | step s | refreshes "
             "(s) | swaps ok |", "|---|---|---|---|---|---|---|"]
    for r in summaries:
        rel = f"{r['rollout_tokens_per_s'] / none_tps:.2f}x" if none_tps else "–"
        lines.append(f"| {r['variant']} | {r['rollout_tokens_per_s']:.1f} | {rel} | "
                     f"{r['tokens_per_target_step']:.2f} | {r['mean_step_time']:.2f} | "
                     f"{r['refreshes']} ({r['refresh_s']:.1f}) | {r['swaps_ok']} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a draftkit run with an export (its target is "
                    "the policy)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--generations", type=int, default=8, help="GRPO group size")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--k", type=int, default=None, help="speculative tokens (default: the "
                    "draft's served k; 3 for n-gram and suffix)")
    ap.add_argument("--every", type=int, default=5, help="refresh interval (steps)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--refresh-overrides", nargs="*", default=[])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default="results")
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # a child process
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.one:
        res = one(args)
        (out / "bench_trl_runs").mkdir(parents=True, exist_ok=True)
        (out / "bench_trl_runs" / f"{args.one}.json").write_text(json.dumps(res, indent=1))
        return
    results = []
    for v in args.variants.split(","):
        run = bench_copy(Path(args.run), out / "bench_trl_runs" / v) if v == "refresh" \
            else Path(args.run)
        argv_v = [a for a in (argv if argv is not None else sys.argv[1:])]
        cmd = [sys.executable, __file__, *argv_v, "--one", v, "--run", str(run)]
        print(f"bench_trl: {v}", flush=True)
        subprocess.run(cmd, check=True, env=os.environ)
        results.append(json.loads((out / "bench_trl_runs" / f"{v}.json").read_text()))
    sums = [summary(r) for r in results]
    none_tps = next((s["rollout_tokens_per_s"] for s in sums if s["variant"] == "none"), None)
    from draftkit.core import hardware

    meta = {"cpu": hardware.detect().cpu_model, "argv": sys.argv, "temperature": 1.0,
            "generation_batch": args.prompts * args.generations}
    (out / "bench_trl.json").write_text(json.dumps({"meta": meta, "summary": sums,
                                                    "runs": results}, indent=1))
    md = [f"# TRL GRPO with draftkit ({meta['cpu']})", "",
          f"`{' '.join(sys.argv)}`; T=1.0 (TRL's default), generation batch "
          f"{meta['generation_batch']}, {args.max_tokens} tokens per completion.", "",
          *table(sums, none_tps), ""]
    (out / "bench_trl.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
