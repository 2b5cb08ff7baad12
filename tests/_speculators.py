"""Drafts built and saved by the `speculators` package's own classes (0.9), for the tiny-llama
target: what a speculators user hands to `draftkit init --from-draft`. The draft's vocab keeps
every other target id (ascending, d2t offsets), its aux ids are vLLM's numbering, and its
verifier is the target's local HF dir (speculators reads the verifier's config and embedding)."""

from __future__ import annotations

from pathlib import Path

import torch

AUX = [1, 3, 5]
DRAFT_VOCAB = 256


def vocab(target_vocab: int, n: int = DRAFT_VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """(t2d [V] bool, d2t [n] int64 offsets) of the ids 0, 2, 4, ..."""
    selected = torch.arange(0, 2 * n, 2)  # [n] target ids, ascending
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[selected] = True
    return t2d, selected - torch.arange(n)


def _configs(target_dir: Path, k: int):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    verifier = AutoConfig.from_pretrained(target_dir)
    layer = verifier.__class__(**{**verifier.to_dict(), "num_hidden_layers": 1})
    layer._attn_implementation = "eager"  # the package's default (flex) wants a compiler
    spec = SpeculatorsConfig(
        algorithm="eagle3", default_proposal_method="greedy",
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=k)],
        verifier=VerifierConfig.from_pretrained(str(target_dir)))
    return layer, spec, verifier.vocab_size


def save_eagle3(out: Path, target_dir: Path, seed: int = 0, k: int = 3, **flags) -> Path:
    """A speculators Eagle3DraftModel (random weights, the target's embedding and lm_head rows
    as the package loads them), saved with its save_pretrained."""
    from speculators.models import Eagle3DraftModel, Eagle3SpeculatorConfig

    layer, spec, v = _configs(target_dir, k)
    torch.manual_seed(seed)
    model = Eagle3DraftModel(Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB, speculators_config=spec,
        eagle_aux_hidden_state_layer_ids=AUX, norm_before_residual=False, **flags))
    model.load_vocab_mappings(*vocab(v))
    model.load_verifier_weights()
    model.save_pretrained(out)
    return out


def save_peagle(out: Path, target_dir: Path, mask_token_id: int, seed: int = 0) -> Path:
    """A speculators PEagleDraftModel, its embedding the target's (embed_requires_grad false:
    draftkit shares the target's embedding, foreign.py)."""
    from speculators.models import PEagleDraftModel, PEagleSpeculatorConfig

    layer, spec, v = _configs(target_dir, 3)
    spec.algorithm = "peagle"
    torch.manual_seed(seed)
    model = PEagleDraftModel(PEagleSpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB, speculators_config=spec,
        eagle_aux_hidden_state_layer_ids=AUX, norm_before_residual=False,
        mask_token_id=mask_token_id, embed_requires_grad=False))
    model.load_vocab_mappings(*vocab(v))
    model.load_verifier_weights()
    model.save_pretrained(out)
    return out


def load_with_speculators(directory: Path, target_dir: Path):
    """The package's own loader on `directory`, its verifier pointed at the local target (a
    draftkit export names the target by hub id or registry name, as vLLM serves it)."""
    from speculators import SpeculatorModel, SpeculatorModelConfig

    conf = SpeculatorModelConfig.from_pretrained(str(directory))
    conf.speculators_config.verifier.name_or_path = str(target_dir)
    return SpeculatorModel.from_pretrained(str(directory), config=conf)
