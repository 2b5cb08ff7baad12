"""Where a small draft LM starts (`draft.init`) and the tokenizer check every draft LM passes:
the LM family's (the draft-lm and PARD kinds wrap the LM built here, drafts/*/build.py).

    draftkit init --target Qwen3-8B --data math --draft draft-lm            # sibling Qwen3-0.6B
    draftkit init --target smollm2-135m --data math --draft draft-lm        # truncate, 6 layers
    draftkit init --target tiny-llama --data math --draft draft-lm draft.init=scratch

- sibling: `draft.model`, a smaller model of the target's family with the same tokenizer (a
  registry name such as Qwen3-0.6B / Llama-3.2-1B-Instruct, or a local HF directory);
- truncate: the target's first `draft.num_layers` decoder layers plus its final norm, embedding
  and lm_head, copied exactly (the default where the registry knows no sibling);
- scratch: random weights in the target's architecture, `draft.num_layers` layers, the widths
  of `draft.hidden_size` etc. (derived from the target by `init`).
`train.init_from` (a run dir = its train/best, a checkpoint or an export) overrides all three:
the refresh path's warm start. Speculative decoding with a draft LM needs the target's
tokenizer; a mismatch is an error naming the difference (vocab size, special tokens, or the
first token that maps to another id).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from draftkit.core import artifacts, config, registry
from draftkit.core.config import ConfigError
from draftkit.core.errors import DraftkitError
from draftkit.targets.load import target_dir

INIT_MODES = ("sibling", "truncate", "scratch")


def default_num_layers(target_layers: int) -> int:
    """Layers of a truncated/scratch draft: a fifth of the target's, at least 2 (SmolLM2: 6)."""
    return min(target_layers - 1, max(2, target_layers // 5))


# ----------------------------------------------------------------------------- init (offline)


def resolve_init(cfg, info: registry.TargetInfo) -> None:
    """Fill `draft.init`, `draft.model` and `draft.num_layers` of a draft-lm run in place;
    refuse what cannot work. Needs no download: shapes come from the registry or config.json."""
    d = cfg.draft
    if not d.init:
        d.init = "sibling" if (d.model or info.draft_lm) else "truncate"
    if d.init not in INIT_MODES:
        raise ConfigError(f"draft.init={d.init!r}; choose one of {', '.join(INIT_MODES)}")
    if d.init != "sibling":
        if d.model:
            raise ConfigError(f"draft.model={d.model!r} names a sibling LM but draft.init="
                              f"{d.init}; drop draft.model or set draft.init=sibling")
        if not d.num_layers:
            d.num_layers = default_num_layers(info.num_hidden_layers)
        if d.init == "truncate" and not 1 <= d.num_layers < info.num_hidden_layers:
            raise ConfigError(f"draft.num_layers={d.num_layers}: a truncated draft keeps 1.."
                              f"{info.num_hidden_layers - 1} of {info.name}'s "
                              f"{info.num_hidden_layers} layers")
        return
    if not d.model:
        if not info.draft_lm:
            raise DraftkitError(
                f"no registered draft LM shares {info.name}'s vocabulary ({info.vocab_size} "
                "tokens), so draft.init=sibling cannot pick one. Pass draft.model=NAME|PATH (a "
                "smaller model with the same tokenizer), or draft.init=truncate (the target's "
                "first layers) or draft.init=scratch.")
        d.model = info.draft_lm
    lm = registry.lookup(d.model) or _local_shapes(d.model)
    if lm.vocab_size != info.vocab_size:
        raise DraftkitError(
            f"draft LM {lm.name} has vocab {lm.vocab_size} but the target {info.name} has "
            f"{info.vocab_size}: draft-model speculation needs the same tokenizer")
    if lm.name == info.name:
        raise DraftkitError(f"draft.model={d.model!r} is the target itself; name a smaller "
                            "model or use draft.init=truncate")


def describe_init(cfg) -> str:
    """One line for `draftkit init`: where the draft LM starts and what must be downloaded."""
    d = cfg.draft
    if d.init == "truncate":
        return f"draft LM: the target's first {d.num_layers} layers (copied at train)"
    if d.init == "scratch":
        return f"draft LM: random weights, {d.num_layers} layers of the target's architecture"
    lm = registry.lookup(d.model)
    if lm is not None and lm.source == registry.SOURCE_HUB:
        return f"draft LM {lm.name}: needs downloading before train: {lm.hub_id}"
    return f"draft LM: {d.model}"


def _local_shapes(path: str) -> registry.TargetInfo:
    if not (Path(path).expanduser() / "config.json").is_file():
        raise DraftkitError(f"draft.model={path!r} is neither a registered model ("
                            f"{', '.join(registry.names())}) nor a local HF dir with config.json")
    return registry.shapes_from_hf_config(Path(path).expanduser())


# ----------------------------------------------------------------------------- tokenizer check


def check_tokenizers(target_tok, draft_tok, target_vocab: int, draft_vocab: int,
                     draft_name: str = "the draft") -> None:
    """DraftkitError naming the first difference between the two tokenizers/vocabularies."""
    fix = ("draft-model speculation scores the draft's token ids with the target, so both need "
           "the same tokenizer: pick a draft of the target's family (draft.model) or use "
           "draft.init=truncate")
    if draft_vocab != target_vocab:
        raise DraftkitError(f"{draft_name} has vocab size {draft_vocab} (embedding rows) but the "
                            f"target has {target_vocab}; {fix}")
    if draft_tok is None:
        return
    if len(draft_tok) != len(target_tok):
        raise DraftkitError(f"{draft_name}'s tokenizer has {len(draft_tok)} tokens but the "
                            f"target's has {len(target_tok)}; {fix}")
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if a != b:
            raise DraftkitError(f"special tokens differ: {attr} is {b} in {draft_name} but {a} "
                                f"in the target; {fix}")
    specials_t, specials_d = set(target_tok.all_special_tokens), set(draft_tok.all_special_tokens)
    if specials_t != specials_d:
        only_t, only_d = sorted(specials_t - specials_d), sorted(specials_d - specials_t)
        raise DraftkitError(f"special tokens differ: only the target has {only_t[:5]}, only "
                            f"{draft_name} has {only_d[:5]}; {fix}")
    vt, vd = target_tok.get_vocab(), draft_tok.get_vocab()
    for token, tid in sorted(vt.items(), key=lambda kv: kv[1]):
        if vd.get(token) != tid:
            raise DraftkitError(f"token {token!r} maps to id {tid} in the target but to "
                                f"{vd.get(token)} in {draft_name}; {fix}")


# ----------------------------------------------------------------------------- building


def truncate(target_path: Path, num_layers: int):
    """A new *ForCausalLM: the target's first `num_layers` layers, final norm, embedding and
    lm_head, read in fp32 from the target's HF dir (exact, whatever dtype the target runs in)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(target_path)
    n_target = hf_config.num_hidden_layers
    if not 1 <= num_layers < n_target:
        raise DraftkitError(f"draft.num_layers={num_layers}: keep 1..{n_target - 1} of the "
                            f"target's {n_target} layers")
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the dropped layers are "unused weights" by design
    try:
        return AutoModelForCausalLM.from_pretrained(
            target_path, config=_with_layers(hf_config, num_layers), dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(level)


def _with_layers(hf_config, num_layers: int):
    cfg = copy.deepcopy(hf_config)
    cfg.num_hidden_layers = num_layers
    if isinstance(getattr(cfg, "layer_types", None), list):  # per-layer list (Qwen3)
        cfg.layer_types = cfg.layer_types[:num_layers]
    if getattr(cfg, "max_window_layers", None) is not None:
        cfg.max_window_layers = min(cfg.max_window_layers, num_layers)
    return cfg


def scratch(target_model, draft_cfg, seed: int):
    """Random weights in the target's architecture: `num_layers` layers, draft.* widths."""
    cfg = _with_layers(target_model.config, draft_cfg.num_layers)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim"):
        value = getattr(draft_cfg, key)
        if value:
            setattr(cfg, key, value)
    torch.manual_seed(seed)
    return type(target_model)(cfg)


def load_lm(path: Path):
    """(model fp32, tokenizer or None) from an HF dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    has_tok = (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()
    return model, (AutoTokenizer.from_pretrained(path) if has_tok else None)


def sibling_dir(name: str, revision: str = "main") -> Path:
    """The sibling's HF dir: a registry model (downloaded or cached) or a local dir."""
    if registry.lookup(name) is not None:
        return target_dir(name, revision)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise DraftkitError(f"draft.model={name!r} is not a local HF dir (no config.json)")
    return path


def warm_start_dir(init_from: str) -> Path:
    """train.init_from for a draft LM: a run dir (its train/best), a checkpoint or an export."""
    src = config.run_dir_of(init_from)
    if artifacts.RunPaths(src).config.is_file():
        src = artifacts.RunPaths(src).train / "best"
    if not (src / "config.json").is_file():
        raise DraftkitError(f"train.init_from={init_from}: {src} holds no draft LM (config.json "
                            "missing); name a draft-lm run dir, its train/best or its export")
    conf = json.loads((src / "config.json").read_text())
    if "speculators_model_type" in conf:
        raise DraftkitError(f"train.init_from={src} is an EAGLE-3 head, not a draft LM")
    return src


def build_lm(cfg, target):
    """The HF causal LM a draft-lm run trains, checked against the target's tokenizer."""
    d, name, tok = cfg.draft, None, None
    if cfg.train.init_from:
        src = warm_start_dir(cfg.train.init_from)
        lm, tok = load_lm(src)
        name = f"train.init_from={src}"
    elif d.init == "sibling":
        src = sibling_dir(d.model, cfg.target.revision)
        lm, tok = load_lm(src)
        name = f"draft LM {d.model}"
    elif d.init == "truncate":
        lm = truncate(target.path, d.num_layers)
    elif d.init == "scratch":
        lm = scratch(target.model, d, cfg.train.seed).float()
    else:
        raise ConfigError(f"draft.init={d.init!r}; choose one of {', '.join(INIT_MODES)} "
                          "(rerun `draftkit init` to fill it)")
    check_tokenizers(target.tokenizer, tok, cfg.target.vocab_size,
                     lm.get_input_embeddings().weight.shape[0], name or "the draft")
    return lm
