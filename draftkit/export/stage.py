"""`draftkit export`: the trained draft as a dir vLLM serves as it is, then a parity check.

    draftkit export runs/demo                 # -> runs/demo/export, then a vLLM parity check
    draftkit export runs/demo --no-check --out /tmp/draft
    python -c "from draftkit import api; api.export('runs/tiny')"    # tiny CPU run

The draft kind writes its files (drafts/eagle3/export.py: a speculators-format EAGLE-3 dir;
drafts/draft_lm/export.py: a plain HF model dir), each with speculative_config.json, README.md
(serving snippets for vLLM, NeMo-RL and verl, drafts/export_files.py) and meta.json. The parity check
(`export.check`) serves the export in vLLM at T=0 on the run's eval prompts and puts vLLM's
measured AL next to the training-time simulated AL (check.json, meta.json).
Where `draftkit eval` measured these weights (its decision: <run>/eval/choice.json), the export
also gets the measured method and k per batch size (export/serving_file.py: serving.json, a
README section, meta.json["serving"]): export, eval, then export again.

An export is relocatable: the files a server reads hold no path of the machine that wrote them.
`speculative_config.json` names the draft as `"model": "."` (this directory: vLLM resolves it
against its working directory; serving/speculative.py's `export_config` resolves it against the
file, and its `served` says what serves the export at a batch size and temperature).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from draftkit.core import artifacts, config, hardware
from draftkit.core.config import Run
from draftkit.core.errors import DraftkitError
from draftkit.core.prepared_data import load_prompts
from draftkit.drafts import kind as kinds
from draftkit.drafts.acceptance import simulated_al
from draftkit.drafts.export_files import read_json
from draftkit.export.serving_file import keep_choice
from draftkit.serving import vllm_engine


def export(run_dir: str | Path, overrides: list[str] | None = None) -> Path:
    """Write the export dir for `run_dir` (the draft kind's files) and, if export.check,
    parity-check it in vLLM."""
    run = config.open_run(run_dir, overrides)
    out = kinds.of(run.cfg).export_run(run)
    keep_choice(run, out)
    check_in_vllm(run, out)
    return out


# ----------------------------------------------------------------------------- parity check


def check_in_vllm(run: Run, out: Path) -> None:
    """The parity check of a finished export, if export.check; an engine that does not start
    says the export itself is complete (every draft kind's export ends here)."""
    if not run.cfg.export.check:
        return
    try:
        parity_check(run, out)
    except vllm_engine.EngineStartError as e:
        raise DraftkitError(f"{e}\nThe export itself is complete at {out}; rerun with "
                            "--no-check to skip the vLLM parity check.") from e


def parity_check(run: Run, export_dir: Path, llm=None) -> dict:
    """Serve the export in vLLM (or use `llm`, already serving it), greedy on the eval
    prompts; write check.json + meta.json["check"]; warn when the AL gap is large."""
    cfg = run.cfg
    k = cfg.draft.num_speculative_tokens
    try:
        prompts = load_prompts(run.paths.data, cfg.export.check_prompts)
    except DraftkitError as e:
        raise DraftkitError(f"{e}, or export with --no-check") from e
    train_meta = read_json(run.paths.train / "best" / "meta.json")
    sim = simulated_al(train_meta.get("eval") or {}, k)
    params = vllm_engine.sampling(0.0, cfg.eval.max_new_tokens)
    t0 = time.perf_counter()
    if llm is None:
        spec = vllm_engine.run_engine_spec(cfg, kinds.of(cfg).speculative_config(export_dir, k),
                                           prompts, batch_size=len(prompts))
        with vllm_engine.engine(spec) as engine:
            m = vllm_engine.measure(engine, prompts, params, batch_size=len(prompts))
    else:
        m = vllm_engine.measure(llm, prompts, params, batch_size=len(prompts))
    counters = m["spec"] or {}
    measured = counters.get("acceptance_length")
    gap = abs(measured - sim) if measured is not None and sim is not None else None
    result = {"vllm_al": measured, "sim_al": sim, "gap": gap, "k": k, "temperature": 0.0,
              "prompts": len(prompts), "max_new_tokens": cfg.eval.max_new_tokens,
              "dtype": hardware.resolve(cfg.eval.dtype, key="eval.dtype"),
              "batch_size": len(prompts), "spec": counters,
              "tokens_per_s": m["tokens_per_s"], "check_s": time.perf_counter() - t0,
              "warning": None}
    if measured is None:
        result["warning"] = "vLLM reported no drafts: speculative decoding did not run"
    elif gap is not None and gap > cfg.export.al_gap_warn:
        result["warning"] = (f"vLLM AL {measured:.2f} vs simulated {sim:.2f} (gap {gap:.2f} > "
                             f"export.al_gap_warn={cfg.export.al_gap_warn}). Likely causes: "
                             + "; ".join(kinds.of(cfg).likely_causes))
    artifacts.write_json_atomic(export_dir / "check.json", result)
    meta = read_json(export_dir / "meta.json")
    meta["check"] = {k2: v for k2, v in result.items() if k2 != "spec"}
    artifacts.write_json_atomic(export_dir / "meta.json", meta)
    sim_txt = f"{sim:.2f}" if sim is not None else "n/a"
    meas_txt = f"{measured:.2f}" if measured is not None else "n/a"
    print(f"parity check: vLLM AL {meas_txt} vs simulated AL {sim_txt} "
          f"(k={k}, T=0, {len(prompts)} prompts)")
    if result["warning"]:
        print(f"warning: {result['warning']}", file=sys.stderr)
    return result
