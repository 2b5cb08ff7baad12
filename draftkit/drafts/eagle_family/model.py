"""EAGLE-3 draft head: decoder layer(s) over [token embedding, fused target features]; and
`FamilyDraft`, what it shares with P-EAGLE's head and the DFlash draft (output side, verifier
parts, loss).

One layer by default, as EAGLE-3; `draft.num_layers` > 1 stacks plain decoder layers on it
(vLLM's multi-layer Eagle3 drafts, layer.py). Parameter names are the speculators/vLLM
checkpoint names (`fc`, `layers.{i}.*`, `norm`,
`lm_head`, `d2t`, `t2d`, optional `input_norm`/`fc_norm.{i}`), so `save_pretrained` writes
what vLLM loads with no renaming. `embed_tokens` is a frozen copy of the target's embedding
(not exported: vLLM shares the target's). `verifier_norm` and `verifier_lm_head` are frozen
copies of the target's final norm and FULL lm_head (the acc metric needs the full-vocab
argmax), used only for the loss and never exported.

Alignment (vLLM's proposer, v1/spec_decode): the target ran over x_0..x_n, giving aux features
h_0..h_n, and sampled x_{n+1}. Draft input at index t is token x_{t+1} with feature fuse(h_t)
at position t; its output predicts x_{t+2}. Draft step j>0 appends (draft token, own
hidden_out) at position n+j. Training-time test (TTT) unrolls the same thing over a whole
sequence; with T=6 and ttt_steps=3, index t=1:
    step 0: token x_2, hidden fuse(h_1),            position 1 -> predicts x_3, target last[2]
    step 1: token x_3, hidden step-0 hidden_out[1], position 2 -> predicts x_4, target last[3]
    step 2: token x_4, hidden step-1 hidden_out[1], position 3 -> predicts x_5, target last[4]
Departures from the paper/speculators: teacher-forced tokens at steps j>0 (as speculators);
accuracy is measured against the verifier's full-vocab argmax; positions count only when the
predicted token is an assistant token (loss_mask of the predicted token; train.loss_on=all sets
it on every token for training, data.py). draft.init_layer_from starts the layer from a target
layer (init_layer.py).
"""

from __future__ import annotations

import abc
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from draftkit.core import artifacts, registry
from draftkit.core.batching import pad_rows
from draftkit.core.config import TrainConfig
from draftkit.core.errors import DraftkitError
from draftkit.drafts import acceptance, fused_loss
from draftkit.drafts.divergence import KL
from draftkit.drafts.eagle_family import format as fmt
from draftkit.drafts.eagle_family import init_layer, losses
from draftkit.drafts.eagle_family.format import DraftSpec
from draftkit.drafts.eagle_family.layer import (
    MLP,
    Eagle3Layer,
    RMSNorm,
    Rotary,
    TTTAttention,
    causal_mask,
    rms_norm,
)
from draftkit.drafts.eagle_family.target_tensors import module_tensors, read_target_tensors
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.targets.load import run_target_dir, target_dir

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_TRAIN_DEFAULTS = TrainConfig()
# matmuls over the positions a mask picks run on row counts rounded up to this: on CPU each new
# shape of a bf16 matmul costs ~10-25 MiB of oneDNN caches (scripts/bench_stream.py)
ROW_MULTIPLE = 64


