"""Small EAGLE-3 heads for tests: hand-built specs with random 'target' tensors (no target
model needed), and a tiny-llama run dir."""

from __future__ import annotations

import torch

from draftkit.drafts.eagle_family.format import DraftSpec
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.eagle_family.vocab import DraftVocab

V, VD, H = 64, 40, 32


def make_spec(family: str = "llama", flags: tuple = (False, False, False, False),
              vocab: int = V, draft_vocab: int = VD, rope_scaling: dict | None = None,
              num_layers: int = 1) -> DraftSpec:
    nbr, nbf, fcn, nout = flags
    return DraftSpec(
        family=family, hidden_size=H, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
        rope_scaling=rope_scaling, max_position_embeddings=256, target_vocab_size=vocab,
        draft_vocab_size=draft_vocab, target_hidden_size=H, aux_layer_ids=[1, 2, 4],
        norm_before_residual=nbr, norm_before_fc=nbf, fc_norm=fcn, norm_output=nout,
        num_speculative_tokens=3, verifier_name_or_path="", verifier_architecture="LlamaForCausalLM",
        num_layers=num_layers)


def make_model(spec: DraftSpec, ttt_steps: int = 3, seed: int = 0) -> Eagle3Draft:
    """A head with random weights, random target tensors and non-trivial norm weights."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 1000, (spec.target_vocab_size,), generator=g)
    vocab = DraftVocab.build(counts, spec.draft_vocab_size)
    torch.manual_seed(seed)
    model = Eagle3Draft(spec, vocab, ttt_steps=ttt_steps)
    embed = torch.randn(spec.target_vocab_size, H, generator=g)
    lm_head = torch.randn(spec.target_vocab_size, H, generator=g) * 0.3
    model.load_target_tensors(embed, 1 + 0.1 * torch.randn(H, generator=g), lm_head,
                              init_lm_head=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def make_batch(spec: DraftSpec, lengths: list[int], t: int, seed: int = 1) -> dict:
    """Right-padded random batch; loss_mask 1 everywhere valid except the first 2 tokens."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    attn = torch.zeros(b, t, dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    loss_mask = attn.clone()
    loss_mask[:, :2] = 0
    return {"aux": torch.randn(b, t, spec.num_aux * spec.target_hidden_size, generator=g),
            "last": torch.randn(b, t, spec.hidden_size, generator=g) * 3,
            "input_ids": torch.randint(0, spec.target_vocab_size, (b, t), generator=g) * attn,
            "loss_mask": loss_mask, "attention_mask": attn}
