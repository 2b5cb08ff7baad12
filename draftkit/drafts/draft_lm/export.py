"""`draftkit export` for a draft LM: a plain HF model dir that vLLM serves with
`{"method": "draft_model", "model": DIR, "num_speculative_tokens": k}`.

    draftkit export runs/smol-lm              # -> runs/smol-lm/export, then the vLLM parity check

Reads `<run>/train/best` (the trainer's `DraftLM.save_pretrained`: the LM alone, no target
parts), checks its vocabulary against the run's target and writes atomically: config.json,
generation_config.json, model.safetensors (in the target's stored dtype), the TARGET's tokenizer
(the draft has no other), speculative_config.json, README.md (vllm serve, LLM(...), NeMo-RL,
verl) and meta.json; the files are the LM family's (drafts/lm_family/export.py). The parity
check is export/stage.py's, after this: the export served in vLLM at T=0 on the run's eval
prompts, vLLM's AL beside the training-time simulated AL (check.json).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftkit.core import artifacts, provenance
from draftkit.core.errors import DraftkitError
from draftkit.drafts.export_files import run_speculative_config
from draftkit.drafts.lm_family.build import check_tokenizers, load_lm
from draftkit.drafts.lm_family.export import num_params, stored_dtype, target_ref, write_files
from draftkit.targets.load import run_target_dir


def export_run(run) -> Path:
    """Write the draft LM's export dir (export/stage.py then runs the vLLM parity check)."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    cfg, run_dir = run.cfg, run.paths.root
    best = run.paths.train / "best"
    if not (best / "config.json").is_file() or not (best / "model.safetensors").is_file():
        raise DraftkitError(f"run {run_dir} has no trained draft LM ({best} is missing "
                            f"config.json/model.safetensors); run `draftkit train {run_dir}` first")
    tpath = run_target_dir(cfg.target)
    lm, _ = load_lm(best)
    tok = AutoTokenizer.from_pretrained(tpath)
    check_tokenizers(tok, tok, cfg.target.vocab_size, lm.get_input_embeddings().weight.shape[0],
                     f"the draft at {best}")
    lm = lm.to(stored_dtype(tpath))
    train_meta = artifacts.read_json(best / "meta.json") if (best / "meta.json").is_file() else {}
    out = run.export_dir.resolve()
    with artifacts.atomic_dir(out, overwrite=True) as tmp:
        write_files(tmp, out, lm, tok, cfg)
        provenance.write_meta(tmp, "export", cfg.to_dict(), {"export_s": time.perf_counter() - t0},
                             source=str(best), kind="draft-lm", params=num_params(lm),
                             train_step=train_meta.get("step"),
                             sim_al=(train_meta.get("eval") or {}).get("sim_al"))
    print(f"exported {out}\n  vllm serve {target_ref(cfg)} --speculative-config "
          f"'{json.dumps(run_speculative_config(cfg, str(out)))}'")
    return out
