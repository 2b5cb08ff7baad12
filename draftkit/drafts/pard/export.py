"""`draftkit export` for a PARD draft: the draft-lm export (drafts/lm_family/export.py: a plain HF
dir with the target's tokenizer) whose config.json names `pard_token` and whose
speculative_config.json says `"parallel_drafting": true`, which vLLM 0.32 needs to run a
`draft_model` draft as PARD (it does not infer it from the config).

    draftkit export runs/smol-pard            # -> runs/smol-pard/export, then the vLLM parity check
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftkit.core import artifacts, provenance
from draftkit.core.errors import DraftkitError
from draftkit.drafts.export_files import run_speculative_config, serving_snippets
from draftkit.drafts.lm_family import export as lm_export
from draftkit.drafts.lm_family.build import check_tokenizers, load_lm
from draftkit.targets.load import run_target_dir


def write_files(tmp: Path, final: Path, lm, tokenizer, cfg) -> None:
    """The draft-lm export's files with PARD's README.md (speculative_config.json is the
    kind's: draft_model with parallel_drafting)."""
    if getattr(lm.config, "pard_token", None) is None:
        raise DraftkitError("this draft LM has no pard_token in its config: it was not trained "
                            "as a PARD draft (draft.kind=pard)")
    lm_export.write_files(tmp, final, lm, tokenizer, cfg, readme(final, cfg, lm))


def export_run(run) -> Path:
    """Write the PARD export dir (export/stage.py then runs the vLLM parity check)."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    cfg, best = run.cfg, run.paths.train / "best"
    if not (best / "config.json").is_file() or not (best / "model.safetensors").is_file():
        raise DraftkitError(f"run {run.paths.root} has no trained PARD draft ({best} is missing "
                            f"config.json/model.safetensors); run `draftkit train "
                            f"{run.paths.root}` first")
    tpath = run_target_dir(cfg.target)
    lm, _ = load_lm(best)
    tok = AutoTokenizer.from_pretrained(tpath)
    check_tokenizers(tok, tok, cfg.target.vocab_size, lm.get_input_embeddings().weight.shape[0],
                     f"the draft at {best}")
    lm = lm.to(lm_export.stored_dtype(tpath))
    meta = artifacts.read_json(best / "meta.json") if (best / "meta.json").is_file() else {}
    out = run.export_dir.resolve()
    with artifacts.atomic_dir(out, overwrite=True) as tmp:
        write_files(tmp, out, lm, tok, cfg)
        provenance.write_meta(tmp, "export", cfg.to_dict(), {"export_s": time.perf_counter() - t0},
                             source=str(best), kind="pard", params=lm_export.num_params(lm),
                             pard_token=int(lm.config.pard_token), train_step=meta.get("step"),
                             sim_al=(meta.get("eval") or {}).get("sim_al"))
    sc = run_speculative_config(cfg, str(out))
    print(f"exported {out}\n  vllm serve {lm_export.target_ref(cfg)} --speculative-config "
          f"'{json.dumps(sc)}'")
    return out


def readme(out: Path, cfg, lm) -> str:
    sc = json.dumps(run_speculative_config(cfg, f"/path/to/{out.name}"))
    target = lm_export.target_ref(cfg)
    return f"""# PARD draft LM for {cfg.target.name}

A {lm.config.num_hidden_layers}-layer {lm.config.architectures[0]} \
({lm_export.num_params(lm) / 1e6:.1f}M parameters) that shares the target's tokenizer, distilled
from the target by draftkit run `{cfg.name}` to propose all k tokens in ONE forward (PARD,
parallel drafting): vLLM appends k-1 copies of the mask token `pard_token`
({int(lm.config.pard_token)}, in config.json) after the last verified token and drafts the
argmax at each. vLLM runs it as `method: draft_model` with `parallel_drafting: true`; without that
flag it would draft autoregressively, which this draft was not trained for beyond the first token.
Serve it with the target it was distilled from: `{target}`.

{serving_snippets(target, sc)}
Acceptance falls as the policy drifts from the weights the draft was distilled from: refresh it
with `draftkit refresh RUN ...` or `draftkit watch RUN ...` (RUN: the run dir of `{cfg.name}`).
"""
