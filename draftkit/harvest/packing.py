"""How harvest batches sequences of different lengths into target forwards (harvest.packing):
equal lengths only, length-sorted padded batches, or sequences packed back to back in one row
(varlen), and the inputs each needs.
"""

from __future__ import annotations

import torch

from draftkit.core import batching
from draftkit.core.errors import DraftkitError

PACKINGS = ("auto", "equal", "pad", "varlen")


def resolve_packing(packing: str, device: str) -> str:
    """harvest.packing as it runs on `device`: auto = pad on CUDA (length-sorted batches keep
    the GPU busy), equal on the CPU (bit-exact, and batching buys little there)."""
    if packing not in PACKINGS:
        raise DraftkitError(f"harvest.packing={packing!r}; choose one of {', '.join(PACKINGS)}")
    if packing == "auto":
        return "pad" if torch.device(device).type == "cuda" else "equal"
    if packing == "varlen":
        import transformers.masking_utils as mu

        if not hasattr(mu, "find_packed_sequence_indices"):
            raise DraftkitError("harvest.packing=varlen needs a transformers that reads packed "
                                "position ids (masking_utils.find_packed_sequence_indices); "
                                "upgrade transformers or use harvest.packing=pad")
    return packing


def plan_batches(lengths: list[int], batch_tokens: int, packing: str) -> list[list[int]]:
    """Forwards of <= batch_tokens tokens (core/batching.py): `equal` groups only equal lengths
    ([4, 3, 4, 3, 5], 8 -> [[1, 3], [0, 2], [4]]), `pad` length-sorted padded batches (12 ->
    [[1, 3, 0], [2, 4]]), `varlen` consecutive sequences in order, concatenated into one row
    (8 -> [[0, 1], [2, 3], [4]])."""
    if packing != "varlen":
        return batching.plan_batches(lengths, batch_tokens, equal_lengths=packing == "equal")
    plan: list[list[int]] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if plan and plan[-1] and tokens + n <= batch_tokens:
            plan[-1].append(i)
            tokens += n
        else:
            plan.append([i])
            tokens = n
    return plan


def pad_right(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, T_max] input ids (right-padded with 0) and attention mask; mask None if no padding."""
    x, mask = batching.pad_right(seqs, torch.long)  # [B, T], [B, T]
    return x, (None if bool(mask.all()) else mask)


def forward_inputs(seqs: list[torch.Tensor], packing: str) -> dict:
    """The capture's inputs for one planned batch: input_ids [B, T] and attention_mask (None
    without padding); varlen: input_ids [1, N] of the sequences back to back and position_ids
    [1, N] restarting at 0 for each (e.g. lengths 2, 3 -> [[0, 1, 0, 1, 2]]), which transformers
    turns into a block-diagonal causal mask."""
    if packing != "varlen":
        x, mask = pad_right(seqs)
        return {"input_ids": x, "attention_mask": mask}
    pos = torch.cat([torch.arange(len(s)) for s in seqs])  # [N]
    return {"input_ids": torch.cat(seqs)[None], "attention_mask": None,
            "position_ids": pos[None]}
