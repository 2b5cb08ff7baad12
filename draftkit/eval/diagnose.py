"""`draftkit diagnose`: why a draft accepts what it accepts, measured on rollouts or prompts.

    draftkit diagnose runs/demo                               # the run's held-out split
    draftkit diagnose runs/demo --rollouts rl/rollouts/ --policy rl/ckpt/step-40

Every figure comes from the draft's teacher-forced unroll over the rows (rl/drift.py's
estimate: the policy's forward gives its distribution at each token, the draft drafts from
each response index), in torch on the CPU or the run's device, no vLLM engine:
  - per-position acceptance at T=0, T=1 and the served temperature (eval.choice_temperature,
    the rollouts' own `temperature` where they carry one), the first position per start;
  - the draft vocabulary: the share of the policy's sampled tokens (and of its argmax, and of
    its probability mass at the served temperature) outside the draft vocab (never accepted);
  - first-position acceptance by token class of the drafted token (digits, whitespace,
    template/special tokens, other);
  - consistency of the run, the export and the engine's config (aux layer ids, k, method) and
    of the rows' chat template (prompts that end with the run's generation prompt);
  - the temperature the answers were made at (data.regen_temperature) against the served one;
  - drift: with rollouts, first-position acceptance on them against the run's own held-out
    rows (what the draft was trained like).
The report (diagnose_report.py) turns these into causes ranked by the first-position
acceptance each costs, worst first, each with its figure and fix; a `draftkit eval` on the run
adds its vLLM rows (optional, read from <run>/eval). Rows with no answer tokens (a split of bare
prompts) get the target's own continuations, sampled at the served temperature.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from draftkit.core import artifacts, config, registry
from draftkit.core.batching import to_device
from draftkit.core.errors import DraftkitError
from draftkit.core.prepared_data import load_prompts, load_rows
from draftkit.drafts import kind as kinds
from draftkit.eval import diagnose_report
from draftkit.eval.compare import check_export
from draftkit.rl import drift
from draftkit.rl.policy import check_lineage, load_policy
from draftkit.rl.rollouts import Rollout, read_rollouts
from draftkit.targets.load import load_target

CLASSES = ("digits", "whitespace", "template", "other")
_CHUNK = 256  # starts whose [n, V] policy probabilities are held at once


def diagnose(run_dir: str | Path, overrides: list[str] | None = None,
             rollouts: list[str] | None = None, policy: str | None = None) -> dict:
    """Measure and rank why the run's exported draft accepts what it does; returns the report
    (also written to <run>/diagnose/diagnose-<time>.{md,json,png})."""
    run = config.open_run(run_dir, overrides)
    cfg = run.cfg
    export_dir = check_export(run)  # a run with no export: the error says `draftkit export`
    kind, k = kinds.of(cfg), cfg.draft.num_speculative_tokens
    target = load_target(cfg.target.name, dtype="float32", revision=cfg.target.revision)
    model_p, tok = target.model, target.tokenizer
    if policy:
        pol = load_policy(policy, dtype="float32")
        check_lineage(pol, cfg)  # another tokenizer or chat template: a clear error
        model_p = pol.model
    draft = kind.load(export_dir, model_p, k)
    served = cfg.eval.choice_temperature
    own = held_out_rows(run, target, served)
    rows = read_rollouts(rollouts, tok, cfg.target.vocab_size, cfg.refresh.max_seq_len) \
        if rollouts else own
    check_tokenizer(rows, tok)  # round trip; the likelihood check follows the measure
    temps = [r.temperature for r in rows if r.temperature is not None]
    if temps:
        served = max(set(temps), key=temps.count)
    t0 = time.perf_counter()
    measured = measure(kind, draft, model_p, rows, k, served, cfg, tok)
    check_likelihood(measured["first_position"]["likelihood"], rows)
    rep = {"run": cfg.name, "run_dir": str(run.paths.root), "export": str(export_dir),
           "kind": cfg.draft.kind, "k": k, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "rows": {"source": "rollouts" if rollouts else "held-out", "count": len(rows),
                    "paths": [str(p) for p in rollouts or []], "policy": policy or cfg.target.name},
           "served_temperature": served,
           "trained_temperature": cfg.data.regen_temperature if cfg.data.regenerate else None,
           "draft_sample_method": cfg.draft.draft_sample_method, **measured,
           "consistency": consistency(run, export_dir, kind, draft, rows, tok),
           "engine": last_eval(run.paths.eval, kind.method, k)}
    if rollouts:  # drift: the same measure on what the draft was trained like
        rep["held_out"] = measure(kind, draft, model_p, own, k, served, cfg, tok)["first_position"]
    rep["seconds"] = time.perf_counter() - t0
    rep["causes"] = diagnose_report.rank(rep, cfg)
    rep["files"] = diagnose_report.write(rep, run.paths.root / "diagnose")
    print(diagnose_report.markdown(rep))
    return rep


# ----------------------------------------------------------------------------- rows


def held_out_rows(run, target, temperature: float) -> list[Rollout]:
    """The prepared eval split's rows with answers (eval.num_prompts of them); a split of bare
    prompts gets the target's continuations (eval.max_new_tokens, sampled at `temperature`)."""
    cfg = run.cfg
    ds = load_rows(run.paths.data, "eval")
    if ds is None:
        raise DraftkitError(f"run {run.paths.root} has no prepared eval split; run `draftkit "
                            f"prepare {run.paths.root}` or pass --rollouts")
    out = []
    for r in ds.select(range(min(cfg.eval.num_prompts, len(ds)))):
        mask = [int(m) for m in r["loss_mask"]]
        if sum(mask) >= 2:
            out.append(Rollout([int(t) for t in r["input_ids"]], mask, mask.index(1),
                               f"eval:{r['id']}"))
    if out:
        return out
    prompts = load_prompts(run.paths.data, cfg.eval.num_prompts)
    return generate_rows(target, prompts, cfg.eval.max_new_tokens, temperature, cfg.eval.seed)


