"""TRL GRPO steps with draftkit in TRL's colocated vLLM engine (draftkit/integrations/trl.py);
`scripts/bench_trl.py` drives it and writes <out>/bench_trl.{json,md}.

Variants, on the same math problems (draftkit.prepare.mathgen, eval split), seed and settings:
    none, ngram, suffix   no speculation, vLLM's n-gram and suffix decoding
    frozen                the run's draft, never refreshed
    refresh               the draft refreshed every `every` steps from the observed rollouts,
                          its features read from TRL's own loss forwards (taps_from_trainer)
    refresh-own           the same refreshes, each running its own policy pass over the rollouts
                          (taps_from_trainer=False): what the taps save
    refresh-bg            the refreshes of `refresh` in a background thread of rank 0
                          (DraftkitConfig(refresh_in="background")): training goes on meanwhile
    auto                  DraftkitConfig(method="auto"): what the export's serving.json picks for
                          TRL's generation batch and T (the draft, refreshed like `refresh`, or
                          a free method / none)
    refresh-watch         `draftkit watch` in another process refreshes from the rollouts the
                          trainer writes and TRL's checkpoints (saved every `every` steps); the
                          trainer follows what it publishes (refresh_in="watch")
With `processes=2` every variant runs under `accelerate launch --num_processes 2` (gloo on a
CPU): one colocated engine per rank, each with `prompts x generations` completions per step.
The trainer's extra wall time per refresh, in GRPO steps: (the variant's `trainer.train()` wall
time - frozen's) / its refreshes / frozen's mean step time (same seed, same prompts).
Per step: rollout tokens/s, step time (TRL's `step_time`: generation, loss and backward), AL and
tokens per target step. Per refresh: its wall time, its capture's seconds, the rows read from
taps or computed, and both as a share of the variant's mean GRPO step; per variant the time
spent copying taps out of TRL's forwards.

Each variant runs in its own process (TRL's colocated engine lives in the trainer's process):
`python -m benchmarks.rl.trl_grpo OUT VARIANT CONFIG_JSON` writes OUT/bench_trl_runs/VARIANT.json.
A refreshed variant works on a fresh copy of the run's config and export
(`<out>/bench_trl_runs/<variant>/runs/`): the source run's drafts are never moved. The reward is
benchmarks/rl/reward.py's (the answer after `####`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError

ROOT = Path(__file__).resolve().parents[2]  # the repo root: `-m benchmarks...` children
VARIANTS = ("none", "ngram", "suffix", "frozen", "refresh", "refresh-own", "refresh-bg",
            "refresh-watch", "auto")
REFRESHED = ("refresh", "refresh-own", "refresh-bg", "refresh-watch", "auto")
IN = {"refresh-bg": "background", "refresh-watch": "watch"}  # refresh_in; else "sync"


@dataclass
class BenchConfig:
    run: str = ""  # a draftkit run with an export; its target is the policy
    steps: int = 20  # GRPO steps per variant
    prompts: int = 4  # prompts per step
    generations: int = 8  # GRPO group size (completions per prompt)
    max_tokens: int = 128  # max_completion_length
    max_model_len: int = 1024
    k: int | None = None  # speculative tokens (None: the draft's served k; 3 for ngram/suffix)
    every: int = 5  # refresh interval (policy steps) of the refreshed variants
    lr: float = 1e-6  # the policy's learning rate
    refresh_overrides: list[str] = field(default_factory=list)  # run-config key=value
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    seed: int = 0
    processes: int = 1  # trainer processes (accelerate launch), each with its own engine
    # keep a variant's record from an earlier invocation into the same --out when it ran these
    # same settings (a killed or extended run measures only what it lacks)
    resume: bool = False

    def check(self) -> BenchConfig:
        if not self.run:
            raise DraftkitError("bench_trl needs run=RUN (a draftkit run with an export)")
        if bad := [v for v in self.variants if v not in VARIANTS]:
            raise DraftkitError(f"variants: {bad} unknown; choose from {', '.join(VARIANTS)}")
        return self


def load_config(overrides: list[str]) -> BenchConfig:
    return config.merge(BenchConfig(), config.parse_overrides(overrides)).check()


def problems(n: int) -> tuple[list, list[float]]:
    from benchmarks.rl import reward
    from draftkit.prepare import mathgen

    probs = mathgen.generate("eval", n, seed=11)
    prompts = [[{"role": "user", "content": f"{p.question}\n{reward.INSTRUCTION}"}] for p in probs]
    return prompts, [reward.reference_answer(p.answer) for p in probs]


def bench_copy(run: Path, out: Path) -> Path:
    """A fresh copy of `run`'s config and export (and data: the probe prompts' fallback) under
    `out/runs/`: refreshes publish there."""
    copy = out / "runs" / run.name
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    shutil.copy(run / config.CONFIG_NAME, copy / config.CONFIG_NAME)
    shutil.copytree(artifacts.RunPaths(run).export, artifacts.RunPaths(copy).export)
    if (run / "data").is_dir():
        shutil.copytree(run / "data", copy / "data")
    return copy


def one(cfg: BenchConfig, variant: str, out: Path) -> dict:
    """Run one variant in this process; returns its per-step records and refresh events."""
    # TRL and its colocated vLLM engine: the optional extra, loaded in the variant's process only
    from datasets import Dataset
    from trl import GRPOConfig

    from benchmarks.rl import reward
    from draftkit.integrations.trl import DraftkitConfig, SpeculativeGRPOTrainer
    from draftkit.targets.load import run_target_dir

    run = Path(cfg.run)
    prompts, answers = problems(cfg.prompts * cfg.steps * cfg.processes)
    data = Dataset.from_dict({"prompt": prompts, "answer": answers})

    def math_reward(completions, answer, **kwargs):
        return [reward.math_reward(c[0]["content"], a)["reward"]
                for c, a in zip(completions, answer, strict=True)]

    method = "draft" if variant in ("frozen", *REFRESHED) else variant
    method = "auto" if variant == "auto" else method
    refreshed = variant in REFRESHED
    dk = DraftkitConfig(run=str(run) if method in ("draft", "auto") else None, method=method, k=cfg.k,
                        every=cfg.every if refreshed else 0, refresh=refreshed,
                        overrides=cfg.refresh_overrides,
                        refresh_in=IN.get(variant, "sync"),
                        taps_from_trainer=variant in ("refresh", "refresh-bg", "auto"))
    args = GRPOConfig(output_dir=str(out / "bench_trl_runs" / "trainer" / variant),
                      use_vllm=True, vllm_mode="colocate", use_cpu=True, bf16=False,
                      seed=cfg.seed, per_device_train_batch_size=cfg.prompts * cfg.generations,
                      num_generations=cfg.generations, max_completion_length=cfg.max_tokens,
                      max_steps=cfg.steps, learning_rate=cfg.lr, logging_steps=1,
                      report_to="none", disable_tqdm=True,
                      # the watch reads the policy from TRL's checkpoints
                      save_strategy="steps" if variant == "refresh-watch" else "no",
                      save_steps=cfg.every, save_only_model=True,
                      vllm_max_model_length=cfg.max_model_len)
    t0 = time.perf_counter()
    trainer = SpeculativeGRPOTrainer(model=str(run_target_dir(config.load(run).target)),
                                     reward_funcs=math_reward, args=args, train_dataset=data,
                                     draftkit=dk)
    start_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t1
    logs = {h["step"]: h for h in trainer.state.log_history if "step_time" in h}
    steps = []
    for g in trainer.draftkit.generations:
        h = logs.get(g["step"] + 1, {})
        steps.append({**{k: g[k] for k in ("step", "tokens", "seconds", "tokens_per_s", "drafts",
                                           "accepted")},
                      "al": g["acceptance_length"] if g["drafts"] else None,
                      "tokens_per_target_step": g["tokens"] / max(1, g["tokens"] - g["accepted"]),
                      "step_time": h.get("step_time"), "reward": h.get("reward")})
    taps = trainer.draftkit.taps
    return {"variant": variant, "engine_start_s": start_s, "train_s": train_s, "steps": steps,
            "rank": trainer.accelerator.process_index, "engines": trainer.draftkit.engines,
            "events": trainer.draftkit.events, "syncs": trainer.draftkit.syncs,
            "taps_copy_s": taps.seconds if taps is not None else None}


def summary(res: dict) -> dict:
    s = res["steps"]
    tok, sec = sum(x["tokens"] for x in s), sum(x["seconds"] for x in s)
    acc = sum(x["accepted"] for x in s)
    refreshes = [e for e in res["events"] if e["event"] == "refresh"]
    step_times = [x["step_time"] for x in s if x["step_time"] is not None]
    mean_step = sum(step_times) / max(1, len(step_times))
    caps = [e.get("capture") or {} for e in refreshes]
    tapped = [c for c in caps if c.get("taps")]
    refresh_s = sum(e["refresh_s"] for e in refreshes) / max(1, len(refreshes))
    capture_s = sum(c.get("seconds", 0.0) for c in caps) / max(1, len(caps))
    return {"variant": res["variant"], "rollout_tokens": tok, "rollout_tokens_per_s": tok / sec,
            "train_s": res.get("train_s"),
            "tokens_per_target_step": tok / max(1, tok - acc), "mean_step_time": mean_step,
            "refreshes": len(refreshes), "mean_refresh_s": refresh_s,
            # versions published elsewhere (draftkit watch) that the trainer swapped in
            "follows": sum(e["event"] == "follow" for e in res["events"]),
            "mean_capture_s": capture_s,
            "refresh_share_of_step": refresh_s / mean_step if refreshes and mean_step else None,
            # rows the refreshes read from the taps / computed (None: no taps, all computed)
            "rows_from_taps": sum(c["taps"]["rows"] for c in tapped) if tapped else None,
            "rows_computed": sum(c["taps"]["computed_rows"] for c in tapped) if tapped else None,
            "taps_copy_s_per_step": (res["taps_copy_s"] / max(1, len(s))
                                     if res.get("taps_copy_s") is not None else None),
            "swaps_ok": sum(bool((e.get("swap") or {}).get("ok")) for e in res["events"])}


def _child(cfg: BenchConfig, variant: str, out: Path) -> dict:
    run = Path(cfg.run)
    if variant in REFRESHED:
        run = bench_copy(run, out / "bench_trl_runs" / variant)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    launch = [sys.executable, "-m"]
    if cfg.processes > 1:  # `--multi_gpu` spawns the ranks via torchrun; gloo without CUDA
        # one core per rank: torch's threads, and numba's (vLLM's n-gram proposer), whose
        # default pool of one thread per core, in each rank, oversubscribes the cores
        env.update(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                  "--num_processes", str(cfg.processes), "--num_machines", "1",
                  "--mixed_precision", "no", "--dynamo_backend", "no", "-m"]
    watch = _watch(cfg, run, out) if variant == "refresh-watch" else None
    try:
        subprocess.run([*launch, "benchmarks.rl.trl_grpo", str(out), variant,
                        json.dumps({**asdict(cfg), "run": str(run)})], check=True, env=env)
    finally:
        if watch is not None:
            watch.terminate()  # SIGTERM: it stops cleanly (rl/watch.py)
            watch.wait(120)
    path = out / "bench_trl_runs" / f"{variant}.json"
    rec = {**json.loads(path.read_text()), "config": asdict(cfg)}  # what `resume` compares
    artifacts.write_json_atomic(path, rec)
    return rec


def _watch(cfg: BenchConfig, run: Path, out: Path) -> subprocess.Popen:
    """`draftkit watch` beside the trainer: TRL's checkpoints and the rollouts it writes."""
    ckpts = out / "bench_trl_runs" / "trainer" / "refresh-watch"
    ckpts.mkdir(parents=True, exist_ok=True)
    rollouts = run / "drafts" / "rollouts"
    rollouts.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "draftkit.cli", "watch", str(run),
                             *cfg.refresh_overrides, "--checkpoints", str(ckpts),
                             "--rollouts", str(rollouts), "--every", str(cfg.every)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def run(cfg: BenchConfig, out: str | Path) -> dict:
    """Every variant, one child process each; {"config", "summary", "runs"}."""
    out = Path(out)
    results = []
    for v in cfg.variants:
        kept = kept_record(cfg, v, out) if cfg.resume else None
        print(f"bench_trl: {v}{' (kept from an earlier run)' if kept else ''}", flush=True)
        results.append(kept or _child(cfg, v, out))
    return {"config": asdict(cfg), "summary": overhead([summary(r) for r in results]),
            "runs": results}


