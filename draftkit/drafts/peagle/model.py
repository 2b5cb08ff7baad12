"""P-EAGLE head: an EAGLE-3 head (drafts/eagle_family/model.py) whose ONE forward drafts all k tokens.

What vLLM 0.32 runs (v1/spec_decode/llm_base_proposer.py with `parallel_drafting`, the
`copy_and_expand_eagle_inputs` kernel, utils/cpu_triton_utils.py on the CPU): the target has
verified x_0..x_n and sampled x_{n+1}; the draft's KV cache holds, for every context position
p < n, the entry of (token x_{p+1}, fused target feature fuse(h_p), position p). One draft
forward then runs k query slots of the request:
    slot 0:     token x_{n+1},          hidden fuse(h_n),          position n     -> d_1
    slot j>0:   token mask_token_id,    hidden fuse(mask_hidden),  position n+j   -> d_{j+1}
causal over the context and the earlier slots, and samples all k slots. fuse(mask_hidden) is
the head's own fc (and input/fc norms) applied to the learned `mask_hidden` [A*Ht], computed
once when vLLM loads the draft; the mask token's embedding is the target's (shared, frozen).
Slot j's output never feeds another slot: hidden_out is unused.

Training (teacher-forced, from the EAGLE-3 harvest: aux + last) unrolls the same thing over a
whole sequence, every index t an anchor n=t, with EAGLE-3's TTT key layout and mask
(layer.ttt_mask, TTTAttention): step 0 is EAGLE-3's step 0; step j>0 at index t is slot j of anchor t, whose
query sees K^0[0..t] (the real context and slot 0) and K^1..K^j at t (its own earlier slots).
Worked example, T=6, k=3, index t=1 (anchor n=1):
    step 0: token x_2,  hidden fuse(h_1),         position 1 -> predicts x_3, target last[2]
    step 1: token MASK, hidden fuse(mask_hidden), position 2 -> predicts x_4, target last[3]
    step 2: token MASK, hidden fuse(mask_hidden), position 3 -> predicts x_5, target last[4]
The loss, metrics and simulated AL are EAGLE-3's (Eagle3Draft.forward over these states).
Departure from the P-EAGLE paper: no separate position-wise loss weighting beyond
train.ttt_decay; the mask token is a fixed id of the target vocab (`mask_token_for`), not a
new token, so vLLM shares the target's embedding as for EAGLE-3.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from draftkit.core import artifacts
from draftkit.core.config import TrainConfig
from draftkit.core.errors import DraftkitError
from draftkit.drafts import acceptance
from draftkit.drafts.eagle_family import format as eagle3_fmt
from draftkit.drafts.eagle_family.format import DraftSpec
from draftkit.drafts.eagle_family.layer import TTTAttention
from draftkit.drafts.eagle_family.model import CONFIG_FILE, WEIGHTS_FILE, Eagle3Draft
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.drafts.peagle import format as fmt


def mask_token_for(tokenizer) -> int:
    """The parallel slots' token id: the tokenizer's pad token, else its eos, else 0. Any id
    works (mask_hidden is what the head learns); a fixed rule keeps runs comparable."""
    for attr in ("pad_token_id", "eos_token_id"):
        tid = getattr(tokenizer, attr, None)
        if isinstance(tid, list):
            tid = tid[0] if tid else None
        if tid is not None:
            return int(tid)
    return 0


_TRAIN_DEFAULTS = TrainConfig()  # the head's defaults when built outside a run config


class PEagleDraft(Eagle3Draft):
    def __init__(self, spec: DraftSpec, vocab: DraftVocab,
                 ttt_steps: int = _TRAIN_DEFAULTS.ttt_steps,
                 ttt_decay: float = _TRAIN_DEFAULTS.ttt_decay, init_std: float = 0.02,
                 mask_token_id: int | None = None):
        super().__init__(spec, vocab, ttt_steps, ttt_decay, init_std)
        self.mask_token_id = mask_token_id  # None until build sets it (mask_token_for)
        width = spec.num_aux * spec.target_hidden_size
        self.mask_hidden = nn.Parameter(torch.randn(width) * init_std)  # [A*Ht]

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_pretrained(cls, directory: str | Path, target_model=None,
                        ttt_steps: int = _TRAIN_DEFAULTS.ttt_steps,
                        ttt_decay: float = _TRAIN_DEFAULTS.ttt_decay) -> PEagleDraft:
        """A P-EAGLE dir, or an EAGLE-3 head to warm-start from (its layer, fc, norm and
        lm_head; mask_hidden starts random, mask_token_id None until the caller sets it)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
            raise DraftkitError(f"{directory} is not a P-EAGLE or EAGLE-3 checkpoint (needs "
                                f"{CONFIG_FILE} and {WEIGHTS_FILE})")
        spec, mask_token_id = fmt.from_config(artifacts.read_json(directory / CONFIG_FILE))
        tensors = load_file(str(directory / WEIGHTS_FILE))
        if mask_token_id is None:  # an EAGLE-3 head

            eagle3_fmt.check_state_dict(spec, tensors)
        else:
            fmt.check_state_dict(spec, tensors, mask_token_id)
        mask = tensors.pop(fmt.MASK_HIDDEN, None)
        model = cls.from_state(spec, tensors, target_model, ttt_steps, ttt_decay)
        if mask is not None:
            model.mask_hidden.data.copy_(mask.reshape(-1))
            model.mask_token_id = mask_token_id
        return model

    # ----------------------------------------------------------------- the parallel slots

    def mask_inputs(self, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(embedding of the mask token, fuse(mask_hidden)), each broadcast to [b, t, H]."""
        if self.mask_token_id is None:
            raise DraftkitError("the P-EAGLE head has no mask_token_id; set it (mask_token_for "
                                "the target's tokenizer) before training or drafting")
        embed = self.embed_tokens.weight[self.mask_token_id]  # [H]
        hidden = self.fuse(self.mask_hidden.view(1, 1, -1))  # [1, 1, H]
        return embed.view(1, 1, -1).expand(b, t, -1), hidden.expand(b, t, -1)

    def ttt_states(self, aux: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """The normed lm_head inputs of the k parallel slots at every anchor: ttt_steps x
        [B, T, H]; step j at index t drafts x_{t+2+j} (module docstring)."""
        valid = attention_mask.bool()  # [B, T]
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)  # [B, T]
        b, t = input_ids.shape
        attention = TTTAttention(valid, self.ttt_steps)  # the keys each step's queries see
        mask_embed, mask_hidden = self.mask_inputs(b, t)  # [B, T, H] each
        keys = [[] for _ in self.layers]  # per layer: the K of steps 0..j
        values = [[] for _ in self.layers]
        states = []
        for j in range(self.ttt_steps):
            if j == 0:  # token x_{t+1} beside fuse(h_t): EAGLE-3's step 0
                embeds, prenorm = self.embed_tokens(acceptance.shift(input_ids, 1)), self.fuse(aux)
            else:  # slot j: nothing of the draft's own earlier outputs
                embeds, prenorm = mask_embed, mask_hidden
            cos, sin = self.rotary(positions + j, prenorm.dtype)  # position t+j
            prenorm = self.ttt_layers(embeds, prenorm, cos, sin, keys, values, attention, j)
            states.append(self.norm(prenorm))
        return states

    # ----------------------------------------------------------------- save

    def save_pretrained(self, directory: str | Path, include_embed: bool = False) -> Path:
        """Write speculators P-EAGLE config.json + model.safetensors (atomic files); the
        tensors are EAGLE-3's (export_state_dict) plus the parameter mask_hidden [A*Ht]."""
        from safetensors.torch import save

        directory = Path(directory)
        tensors = self.export_state_dict(include_embed)
        fmt.check_state_dict(self.spec, tensors, self.mask_token_id)
        directory.mkdir(parents=True, exist_ok=True)
        artifacts.write_bytes_atomic(directory / WEIGHTS_FILE,
                                     save(tensors, metadata={"format": "pt"}))
        artifacts.write_json_atomic(directory / CONFIG_FILE,
                                    fmt.to_config(self.spec, self.mask_token_id))
        return directory
