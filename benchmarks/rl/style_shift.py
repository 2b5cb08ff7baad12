"""Controlled drift for the refresh benchmark: a documented fine-tune that moves policy v0 to a
policy vN whose answers follow another layout, for when RL alone moves the policy too little
to see. `scripts/drift_policy.py` drives it.

    python scripts/drift_policy.py --out runs/drift/style policy=smollm2-135m
    python scripts/bench_refresh.py draft_run=runs/smol policy_vn=runs/drift/style/policy \
        rollouts=[runs/drift/style/rollouts]

The data: offline math problems (mathgen `train`, known step-by-step solutions) prompted
exactly as the RL loop prompts them (grpo_loop.prompt_ids), answered in a fixed layout built
from the problem's own fields (`styled_answer`):

    Given: 12, 10, 3                 the numbers of the question, in order
    Step 1: 12 * 25 = 300            the equation of each solution line (the line when it has none)
    ...
    Answer: 415
    #### 415                         kept, so the RL loop's format reward still holds for vN

Supervised fine-tune (SFT) with the loss on the response tokens only, AdamW, `steps` steps
of `batch_size` sequences after a linear warm-up, fp32 master weights under the hardware's
autocast dtype (`dtype`, auto: core/hardware.py). Policy vN goes to `<out>/policy` (an HF dir
with the tokenizer; meta.json: base, data, steps, lr, the loss curve, and how far it moved:
the share of greedy held-out answers in the new layout for v0 and vN, and the mean exact
per-token KL(vN || v0) on vN's greedy held-out answers). Then vLLM samples vN at T=1 on
training-distribution prompts (grpo_loop.rollout) into `<out>/rollouts/step-NNNNN.jsonl`
(token ids, `policy_step` = the fine-tune's step count): the RL loop's rollout format.
A rerun with the same settings reuses a finished policy and finished rollouts.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.rl import grpo_loop, reward
from benchmarks.rl.grpo_loop import prompt_ids
from benchmarks.rl.refresh import heldout_prompts
from draftkit.core import artifacts, config, hardware, provenance
from draftkit.core.errors import DraftkitError
from draftkit.prepare import mathgen
from draftkit.rl.policy import dir_digest
from draftkit.serving import vllm_engine
from draftkit.targets.load import target_dir
from draftkit.targets.tokens import end_of_turn_ids

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
# "12 * 25 = 300", "$3.50 + 2 = $5.50", "(4 - 1) * 6 = 18": operands and operators, '=', result
_EQUATION = re.compile(r"[\d$(][\d$.,()\s]*(?:[-+*/x×÷]\s*[\d$(][\d$.,()\s]*)*=\s*\$?\d[\d,]*(?:\.\d+)?")
_LAYOUT = re.compile(r"\s*Given:[^\n]*\nStep 1:")


@dataclass
class StyleShiftConfig:
    policy: str = "smollm2-135m"  # v0: registry name or HF dir
    examples: int = 256  # SFT problems (mathgen train split)
    steps: int = 60  # optimizer steps
    batch_size: int = 4  # sequences per step
    lr: float = 5e-5
    warmup_steps: int = 10  # linear warm-up, then constant lr
    max_grad_norm: float = 1.0
    dtype: str = "auto"  # autocast dtype (fp32 master weights); auto: core/hardware.py
    heldout: int = 16  # mathgen eval prompts the drift measure runs on
    measure_tokens: int = 96  # greedy tokens per held-out answer
    rollout_prompts: int = 32  # training-distribution prompts sampled by vN in vLLM
    group_size: int = 4  # samples per prompt
    max_tokens: int = 128  # rollout length cap
    temperature: float = 1.0  # the RL setting
    engine_dtype: str = "float32"
    max_model_len: int = 1024
    seed: int = 0

    def check(self) -> StyleShiftConfig:
        if self.steps < 1 or self.batch_size < 1 or self.examples < self.batch_size:
            raise DraftkitError(f"style shift needs steps >= 1 and examples >= batch_size >= 1 "
                                f"(got steps={self.steps}, examples={self.examples}, "
                                f"batch_size={self.batch_size})")
        return self


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> StyleShiftConfig:
    """Defaults <- YAML file (optional) <- key=value overrides, type-checked."""
    cfg = StyleShiftConfig()
    if path:
        config.merge(cfg, yaml.safe_load(Path(path).read_text()) or {})
    if overrides:
        config.merge(cfg, config.parse_overrides(overrides))
    return cfg.check()


# ----------------------------------------------------------------------------- the layout


def equation(line: str) -> str:
    """The arithmetic of one solution line ("Dimes: 10 * 10 = 100 cents." -> "10 * 10 = 100");
    the line itself when it holds none."""
    found = _EQUATION.findall(line)
    return " ".join(found[-1].split()).strip(" .,") if found else line.strip()


def styled_answer(question: str, answer: str) -> str:
    """A GSM8K-format solution (step lines + '#### N') rewritten in the fixed layout."""
    steps, _, final = answer.rpartition("####")
    final = final.strip()
    given = ", ".join(n.rstrip(",") for n in _NUMBER.findall(question)) or "none"
    lines = [f"Given: {given}"]
    lines += [f"Step {i}: {equation(s)}" for i, s in
              enumerate((s for s in steps.splitlines() if s.strip()), 1)]
    return "\n".join([*lines, f"Answer: {final}", f"#### {final}"])


def follows_layout(text: str) -> bool:
    """Does a response open with the fixed layout ('Given: ...' then 'Step 1:')?"""
    return bool(_LAYOUT.match(text))


def sft_rows(tok, problems) -> list[dict]:
    """{"prompt_ids", "response_ids", "question", "response"} per problem: the RL loop's prompt
    and the styled answer closed by the chat template's end of turn."""
    rows = []
    for p in problems:
        prompt = prompt_ids(tok, p.question)
        response = styled_answer(p.question, p.answer)
        full = list(tok.apply_chat_template(
            [{"role": "user", "content": _user_text(p.question)},
             {"role": "assistant", "content": response}],
            tokenize=True, return_dict=False))
        if full[:len(prompt)] != prompt:
            raise DraftkitError("the chat template renders the prompt differently inside a "
                                "conversation than with add_generation_prompt; the style shift "
                                "needs a template whose prompt is a prefix of the conversation")
        rows.append({"prompt_ids": prompt, "response_ids": full[len(prompt):],
                     "question": p.question, "response": response})
    return rows