class FamilyDraft(nn.Module, abc.ABC):
    """What every EAGLE-family draft model (Eagle3Draft, PEagleDraft, drafts/dflash's
    DFlashDraft) shares around its own input side and layers: the output side (`norm`, `lm_head`
    over the draft vocab, `d2t`/`t2d`), the frozen copies of the target's embedding, final norm
    and FULL lm_head (`load_target_tensors`), the verifier's targets they give, and the loss
    over the per-step states a subclass's `train_states` returns (losses.py)."""

    # how to get a draft whose verifier parts are loaded (verifier_targets' error)
    LOAD_HINT = "build the model with Eagle3Draft.from_run_config or from_pretrained"
    # frozen copies of the target's tensors: training holds them in its compute dtype
    FROZEN_TARGET_PARTS = ("embed_tokens.weight", "verifier_norm", "verifier_lm_head")

    def __init__(self, spec, vocab: DraftVocab, ttt_decay: float):
        super().__init__()
        if vocab.draft_size != spec.draft_vocab_size or vocab.target_size != spec.target_vocab_size:
            raise DraftkitError(f"draft vocab {vocab.draft_size}/{vocab.target_size} does not "
                                f"match the spec {spec.draft_vocab_size}/{spec.target_vocab_size}")
        self.spec, self.ttt_decay = spec, ttt_decay
        self.divergence = KL  # train.loss: the train stage and refresh set the run's

    def add_output(self, vocab: DraftVocab, init_std: float) -> None:
        """The output side, the (empty) verifier parts and RoPE, after the subclass's layers;
        then every linear weight starts N(0, init_std^2)."""
        h = self.spec.hidden_size
        self.norm = RMSNorm(h, self.spec.rms_norm_eps)
        self.lm_head = nn.Linear(h, self.spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", vocab.d2t.clone())
        self.register_buffer("t2d", vocab.t2d.clone())
        # Frozen parameters rather than buffers: DDP would re-broadcast a [V, H] buffer every step.
        self.verifier_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.verifier_lm_head = nn.Parameter(torch.empty(0, h), requires_grad=False)
        self.rotary = Rotary(self.spec)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=init_std)

    @torch.no_grad()
    def load_target_tensors(self, embed: torch.Tensor, norm: torch.Tensor,
                            lm_head: torch.Tensor, init_lm_head: bool,
                            init_norm: bool = False) -> None:
        """Copy the target's embedding [V, H], final norm [H] and lm_head [V, H]; with
        `init_lm_head` the head's lm_head starts as the target's rows of the draft vocab, with
        `init_norm` the head's norm as the target's final norm."""
        shape = (self.spec.target_vocab_size, self.spec.hidden_size)
        if tuple(embed.shape) != shape or tuple(lm_head.shape) != shape:
            raise DraftkitError(f"target embedding/lm_head {tuple(embed.shape)}/"
                                f"{tuple(lm_head.shape)} do not match the draft's {shape}: the "
                                "draft belongs to another target")
        like = {"dtype": self.embed_tokens.weight.dtype, "device": self.embed_tokens.weight.device}
        self.embed_tokens.weight.data.copy_(embed)
        self.verifier_norm = nn.Parameter(norm.detach().to(**like).clone(), requires_grad=False)
        self.verifier_lm_head = nn.Parameter(lm_head.detach().to(**like).clone(),
                                             requires_grad=False)
        if init_lm_head:
            self.lm_head.weight.data.copy_(lm_head[self.t2d.to(lm_head.device)])
        if init_norm:
            self.norm.weight.data.copy_(norm)

    def compile_parts(self) -> list[nn.Module]:
        """What train.compile compiles: the norms and MLPs (elementwise chains that fuse)."""
        return [m for m in self.modules() if isinstance(m, (RMSNorm, MLP))]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids]

    def target_logits(self, logits_d: torch.Tensor) -> torch.Tensor:
        """[..., Vd] -> [..., V], -inf outside the draft vocab (vLLM's compute_logits)."""
        out = logits_d.new_full((*logits_d.shape[:-1], self.spec.target_vocab_size),
                                float("-inf"))
        out[..., self.draft_to_target(torch.arange(logits_d.shape[-1], device=out.device))] = \
            logits_d
        return out

    # ----------------------------------------------------------------- training

    @torch.no_grad()
    def verifier_rows(self, last: torch.Tensor, where: torch.Tensor, full_vocab: bool = True,
                      chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier at the positions `where` [B, T] bool picks (M of them, row-major):
        last [B, T, H] (target pre-norm) -> (logits on the draft vocab [M, Vd] in the matmul's
        dtype, argmax over the full vocab [M] as target ids); chunked over tokens."""
        if self.verifier_lm_head.numel() == 0:
            raise DraftkitError(f"the verifier lm_head is not loaded; {self.LOAD_HINT}")
        # The loss needs only the draft-vocab rows; the full-vocab argmax behind the acc metrics
        # costs 4-12x more. forward() asks for it in eval mode only, so train-step acc_j is vs
        # the draft-vocab argmax (logged approximation; eval/best-checkpoint metrics are exact).
        draft_only = not full_vocab
        head = self.verifier_lm_head[self.t2d] if draft_only else self.verifier_lm_head
        to_target = self.draft_to_target(torch.arange(self.spec.draft_vocab_size,
                                                      device=last.device))  # [Vd]
        logits_d, ids = [], []
        for piece in last[where].split(chunk):  # [n, H]
            normed = rms_norm(pad_rows(piece, ROW_MULTIPLE).to(head.dtype), self.verifier_norm,
                              self.spec.rms_norm_eps)  # [n', H], zero rows appended
            logits = F.linear(normed, head)[: piece.shape[0]]  # [n, V] (eval) or [n, Vd] (train)
            if draft_only:
                ids.append(to_target[logits.argmax(-1)])
                logits_d.append(logits)
            else:
                ids.append(logits.argmax(-1))
                logits_d.append(logits[:, self.t2d])  # [n, Vd]; t2d order == draft id order
        if not logits_d:
            return last.new_zeros(0, self.spec.draft_vocab_size), \
                torch.zeros(0, dtype=torch.long, device=last.device)
        return torch.cat(logits_d), torch.cat(ids)

    @torch.no_grad()
    def verifier_targets(self, last: torch.Tensor, where: torch.Tensor | None = None,
                         full_vocab: bool = True,
                         chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
        """`verifier_rows` laid out over the batch: (verifier logits on the draft vocab
        [B, T, Vd] float32, verifier argmax over the full vocab [B, T] as target ids); positions
        outside `where` (default: all) get 0 logits and id -1. For analyses: training never
        builds the [B, T, Vd] tensor (forward)."""
        b, t, _ = last.shape
        if where is None:
            where = torch.ones(b, t, dtype=torch.bool, device=last.device)
        rows, ids = self.verifier_rows(last, where, full_vocab, chunk)
        out_logits = last.new_zeros(b, t, self.spec.draft_vocab_size, dtype=torch.float32)
        out_ids = torch.full((b, t), -1, dtype=torch.long, device=last.device)
        out_logits[where] = rows.float()  # fp32 even under autocast
        out_ids[where] = ids
        return out_logits, out_ids

    @abc.abstractmethod
    def train_states(self, batch: dict, valid: torch.Tensor) -> list[torch.Tensor]:
        """The normed lm_head inputs of every draft step, k x [B, T, H]: step j at index t
        drafts x_{t+2+j}. Each draft model says how it gets them."""

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """The loss over a padded batch: aux [B,T,A*Ht], last [B,T,H], input_ids [B,T],
        loss_mask [B,T], attention_mask [B,T] (one sequence per row, any padding side).
        Only positions that count are scored: the verifier once over the M positions any
        step needs, each step's lm_head and loss fused over its N rows (losses.step_terms);
        no [B, T, Vd] tensor is built."""
        valid = batch["attention_mask"].bool()  # [B, T]
        learn = valid & batch["loss_mask"].bool()  # [B, T] tokens the draft must predict
        # the verifier is needed only at positions p whose next token x_{p+1} is learned
        need = valid & acceptance.shift(learn, 1)  # [B, T]
        tgt_logits, tgt_ids = self.verifier_rows(  # [M, Vd], [M]
            batch["last"], need, full_vocab=not self.training)
        row_of = torch.full(need.shape, -1, dtype=torch.long, device=need.device)  # [B, T]
        row_of[need] = torch.arange(tgt_ids.shape[0], device=need.device)  # position -> row
        states = self.train_states(batch, valid)  # steps x [B, T, H]
        to_target = self.draft_to_target(torch.arange(self.spec.draft_vocab_size,
                                                      device=valid.device))  # [Vd]
        chunk = fused_loss.chunk_rows(self.spec.draft_vocab_size, ROW_MULTIPLE)
        sums, counts = [], []
        chain_ok = torch.ones_like(valid)  # steps < j all correct at this index
        for j, post in enumerate(states):
            # index t predicts x_{t+2+j} (counts if it exists and is an assistant token);
            # the verifier's distribution for it comes from last[t+1+j]
            step_valid = valid & acceptance.shift(learn, 2 + j)  # [B, T]
            at = acceptance.shift(row_of, 1 + j)[step_valid]  # [N] verifier rows
            div_sum, c, correct = losses.step_terms(
                post[step_valid], self.lm_head.weight, tgt_logits, tgt_ids, at, to_target,
                step_valid, chain_ok, self.divergence, chunk, ROW_MULTIPLE)
            chain_ok = chain_ok & correct
            sums.append(div_sum)
            counts.append(c)
        return losses.combine(sums, counts, self.ttt_decay)


class Eagle3Draft(FamilyDraft):
    def __init__(self, spec: DraftSpec, vocab: DraftVocab,
                 ttt_steps: int = _TRAIN_DEFAULTS.ttt_steps,
                 ttt_decay: float = _TRAIN_DEFAULTS.ttt_decay, init_std: float = 0.02):
        super().__init__(spec, vocab, ttt_decay)
        if ttt_steps < 1:
            raise DraftkitError(f"train.ttt_steps must be >= 1, got {ttt_steps}")
        self.ttt_steps = ttt_steps
        self.feature_noise = 0.0  # train.feature_noise: applied in training mode only
        h, ht, a, eps = spec.hidden_size, spec.target_hidden_size, spec.num_aux, spec.rms_norm_eps
        self.embed_tokens = nn.Embedding(spec.target_vocab_size, h).requires_grad_(False)
        self.input_norm = RMSNorm(a * ht, eps) if spec.norm_before_fc else None
        self.fc_norm = nn.ModuleList([RMSNorm(ht, eps) for _ in range(a)]) if spec.fc_norm else None
        self.fc = nn.Linear(a * ht, h, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(spec, i) for i in range(spec.num_layers)])
        self.add_output(vocab, init_std)

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_run_config(cls, cfg, vocab: DraftVocab, target_model=None) -> Eagle3Draft:
        """New head for a run: embedding + verifier parts from the target, lm_head = target
        lm_head rows of the draft vocab, the decoder layer from a target layer with
        draft.init_layer_from (init_layer.py). Without `target_model` the three tensors are read
        from the target's safetensors (no full model load)."""
        hub = cfg.target.source == "hub" and cfg.target.hub_id
        path = None if hub and target_model is not None else run_target_dir(cfg.target)
        verifier = cfg.target.hub_id if hub else str(Path(path).resolve())
        spec = fmt.spec_from_run_config(cfg, vocab.draft_size, verifier)
        model = cls(spec, vocab, cfg.train.ttt_steps, cfg.train.ttt_decay)
        tensors = module_tensors(target_model) if target_model is not None \
            else read_target_tensors(path)
        model.load_target_tensors(*tensors, init_lm_head=True,
                                  init_norm=cfg.draft.init_norm_from_target)
        if cfg.draft.init_layer_from is not None:  # else the layer stays random

            layers = init_layer.layers_to_copy(cfg.draft.init_layer_from,
                                               cfg.target.num_hidden_layers, spec.num_layers)
            for i, layer in enumerate(layers):
                init_layer.init_from_target_layer(
                    model, init_layer.target_layer_tensors(layer, target_model, path), layer, i)
        return model

    @classmethod
    def from_pretrained(cls, directory: str | Path, target_model=None,
                        ttt_steps: int = _TRAIN_DEFAULTS.ttt_steps,
                        ttt_decay: float = _TRAIN_DEFAULTS.ttt_decay) -> Eagle3Draft:
        """Load a speculators-format dir (ours or foreign); embedding/verifier from the target."""
        from safetensors.torch import load_file

        directory = Path(directory)
        if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
            raise DraftkitError(f"{directory} is not an EAGLE-3 checkpoint (needs {CONFIG_FILE} "
                                f"and {WEIGHTS_FILE})")
        spec = fmt.from_config(artifacts.read_json(directory / CONFIG_FILE))
        tensors = load_file(str(directory / WEIGHTS_FILE))
        fmt.check_state_dict(spec, tensors)
        return cls.from_state(spec, tensors, target_model, ttt_steps, ttt_decay)

    @classmethod
    def from_state(cls, spec: DraftSpec, tensors: dict, target_model=None,
                   ttt_steps: int = _TRAIN_DEFAULTS.ttt_steps,
                   ttt_decay: float = _TRAIN_DEFAULTS.ttt_decay) -> Eagle3Draft:
        """A head from a checked spec + checkpoint tensors (from_pretrained's second half;
        drafts/peagle reads its own config.json and shares this)."""
        tensors = dict(tensors)
        if "d2t" in tensors:
            vocab = DraftVocab.from_d2t(tensors.pop("d2t").to(torch.int64),
                                        spec.target_vocab_size)
            tensors.pop("t2d", None)
        else:
            vocab = DraftVocab.full(spec.target_vocab_size)
        model = cls(spec, vocab, ttt_steps, ttt_decay)
        embed = tensors.pop("embed_tokens.weight", None)
        if target_model is not None:
            target = module_tensors(target_model)
        else:
            target = read_target_tensors(_target_path(spec))
        model.load_target_tensors(*target, init_lm_head=False)
        if embed is not None:
            model.embed_tokens.weight.data.copy_(embed)
        model.load_state_dict(tensors, strict=False)
        return model

    # ----------------------------------------------------------------- inference interface

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [B, T, A*Ht] -> [B, T, H]: (input_norm | fc_norm per chunk) then fc."""
        x = aux.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            chunks = x.chunk(len(self.fc_norm), dim=-1)  # A x [B, T, Ht]
            x = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(x)

    def step(self, input_ids: torch.Tensor, hidden: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass over whole sequences (no cache).

        input_ids [B, S], hidden [B, S, H] (row s: fused target features or an earlier
        hidden_out), positions [B, S] -> (logits [B, S, Vd], hidden_out [B, S, H]).
        """
        cos, sin = self.rotary(positions, hidden.dtype)
        embeds, mask = self.embed_tokens(input_ids), causal_mask(input_ids.shape[1],
                                                                 input_ids.device)
        for layer in self.layers:
            q, k, v, residual = layer.begin(embeds, hidden, cos, sin)
            hidden = layer.end(layer.self_attn.attend(q, k, v, mask), residual)  # pre-norm
        return self._head(hidden)

    def _head(self, prenorm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        post = self.norm(prenorm)  # [B, T, H]
        return self.lm_head(post), (post if self.spec.norm_output else prenorm)

    # ----------------------------------------------------------------- training

    def ttt_unroll(self, aux: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """Draft logits of every TTT step: ttt_steps x [B, T, Vd]; step j at index t drafts
        x_{t+2+j} from token x_{t+1+j} (teacher-forced) at position t+j."""
        return [self.lm_head(post) for post in self.ttt_states(aux, input_ids, attention_mask)]

    def ttt_states(self, aux: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """The normed lm_head inputs of every TTT step: ttt_steps x [B, T, H] (see ttt_unroll);
        training applies lm_head only where a position counts, the costliest matmul."""
        valid = attention_mask.bool()  # [B, T]
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)  # [B, T]
        hidden = self.fuse(aux)  # [B, T, H]: step-0 features fuse(h_t)
        attention = TTTAttention(valid, self.ttt_steps)  # the keys each step's queries see
        keys = [[] for _ in self.layers]  # per layer: the K of steps 0..j
        values = [[] for _ in self.layers]
        states = []
        for j in range(self.ttt_steps):
            cos, sin = self.rotary(positions + j, hidden.dtype)  # position t+j
            embeds = self.embed_tokens(acceptance.shift(input_ids, 1 + j))  # token x_{t+1+j}: [B, T, H]
            prenorm = self.ttt_layers(embeds, hidden, cos, sin, keys, values, attention, j)
            post = self.norm(prenorm)
            states.append(post)
            hidden = post if self.spec.norm_output else prenorm  # next step's hidden
        return states

    def ttt_layers(self, embeds: torch.Tensor, prenorm: torch.Tensor, cos, sin,
                   keys: list[list], values: list[list], attention: TTTAttention,
                   j: int) -> torch.Tensor:
        """TTT step j through the decoder layers: its K/V are appended to each layer's
        `keys`/`values` (steps 0..j), its queries attend to them as `attention` says (the TTT
        mask's structure, layer.py); returns the step's pre-norm state [B, T, H]."""
        for n, layer in enumerate(self.layers):
            q, k, v, residual = layer.begin(embeds, prenorm, cos, sin)
            keys[n].append(k)
            values[n].append(v)
            out = attention(layer.self_attn, q, torch.cat(keys[n], dim=2),
                            torch.cat(values[n], dim=2), j)  # keys [B,nKV,(j+1)T,hd]
            prenorm = layer.end(out, residual)  # [B, T, H]
        return prenorm

    def train_states(self, batch: dict, valid: torch.Tensor) -> list[torch.Tensor]:
        """The TTT states of a training batch (ttt_states), the aux features noised in
        training mode by train.feature_noise."""
        aux = batch["aux"]
        if self.training and self.feature_noise > 0:
            aux = add_feature_noise(aux, self.feature_noise, self.spec.num_aux)
        return self.ttt_states(aux, batch["input_ids"], valid)  # steps x [B, T, H]

    # ----------------------------------------------------------------- save

    def export_state_dict(self, include_embed: bool = False) -> dict[str, torch.Tensor]:
        """The checkpoint tensors (vLLM names); d2t/t2d only for a reduced vocab."""
        out = {}
        for name, tensor in self.state_dict().items():
            if name in ("verifier_norm", "verifier_lm_head") or (
                    name == "embed_tokens.weight" and not include_embed):
                continue
            if name in ("d2t", "t2d") and self.spec.draft_vocab_size == self.spec.target_vocab_size:
                continue
            out[name] = tensor.detach().cpu().contiguous()
        return out

    def save_pretrained(self, directory: str | Path, include_embed: bool = False) -> Path:
        """Write speculators-format config.json + model.safetensors (files written atomically)."""
        from safetensors.torch import save

        directory = Path(directory)
        tensors = self.export_state_dict(include_embed)
        fmt.check_state_dict(self.spec, tensors)
        directory.mkdir(parents=True, exist_ok=True)
        artifacts.write_bytes_atomic(directory / WEIGHTS_FILE,
                                     save(tensors, metadata={"format": "pt"}))
        artifacts.write_json_atomic(directory / CONFIG_FILE, fmt.to_config(self.spec))
        return directory


def add_feature_noise(aux: torch.Tensor, std: float, num_aux: int) -> torch.Tensor:
    """aux [B, T, A*Ht] plus N(0, (std * r)^2) per element, r = the RMS of that token's features
    from the same aux layer (the layers' scales differ by orders of magnitude); torch's global
    RNG, so the train loop's checkpoints resume it exactly."""
    x = aux.float().unflatten(-1, (num_aux, -1))  # [B, T, A, Ht]
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, A, 1]
    return (x + torch.randn_like(x) * (rms * std)).flatten(-2).to(aux.dtype)


def _target_path(spec: DraftSpec) -> Path:
    name = spec.target_name or spec.verifier_name_or_path
    if not name:
        raise DraftkitError("the checkpoint names no verifier; pass target_model= to "
                            "Eagle3Draft.from_pretrained")
    if registry.lookup(name) is None and Path(spec.verifier_name_or_path).is_dir():
        name = spec.verifier_name_or_path
    return target_dir(name)
