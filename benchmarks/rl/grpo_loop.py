"""A small GRPO run on a real policy with speculative rollouts: the loop `scripts/rl_loop.py`
drives, and what it logs.

Each step: vLLM samples G responses per prompt at T=1 (offline math problems with known
answers, `draftkit.prepare.mathgen`) with the current draft as speculative decoder; rewards
(rl/reward.py) -> group advantages -> one clipped policy-gradient update in torch
(rl/grpo.py); the updated weights go into the running engine in place
(draftkit/serving/policy_sync.py); `DraftRefresher` sees the step's rollouts and, when its
trigger fires, refreshes the draft with the updated policy and swaps it in (hash + probe-AL
checked). One JSON line per step in `<out>/log.jsonl` (and wandb, offline without a key):
reward, rollout AL from vLLM's counters, tokens per target step, rollout tokens/s, KL from the
initial policy, refresh events with their cost.

Drafts without training: `draft=ngram`, and `draft=suffix` (vLLM's suffix decoding; needs
arctic-inference, which `make setup` installs). A step's G samples of a prompt go to the engine
together, so suffix decoding's global tree drafts from the sibling rollouts of the GRPO group
as they are generated, and from every earlier step's rollouts (the engine's cache is never
emptied in the loop: rollout history is what it drafts from).

With and without refresh on the same draft: run without refresh first (it leaves the draft
run's `drafts/current` alone), then with it; or give each its own copy of the draft run.
Not resumable: a crashed run starts again (a 20-step run is ~20 minutes on 2 cores).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml
from matplotlib.ticker import MaxNLocator
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks import report
from benchmarks.rl import grpo, reward
from draftkit.core import artifacts, config, hardware, provenance
from draftkit.core.config import TrackingConfig
from draftkit.core.errors import DraftkitError
from draftkit.prepare import mathgen
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import policy_sync, speculative, vllm_engine
from draftkit.serving.drafter_swap import DraftSwapError
from draftkit.targets.load import target_dir
from draftkit.train.loop import Tracker

DRAFTS = ("draft", "ngram", "suffix", "none")


@dataclass
class LoopConfig:
    target: str = "smollm2-135m"  # registry name or HF dir of the initial policy
    steps: int = 20
    prompts_per_step: int = 4  # P: problems per step
    group_size: int = 4  # G: samples per problem
    max_tokens: int = 128  # response length cap
    temperature: float = 1.0  # rollout temperature (the RL setting)
    lr: float = 1e-5
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # KL-to-initial penalty in the loss (the KL is logged either way)
    epochs: int = 1  # optimizer steps per batch of rollouts (>1: the clip binds)
    micro_batch: int = 4  # sequences per forward/backward
    kl_samples: int = 4  # rollouts per step the logged KL-to-initial is measured on
    loss_agg: str = "token"  # token | sequence
    format_weight: float = 0.1  # reward for stating the answer as '#### N'
    draft: str = "draft"  # draft (draft_run's trained draft, any kind) | ngram | suffix | none
    draft_run: str = ""  # draft: run dir whose drafts/current (or export) is the draft
    k: int = 3  # speculative tokens
    refresh_every: int = 0  # DraftRefresher: refresh every N steps (0 = off)
    refresh_al_drop: float = 0.0  # ... or when rollout AL < (1 - x) * AL after the last refresh
    refresh_overrides: list[str] = field(default_factory=list)  # draft run overrides
    save_policy: bool = True  # save the final policy to <out>/policy (bench_refresh's vN)
    dtype: str = "float32"  # policy (torch) and engine dtype
    max_model_len: int = 1024
    seed: int = 0
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def check(self) -> LoopConfig:
        if self.draft not in DRAFTS:
            raise DraftkitError(f"draft={self.draft!r} is not one of {', '.join(DRAFTS)}")
        if self.draft == "draft" and not self.draft_run:
            raise DraftkitError("draft=draft needs draft_run=RUN_DIR (a run with an exported "
                                "draft for this target); or use draft=ngram / none")
        if self.group_size < 2:
            raise DraftkitError("group_size must be >= 2: GRPO normalises within a group")
        if (self.refresh_every or self.refresh_al_drop) and self.draft != "draft":
            raise DraftkitError("refresh needs draft=draft (n-gram, suffix and none have no "
                                "weights)")
        if self.draft == "suffix":

            if why := vllm_engine.suffix_unavailable():
                raise DraftkitError(f"draft=suffix cannot run here: {why}; or use draft=ngram")
        return self

    @property
    def refreshing(self) -> bool:
        return self.draft == "draft" and bool(self.refresh_every or self.refresh_al_drop)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> LoopConfig:
    """Defaults <- YAML file (optional) <- key=value overrides, type-checked."""
    cfg = LoopConfig()
    if path:
        config.merge(cfg, yaml.safe_load(Path(path).read_text()) or {})
    if overrides:
        config.merge(cfg, config.parse_overrides(overrides))
    return cfg.check()


def problems(cfg: LoopConfig, tok) -> list[dict]:
    """steps * P math problems as {"prompt_ids", "answer", "question"} (chat-templated)."""
    return [{"prompt_ids": prompt_ids(tok, p.question),
             "answer": reward.reference_answer(p.answer), "question": p.question}
            for p in mathgen.generate("train", cfg.steps * cfg.prompts_per_step, seed=cfg.seed)]


def prompt_ids(tok, question: str) -> list[int]:
    """A math problem as the policy sees it: one chat-templated user turn + the instruction."""
    return list(tok.apply_chat_template(
        [{"role": "user", "content": f"{question}\n{reward.INSTRUCTION}"}],
        add_generation_prompt=True, tokenize=True, return_dict=False))


def speculative_config(cfg: LoopConfig) -> dict | None:
    """What the rollout engine drafts with: n-gram, suffix decoding (drafts from the group's
    sibling rollouts and earlier steps'), or the run's current draft at k (serving/speculative.py
    `served`; its speculative_config.json says how its kind drafts); else none."""
    if cfg.draft in ("ngram", "suffix", "none"):
        return speculative.method_config(cfg.draft, cfg.k)
    if cfg.draft == "draft":
        current = DraftStore(cfg.draft_run).current_dir()
        return speculative.served(current, temperature=cfg.temperature, k=cfg.k).config
    return None


def rollout(llm, batch: list[dict], cfg: LoopConfig, tok) -> tuple[list[dict], dict]:
    """G samples per problem at cfg.temperature, every group in one engine call (siblings are
    generated side by side): (rows with reward, engine stats)."""
    prompts = [b["prompt_ids"] for b in batch for _ in range(cfg.group_size)]
    run = vllm_engine.measure(llm, prompts, vllm_engine.sampling(cfg.temperature,
                                                                 cfg.max_tokens),
                              batch_size=len(prompts))
    rows = []
    for i, out in enumerate(run["outputs"]):
        b = batch[i // cfg.group_size]
        text = tok.decode(out, skip_special_tokens=True)
        rows.append({"prompt_ids": b["prompt_ids"], "response_ids": list(out),
                     "temperature": cfg.temperature,
                     **reward.math_reward(text, b["answer"], cfg.format_weight)})
    spec = run["spec"] or {}
    stats = {"rollout_tokens": run["output_tokens"], "rollout_s": run["seconds"],
             "tokens_per_s": run["tokens_per_s"], "al": spec.get("acceptance_length"),
             "tokens_per_step": run["tokens_per_step"], "drafts": spec.get("drafts", 0),
             "per_position": spec.get("per_position")}
    return rows, stats


def write_rollouts(path: Path, rows: list[dict], step: int) -> None:
    """The step's rollouts in draftkit's JSONL (token ids; draftkit/rl/rollouts.py)."""
    artifacts.write_text_atomic(path, "".join(
        json.dumps({**r, "policy_step": step}) + "\n" for r in rows if r["response_ids"]))


def samples(rows: list[dict], group_size: int) -> tuple[list[grpo.Sample], torch.Tensor]:
    r = torch.tensor([row["reward"] for row in rows]).view(-1, group_size)  # [P, G]
    adv = grpo.group_advantages(r).flatten()  # [P*G]
    return [grpo.Sample(row["prompt_ids"], row["response_ids"], float(a))
            for row, a in zip(rows, adv, strict=True) if row["response_ids"]], r


def update(model, ref, opt, todo: list[grpo.Sample], cfg: LoopConfig, pad_id: int) -> dict:
    """The KL to the initial policy on the first `kl_samples` rollouts (before the update),
    then the update; without a KL term only samples with a non-zero advantage are run (the
    same gradient, see grpo.informative)."""
    kl = grpo.mean_kl(model, ref, todo[:cfg.kl_samples], pad_id) if todo else None
    run = todo if cfg.kl_coef else grpo.informative(todo)
    out = {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "updated_samples": len(run)}
    if run:
        out.update(grpo.policy_update(
            model, opt, run, pad_id, cfg.clip_eps, cfg.kl_coef, ref if cfg.kl_coef else None,
            cfg.epochs, cfg.micro_batch, cfg.loss_agg,
            n_tokens=grpo.response_tokens(todo), n_seqs=len(todo)))
    out["kl_ref"] = kl
    return out


def rates(rows: list[dict]) -> dict:
    return {k: sum(r[k] for r in rows) / len(rows) for k in ("correct", "formatted")}


def maybe_refresh(refresher, llm, model, tok, rows: list[dict], step: int,
                  al: float | None) -> dict | None:
    """Observe the step's rollouts; refresh + swap when the trigger fires. The event (or None)."""
    refresher.observe([{k: r[k] for k in ("prompt_ids", "response_ids", "reward",
                                          "temperature")} for r in rows if r["response_ids"]],
                      policy_step=step, al=al)
    if not refresher.should_refresh():
        return None
    reason, t0 = refresher.reason, time.perf_counter()
    res = refresher.refresh(model, tok)
    lin = res.get("lineage") or {}
    event = {"reason": reason, "status": res["status"], "version": res.get("version"),
             "train_steps": lin.get("steps"), "tokens_trained": lin.get("tokens_trained"),
             "refresh_s": time.perf_counter() - t0, "gain": lin.get("gain")}
    if res["status"] == "published":
        try:
            swapped = refresher.swap_into(llm)
            event.update({"swap_s": swapped["swap_s"], "probe_al": swapped["al"]})
        except DraftSwapError as e:  # rolled back: rollouts go on with the previous draft
            event.update({"status": "swap_failed", "error": str(e)[:300]})
    model.train(False)
    return event


def run(cfg: LoopConfig, out_dir: str | Path) -> list[dict]:
    """The whole loop; returns the per-step records (also in out_dir/log.jsonl)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    path = target_dir(cfg.target)
    tok = AutoTokenizer.from_pretrained(path)
    dtype = hardware.torch_dtype(cfg.dtype, "cpu", key="rl dtype")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    probs = problems(cfg, tok)
    refresher = (DraftRefresher(cfg.draft_run, cfg.refresh_overrides, cfg.refresh_every,
                                cfg.refresh_al_drop) if cfg.refreshing else None)
    spec = vllm_engine.EngineSpec(
        model=str(path), dtype=cfg.dtype, max_model_len=cfg.max_model_len, seed=cfg.seed,
        max_num_seqs=max(64, cfg.prompts_per_step * cfg.group_size),
        speculative_config=speculative_config(cfg), extra=policy_sync.engine_kwargs())
    tracker = Tracker(cfg.tracking, out_dir.name, out_dir / "wandb", asdict(cfg), True)
    records, t_start = [], time.perf_counter()
    provenance.write_meta(out_dir, "rl-loop", asdict(cfg), {}, speculative=spec.speculative_config)
    with vllm_engine.engine(spec) as llm:
        bar = tqdm(range(cfg.steps), desc="rl steps", unit="step")
        for step in bar:
            batch = probs[step * cfg.prompts_per_step:(step + 1) * cfg.prompts_per_step]
            rows, stats = rollout(llm, batch, cfg, tok)
            todo, rewards = samples(rows, cfg.group_size)
            t0 = time.perf_counter()
            upd = update(model, ref, opt, todo, cfg, tok.pad_token_id or 0)
            update_s = time.perf_counter() - t0
            sync = policy_sync.sync_policy(llm, model, out_dir / "policy-sync")
            event = (maybe_refresh(refresher, llm, model, tok, rows, step, stats["al"])
                     if refresher else None)
            rec = {"step": step, "reward": float(rewards.mean()), **rates(rows), **stats,
                   **upd, "update_s": update_s, "sync_s": sync["total_s"], "refresh": event,
                   "elapsed_s": time.perf_counter() - t_start}
            records.append(rec)
            write_rollouts(out_dir / "rollouts" / f"step-{step:05d}.jsonl", rows, step)
            artifacts.write_text_atomic(out_dir / "log.jsonl",
                                        "".join(json.dumps(r) + "\n" for r in records))
            tracker.log({k: v for k, v in rec.items()
                         if isinstance(v, (int, float)) and v is not None}, step=step)
            bar.set_postfix(reward=f"{rec['reward']:.2f}",
                            al=f"{rec['al']:.2f}" if rec["al"] else "-",
                            tps=f"{rec['tokens_per_s']:.0f}")
    tracker.finish()
    if cfg.save_policy:
        with artifacts.atomic_dir(out_dir / "policy", overwrite=True) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
    provenance.write_meta(out_dir, "rl-loop", asdict(cfg),
                         {"total_s": time.perf_counter() - t_start}, steps=len(records),
                         speculative=spec.speculative_config)
    return records


def read_log(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot(logs: dict[str, str | Path], out: str | Path) -> Path:
    """Rollout AL and mean reward against RL step, one line per labelled log (e.g. "refresh",
    "no refresh"); a published refresh is a dotted line at the step whose rollouts it trained
    on (the next step's rollouts use it)."""
    plt = report.pyplot()
    fig, (ax_al, ax_r) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, path in logs.items():
        recs = read_log(path)
        steps = [r["step"] for r in recs]
        line, = ax_al.plot(steps, [r["al"] if r["al"] is not None else float("nan")
                                   for r in recs], marker="o", ms=3, label=label)
        ax_r.plot(steps, [r["reward"] for r in recs], marker="o", ms=3, label=label)
        for r in recs:
            if (r.get("refresh") or {}).get("status") == "published":
                ax_al.axvline(r["step"], color=line.get_color(), ls=":", lw=1)
    ax_al.set(xlabel="RL step", ylabel="rollout AL (vLLM counters)", title="acceptance length")
    ax_r.set(xlabel="RL step", ylabel="mean reward", title="reward")
    for ax in (ax_al, ax_r):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out)
    return out
