"""`draftkit export` for an EAGLE-3 head: a vLLM-loadable speculators-format dir.

Reads `<run>/train/best` (written by the trainer with `Eagle3Draft.save_pretrained`), checks it
against the run's target (hidden size, vocab, aux layer ids, family) and against what vLLM
loads (every tensor and shape, `d2t` for a reduced vocab, every norm flag written), and writes
atomically: config.json, model.safetensors, speculative_config.json, README.md (serving
snippets for vLLM, NeMo-RL and verl) and meta.json. `embed_tokens` is never exported: vLLM
then shares the target's embedding, which the draft was trained against (a frozen copy).
The verifier is named by its hub id where one is known, else by its registry or directory name
(`portable`), so the dir holds no path of the machine that wrote it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from draftkit.core import artifacts, provenance, registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.eagle3 import format as fmt
from draftkit.drafts.eagle3.model import CONFIG_FILE, WEIGHTS_FILE
from draftkit.drafts.export_files import read_json, serving_snippets

# serving/drafter_swap.py's worker extension, named for the README (drafts never import serving)
SWAP_EXTENSION = "draftkit.serving.drafter_swap.DrafterSwap"


def export_run(run) -> Path:
    """The run's best head as `run.export_dir` (no vLLM check: export/stage.py runs it)."""
    t0 = time.perf_counter()
    cfg = run.cfg
    best = run.paths.train / "best"
    spec, tensors = load_checkpoint(best, run.paths.root)
    spec = portable(fmt.with_k(spec, cfg.draft.num_speculative_tokens), cfg)
    check_against_run(spec, cfg)
    tensors.pop("embed_tokens.weight", None)  # vLLM shares the target's embedding
    fmt.check_state_dict(spec, tensors)
    train_meta = read_json(best / "meta.json")
    out = run.export_dir.resolve()
    with artifacts.atomic_dir(out, overwrite=True) as tmp:
        write_files(tmp, out, spec, tensors, cfg)
        provenance.write_meta(tmp, "export", cfg.to_dict(),
                             {"export_s": time.perf_counter() - t0}, source=str(best),
                             train_step=train_meta.get("step"),
                             sim_al=(train_meta.get("eval") or {}).get("sim_al"))
    sc = _run_speculative_config(spec, cfg, model=str(out))
    print(f"exported {out}\n  vllm serve {_target_ref(spec)} --speculative-config "
          f"'{json.dumps(sc)}'")
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


def _run_speculative_config(spec: fmt.DraftSpec, cfg, model: str = ".") -> dict:
    """`speculative_config` of this head under the run's draft.draft_sample_method, `model` as given
    (asked of the run's kind)."""
    return kinds.of(cfg).speculative_config(model, spec.num_speculative_tokens,
                                            cfg.draft.draft_sample_method)


def portable(spec: fmt.DraftSpec, cfg) -> fmt.DraftSpec:
    """The spec with no local path: the verifier by hub id where known (smollm2-135m ->
    HuggingFaceTB/SmolLM2-135M-Instruct), else its registry name or directory name."""
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
hashes and probe AL (start it with `worker_extension_cls="{SWAP_EXTENSION}"`).
"""
