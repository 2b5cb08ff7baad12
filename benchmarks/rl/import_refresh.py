"""Benchmark (#53): a head trained by the speculators package, imported and refreshed by draftkit.

1. speculators trains an EAGLE-3 head for the target on the first half of the demo's prepared
   conversations: the package's `Eagle3DraftModel` (eager attention), its batch alignment
   (`shift_batch`) and its TTT loss in its `forward` (KL, its eager implementation), driven by
   a plain AdamW loop here (the package's `Trainer` is built for torchrun and its own
   hidden-state files; not used), one conversation per step, until `--cpu-seconds` of process
   CPU time in its optimizer steps (the target's capture excluded, as train.max_cpu_seconds
   counts; default: what the demo's own head spent, `<run>/train/meta.json` cpu_s) or
   `--steps`. The draft vocab: the top `--draft-vocab` assistant tokens of that half; the taps:
   vLLM's default [2, N//2, N-3], captured by draftkit's hooks (the same states vLLM's
   extract_hidden_states writes). Saved with the package's `save_pretrained`.
2. `draftkit init --from-draft` imports it; the other half of the conversations becomes
   rollouts of the policy (= the target: prompt up to the first assistant token, response the
   rest) and `draftkit refresh` fine-tunes the draft on them, measuring tokens per target step
   on its held-out prompts before and after (teacher-forced at T=0, which is what vLLM accepts
   on a greedy rollout, and at refresh.temperature).

The goal: after >= before on the held-out rollouts. `--tiny` checks the script in minutes
(tiny-llama, generated conversations); the real run reads `make demo`'s run (smollm2-135m).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from draftkit.core import artifacts, hardware, provenance
from draftkit.targets.capture import capture

FALLBACK_CPU_S = 600.0  # speculators' budget where the run has no train/meta.json


def budget(args) -> tuple[float, str]:
    """(process CPU-seconds for speculators' optimizer steps, where the figure comes from):
    --cpu-seconds, else the demo head's own training CPU time (train/meta.json cpu_s)."""
    if args.cpu_seconds is not None:
        return args.cpu_seconds, "--cpu-seconds"
    if args.tiny:
        return FALLBACK_CPU_S, f"--tiny: {FALLBACK_CPU_S:g} s"
    meta = Path(args.run) / "train" / "meta.json"
    if meta.is_file() and artifacts.read_json(meta).get("cpu_s"):
        return float(artifacts.read_json(meta)["cpu_s"]), f"{meta} cpu_s (the run's own head)"
    return FALLBACK_CPU_S, f"no cpu_s in {meta}: {FALLBACK_CPU_S:g} s"


def conversations(args, target) -> list[tuple[list[int], list[int]]]:
    """(input_ids, loss_mask) rows: the demo run's prepared train split, or (tiny) the target's
    greedy continuations of templated questions."""
    if not args.tiny:
        from draftkit.core import config, prepared_data

        rows = prepared_data.load_rows(config.run_paths(args.run).data, "train")
        out = [(list(r["input_ids"]), list(r["loss_mask"])) for r in rows]
        random.Random(0).shuffle(out)
        return out[: args.rows]
    tok, out = target.tokenizer, []
    words = "apples books cookies students dollars hours pencils trains".split()
    for i in range(args.rows):
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"{words[i % 8]} {i * 7} per day, how many?"}],
            add_generation_prompt=True, tokenize=False)
        p = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            seq = target.model.generate(torch.tensor([p]), max_new_tokens=args.new_tokens,
                                        do_sample=False, eos_token_id=None)[0].tolist()
        out.append((seq, [0] * len(p) + [1] * (len(seq) - len(p))))
    return out


def vocab_of(rows, vocab_size: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t2d [V] bool, d2t [n] offsets): the top-n assistant tokens, ids ascending."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in rows:
        counts += torch.bincount(torch.tensor(ids)[torch.tensor(mask).bool()], minlength=vocab_size)
    selected = counts.topk(n).indices.sort().values  # [n]
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[selected] = True
    return t2d, selected - torch.arange(n)