def same_settings(a: dict, b: dict) -> bool:
    """Two BenchConfig dicts measure alike: all but the variant list and `resume` agree."""
    skip = ("variants", "resume")
    return {k: v for k, v in a.items() if k not in skip} == \
        {k: v for k, v in b.items() if k not in skip}


def kept_record(cfg: BenchConfig, variant: str, out: Path) -> dict | None:
    """`variant`'s record from an earlier run into `out` under the same settings, else None."""
    path = out / "bench_trl_runs" / f"{variant}.json"
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())
    return rec if same_settings(rec.get("config") or {}, asdict(cfg)) else None


def overhead(sums: list[dict]) -> list[dict]:
    """Each refreshed variant's extra trainer wall time per refresh, in frozen's GRPO steps."""
    frozen = next((s for s in sums if s["variant"] == "frozen"), None)
    for s in sums:
        s["extra_steps_per_refresh"] = None
        n = s["refreshes"] or s.get("follows", 0)  # a watch's refreshes: the trainer's follows
        if frozen and n and frozen["mean_step_time"] and s.get("train_s"):
            s["extra_steps_per_refresh"] = ((s["train_s"] - frozen["train_s"]) / n
                                            / frozen["mean_step_time"])
    return sums


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def markdown(result: dict) -> str:
    cfg, sums = result["config"], result["summary"]
    none_tps = next((s["rollout_tokens_per_s"] for s in sums if s["variant"] == "none"), None)
    meta = result.get("meta") or {}
    cpu = (meta.get("hardware") or {}).get("cpu_model", "this CPU")
    cmd = " ".join(["python", *meta.get("argv", ["scripts/bench_trl.py"])])
    lines = [f"# TRL GRPO with draftkit ({cpu})", "",
             f"Command: `{cmd}` at code `{(meta.get('git_sha') or '?')[:7]}`. Each variant is one "
             "launch (each trainer process with its colocated vLLM engine), one after another.",
             "", f"{cfg.get('processes', 1)} trainer process(es), each with its own engine; "
             f"{cfg['steps']} steps; T=1.0 (TRL's default), generation batch "
             f"{cfg['prompts'] * cfg['generations']}, {cfg['max_tokens']} tokens per completion; "
             f"refresh interval {cfg['every']} steps.", "",
             "| variant | rollout tok/s | vs none | tokens per target step | step s | swaps ok |",
             "|---|---|---|---|---|---|"]
    for r in sums:
        rel = f"{r['rollout_tokens_per_s'] / none_tps:.2f}x" if none_tps else "–"
        lines.append(f"| {r['variant']} | {r['rollout_tokens_per_s']:.1f} | {rel} | "
                     f"{r['tokens_per_target_step']:.2f} | {r['mean_step_time']:.2f} | "
                     f"{r['swaps_ok']} |")
    refreshed = [r for r in sums if r["refreshes"]]
    if refreshed:
        lines += ["", "Refresh cost, with the features from TRL's loss forward (refresh) and "
                  "with the refresh's own policy pass (refresh-own):", "",
                  "| variant | refreshes | s per refresh | capture s | share of a GRPO step | "
                  "rows from taps / computed | taps copy s per step |", "|---|---|---|---|---|---|---|"]
        for r in refreshed:
            lines.append(f"| {r['variant']} | {r['refreshes']} | {r['mean_refresh_s']:.2f} | "
                         f"{r['mean_capture_s']:.3f} | {_f(r['refresh_share_of_step'], '.2f')} | "
                         f"{_f(r['rows_from_taps'], 'd')} / {_f(r['rows_computed'], 'd')} | "
                         f"{_f(r['taps_copy_s_per_step'], '.4f')} |")
    over = [r for r in sums if r.get("extra_steps_per_refresh") is not None]
    if over:
        lines += ["", "The trainer's extra wall time per refresh (vs frozen, same seed), in "
                  "GRPO steps; `refresh` waits at the step end, `refresh-bg` runs in a thread, "
                  "`refresh-watch` counts the versions the trainer followed:",
                  "", "| variant | refreshes | train s | extra GRPO steps per refresh |",
                  "|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['refreshes'] or r.get('follows', 0)} | "
                  f"{r['train_s']:.1f} | "
                  f"{r['extra_steps_per_refresh']:.2f} |" for r in over]
    return "\n".join([*lines, ""])


