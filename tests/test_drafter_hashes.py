"""The swap's hash check with tensor parallelism, no engine: vLLM's own parallel layers built as
workers 0 and 1 of a TP=2 group (vLLM's TP rank and size patched in), their shards loaded by
vLLM's own weight loaders from whole tensors, hashed as a worker hashes them
(drafter_hashes.worker_hashes) and compared with the whole published tensors (`diff`).
The layers are those of a draft layer at tiny-llama's shapes: fused qkv with one kv head (so it
repeats in both workers), fused gate/up, row-parallel o/down, a vocab-parallel lm_head whose
vocab (250) leaves padding rows in the partitions, a replicated fc and a norm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from draftkit.serving import drafter_hashes

H, HEADS, KV, D, FFN, VOCAB, TP = 128, 2, 1, 64, 256, 250, 2


def _whole(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k, v = r(HEADS * D, 2 * H), r(KV * D, 2 * H), r(KV * D, 2 * H)
    return {"layer.qkv_proj.weight": torch.cat([q, k, v]),  # [256, 256]: q 128, k 64, v 64
            "layer.o_proj.weight": r(H, HEADS * D),
            "layer.gate_up_proj.weight": torch.cat([r(FFN, H), r(FFN, H)]),  # [512, 128]
            "layer.down_proj.weight": r(H, FFN), "layer.down_proj.bias": r(H),
            "lm_head.weight": r(VOCAB, H), "fc.weight": r(H, 3 * H), "norm.weight": r(H)}


def _tp_group(monkeypatch, rank: int, size: int) -> None:
    """vLLM's TP group, as its layers and parameters ask it: this is worker `rank` of `size`."""
    from vllm.distributed import parallel_state

    monkeypatch.setattr(parallel_state, "_TP", SimpleNamespace(rank_in_group=rank,
                                                               world_size=size))


def _worker(rank: int, whole: dict[str, torch.Tensor], monkeypatch) -> nn.Module:
    """Worker `rank`'s drafter layers, loaded by vLLM's weight loaders from `whole`."""
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    _tp_group(monkeypatch, rank, TP)
    m = nn.Module()
    m.layer = nn.Module()
    m.layer.qkv_proj = QKVParallelLinear(2 * H, D, HEADS, KV, bias=False)
    m.layer.o_proj = RowParallelLinear(HEADS * D, H, bias=False)
    m.layer.gate_up_proj = MergedColumnParallelLinear(H, [FFN, FFN], bias=False)
    m.layer.down_proj = RowParallelLinear(FFN, H, bias=True)
    m.lm_head = ParallelLMHead(VOCAB, H)
    m.fc = ReplicatedLinear(3 * H, H, bias=False)
    m.norm = nn.Module()
    m.norm.weight = nn.Parameter(torch.empty(H))
    params = dict(m.named_parameters())
    qkv = whole["layer.qkv_proj.weight"].split([HEADS * D, KV * D, KV * D])
    for part, t in zip("qkv", qkv, strict=True):
        params["layer.qkv_proj.weight"].weight_loader(params["layer.qkv_proj.weight"], t, part)
    for i, t in enumerate(whole["layer.gate_up_proj.weight"].split([FFN, FFN])):
        p = params["layer.gate_up_proj.weight"]
        p.weight_loader(p, t, i)
    for name in ("layer.o_proj.weight", "layer.down_proj.weight", "layer.down_proj.bias",
                 "lm_head.weight", "fc.weight"):
        params[name].weight_loader(params[name], whole[name])
    params["norm.weight"].data.copy_(whole["norm.weight"])
    for mod in m.modules():  # as after a model load: vLLM-CPU repacks the linear weights here
        if hasattr(mod, "quant_method"):
            mod.quant_method.process_weights_after_loading(mod)
    return m


def test_each_tp_worker_shard_is_checked_against_the_same_slice_of_the_published_tensors(
        monkeypatch):
    pytest.importorskip("vllm")
    whole = _whole()
    held = [drafter_hashes.worker_hashes(_worker(r, whole, monkeypatch), torch.float32)
            for r in range(TP)]
    qkv0, qkv1 = held[0]["layer.qkv_proj.weight"][2], held[1]["layer.qkv_proj.weight"][2]
    assert qkv0 == [[0, 0, 64], [0, 128, 64], [0, 192, 64]]  # q head 0, the one kv head
    assert qkv1 == [[0, 64, 64], [0, 128, 64], [0, 192, 64]]  # q head 1, the same kv head
    assert held[1]["layer.gate_up_proj.weight"][2] == [[0, 128, 128], [0, 384, 128]]
    assert held[1]["layer.down_proj.weight"][2] == [[1, 128, 128]]
    assert len(held[1]["layer.down_proj.bias"]) == 2  # a row-parallel bias is whole
    assert held[1]["lm_head.weight"][2] == [[0, 128, 122]]  # 250 rows padded to 256: 6 not hashed
    assert len(held[0]["fc.weight"]) == 2 and len(held[0]["norm.weight"]) == 2  # whole
    assert drafter_hashes.diff(whole, held) == []

    # a change inside worker 1's slice only is seen in worker 1's tensor only
    bad = {**whole, "lm_head.weight": whole["lm_head.weight"].clone()}
    bad["lm_head.weight"][200] += 1.0
    bad["layer.o_proj.weight"] = whole["layer.o_proj.weight"].clone()
    bad["layer.o_proj.weight"][:, 3] = 0.0  # worker 0's input columns
    assert drafter_hashes.diff(bad, held) == ["worker 0: layer.o_proj.weight differs",
                                              "worker 1: lm_head.weight differs"]
    # zeroed weights (the swap test's bad draft) differ in every worker
    zero = {k: torch.zeros_like(v) for k, v in whole.items()}
    assert len(drafter_hashes.diff(zero, held)) == 2 * len(whole)
    # a published tensor too small for a worker's slice is a problem, not a crash
    small = {**whole, "lm_head.weight": whole["lm_head.weight"][:100]}
    assert "worker 1: lm_head.weight has another shape" in drafter_hashes.diff(small, held)


def test_one_worker_hashes_whole_tensors_as_before(monkeypatch):
    """TP=1: no pieces, every hash the whole published tensor's (the format engines report
    today), and a vocab-parallel head's padding rows left out."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    _tp_group(monkeypatch, 0, 1)
    m = nn.Module()
    m.lm_head = ParallelLMHead(VOCAB, H)  # 250 rows padded to 256
    w = torch.randn(VOCAB, H)
    m.lm_head.weight.weight_loader(m.lm_head.weight, w)
    held = drafter_hashes.worker_hashes(m, torch.float32)
    assert held == {"lm_head.weight": ["float32", drafter_hashes.tensor_digest(w)]}
