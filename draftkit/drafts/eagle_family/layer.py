"""The EAGLE-3 decoder layers, written in pieces so training (TTT) and inference share them.

Layer 0 is vLLM's `Eagle3LlamaForCausalLM` / `Eagle3Qwen3ForCausalLM` layer 0, op for op:
    e = input_layernorm(embed(token));  h_n = hidden_norm(h)
    residual = h_n if norm_before_residual else h          (vLLM's _residual_norm)
    q, k, v = proj(cat[e, h_n])   # q/k/v take 2H inputs; qwen3 adds per-head q_norm/k_norm
    r = attn(q, k, v) + residual;  prenorm = mlp(post_attention_layernorm(r)) + r
Layers 1.. (vLLM's `layer_idx > 0`, `draft.num_layers` > 1) are plain decoder layers over the
previous layer's pre-norm output x: q, k, v = proj(input_layernorm(x)) with H inputs, residual
= x (vLLM's fused add-norm); their hidden_norm exists, as in vLLM, and is unused.
`begin` returns (q, k, v, residual) so a caller can attend over keys of several TTT steps;
`attend` runs SDPA with an explicit boolean mask (`TTTAttention`: flex attention without a
dense mask on CUDA); `end` adds the residual and the MLP.
RoPE is built by transformers' own init functions (default, llama3, yarn...) from the same
`rope_parameters` the export writes, and is applied in float32 (no bf16 inv_freq drift).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from draftkit.drafts.eagle_family.format import DraftSpec, rope_parameters


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM/HF RMSNorm: normalise in float32, cast back, scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return x32.to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Rotary:
    """cos/sin for positions, from transformers' RoPE init functions (plain attribute: a
    module buffer would be cast to bf16 by `.to(dtype)`)."""

    def __init__(self, spec: DraftSpec):
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        params = rope_parameters(spec)
        cfg = LlamaConfig(hidden_size=spec.num_attention_heads * spec.head_dim,
                          num_attention_heads=spec.num_attention_heads, head_dim=spec.head_dim,
                          max_position_embeddings=spec.max_position_embeddings,
                          rope_parameters=dict(params))
        if params["rope_type"] == "default":
            inv_freq, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
        else:
            inv_freq, scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg)
        self.inv_freq = inv_freq.to(torch.float32)  # [hd/2]
        self.scale = float(scale)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # [B, T, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, hd]
        return (emb.cos() * self.scale).to(dtype), (emb.sin() * self.scale).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation (vLLM llama/qwen3, HF rotate_half). x [B, nH, T, hd], cos [B, T, hd]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, hd]
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, spec: DraftSpec, in_features: int):
        super().__init__()
        h, hd = spec.hidden_size, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_attention_heads, spec.num_key_value_heads, hd)
        self.q_proj = nn.Linear(in_features, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(in_features, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(in_features, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=False)
        self.qk_norm = spec.family == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
            self.k_norm = RMSNorm(hd, spec.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, 2H] (layer 0) or [B, T, H] -> q [B, nH, T, hd], k and v [B, nKV, T, hd] (RoPE applied)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:  # qwen3: per-head RMSNorm before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """q [B, nH, T, hd], k/v [B, nKV, S, hd], mask [B|1, 1, T, S] bool -> [B, T, H]."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        return self.output(out)

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The heads' outputs [B, nH, T, hd] -> o_proj of them concatenated [B, T, H]."""
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, spec: DraftSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """`layers.{index}` of the checkpoint: self_attn, mlp, input_layernorm, hidden_norm,
    post_attention_layernorm."""

    def __init__(self, spec: DraftSpec, index: int = 0):
        super().__init__()
        eps = spec.rms_norm_eps
        self.index = index
        self.self_attn = Attention(spec, (2 if index == 0 else 1) * spec.hidden_size)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, eps)
        self.hidden_norm = RMSNorm(spec.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps)
        self.norm_before_residual = spec.norm_before_residual

    def begin(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor):
        """embeds, hidden [B, T, H] -> (q, k, v, residual [B, T, H]). Layers > 0 ignore
        `embeds`; their `hidden` is the previous layer's pre-norm output."""
        if self.index > 0:
            return (*self.self_attn.project(self.input_layernorm(hidden), cos, sin), hidden)
        e = self.input_layernorm(embeds)  # [B, T, H]
        h = self.hidden_norm(hidden)  # [B, T, H]
        residual = h if self.norm_before_residual else hidden
        q, k, v = self.self_attn.project(torch.cat([e, h], dim=-1), cos, sin)  # x: [B, T, 2H]
        return q, k, v, residual

    def end(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """-> pre-norm output (mlp + residual) [B, T, H]."""
        r = attn_out + residual
        return self.mlp(self.post_attention_layernorm(r)) + r


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """[1, 1, S, S] bool, True = may attend (key index <= query index)."""
    idx = torch.arange(length, device=device)
    return (idx[None, :] <= idx[:, None])[None, None]


def ttt_mask(valid: torch.Tensor, steps: int) -> torch.Tensor:
    """Attention mask of all TTT steps over the concatenated keys [K^0 | K^1 | ... ].

    valid [B, T] bool (False = padding) -> [B, 1, T, steps*T] bool; step j uses the first
    (j+1)*T columns. Query t of step j sees the step-0 keys of its own sequence at indices
    <= t, plus the step-i key at index t for i = 1..j (its own earlier drafts), exactly what
    vLLM's KV cache holds when it drafts token j+1. Worked example, T=5, j=2, query t=2:
        K^0: [1 1 1 0 0]   K^1: [0 0 1 0 0]   K^2: [0 0 1 0 0]
    i.e. K0[0..2], K1[2], K2[2]. The step-0 diagonal is always on so a padded query row still
    has one key (no NaN); padded rows never enter the loss.
    """
    b, t = valid.shape
    idx = torch.arange(t, device=valid.device)
    causal = idx[None, :] <= idx[:, None]  # [T, T] (query, key)
    diag = idx[None, :] == idx[:, None]  # [T, T]
    block0 = (causal[None] & valid[:, None, :]) | diag[None]  # [B, T, T]
    blocks = [block0] + [diag[None].expand(b, t, t)] * (steps - 1)
    return torch.cat(blocks, dim=-1)[:, None]  # [B, 1, T, steps*T]


class TTTAttention:
    """The attention of TTT step j over the keys of steps 0..j, under `ttt_mask`'s structure.

    On CUDA (or with flex=True): flex attention, the structure given as a BlockMask built block
    by block from the rule (step-0 keys at indices <= t of the same sequence, plus the key at t
    of every step), with no dense [B, 1, T, steps*T] mask, compiled on CUDA (fused kernels
    that skip the empty blocks). On the CPU: SDPA under the dense boolean mask, the measured
    path (flex attention has no CPU backward). Both give the same attention (tests compare
    them)."""

    def __init__(self, valid: torch.Tensor, steps: int, flex: bool | None = None):
        self.valid, self.steps = valid, steps  # [B, T] bool
        self.flex = valid.is_cuda if flex is None else flex
        self.dense = None if self.flex else ttt_mask(valid, steps)  # [B, 1, T, steps*T]
        self.blocks: dict[int, object] = {}  # step j -> its BlockMask

    def __call__(self, attn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 j: int) -> torch.Tensor:
        """Step j: q [B, nH, T, hd], k/v [B, nKV, (j+1)T, hd] -> [B, T, H]."""
        t = self.valid.shape[1]
        if not self.flex:
            return attn.attend(q, k, v, self.dense[..., : (j + 1) * t])
        if j not in self.blocks:
            self.blocks[j] = ttt_block_mask(self.valid, j + 1)
        out = _flex_attention(q.is_cuda)(q, k, v, block_mask=self.blocks[j],
                                         enable_gqa=attn.num_heads != attn.num_kv_heads)
        return attn.output(out)


def ttt_block_mask(valid: torch.Tensor, steps: int):
    """`ttt_mask`'s structure as flex attention's BlockMask over steps*T keys: query t sees
    key index kv (step kv // T, index kv % T) if kv % T == t, or if kv is a step-0 key at an
    index <= t of its sequence."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, t = valid.shape

    def rule(bi, _h, qi, kv):
        k = kv % t
        return (k == qi) | ((kv < t) & (k <= qi) & valid[bi, k])

    return create_block_mask(rule, b, None, t, steps * t, device=valid.device)


@functools.cache
def _flex_attention(compiled: bool):
    """flex_attention, compiled for CUDA (eager it runs a reference implementation)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True) if compiled else flex_attention