if __name__ == "__main__":  # one variant, in the process its trainer and engine live in
    _out, _variant = Path(sys.argv[1]), sys.argv[2]
    _res = one(config.merge(BenchConfig(), json.loads(sys.argv[3])), _variant, _out)
    if _res["rank"] == 0:  # rank 0's engine and events (every rank's versions: "engines")
        artifacts.write_json_atomic(_out / "bench_trl_runs" / f"{_variant}.json", _res)


def plot(result: dict, path: Path) -> None:
    """Per GRPO step and variant: rollout tokens/s and tokens per target step."""
    from benchmarks import report

    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for res in result["runs"]:
        steps = [x["step"] for x in res["steps"]]
        axes[0].plot(steps, [x["tokens_per_s"] for x in res["steps"]], "o-", label=res["variant"])
        axes[1].plot(steps, [x["tokens_per_target_step"] for x in res["steps"]], "o-",
                     label=res["variant"])
        for e in res["events"]:
            if e["event"] == "refresh":
                axes[1].axvline(e.get("step", 0), color="gray", lw=0.5)
    axes[0].set(xlabel="GRPO step", ylabel="rollout tokens/s", title="rollout speed")
    axes[1].set(xlabel="GRPO step", ylabel="tokens per target step",
                title="tokens per target step (grey: a refresh)")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
