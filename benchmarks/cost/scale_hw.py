"""bench_scale's hardware columns (#55): what the device allows beside what draftkit reaches.

- `train_flops`: the EAGLE-3 head's training FLOPs per token, term by term (MFU's numerator);
- `matmul_peak`: the device's measured bf16/fp32 matmul FLOP/s (MFU's denominator; the spec
  sheet's dense bf16 figure beside it where the GPU is known);
- `null_sink`: the harvest's own loop (forward, capture, encode, finite flags, copies into the
  host ring, the writer pool) with writers that store nothing: what harvest costs without a disk;
- `disk_rate`: the harvest disk's sequential write rate, through the shard writer (hash included)
  and fsynced, in the same run;
- `verify_curve` (GPU): the target's forward of q = 1..k+1 new tokens per sequence against a KV
  cache, batch 1..256, relative to a 1-token step; `project` combines it with a draft's tokens
  per target step into a projected rollout speedup per batch size (a projection, not a
  measurement: no vLLM ran).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from draftkit.core import speed
from draftkit.harvest import stage as hv
from draftkit.harvest import writer
from draftkit.targets import capture as capture_mod

# dense bf16 tensor FLOP/s from the vendors' sheets (no sparsity)
SPEC_BF16 = {"H200": 989.5e12, "H100": 989.5e12, "A100": 312e12}


def train_flops(tc, draft_vocab: int, aux: int, ttt: int, seq_len: int) -> dict:
    """FLOPs per trained token of the EAGLE-3 head at target config `tc` (an HF config):
    trainable matmuls count 3x (forward + backward), the frozen verifier logits 1x.

    fc: 2 * A*H * H; per TTT step the decoder layer on [embed; hidden] (2H in): q, k, v from 2H,
    o, the MLP (3 matmuls of H x I), attention scores and values (2 * 2 * ctx * H, ctx ~ L/2 for
    a causal sequence of L), and the draft lm_head (H x draft vocab); the target's logits over
    the draft vocab from the stored last state, once per token.
    """
    h, inter = tc.hidden_size, tc.intermediate_size
    d = getattr(tc, "head_dim", None) or h // tc.num_attention_heads
    q, kv = tc.num_attention_heads * d, tc.num_key_value_heads * d
    layer = 2 * (2 * h * (q + 2 * kv) + q * h + 3 * h * inter) + 4 * (seq_len / 2) * h
    terms = {"fc": 2 * aux * h * h, "layer_per_ttt_step": layer,
             "lm_head_per_ttt_step": 2 * h * draft_vocab}
    trainable = terms["fc"] + ttt * (layer + terms["lm_head_per_ttt_step"])
    terms["verifier_logits"] = 2 * h * draft_vocab
    return {"terms": terms, "ttt_steps": ttt, "total": 3 * trainable + terms["verifier_logits"],
            "formula": "3 x (fc + ttt x (layer + lm_head)) + verifier logits"}


def matmul_peak(device: torch.device, dtype: torch.dtype, cuda_name: str = "") -> dict:
    out = {"measured_flops": speed.measure_matmul_flops(device.type, dtype), "dtype": str(dtype)}
    spec = next((v for k, v in SPEC_BF16.items() if k in cuda_name), None)
    if spec and dtype == torch.bfloat16:
        out["spec_flops"] = spec
    return out


def null_sink(model, opened, device: torch.device, sync) -> dict:
    """The harvest loop of draftkit/harvest/stage.py over the run's shards with the loaded
    `model`, writers that wait for each slot's copies and store nothing."""
    cfg = opened.cfg
    jobs = [j for j in hv.plan(opened, str(device)) if j.split == "train"]
    todo = [(job, i) for job in jobs for i in range(len(job.shards))]
    capture = capture_mod.OnlineCapture(model, cfg.draft.aux_layer_ids)
    sizes = [sum(job.lengths[r] for r in job.shards[i]) for job, i in todo]
    ring = hv.host_ring(cfg, device, max(sizes), len(todo))

    def nothing(directory, index, tensors, fingerprint) -> dict:
        return {"tokens": int(tensors["input_ids"].numel())}

    with torch.no_grad():
        warm = hv.harvest_shard(*todo[0], capture, cfg, ring)
        warm.ready()
        warm.release()
        sync(device)
        pool = writer.WriterPool(cfg.harvest.writers)
        t0 = time.perf_counter()
        for job, i in todo:
            pool.put(job.directory, i, hv.harvest_shard(job, i, capture, cfg, ring),
                     job.fingerprint, nothing)
        entries = pool.close()
        seconds = time.perf_counter() - t0
    tokens = sum(e["tokens"] for e in entries.values())
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "packing": jobs[0].header["packing"], "writers": cfg.harvest.writers}