@torch.no_grad()
def generate_rows(target, prompts: list[list[int]], new_tokens: int, temperature: float,
                  seed: int) -> list[Rollout]:
    """The target's continuations of `prompts` (one at a time: no padding) as rows."""
    torch.manual_seed(seed)
    dev = next(target.model.parameters()).device
    out = []
    for i, p in enumerate(prompts):
        sample = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 \
            else {"do_sample": False}
        ids = target.model.generate(torch.tensor([p], device=dev), max_new_tokens=new_tokens,
                                    pad_token_id=target.tokenizer.eos_token_id, **sample)[0]
        ids = ids.tolist()
        out.append(Rollout(ids, [0] * len(p) + [1] * (len(ids) - len(p)), len(p), f"gen:{i}"))
    return out


def check_tokenizer(rows: list[Rollout], tok) -> None:
    """Rows of another tokenizer are refused: their prompts must survive a decode and
    re-encode with the run's tokenizer (a template-made prompt always does)."""
    bad = [r for r in rows if not _round_trips(r.input_ids[:r.prompt_len], tok)]
    if len(bad) * 2 > len(rows):
        raise DraftkitError(
            f"{len(bad)} of {len(rows)} rows ({bad[0].source}, ...) do not decode and re-encode "
            "to the same ids with the run's tokenizer: they were tokenized by another one. "
            "Pass rollouts of this run's target lineage (token ids of its tokenizer, or text "
            "rows: {\"prompt\", \"response\"} / {\"messages\"}), or diagnose the run whose "
            "target wrote them")


def check_likelihood(lik: dict, rows: list[Rollout]) -> None:
    """Rows whose tokens the policy finds far less likely than its own samples (mean p(x) of
    the rows' tokens under 5% of E_{x~p} p(x), both at T=1) are not its rollouts: ids of
    another tokenizer read as this one's (a round trip does not catch every vocabulary)."""
    if lik["ratio"] < 0.05:
        raise DraftkitError(
            f"the rows' tokens ({rows[0].source}, ...) have mean probability "
            f"{lik['mean_p_token']:.2g} under the policy, against {lik['mean_p_sample']:.2g} for "
            "its own samples: they were not written by this policy's tokenizer (another one's "
            "ids?). Pass rollouts of this run's target lineage, or diagnose the run whose "
            "target wrote them")


def _round_trips(ids: list[int], tok) -> bool:
    text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return tok(text, add_special_tokens=False)["input_ids"] == list(ids)


# ----------------------------------------------------------------------------- measures


def measure(kind, draft, policy_model, rows: list[Rollout], k: int, served: float, cfg,
            tok) -> dict:
    """Per-position acceptance (drift.estimate) at T=0, T=1 and `served`, and the first-position
    figures: vocab coverage, token classes, templated rows."""
    temps = sorted({0.0, 1.0, served})  # T=0, RL's T=1 and the served one
    sampling = cfg.draft.draft_sample_method
    est = drift.estimate(kind, draft, policy_model, rows, k, temps, sampling,
                         cfg.refresh.batch_tokens)
    per_pos = {key: {"al": e["al"], "per_position": e["per_position"], "starts": e["starts"]}
               for key, e in est.items()}
    first = first_steps(kind, draft, policy_model, rows, served, sampling,
                        cfg.refresh.batch_tokens)
    return {"per_position": per_pos,
            "first_position": summarize(first, tok, served, templated_rows(rows, tok))}


