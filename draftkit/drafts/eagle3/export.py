"""`draftkit export` for an EAGLE-3 head: a vLLM-loadable speculators-format dir.

Reads `<run>/train/best` (written by the trainer with `Eagle3Draft.save_pretrained`), checks it
against the run's target (hidden size, vocab, aux layer ids, family) and against what vLLM
loads (every tensor and shape, `d2t` for a reduced vocab, every norm flag written), and writes
atomically: config.json, model.safetensors, speculative_config.json, README.md (serving
snippets for vLLM, NeMo-RL and verl) and meta.json. `embed_tokens` is never exported: vLLM
then shares the target's embedding, which the draft was trained against (a frozen copy).
The checks against the run and the portable verifier name are the EAGLE family's
(drafts/eagle_family/export.py), shared with P-EAGLE's export.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftkit.core import artifacts, provenance
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import format as fmt
from draftkit.drafts.eagle_family.export import _target_ref, check_against_run, portable
from draftkit.drafts.eagle_family.model import CONFIG_FILE, WEIGHTS_FILE
from draftkit.drafts.export_files import (
    read_json,
    run_speculative_config,
    serving_snippets,
    write_serving_files,
)

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
    sc = run_speculative_config(cfg, model=str(out))
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


def write_files(tmp: Path, out: Path, spec: fmt.DraftSpec, tensors: dict, cfg) -> None:
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    artifacts.write_bytes_atomic(tmp / WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
    artifacts.write_json_atomic(tmp / CONFIG_FILE, fmt.to_config(spec))
    write_serving_files(tmp, cfg, readme(out.name, spec, cfg))


def readme(name: str, spec: fmt.DraftSpec, cfg) -> str:
    sc = json.dumps(run_speculative_config(cfg, model=f"/path/to/{name}"))
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
