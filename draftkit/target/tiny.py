"""Tiny in-process targets for tests and smoke runs: seeded random weights of a real
architecture plus a small BPE tokenizer trained on generated math text (no download)."""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core import artifacts, registry
from draftkit.core.registry import TargetInfo

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)




def build_tiny(info: TargetInfo) -> Path:
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