@torch.no_grad()
def first_steps(kind, draft, policy_model, rows: list[Rollout], served: float, sampling: str,
                batch_tokens: int) -> dict[str, torch.Tensor]:
    """Per draft start t (x_{t+1}, x_{t+2} response tokens), the first draft step's figures, on
    the CPU: token x_{t+2} (sampled by the policy), row, acceptance at T=0 and at `served`,
    whether the policy's argmax / its token is in the draft vocab, its mass inside the vocab."""
    parts: dict[str, list] = {}
    for group in drift.plan(rows, batch_tokens):
        batch = drift.pad_rows([rows[i] for i in group])
        feats = kind.features(draft, policy_model, batch["input_ids"], batch["attention_mask"])
        dev = feats["last"].device
        batch = to_device({**batch, **feats}, dev)
        steps, vocab_ids = kind.step_logits(draft, batch)  # k x [B, T, Vd], [Vd]
        resp = batch["loss_mask"].bool() & batch["attention_mask"].bool()  # [B, T]
        t = resp.shape[1]
        start = torch.zeros_like(resp)
        start[:, : t - 2] = resp[:, 1: t - 1] & resp[:, 2:]
        b_idx, cols = start.nonzero(as_tuple=True)  # [N]
        for sl in torch.arange(len(b_idx), device=dev).split(_CHUNK):
            b, c = b_idx[sl], cols[sl]
            p_logits = drift.policy_logits(policy_model, batch["last"][b, c + 1])  # [n, V]
            q_logits = steps[0][b, c].float()  # [n, Vd]
            in_vocab = torch.zeros(p_logits.shape[-1], dtype=torch.bool, device=dev)  # [V]
            in_vocab[vocab_ids] = True
            p = F.softmax(p_logits / max(served, 1e-6), -1) if served > 0 else None
            got = {"token": batch["input_ids"][b, c + 2],
                   "row": torch.tensor(group, device=dev)[b],
                   "a0": drift.step_alpha(q_logits, vocab_ids, p_logits, 0.0, sampling),
                   "at": drift.step_alpha(q_logits, vocab_ids, p_logits, served, sampling),
                   "argmax_in": in_vocab[p_logits.argmax(-1)].float(),
                   "mass_in": p[:, in_vocab].sum(-1) if p is not None
                   else in_vocab[p_logits.argmax(-1)].float()}
            got["token_in"] = in_vocab[got["token"]].float()
            p1 = p if served == 1.0 else F.softmax(p_logits, -1)  # [n, V] at T=1
            got["p_token"] = p1.gather(-1, got["token"][:, None])[:, 0]  # the row's own token
            got["p_sq"] = (p1 * p1).sum(-1)  # E_{x~p} p(x): what the policy's samples get
            got["vocab_n"] = torch.full((len(b),), len(vocab_ids), device=dev)
            for key, v in got.items():
                parts.setdefault(key, []).append(v.cpu())
    if not parts:
        raise DraftkitError("no draft starts in the rows: every row needs at least two response "
                            "tokens (x_{t+1}, x_{t+2})")
    return {key: torch.cat(v) for key, v in parts.items()}


def token_classes(ids: torch.Tensor, tok) -> list[str]:
    """The class of each token id: template (special/added tokens), whitespace, digits, other."""
    special = set(tok.all_special_ids) | set(getattr(tok, "added_tokens_decoder", {}) or {})
    names = {}
    for t in ids.unique().tolist():
        text = tok.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        names[t] = ("template" if t in special else "whitespace" if not text.strip()
                    else "digits" if text.strip().isdigit() else "other")
    return [names[t] for t in ids.tolist()]


def templated_rows(rows: list[Rollout], tok) -> list[bool]:
    """Whether each row's prompt ends with the run's chat template's generation prompt (the
    assistant header its answers follow in training)."""
    msgs = [{"role": "user", "content": "x"}]
    try:
        with_gen = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        without = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    except (ValueError, AttributeError, TypeError):  # no chat template: nothing to compare
        return [True] * len(rows)
    header = with_gen[len(without):] if with_gen.startswith(without) else ""
    ids = tok(header, add_special_tokens=False)["input_ids"] if header else []
    n = len(ids)
    return [not n or r.input_ids[max(0, r.prompt_len - n):r.prompt_len] == ids for r in rows]


