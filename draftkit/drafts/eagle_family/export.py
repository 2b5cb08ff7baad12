"""What the exports of EAGLE-family drafts share: the checkpoint checked against the run's
target (hidden size, vocab, aux layer ids, family; EAGLE-3 and P-EAGLE heads), the verifier
named by its hub id where one is known, else by its registry or directory name (`portable`), so
an export dir holds no path of the machine that wrote it, and the export dir written with its
provenance (`write_export`; P-EAGLE and DFlash).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

from draftkit.core import artifacts, provenance, registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import format as fmt
from draftkit.drafts.export_files import read_json, run_speculative_config


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


def portable(spec, cfg):
    """The spec (a DraftSpec or DFlashSpec) with no local path: the verifier by hub id where
    known (smollm2-135m -> HuggingFaceTB/SmolLM2-135M-Instruct), else its registry name or
    directory name."""
    info = registry.lookup(cfg.target.name)
    name = info.name if info is not None else Path(cfg.target.name).name
    verifier = cfg.target.hub_id or (info.hub_id if info is not None else "") or name
    return dataclasses.replace(spec, verifier_name_or_path=verifier, target_name=name)


def _target_ref(spec: fmt.DraftSpec) -> str:
    return spec.verifier_name_or_path or spec.target_name


def write_export(run, best: Path, spec, write: Callable[[Path, Path], None],
                 t0: float) -> Path:
    """`run.export_dir`, written atomically: the draft's files by `write(tmp, out)`, then
    meta.json (the run's config, the export time since `t0`, the checkpoint `best` with its
    training step and simulated AL); prints how vLLM serves it."""
    cfg = run.cfg
    train_meta = read_json(best / "meta.json")
    out = run.export_dir.resolve()
    with artifacts.atomic_dir(out, overwrite=True) as tmp:
        write(tmp, out)
        provenance.write_meta(tmp, "export", cfg.to_dict(),
                              {"export_s": time.perf_counter() - t0}, source=str(best),
                              train_step=train_meta.get("step"),
                              sim_al=(train_meta.get("eval") or {}).get("sim_al"))
    sc = run_speculative_config(cfg, model=str(out))
    print(f"exported {out}\n  vllm serve {_target_ref(spec)} --speculative-config "
          f"'{json.dumps(sc)}'")
    return out
