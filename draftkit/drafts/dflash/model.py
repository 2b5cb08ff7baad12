"""DFlash draft: a Qwen3-style stack that drafts a whole block of k tokens in ONE forward,
bidirectional inside the block, conditioned on the target's tap features (block diffusion in
one denoising step, as vLLM 0.32 serves it).

What vLLM runs (v1/spec_decode/dflash.py, models/qwen3_dflash.py, the CPU path in
utils/cpu_triton_utils.py): the target verified x_0..x_n and sampled x_{n+1}; its tap features
h_0..h_n (aux ids, vLLM convention) give the context states c_p = fc(h_p). For every draft
layer l the context keys/values are K_l = rope(k_norm_l(W_k,l hidden_norm(c_p)), p),
V_l = W_v,l hidden_norm(c_p): the same normed context for every layer, no input_layernorm.
The query block is k+1 tokens [x_{n+1}, MASK, ..., MASK] at positions n+1..n+1+k, embedded with
the target's embedding (the mask token's by the learned `mask_embedding`), through plain
pre-norm decoder layers whose attention sees all context keys and ALL keys of its own block
(non-causal). Slot j >= 1 is normed and read by lm_head: it drafts x_{n+1+j}.

Training (the masked-block objective) runs every index t of a sequence as an anchor n = t in
one pass: T blocks of k+1 query slots, each block attending to the context keys p <= t (valid
ones) and to its own slots only. In the shared index convention of the kinds (drafts/kind.py
step_logits), step j = slot j+1 at index t drafts x_{t+2+j}, the verifier's distribution for
it coming from last[t+1+j]: the same targets, masks, loss (KL to the verifier over the draft
vocab, weight ttt_decay**j), metrics and simulated AL as EAGLE-3 (the EAGLE family's
FamilyDraft, drafts/eagle_family/model.py, and losses.py).
Worked example, k=3, index t=1: block [x_2, M, M, M] at positions 2..5 over c_0, c_1;
slot 1 predicts x_3 (verifier last[2]), slot 2 x_4 (last[3]), slot 3 x_5 (last[4]).
Departures from the DFlash paper: blocks at every anchor (not a random sample of them), the
EAGLE-3 KL loss with position decay instead of cross-entropy to the data, a reduced draft vocab
with its own lm_head (d2t) instead of the target's head, and the mask token an existing id with
a learned embedding (the target vocab has no spare id).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save
from torch import nn

from draftkit.core import artifacts
from draftkit.core.config import TrainConfig
from draftkit.core.errors import DraftkitError
from draftkit.drafts import acceptance
from draftkit.drafts.dflash import format as fmt
from draftkit.drafts.eagle_family.layer import MLP, Attention, RMSNorm, apply_rope
from draftkit.drafts.eagle_family.model import FamilyDraft
from draftkit.drafts.eagle_family.target_tensors import module_tensors, read_target_tensors
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.targets.load import target_dir

_TRAIN = TrainConfig()


class DFlashLayer(nn.Module):
    """`layers.{i}`: self_attn (q/k/v/o, q_norm, k_norm), mlp, input/post-attention norms."""

    def __init__(self, spec: fmt.DFlashSpec):
        super().__init__()
        self.self_attn = Attention(spec, spec.hidden_size)  # qwen3: per-head q/k norms
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Normed context states [B, C, H] -> K, V [B, nKV, C, hd] (k_norm, RoPE on K)."""
        a = self.self_attn
        b, c, _ = ctx.shape
        k = a.k_norm(a.k_proj(ctx).view(b, c, a.num_kv_heads, a.head_dim)).transpose(1, 2)
        v = a.v_proj(ctx).view(b, c, a.num_kv_heads, a.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx_k: torch.Tensor, ctx_v: torch.Tensor, ctx_mask: torch.Tensor) -> torch.Tensor:
        """x [B, N, S, H] (N blocks of S slots), cos/sin [B, N*S, hd], context K/V
        [B, nKV, C, hd], ctx_mask [B, N, C] bool -> [B, N, S, H]."""
        b, n, s, h = x.shape
        a = self.self_attn
        q, k, v = a.project(self.input_layernorm(x).reshape(b, n * s, h), cos, sin)
        # grouped heads (GQA): query head g*rep + r reads kv head g, as repeat_interleave would
        g, rep = a.num_kv_heads, a.num_heads // a.num_kv_heads
        q = q.unflatten(1, (g, rep)).unflatten(3, (n, s))  # [B, G, R, N, S, hd]
        k, v = (z.unflatten(2, (n, s)) for z in (k, v))  # [B, G, N, S, hd]
        q = q * a.head_dim ** -0.5
        s_ctx = torch.einsum("bgrnsd,bgcd->bgrnsc", q, ctx_k)  # [B, G, R, N, S, C]
        s_ctx = s_ctx.masked_fill(~ctx_mask[:, None, None, :, None, :], float("-inf"))
        s_blk = torch.einsum("bgrnsd,bgnud->bgrnsu", q, k)  # [B, G, R, N, S, S]
        p = torch.softmax(torch.cat([s_ctx, s_blk], -1).float(), -1).to(q.dtype)
        c = ctx_k.shape[2]
        out = torch.einsum("bgrnsc,bgcd->bgrnsd", p[..., :c], ctx_v) + \
            torch.einsum("bgrnsu,bgnud->bgrnsd", p[..., c:], v)  # [B, G, R, N, S, hd]
        out = out.permute(0, 3, 4, 1, 2, 5).reshape(b, n, s, a.num_heads * a.head_dim)
        r = a.o_proj(out) + x
        return self.mlp(self.post_attention_layernorm(r)) + r


