"""`draftkit export` for a P-EAGLE head: a speculators-format dir vLLM 0.32 serves as it is with
`{"method": "eagle3", "parallel_drafting": true, ...}`.

The EAGLE-3 export (drafts/eagle3/export.py) with the P-EAGLE config (format.py: type
"peagle", mask_token_id) and the `mask_hidden` tensor; the same checks against the run's target
(check_against_run), the same relocatable verifier name (portable; both the EAGLE family's,
drafts/eagle_family/export.py), no `embed_tokens` (vLLM
shares the target's, whose row `mask_token_id` embeds every parallel slot).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import export as family_export
from draftkit.drafts.eagle_family import format as eagle3_fmt
from draftkit.drafts.eagle_family.export import _target_ref, check_against_run, portable
from draftkit.drafts.eagle_family.model import CONFIG_FILE, WEIGHTS_FILE
from draftkit.drafts.export_files import (
    run_speculative_config,
    serving_snippets,
    write_serving_files,
)
from draftkit.drafts.peagle import format as fmt


def export_run(run) -> Path:
    """The run's best P-EAGLE head as `run.export_dir` (export/stage.py runs the vLLM check)."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    cfg = run.cfg
    best = run.paths.train / "best"
    if not (best / CONFIG_FILE).is_file() or not (best / WEIGHTS_FILE).is_file():
        raise DraftkitError(f"run {run.paths.root} has no trained checkpoint ({best} is missing "
                            f"{CONFIG_FILE}/{WEIGHTS_FILE}); run `draftkit train "
                            f"{run.paths.root}` first")
    spec, mask_token_id = fmt.from_config(artifacts.read_json(best / CONFIG_FILE))
    if mask_token_id is None:
        raise DraftkitError(f"{best} holds an EAGLE-3 head, not a P-EAGLE one: train this run "
                            f"(`draftkit train {run.paths.root}`; train.init_from=RUN warm-starts "
                            "from an EAGLE-3 head) before exporting it as peagle")
    tensors = load_file(str(best / WEIGHTS_FILE))
    spec = portable(eagle3_fmt.with_k(spec, cfg.draft.num_speculative_tokens), cfg)
    check_against_run(spec, cfg)
    tensors.pop("embed_tokens.weight", None)  # vLLM shares the target's embedding
    fmt.check_state_dict(spec, tensors, mask_token_id)
    return family_export.write_export(
        run, best, spec, lambda tmp, out: write_files(tmp, out, spec, tensors, mask_token_id, cfg),
        t0)


def write_files(tmp: Path, out: Path, spec, tensors: dict, mask_token_id: int, cfg) -> None:
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    artifacts.write_bytes_atomic(tmp / WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
    artifacts.write_json_atomic(tmp / CONFIG_FILE, fmt.to_config(spec, mask_token_id))
    write_serving_files(tmp, cfg, readme(out.name, spec, mask_token_id, cfg))


def readme(name: str, spec, mask_token_id: int, cfg) -> str:
    sc = json.dumps(run_speculative_config(cfg, model=f"/path/to/{name}"))
    target = _target_ref(spec)
    return f"""# P-EAGLE draft for {cfg.target.name}

Speculators-format P-EAGLE head (`speculators_model_type: "peagle"`: one {spec.family} decoder
layer, as EAGLE-3) trained by draftkit run `{cfg.name}`: ONE draft forward proposes all
{spec.num_speculative_tokens} tokens. The first slot reads the newest token and the target's
features; the others read token {mask_token_id} (`mask_token_id`) and the learned
`mask_hidden`. Draft vocab {spec.draft_vocab_size} of {spec.target_vocab_size} target tokens,
aux layers {spec.aux_layer_ids} (vLLM convention). vLLM needs `"parallel_drafting": true` beside
`"method": "eagle3"` (below); without it vLLM would draft autoregressively and ignore
`mask_hidden`. The token embedding is not included: vLLM shares the target's. Serve it with
the target it was trained against: `{target}`.

{serving_snippets(target, sc)}"""
