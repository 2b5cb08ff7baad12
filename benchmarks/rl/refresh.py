"""The refresh benchmark: does a refreshed draft keep rollouts fast as the policy moves?
`scripts/bench_refresh.py` drives it.

On held-out math prompts (mathgen `eval` split, templated as the RL loop templates them),
measured in vLLM at each temperature (T=1, the RL setting, and T=0):
    v0/v0       draft v0 on policy v0 (what the draft was trained for)
    stale       draft v0 on policy vN
    refreshed   draft v0 refreshed on vN's rollouts (`draftkit refresh`), hot-swapped into the
                stale engine (the swap's latency is measured there, no restart)
    scratch     a draft trained from scratch on vN with v0's data budget (a run dir:
                scripts/scratch_draft.py builds it, rl/scratch.py; skipped when not given)
    ngram       vLLM n-gram on vN
    suffix      vLLM suffix decoding on vN (arctic-inference; where it cannot be imported the
                row says why); its cache is emptied before each temperature, so it never
                drafts the previous temperature's answers to the same prompts
    none        no speculation on vN
Each row: AL (vLLM's, drafted steps), tokens per target step (every step), per-position
acceptance, tokens/s. The refresh's compute (steps, tokens, wall time) is set against the
scratch run's (steps, stage times), and the issue's goals are checked:
refreshed AL >= 90% of scratch at <= 20% of its compute, swap < 1 s, refreshed rollouts at
T=1 faster than stale, than n-gram and than suffix decoding.

The refresh runs on a copy of the draft run (`<work_dir>/refresh-run`: config + export only),
so the draft run itself is never modified.

Compute is wall time on the same machine: the refresh job's whole wall (capture, fine-tune,
the before/after AL gate) against the scratch run's prepare (vN regenerating v0's answers) +
harvest + train. The policy's rollouts are not charged to the refresh: RL generates them anyway.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import AutoTokenizer

from benchmarks import report
from benchmarks.rl.grpo_loop import prompt_ids
from draftkit.core import artifacts, config, hardware
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.kind import draft_sampling
from draftkit.prepare import mathgen
from draftkit.rl.job import refresh
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap, policy_sync, speculative, vllm_engine
from draftkit.targets.load import target_dir

FREE = ("ngram", "suffix")  # vLLM's speculation without a trained draft


@dataclass
class BenchConfig:
    draft_run: str = ""  # run dir whose export is draft v0 (trained on policy v0)
    policy_v0: str = "smollm2-135m"  # registry name or HF dir
    policy_vn: str = ""  # HF dir of the moved policy (rl_loop.py saves <out>/policy)
    rollouts: list[str] = field(default_factory=list)  # vN rollouts (rl_loop: <out>/rollouts)
    scratch_run: str = ""  # run dir of a draft trained from scratch on vN (optional)
    # the refresh runs on a copy of draft_run here (config + export; rewritten each run)
    work_dir: str = "runs/bench-refresh"
    refresh_overrides: list[str] = field(default_factory=list)  # refresh.* of the copy
    prompts: int = 32  # held-out prompts
    max_tokens: int = 128
    temperatures: list[float] = field(default_factory=lambda: [1.0, 0.0])
    k: int = 3
    # vLLM's draft_sample_method for every EAGLE-3 row (draft.draft_sample_method); the
    # committed results/bench_refresh*.json were measured with greedy drafting
    draft_sampling: str = "greedy"
    free_methods: list[str] = field(default_factory=lambda: list(FREE))  # no trained draft
    batch_size: int = 16
    dtype: str = "float32"
    max_model_len: int = 1024
    seed: int = 0

    def check(self) -> BenchConfig:
        missing = [n for n in ("draft_run", "policy_vn") if not getattr(self, n)]
        if missing or not self.rollouts:
            raise DraftkitError(f"bench_refresh needs draft_run, policy_vn and rollouts (missing: "
                                f"{', '.join(missing + ([] if self.rollouts else ['rollouts']))});"
                                " rl_loop.py writes <out>/policy and <out>/rollouts")

        draft_sampling(self.draft_sampling)  # a clear error before any engine starts
        if bad := [m for m in self.free_methods if m not in FREE]:
            raise DraftkitError(f"free_methods: {bad} unknown; choose from {', '.join(FREE)}")
        return self


def load_config(overrides: list[str]) -> BenchConfig:
    return config.merge(BenchConfig(), config.parse_overrides(overrides)).check()


def heldout_prompts(tok, n: int, seed: int) -> list[list[int]]:
    return [prompt_ids(tok, p.question) for p in mathgen.generate("eval", n, seed=seed)]


def measure(llm, prompts: list[list[int]], cfg: BenchConfig, suffix: bool = False) -> dict:
    """{"T=1": {al, tokens_per_step, per_position, tokens_per_s, output_tokens}, ...} for one
    engine state (after an untimed warm-up: the first batch of an engine pays for allocations).
    `suffix`: a suffix decoding engine, its cache emptied before each temperature."""
    vllm_engine.generate(llm, prompts[:2], vllm_engine.sampling(0.0, 8))  # warm-up, untimed
    out = {}
    for t in cfg.temperatures:
        if suffix:  # else it drafts the warm-up's / last temperature's answers to these prompts
            vllm_engine.reset_suffix_cache(llm)
        run = vllm_engine.measure(llm, prompts, vllm_engine.sampling(t, cfg.max_tokens,
                                                                     seed=cfg.seed),
                                  batch_size=cfg.batch_size)
        spec = run["spec"] or {}
        out[f"T={t:g}"] = {"al": spec.get("acceptance_length", 1.0),
                           "tokens_per_step": run["tokens_per_step"],
                           "per_position": spec.get("per_position", []),
                           "tokens_per_s": run["tokens_per_s"],
                           "output_tokens": run["output_tokens"]}
    return out


def refresh_copy(cfg: BenchConfig) -> dict:
    """Refresh draft v0 on vN's rollouts in a copy of the draft run; the job's result."""
    src, dst = Path(cfg.draft_run), Path(cfg.work_dir) / "refresh-run"
    if not (src / "export").is_dir():
        raise DraftkitError(f"draft run {src} has no export/; run `draftkit export {src}` first")
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    shutil.copy2(src / config.CONFIG_NAME, dst / config.CONFIG_NAME)
    shutil.copytree(src / "export", dst / "export")
    res = refresh(dst, cfg.policy_vn, cfg.rollouts, cfg.refresh_overrides)
    if res["status"] != "published":
        raise DraftkitError(f"the refresh did not publish ({res.get('reason')}); raise "
                            "refresh.budget_steps or give more rollouts")
    lin = res["lineage"]
    return {"dir": str(dst / "drafts" / res["version"]), "steps": lin["steps"],
            "tokens_trained": lin["tokens_trained"], "train_s": lin["train_s"],
            "wall_s": lin["wall_s"], "al_estimate": {"before": lin["al_before"],
                                                     "after": lin["al_after"]}}


def scratch_compute(run_dir: str) -> dict:
    """Steps and wall seconds of a from-scratch run, per stage: prepare (data/meta.json),
    harvest (harvest/meta.json) and train (history.json's last wall_s, which a resumed run
    carries on, unlike the meta's time of the last call)."""
    paths = artifacts.RunPaths(run_dir)
    history = artifacts.read_json(paths.train / "history.json")
    stages = {"prepare_s": artifacts.read_json(paths.data / "meta.json")["timings"]["total_s"],
              "harvest_s": artifacts.read_json(paths.harvest / "meta.json")["timings"]["seconds"],
              "train_s": history[-1]["wall_s"]}
    return {"steps": history[-1]["step"], **stages, "total_s": sum(stages.values())}


def run(cfg: BenchConfig, out: str | Path) -> dict:
    """Every variant, one engine per (policy, speculation) pair; the JSON-able result."""
    out = Path(out)
    v0, vn = str(target_dir(cfg.policy_v0)), str(Path(cfg.policy_vn).resolve())
    prompts = heldout_prompts(AutoTokenizer.from_pretrained(vn), cfg.prompts, cfg.seed)
    v0_draft = Path(cfg.draft_run) / "export"
    refreshed = refresh_copy(cfg)

    def engine(model: str, spec: dict | None):
        return vllm_engine.engine(vllm_engine.EngineSpec(
            model=model, dtype=cfg.dtype, max_model_len=cfg.max_model_len, seed=cfg.seed,
            speculative_config=spec,
            extra=vllm_engine.suffix_engine_kwargs(spec) or policy_sync.engine_kwargs()))

    kind = kinds.of(config.load(cfg.draft_run))  # the draft's kind serves and swaps it

    def spec(draft_dir) -> dict:
        return kind.speculative_config(draft_dir, cfg.k, cfg.draft_sampling)

    rows, swap = {}, {}
    with engine(v0, spec(v0_draft)) as llm:
        rows["v0/v0"] = measure(llm, prompts, cfg)
    with engine(vn, spec(v0_draft)) as llm:
        rows["stale"] = measure(llm, prompts, cfg)
        t0 = time.perf_counter()
        # the check asks only "did it arrive": AL > 1 on prompts of the rollouts it learned
        probes = DraftRefresher(Path(cfg.work_dir) / "refresh-run").probes()
        swapped = drafter_swap.swap_into(llm, refreshed["dir"], kind,
                                         probes, min_al=1.001, max_tokens=32)
        swap = {"load_s": swapped["swap_s"], "with_check_s": time.perf_counter() - t0,
                "restart": False}
        rows["refreshed"] = measure(llm, prompts, cfg)
    if cfg.scratch_run:
        scratch = kinds.of(config.load(cfg.scratch_run)).speculative_config(
            Path(cfg.scratch_run) / "export", cfg.k, cfg.draft_sampling)
        with engine(vn, scratch) as llm:
            rows["scratch"] = measure(llm, prompts, cfg)
    for method in cfg.free_methods:
        if method == "suffix" and (why := vllm_engine.suffix_unavailable()):
            rows[method] = {"unavailable": why}
            continue
        with engine(vn, speculative.method_config(method, cfg.k, None)) as llm:
            rows[method] = measure(llm, prompts, cfg, suffix=method == "suffix")
    with engine(vn, None) as llm:
        rows["none"] = measure(llm, prompts, cfg)
    scratch = scratch_compute(cfg.scratch_run) if cfg.scratch_run else None
    # the published draft's dir relative to the cwd: results files carry no host paths
    refreshed["dir"] = os.path.relpath(refreshed["dir"])
    result = {"config": asdict(cfg), "prompts": len(prompts), "rows": rows,
              "refresh": refreshed, "scratch": scratch, "swap": swap,
              "hardware": hardware.summary()}
    result["goals"] = goals(result, cfg.temperatures)
    return result


def goals(result: dict, temperatures: list[float]) -> dict:
    """The issue's goals, each {"ok", "detail"} (ok None when a row needed is missing)."""
    rows, t1 = result["rows"], f"T={max(temperatures):g}"
    out = {"swap_under_1s": {"ok": result["swap"]["load_s"] < 1.0,
                             "detail": f"{result['swap']['load_s']:.3f} s, no restart"}}
    fast = rows["refreshed"][t1]["tokens_per_s"]
    out["faster_than_stale"] = {"ok": fast > rows["stale"][t1]["tokens_per_s"],
                                "detail": f"{fast:.1f} vs {rows['stale'][t1]['tokens_per_s']:.1f} tok/s"}
    for m in FREE:
        if m not in rows or "unavailable" in rows[m]:
            out[f"faster_than_{m}"] = {"ok": None, "detail": rows.get(m, {}).get(
                "unavailable", "not measured (free_methods)")}
            continue
        other = rows[m][t1]["tokens_per_s"]
        out[f"faster_than_{m}"] = {"ok": fast > other,
                                   "detail": f"{fast:.1f} vs {other:.1f} tok/s"}
    sc = result["scratch"]
    if "scratch" in rows and sc and sc.get("total_s"):
        ratio = rows["refreshed"][t1]["al"] / rows["scratch"][t1]["al"]
        cost = result["refresh"]["wall_s"] / sc["total_s"]
        train = result["refresh"]["train_s"] / sc["train_s"]
        out["recovers_90pct_of_scratch"] = {"ok": ratio >= 0.9, "detail": f"{ratio:.1%}"}
        out["at_20pct_compute"] = {
            "ok": cost <= 0.2, "detail": f"{cost:.1%} of scratch's prepare+harvest+train wall "
                                         f"({train:.1%} of its train wall)"}
    else:
        out["recovers_90pct_of_scratch"] = {"ok": None, "detail": "no scratch_run given"}
    return out


def markdown(result: dict) -> str:
    temps = list(next(iter(result["rows"].values())))
    head = "| variant | " + " | ".join(f"AL {t} | tok/step {t} | per-position {t} | tok/s {t}"
                                       for t in temps) + " |"
    lines = [head, "|" + "---|" * (1 + 4 * len(temps))]
    for name, row in result["rows"].items():
        if "unavailable" in row:
            lines.append(f"| {name} | not measured: {row['unavailable']} |")
            continue
        cells = [f"{row[t]['al']:.3f} | {row[t]['tokens_per_step']:.3f} | "
                 f"{', '.join(f'{x:.2f}' for x in row[t]['per_position'])}"
                 f" | {row[t]['tokens_per_s']:.1f}" for t in temps]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    r = result["refresh"]
    lines += ["", f"Refresh: {r['steps']} steps, {r['tokens_trained']} tokens, "
                  f"{r['train_s']:.1f} s training ({r['wall_s']:.1f} s wall); hot swap "
                  f"{result['swap']['load_s']:.3f} s ({result['swap']['with_check_s']:.2f} s "
                  "with the hash + probe check), no restart."]
    if sc := result["scratch"]:
        lines.append(f"From scratch: {sc['steps']} steps; prepare {sc['prepare_s']:.1f} s + "
                     f"harvest {sc['harvest_s']:.1f} s + train {sc['train_s']:.1f} s = "
                     f"{sc['total_s']:.1f} s wall.")
    if hw := result.get("hardware"):
        lines.append(f"CPU: {hw['cpu_model']}, {hw['cpu_count']} cores, torch capability "
                     f"{hw['torch_cpu_capability']}, native bf16 {hw['cpu_native_bf16']}; "
                     f"engines {result['config']['dtype']}.")
    lines += ["", "| goal | met | detail |", "|---|---|---|"]
    lines += [f"| {k} | {v['ok']} | {v['detail']} |" for k, v in result["goals"].items()]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path:
    plt = report.pyplot()
    temps = list(next(iter(result["rows"].values())))
    names = [n for n, row in result["rows"].items() if "unavailable" not in row]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(temps)
    for i, t in enumerate(temps):
        xs = [j + i * width for j in range(len(names))]
        axes[0].bar(xs, [result["rows"][n][t]["al"] for n in names], width, label=t)
        axes[1].bar(xs, [result["rows"][n][t]["tokens_per_s"] for n in names], width, label=t)
    for ax, label in zip(axes, ("acceptance length", "tokens/s"), strict=True):
        ax.set_xticks([j + width * (len(temps) - 1) / 2 for j in range(len(names))], names)
        ax.set(ylabel=label)
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
