"""The export dir of the draft-LM family (the draft-lm kind's; PARD's adds its own
speculative_config.json and README.md): a plain HF model dir that vLLM serves with
`{"method": "draft_model", "model": DIR, "num_speculative_tokens": k}`. `write_files` writes
config.json, generation_config.json, model.safetensors, the TARGET's tokenizer (the draft has no
other), speculative_config.json and README.md (vllm serve, LLM(...), NeMo-RL, verl); beside it
the target's reference, its stored dtype (the export's) and the parameter count the exports name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftkit.core import registry
from draftkit.drafts.export_files import (
    run_speculative_config,
    serving_snippets,
    write_serving_files,
)
from draftkit.targets.load import run_target_dir


def target_ref(cfg) -> str:
    """What a user passes to vLLM as the target: the hub id, else the local dir."""
    return cfg.target.hub_id if cfg.target.source == registry.SOURCE_HUB else \
        str(run_target_dir(cfg.target))


def stored_dtype(path: Path) -> torch.dtype:
    """The dtype of the target's checkpoint (config.json), float32 when unknown."""
    conf = json.loads((path / "config.json").read_text())
    name = conf.get("dtype") or conf.get("torch_dtype") or "float32"
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name, torch.float32)


def write_files(tmp: Path, final: Path, lm, tokenizer, cfg, text: str | None = None) -> None:
    """The export dir's files (meta.json aside) into `tmp`, naming `final` where it will live;
    README.md is `text` where a kind of the family gives its own (PARD), else `readme`'s."""
    lm.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    write_serving_files(tmp, cfg, readme(final, cfg, lm) if text is None else text)


def num_params(lm: torch.nn.Module) -> int:
    return sum(p.numel() for p in lm.parameters())  # tied embedding/lm_head counted once


def readme(out: Path, cfg, lm) -> str:
    sc = json.dumps(run_speculative_config(cfg, f"/path/to/{out.name}"))
    target = target_ref(cfg)
    d = cfg.draft
    origin = {"sibling": f"started from {d.model}",
              "truncate": f"started as the target's first {d.num_layers} layers",
              "scratch": f"started from random weights ({d.num_layers} layers)"}.get(d.init, "")
    return f"""# Draft LM for {cfg.target.name}

A {lm.config.num_hidden_layers}-layer {lm.config.architectures[0]} ({num_params(lm) / 1e6:.1f}M
parameters) that shares the target's tokenizer, distilled from the target by draftkit run
`{cfg.name}` (KL(target || draft) over the full vocabulary; {origin}). vLLM runs it as a
separate draft model (`method: draft_model`): it needs no target hidden states, and any engine
with draft-model speculation serves it. Serve it with the target it was distilled from:
`{target}`.

{serving_snippets(target, sc)}
Acceptance falls as the policy drifts from the weights the draft was distilled from: measure
it with `draftkit drift RUN --policy CKPT --rollouts ROLLOUTS.jsonl` and refresh it with
`draftkit refresh RUN ...` or `draftkit watch RUN ...` (RUN: the run dir of `{cfg.name}`);
`train.init_from=RUN` fine-tunes from this draft by hand.
"""