class DFlashDraft(FamilyDraft):
    LOAD_HINT = "build the draft with drafts/dflash/build.py or DFlashDraft.from_pretrained"

    def __init__(self, spec: fmt.DFlashSpec, vocab: DraftVocab, ttt_decay: float = _TRAIN.ttt_decay,
                 init_std: float = 0.02):
        super().__init__(spec, vocab, ttt_decay)
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.embed_tokens = nn.Embedding(spec.target_vocab_size, h).requires_grad_(False)
        self.mask_embedding = nn.Parameter(torch.zeros(h))
        self.fc = nn.Linear(spec.num_aux * spec.target_hidden_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.layers = nn.ModuleList([DFlashLayer(spec) for _ in range(spec.num_layers)])
        self.add_output(vocab, init_std)

    @property
    def num_slots(self) -> int:
        return self.spec.num_speculative_tokens

    # ----------------------------------------------------------------- target tensors

    @torch.no_grad()
    def load_target_tensors(self, embed: torch.Tensor, norm: torch.Tensor,
                            lm_head: torch.Tensor, init_lm_head: bool) -> None:
        """The target's embedding [V, H], final norm [H] and lm_head [V, H] (frozen copies);
        with `init_lm_head` the draft's lm_head starts as the target's draft-vocab rows, its
        norm as the target's final norm and the mask embedding as the mask token's row."""
        super().load_target_tensors(embed, norm, lm_head, init_lm_head, init_norm=init_lm_head)
        if init_lm_head:
            self.mask_embedding.data.copy_(embed[self.spec.mask_token_id])

    # ----------------------------------------------------------------- the block pass

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings, the mask token's replaced by `mask_embedding` (vLLM's rule)."""
        e = self.embed_tokens(ids)
        return torch.where((ids == self.spec.mask_token_id)[..., None],
                           self.mask_embedding.to(e.dtype), e)

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """Tap features [B, C, A*Ht] -> the normed context states [B, C, H]."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def blocks(self, aux: torch.Tensor, ctx_pos: torch.Tensor, ctx_mask: torch.Tensor,
               first: torch.Tensor, first_pos: torch.Tensor) -> torch.Tensor:
        """The normed outputs of N query blocks over one context.

        aux [B, C, A*Ht] and ctx_pos [B, C]: the context; ctx_mask [B, N, C] bool: the context
        keys block n sees; first [B, N]: each block's first token (the newest verified one),
        first_pos [B, N] its position. -> [B, N, k+1, H] (slot 0 included, unused for drafts).
        """
        return self.run_blocks(self.context_kv(aux, ctx_pos), ctx_mask, first, first_pos)

    def context_kv(self, aux: torch.Tensor, ctx_pos: torch.Tensor) -> list[tuple]:
        """Each layer's context keys and values [B, nKV, C, hd] from tap features [B, C, A*Ht]
        at positions ctx_pos [B, C]: what vLLM writes into the draft's KV cache."""
        ctx = self.context(aux)  # [B, C, H]
        cos, sin = self.rotary(ctx_pos, ctx.dtype)
        return [layer.context_kv(ctx, cos, sin) for layer in self.layers]

    def run_blocks(self, kv: list[tuple], ctx_mask: torch.Tensor, first: torch.Tensor,
                   first_pos: torch.Tensor) -> torch.Tensor:
        """The query blocks over given context keys/values (`blocks`' second half)."""
        b, n = first.shape
        s = self.num_slots + 1
        ids = torch.cat([first[..., None], first.new_full((b, n, s - 1), self.spec.mask_token_id)],
                        -1)  # [B, N, S]
        dtype = self.fc.weight.dtype
        x = self.embed(ids).to(dtype)  # [B, N, S, H]
        qpos = (first_pos[..., None] + torch.arange(s, device=first.device)).reshape(b, n * s)
        qcos, qsin = self.rotary(qpos, dtype)
        for layer, (ck, cv) in zip(self.layers, kv, strict=True):
            x = layer(x, qcos, qsin, ck, cv, ctx_mask)
        return self.norm(x)

    def draft_logits(self, aux: torch.Tensor, first: int) -> torch.Tensor:
        """One block after a verified prefix (the reference drafter, vLLM's one forward):
        aux [C, A*Ht] = taps of x_0..x_{C-1}, `first` = x_C -> draft-vocab logits [k, Vd]."""
        c = aux.shape[0]
        device = self.fc.weight.device
        out = self.blocks(aux[None], torch.arange(c, device=device)[None],
                          torch.ones(1, 1, c, dtype=torch.bool, device=device),
                          torch.tensor([[first]], device=device),
                          torch.tensor([[c]], device=device))  # [1, 1, S, H]
        return self.lm_head(out[0, 0, 1:])  # [k, Vd]

    def block_states(self, aux: torch.Tensor, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """Every index t as an anchor: k x [B, T, H], step j at t drafts x_{t+2+j}."""
        valid = attention_mask.bool()  # [B, T]
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)  # [B, T]
        t = input_ids.shape[1]
        idx = torch.arange(t, device=valid.device)
        see = (idx[None, :] <= idx[:, None])[None] & valid[:, None, :]  # [B, N=T, C=T]
        see = see | torch.eye(t, dtype=torch.bool, device=valid.device)[None]  # no empty row
        out = self.blocks(aux, positions, see, acceptance.shift(input_ids, 1), positions + 1)
        return [out[:, :, j] for j in range(1, out.shape[2])]

    # ----------------------------------------------------------------- training

    def train_states(self, batch: dict, valid: torch.Tensor) -> list[torch.Tensor]:
        """The masked-block states of a training batch (block_states; module docstring)."""
        return self.block_states(batch["aux"], batch["input_ids"], valid)

    # ----------------------------------------------------------------- save and load

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """vLLM's tensors (format.py): no embedding, verifier or mask embedding (its own
        file); d2t/t2d only for a reduced vocab."""
        skip = {"embed_tokens.weight", "verifier_norm", "verifier_lm_head", "mask_embedding"}
        full = self.spec.draft_vocab_size == self.spec.target_vocab_size
        return {n: t.detach().cpu().contiguous() for n, t in self.state_dict().items()
                if n not in skip and not (full and n in ("d2t", "t2d"))}

    def save_pretrained(self, directory: str | Path) -> Path:
        """config.json, model.safetensors and mask_embedding.pt (each written atomically)."""
        directory = Path(directory)
        tensors = self.export_state_dict()
        fmt.check_state_dict(self.spec, tensors)
        directory.mkdir(parents=True, exist_ok=True)
        artifacts.write_bytes_atomic(directory / fmt.WEIGHTS_FILE,
                                     save(tensors, metadata={"format": "pt"}))
        fmt.write_mask_embedding(directory / fmt.MASK_FILE, self.spec.mask_token_id,
                                 self.mask_embedding)
        artifacts.write_json_atomic(directory / fmt.CONFIG_FILE, fmt.to_config(self.spec))
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, target_model=None,
                        ttt_decay: float = _TRAIN.ttt_decay) -> DFlashDraft:
        """A DFlash dir (format.py); the embedding and verifier parts from `target_model`, or
        from the target the config names."""
        directory = Path(directory)
        if not (directory / fmt.CONFIG_FILE).is_file() or \
                not (directory / fmt.WEIGHTS_FILE).is_file():
            raise DraftkitError(f"{directory} is not a DFlash draft (needs {fmt.CONFIG_FILE} "
                                f"and {fmt.WEIGHTS_FILE})")
        spec = fmt.from_config(artifacts.read_json(directory / fmt.CONFIG_FILE))
        tensors = load_file(str(directory / fmt.WEIGHTS_FILE))
        fmt.check_state_dict(spec, tensors)
        mask = fmt.read_mask_embedding(directory / fmt.MASK_FILE, spec.mask_token_id)
        vocab = DraftVocab.from_d2t(tensors.pop("d2t"), spec.target_vocab_size) \
            if "d2t" in tensors else DraftVocab.full(spec.target_vocab_size)
        tensors.pop("t2d", None)
        model = cls(spec, vocab, ttt_decay)
        target = module_tensors(target_model) if target_model is not None \
            else read_target_tensors(_target_dir(spec))
        model.load_target_tensors(*target, init_lm_head=False)
        model.load_state_dict(tensors, strict=False)
        model.mask_embedding.data.copy_(mask)
        return model


def _target_dir(spec: fmt.DFlashSpec) -> Path:
    name = spec.target_name or spec.verifier_name_or_path
    if not name:
        raise DraftkitError("the DFlash config names no target; pass target_model=")
    return target_dir(name)