def train_with_speculators(args, target, rows, out: Path) -> dict:
    """The package's EAGLE-3 head trained on `rows`, saved to `out` (module doc, step 1)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.losses import resolve_loss_config
    from speculators.models import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.models.eagle3.data import shift_batch
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    verifier = AutoConfig.from_pretrained(target.path)
    n = verifier.num_hidden_layers
    aux = [2, n // 2, n - 3]
    layer = verifier.__class__(**{**verifier.to_dict(), "num_hidden_layers": 1})
    layer._attn_implementation = "eager"
    torch.manual_seed(args.seed)
    model = Eagle3DraftModel(Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=args.draft_vocab,
        eagle_aux_hidden_state_layer_ids=aux, norm_before_residual=False,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            verifier=VerifierConfig.from_pretrained(str(target.path)))))
    model.load_vocab_mappings(*vocab_of(rows, verifier.vocab_size, args.draft_vocab))
    model.load_verifier_weights()
    loss = resolve_loss_config("kl_div", "eager")  # the fused one is a Triton (GPU) kernel
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    cpu_budget, budget_from = budget(args)
    t0, losses, step, cpu_s = time.perf_counter(), [], 0, 0.0

    def more() -> bool:
        return (args.steps <= 0 or step < args.steps) and cpu_s < cpu_budget

    while more():
        for ids, mask in rows:
            if not more():
                break
            x = torch.tensor([ids])  # [1, T]
            with torch.no_grad():
                states, last = capture(target.model, x, aux)  # [1, T, 3H], [1, T, H]
            b = shift_batch({"input_ids": x[0], "hidden_states": states[0].float(),
                             "verifier_last_hidden_states": last[0].float(),
                             "loss_mask": torch.tensor(mask).bool(),
                             "lengths": torch.tensor([len(ids)]),
                             "position_ids": torch.arange(len(ids))})
            c0 = time.process_time()
            _, value, _ = model(hidden_states=b["hidden_states"][None], input_ids=b["input_ids"][None],
                               document_ids=torch.zeros_like(b["input_ids"])[None],
                               loss_mask=b["loss_mask"][None], position_ids=b["position_ids"][None],
                               verifier_last_hidden_states=b["verifier_last_hidden_states"][None],
                               ttt_steps=3, loss_config=loss)
            opt.zero_grad()
            value.backward()
            opt.step()
            cpu_s += time.process_time() - c0
            losses.append(value.item())
            step += 1
    model.save_pretrained(out)
    return {"steps": step, "rows": len(rows), "seconds": time.perf_counter() - t0,
            "cpu_s": cpu_s, "cpu_budget_s": cpu_budget, "cpu_budget_from": budget_from,
            "loss_first": losses[0], "loss_last": losses[-1], "aux_layer_ids": aux,
            "draft_vocab": args.draft_vocab, "lr": args.lr}


def write_rollouts(rows, path: Path) -> Path:
    """Rows as rollouts of the policy: prompt = up to the first assistant token."""
    lines = []
    for ids, mask in rows:
        cut = mask.index(1) if 1 in mask else len(ids)
        lines.append(json.dumps({"prompt_ids": ids[:cut], "response_ids": ids[cut:],
                                 "policy_step": 0}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def run(args) -> dict:
    from importlib import metadata

    from draftkit import api
    from draftkit.targets.load import load_target

    work = Path(args.work)
    target = load_target(args.target, device="cpu", dtype=args.dtype)
    rows = conversations(args, target)
    half = len(rows) // 2
    trained = train_with_speculators(args, target, rows[:half], work / "speculators-head")
    run_dir = api.init(args.target, None, name="imported", runs_dir=work / "runs", force=True,
                       from_draft=str(work / "speculators-head"),
                       overrides=[f"target.dtype={args.dtype}"])
    target.model.save_pretrained(work / "policy")
    target.tokenizer.save_pretrained(work / "policy")
    rollouts = write_rollouts(rows[half:], work / "rollouts" / "step_0.jsonl")
    res = api.refresh(run_dir, str(work / "policy"), [rollouts],
                      [f"refresh.budget_steps={args.refresh_steps}", "refresh.lr=3e-4"])
    lin = res.get("lineage") or {}  # published and rejected carry it; undecided does not
    return {
        "meta": provenance.make_meta("bench_import", None, argv_note=args.command),
        "speculators_version": metadata.version("speculators"),
        "target": args.target, "dtype": hardware.resolve(args.dtype), "tiny": args.tiny,
        "trained_by_speculators": trained, "refresh": {
            "status": res["status"], "version": res.get("version"),
            "rows": lin.get("rows"), "steps": lin.get("steps"),
            "before": lin.get("al_before"), "after": lin.get("al_after")},
    }


def markdown(r: dict) -> str:
    f, t = r["refresh"], r["trained_by_speculators"]
    lines = ["# bench_import: a speculators-trained head, imported and refreshed by draftkit",
             "", f"`{r['meta']['argv_note']}` on {cpu(r['meta']['hardware'])}, commit "
             f"{r['meta']['git_sha'][:10]}, speculators {r['speculators_version']}, target "
             f"{r['target']} ({r['dtype']}).", "",
             f"speculators trained {t['steps']} steps on {t['rows']} conversations "
             f"(loss {t['loss_first']:.3f} -> {t['loss_last']:.3f}, {t['seconds']:.0f} s, "
             f"{t['cpu_s']:.0f} of {t['cpu_budget_s']:.0f} CPU-s: {t['cpu_budget_from']}); "
             f"draftkit's refresh: {f['status']} ({f['steps']} steps).", "",
             "| held-out tokens per target step | before refresh | after refresh |",
             "|---|---|---|"]
    if f["status"] == "undecided":
        lines.append("| (undecided: too few held-out draft starts) | - | - |")
    for key in sorted((f["before"] or {}).keys()):
        lines.append(f"| {key} | {f['before'][key]['al']:.3f} | {f['after'][key]['al']:.3f} |")
    return "\n".join(lines) + "\n"


def cpu(hw) -> str:
    return hw.get("cpu_model") or hw.get("device") if isinstance(hw, dict) else str(hw)


def plot(r: dict, path: Path) -> None:
    """Held-out tokens per target step before and after the refresh, one pair per temperature."""
    from benchmarks import report

    f = r["refresh"]
    keys = sorted((f["before"] or {}).keys())
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(keys))
    for shift, when in ((-0.2, "before"), (0.2, "after")):
        ax.bar([x + shift for x in xs], [f[when][k]["al"] for k in keys], width=0.4,
               label=f"{when} refresh")
    ax.set_xticks(list(xs), keys)
    ax.set_ylabel("held-out tokens per target step")
    ax.set_title(f"speculators {r['speculators_version']} head on {r['target']}, "
                 f"refresh {f['status']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save(r: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    artifacts.write_json_atomic(out / "bench_import.json", r)
    artifacts.write_text_atomic(out / "bench_import.md", markdown(r))
    if r["refresh"]["before"]:
        plot(r, out / "bench_import.png")