def _user_text(question: str) -> str:
    return f"{question}\n{reward.INSTRUCTION}"


# ----------------------------------------------------------------------------- fine-tune


def pad_sft(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded [B, T] ids, attention mask and labels (-100 on prompt and padding)."""
    t = max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
    ids = torch.full((len(rows), t), pad_id, dtype=torch.long)  # [B, T]
    attn = torch.zeros_like(ids)  # [B, T]
    labels = torch.full_like(ids, -100)  # [B, T]
    for i, r in enumerate(rows):
        p, seq = len(r["prompt_ids"]), r["prompt_ids"] + r["response_ids"]
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        labels[i, p:len(seq)] = ids[i, p:len(seq)]  # loss on the response only
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def finetune(model, rows: list[dict], cfg: StyleShiftConfig, pad_id: int) -> list[float]:
    """`cfg.steps` AdamW steps on seeded shuffles of `rows`; the loss of every step."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    dtype = hardware.torch_dtype(cfg.dtype, "cpu", key="style shift dtype")
    cast = (contextlib.nullcontext if dtype == torch.float32
            else lambda: torch.autocast(device_type="cpu", dtype=dtype))
    model.train()
    losses, order = [], []
    bar = tqdm(range(cfg.steps), desc="style shift", unit="step")
    for _ in bar:
        if len(order) < cfg.batch_size:  # a new seeded epoch order
            order += rng.sample(range(len(rows)), len(rows))
        batch = pad_sft([rows[i] for i in order[:cfg.batch_size]], pad_id)
        del order[:cfg.batch_size]
        with cast():
            loss = model(**batch).loss  # mean CE over the batch's response tokens
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


# ----------------------------------------------------------------------------- how far it moved


def greedy(model, tok, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy responses (up to the end of turn, which is dropped), one prompt at a time."""
    stop = end_of_turn_ids(tok)
    out = []
    with torch.no_grad():
        for p in prompts:
            seq = model.generate(torch.tensor([p]), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=stop,
                                 pad_token_id=tok.pad_token_id or 0)[0, len(p):].tolist()
            out.append([t for t in seq if t not in stop])
    return out


def token_kl(model, ref, prompts: list[list[int]], responses: list[list[int]]) -> float:
    """Mean exact KL(model || ref) over the next-token distributions at the response
    positions (the distribution over the whole vocab, not a sampled estimate)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for p, r in zip(prompts, responses, strict=True):
            if not r:
                continue
            ids = torch.tensor([p + r])  # [1, T]
            sl = slice(len(p) - 1, ids.shape[1] - 1)  # positions that predict the response
            lp = torch.log_softmax(model(input_ids=ids).logits[0, sl].float(), -1)  # [R, V]
            lq = torch.log_softmax(ref(input_ids=ids).logits[0, sl].float(), -1)  # [R, V]
            total += float((lp.exp() * (lp - lq)).sum())
            count += len(r)
    return total / max(count, 1)


def measure_drift(model, ref, tok, cfg: StyleShiftConfig) -> dict:
    """On held-out prompts (mathgen eval, as bench_refresh measures): the share of greedy
    answers in the new layout for v0 and vN, and KL(vN || v0) on vN's greedy answers."""
    prompts = heldout_prompts(tok, cfg.heldout, cfg.seed)
    answers = {"v0": greedy(ref, tok, prompts, cfg.measure_tokens),
               "vN": greedy(model, tok, prompts, cfg.measure_tokens)}
    texts = {k: [tok.decode(a, skip_special_tokens=True) for a in v] for k, v in answers.items()}
    return {"heldout_prompts": len(prompts), "greedy_tokens": cfg.measure_tokens,
            "layout_rate": {k: sum(map(follows_layout, v)) / len(v) for k, v in texts.items()},
            "kl_vn_v0_per_token": token_kl(model, ref, prompts, answers["vN"]),
            "example": {k: v[0] for k, v in texts.items()}}


# ----------------------------------------------------------------------------- the job


def _key(cfg: StyleShiftConfig, fields: tuple[str, ...]) -> str:
    return artifacts.fingerprint({k: v for k, v in asdict(cfg).items() if k in fields})[:16]


POLICY_FIELDS = ("policy", "examples", "steps", "batch_size", "lr", "warmup_steps",
                 "max_grad_norm", "dtype", "heldout", "measure_tokens", "seed")


def _finished(meta_path: Path, key: str) -> dict | None:
    if meta_path.is_file() and (meta := artifacts.read_json(meta_path)).get("job") == key:
        return meta
    return None


def shift_policy(cfg: StyleShiftConfig, out: str | Path) -> Path:
    """Fine-tune v0 into vN at `<out>/policy` (skipped when a finished one has these
    settings); returns the policy dir."""
    dst, key = Path(out) / "policy", _key(cfg, POLICY_FIELDS)
    if _finished(dst / "meta.json", key):
        print(f"style shift: {dst} is done (same settings), reused")
        return dst
    t0 = time.perf_counter()
    base = target_dir(cfg.policy)
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    ref.requires_grad_(False)
    rows = sft_rows(tok, mathgen.generate("train", cfg.examples, seed=cfg.seed))
    losses = finetune(model, rows, cfg, tok.pad_token_id or 0)
    train_s = time.perf_counter() - t0
    moved = measure_drift(model, ref, tok, cfg)
    data = {"source": "mathgen train", "seed": cfg.seed, "examples": len(rows),
            "response_tokens": sum(len(r["response_ids"]) for r in rows),
            "sha256": artifacts.fingerprint([(r["prompt_ids"], r["response_ids"]) for r in rows]),
            "layout": "Given / Step i / Answer / #### (benchmarks/rl/style_shift.py)",
            "example": {"question": rows[0]["question"], "response": rows[0]["response"]}}
    with artifacts.atomic_dir(dst, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        provenance.write_meta(tmp, "style-shift", asdict(cfg),
                             {"train_s": train_s, "total_s": time.perf_counter() - t0},
                             job=key, base={"name": cfg.policy, "dir": str(base),
                                            "sha256": dir_digest(base)},
                             data=data, steps=cfg.steps, lr=cfg.lr, loss=losses, drift=moved)
    print(f"style shift: {dst} ({cfg.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
          f"layout v0 {moved['layout_rate']['v0']:.0%} vN {moved['layout_rate']['vN']:.0%}, "
          f"KL(vN||v0) {moved['kl_vn_v0_per_token']:.3f}/token)")
    return dst


def rollout_problems(cfg: StyleShiftConfig, tok) -> list[dict]:
    """Training-distribution problems (mathgen train) the fine-tune did not see, as the RL
    loop's batch rows."""
    seen = {p.question for p in mathgen.generate("train", cfg.examples, seed=cfg.seed)}
    fresh = [p for p in mathgen.generate("train", 2 * cfg.rollout_prompts, seed=cfg.seed + 1)
             if p.question not in seen][:cfg.rollout_prompts]
    if not fresh:
        raise DraftkitError("no mathgen train problem is left for rollouts outside the SFT "
                            "set; lower `examples` or change `seed`")
    return [{"prompt_ids": prompt_ids(tok, p.question), "question": p.question,
             "answer": reward.reference_answer(p.answer)} for p in fresh]


def sample_rollouts(cfg: StyleShiftConfig, out: str | Path) -> dict:
    """vN's T=`temperature` rollouts in vLLM into `<out>/rollouts/step-NNNNN.jsonl` (the RL
    loop's format, `policy_step` = cfg.steps); their stats (also `<out>/rollouts/meta.json`)."""
    out = Path(out)
    policy, dst = out / "policy", out / "rollouts"
    key = _key(cfg, (*POLICY_FIELDS, "rollout_prompts", "group_size", "max_tokens",
                     "temperature", "engine_dtype"))
    if done := _finished(dst / "meta.json", key):
        print(f"style shift: {dst} is done (same settings), reused")
        return done["rollouts"]
    tok = AutoTokenizer.from_pretrained(policy)
    batch = rollout_problems(cfg, tok)
    loop = grpo_loop.LoopConfig(target=str(policy), prompts_per_step=len(batch),
                                group_size=cfg.group_size, max_tokens=cfg.max_tokens,
                                temperature=cfg.temperature, draft="none",
                                dtype=cfg.engine_dtype, max_model_len=cfg.max_model_len,
                                seed=cfg.seed)
    spec = vllm_engine.EngineSpec(model=str(policy.resolve()), dtype=cfg.engine_dtype,
                                  max_model_len=cfg.max_model_len, seed=cfg.seed,
                                  max_num_seqs=max(64, len(batch) * cfg.group_size))
    with vllm_engine.engine(spec) as llm:
        rows, stats = grpo_loop.rollout(llm, batch, loop, tok)
    grpo_loop.write_rollouts(dst / f"step-{cfg.steps:05d}.jsonl", rows, cfg.steps)
    texts = [tok.decode(r["response_ids"], skip_special_tokens=True) for r in rows]
    stats = {k: v for k, v in stats.items() if k not in ("al", "per_position")}
    stats.update(rows=sum(1 for r in rows if r["response_ids"]), prompts=len(batch), policy_step=cfg.steps,
                 layout_rate=sum(map(follows_layout, texts)) / max(len(texts), 1),
                 **grpo_loop.rates(rows))
    provenance.write_meta(dst, "style-shift-rollouts", asdict(cfg), {}, job=key, rollouts=stats)
    return stats


def run(cfg: StyleShiftConfig, out: str | Path, rollouts: bool = True) -> dict:
    """Policy vN (+ its rollouts); the summary also written to `<out>/meta.json`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    policy = shift_policy(cfg, out)
    meta = artifacts.read_json(policy / "meta.json")
    summary = {"policy": str(policy), "drift": meta["drift"], "steps": meta["steps"],
               "loss": {"first": meta["loss"][0], "last": meta["loss"][-1]},
               "rollouts": sample_rollouts(cfg, out) if rollouts else None,
               "rollout_dir": str(out / "rollouts") if rollouts else None}
    provenance.write_meta(out, "style-shift", asdict(cfg), meta["timings"], **summary)
    return summary
