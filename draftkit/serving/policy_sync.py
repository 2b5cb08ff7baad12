"""Sync updated policy weights into a running vLLM engine, in place (no restart): the RL loop's
weight transfer on CPU.

The driver writes the policy's state dict to one safetensors file and calls the worker method
`draftkit_load_policy(path)` through `collective_rpc` (a path crosses the RPC; tensors would
arrive as lists). Inside every worker, vLLM's `reload_weights(..., is_checkpoint_format=True)`
runs the model's own weight loading (name mapping, stacked qkv/gate_up) and then the CPU
backend's repacking of linear weights; a plain `model.load_weights` into the live model fails
on CPU, where the original linear parameters are empty after repacking. The prefix cache is
reset afterwards: cached KV blocks were computed with the old weights.

    llm = LLM(model=..., **policy_sync.engine_kwargs())   # also has the drafter-swap methods
    report = policy_sync.sync_policy(llm, policy_model, "runs/rl/policy-sync")
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from draftkit.serving.drafter_swap import MEASURABLE, DrafterSwap, ensure_secret

EXTENSION = "draftkit.serving.policy_sync.RLWorker"
FILE = "policy.safetensors"


def engine_kwargs() -> dict:
    """LLM(...) keywords for an RL rollout engine: policy sync plus drafter swap, and the
    metrics the swap's probe reads (drafter_swap.MEASURABLE), and the swap secret set in this
    process (the worker load path refuses a swap without it)."""
    ensure_secret()
    return {"worker_extension_cls": EXTENSION, **MEASURABLE}


class PolicySync:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def draftkit_load_policy(self, path: str) -> float:
        from safetensors.torch import load_file
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        t0 = time.perf_counter()
        tensors = load_file(path)
        reload_weights(self.vllm_config, self.model_runner.model, iter(tensors.items()), None,
                       True)
        refresh_tied_head(self.model_runner.model)
        return time.perf_counter() - t0


def refresh_tied_head(model) -> bool:
    """A tied lm_head (tie_word_embeddings) shares the embedding's weight but gets no weights of
    its own in a reload, so vLLM does not process it again: on the CPU its GEMM (a oneDNN or
    packed copy built from the embedding at load, `cpu_linear`) kept computing logits with the
    old embedding (SmolLM2: logprobs off by up to 0.16 after a sync, 1e-5 with this). Rebuild
    it from the reloaded weight; False where the head is not tied."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head is embed or not hasattr(head, "quant_method") \
            or head.weight.data_ptr() != embed.weight.data_ptr():
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


class RLWorker(DrafterSwap, PolicySync):
    """The worker extension of an RL rollout engine (both method sets)."""


def state_dict_for_engine(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The HF state dict as vLLM's loader reads it: contiguous tensors, and a tied lm_head left
    out (vLLM ties it to the embedding itself; safetensors refuses shared storage)."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    out = {}
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        out[name] = t.detach().cpu().contiguous()
    return out


def write_state(model: torch.nn.Module, directory: str | Path) -> Path:
    """The policy's weights as `directory/policy.safetensors` (atomic: write, then rename)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path, tmp = directory / FILE, directory / f".{FILE}.tmp"
    save_file(state_dict_for_engine(model), str(tmp))
    tmp.replace(path)
    return path


def sync_policy(llm, model: torch.nn.Module, directory: str | Path) -> dict:
    """Write `model`'s weights, reload them in every worker, drop stale cached KV.
    Returns {"write_s", "load_s", "total_s"} (load_s: the slowest worker)."""
    t0 = time.perf_counter()
    path = write_state(model, directory)
    t1 = time.perf_counter()
    load_s = max(llm.collective_rpc("draftkit_load_policy", args=(str(path),)))
    llm.reset_prefix_cache()
    return {"write_s": t1 - t0, "load_s": load_s, "total_s": time.perf_counter() - t0}