def summarize(first: dict[str, torch.Tensor], tok, served: float, templated: list[bool]) -> dict:
    """The first-position figures of `first_steps` as plain numbers."""
    n = len(first["a0"])
    classes = token_classes(first["token"], tok)
    by_class = {}
    for c in CLASSES:
        sel = torch.tensor([x == c for x in classes])
        rest = ~sel
        if sel.any():
            by_class[c] = {"share": float(sel.float().mean()), "starts": int(sel.sum()),
                           "a0": float(first["a0"][sel].mean()),
                           "at": float(first["at"][sel].mean()),
                           "a0_rest": float(first["a0"][rest].mean()) if rest.any() else None}
    missing = first["token"][first["token_in"] == 0]
    top = torch.bincount(missing).topk(min(8, int((torch.bincount(missing) > 0).sum()))) \
        if missing.numel() else None
    tmpl = torch.tensor(templated)[first["row"]]  # [N] the start's row is templated
    return {
        "starts": n, "a0": float(first["a0"].mean()), "at": float(first["at"].mean()),
        "temperature": served,
        "vocab": {"draft_vocab_size": int(first["vocab_n"][0]),
                  "sampled_outside": 1 - float(first["token_in"].mean()),
                  "argmax_outside": 1 - float(first["argmax_in"].mean()),
                  "mass_outside": 1 - float(first["mass_in"].mean()),
                  "distinct_missing": int(missing.unique().numel()),
                  "top_missing": [{"id": int(i), "text": tok.decode([int(i)]), "count": int(c)}
                                  for c, i in zip(*top, strict=True)] if top is not None else []},
        "classes": by_class,
        "likelihood": {"mean_p_token": float(first["p_token"].mean()),
                       "mean_p_sample": float(first["p_sq"].mean()),
                       "ratio": float(first["p_token"].mean() / first["p_sq"].mean())},
        "templated": {"rows": len(templated), "untemplated_rows": templated.count(False),
                      "a0_templated": float(first["a0"][tmpl].mean()) if tmpl.any() else None,
                      "a0_untemplated": float(first["a0"][~tmpl].mean()) if (~tmpl).any()
                      else None},
    }


# ----------------------------------------------------------------------------- settings


def consistency(run, export_dir: Path, kind, draft, rows: list[Rollout], tok) -> dict:
    """Run vs export vs the engine's config: taps (aux layer ids), k, method."""
    cfg = run.cfg
    spec_file = export_dir / "speculative_config.json"
    engine = artifacts.read_json(spec_file) if spec_file.is_file() else {}
    served_k = engine.get("num_speculative_tokens")
    out = {"aux_layer_ids": {"run": registry.aux_layer_ids(cfg) if kind.aux_layer_ids(draft)
                             is not None else None,
                             "export": kind.aux_layer_ids(draft)},
           "k": {"run": cfg.draft.num_speculative_tokens, "engine": served_k},
           "method": {"kind": kind.method, "engine": engine.get("method")},
           "engine_config": str(spec_file) if engine else None}
    problems = []
    a = out["aux_layer_ids"]
    if a["run"] is not None and a["run"] != a["export"]:
        problems.append(f"aux layer ids {a['run']} in the run config, {a['export']} in the "
                        "export: re-export this run's draft (`draftkit export RUN`)")
    if engine and engine.get("method") != kind.method:
        problems.append(f"the engine's config serves method {engine.get('method')!r}, the "
                        f"draft is {kind.method!r}: re-export (`draftkit export RUN`)")
    if served_k is not None and served_k != cfg.draft.num_speculative_tokens:
        problems.append(f"the engine drafts k={served_k}, the run's k is "
                        f"{cfg.draft.num_speculative_tokens} (draft.num_speculative_tokens): "
                        "re-export (`draftkit export RUN`) or set the run's k")
    out["problems"] = problems
    return out


def last_eval(eval_dir: Path, method: str, k: int) -> dict | None:
    """The newest `draftkit eval` report's vLLM rows of this draft at k (optional figures)."""
    files = sorted(Path(eval_dir).glob("eval-*.json")) if Path(eval_dir).is_dir() else []
    if not files:
        return None
    rep = artifacts.read_json(files[-1])
    rows = [{key: r.get(key) for key in ("temperature", "batch_size", "acceptance_length",
                                         "per_position")}
            for r in rep.get("vllm", {}).get("rows", [])
            if r.get("method") == method and r.get("k") == k and not r.get("unavailable")]
    return {"report": str(files[-1]), "rows": rows} if rows else None