def disk_rate(directory: Path, nbytes: int) -> dict:
    """Sequential write rate of the disk holding `directory`: one shard-sized file through the
    shard writer (sha256 as written), then fsynced; bytes / seconds. The file is removed."""
    directory.mkdir(parents=True, exist_ok=True)
    blob = {"x": torch.randint(0, 255, (nbytes,), dtype=torch.uint8)}
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "rate.safetensors"
        t0 = time.perf_counter()
        writer.write_safetensors(path, blob, {})
        t1 = time.perf_counter()
        writer.fsync_files([path])
        t2 = time.perf_counter()
    return {"bytes": nbytes, "write_hash_s": t1 - t0, "fsync_s": t2 - t1,
            "bytes_per_s": nbytes / (t2 - t0), "directory": "beside the run's harvest/"}


def verify_curve(model, device: torch.device, batches: list[int], k: int, context: int,
                 vocab: int, sync, reps: int = 3) -> dict:
    """Seconds of one target forward (incl. lm_head, as a verify step) of q new tokens per
    sequence (q = 1..k+1) against a KV cache of `context` tokens, at each batch size; and each
    relative to q = 1 at that batch. The cache is cropped back to `context` after each."""
    from transformers import DynamicCache

    rows = []
    with torch.no_grad():
        for b in batches:
            try:
                cache = DynamicCache()
                ctx = torch.randint(0, vocab, (b, context), device=device)  # [B, C]
                # the decoder only: logits of B x C tokens over a 152k vocab would not fit
                model.model(input_ids=ctx, past_key_values=cache, use_cache=True)
                times = {}
                for q in range(1, k + 2):
                    x = torch.randint(0, vocab, (b, q), device=device)  # [B, q]
                    best = float("inf")
                    for _ in range(reps + 1):  # the first is a warm-up
                        sync(device)
                        t0 = time.perf_counter()
                        model(input_ids=x, past_key_values=cache, use_cache=True)
                        sync(device)
                        best = min(best, time.perf_counter() - t0)
                        cache.crop(-q)  # back to the context's tokens
                    times[q] = best
                rows.append({"batch": b, "seconds": times,
                             "relative": {q: t / times[1] for q, t in times.items()}})
            except torch.OutOfMemoryError:
                rows.append({"batch": b, "oom": True})
                break
            finally:
                cache = None
                torch.cuda.empty_cache() if device.type == "cuda" else None
    return {"context": context, "k": k, "rows": rows}


def project(curve: dict, tokens_per_step: float, draft_step_rel: float) -> dict:
    """Projected rollout speedup per batch: tokens per target step / (a verify step of k+1
    tokens + k draft steps), both relative to a 1-token target step. `draft_step_rel` is the
    draft's forward relative to a 1-token target step (an assumption: weight bytes, as both are
    memory-bound at small batch). A projection: no engine ran."""
    k = curve["k"]
    out = []
    for row in curve["rows"]:
        if row.get("oom"):
            continue
        cost = row["relative"][k + 1] + k * draft_step_rel
        out.append({"batch": row["batch"], "verify_rel": row["relative"][k + 1],
                    "projected_speedup": tokens_per_step / cost})
    return {"label": "PROJECTION (not measured in vLLM)", "tokens_per_step": tokens_per_step,
            "draft_step_rel": draft_step_rel, "k": k, "rows": out}
