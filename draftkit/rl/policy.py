"""Policy checkpoints (a local HF dir, as NeMo-RL/verl/TRL save them, or an in-memory
`transformers` model), checked against a run's target by the lineage rule (targets/lineage.py:
the same architecture shapes and tokenizer; names never decide, every RL step writes a new
directory).

    policy = load_policy("ckpts/step_200")            # dir -> model, tokenizer, content hash
    policy = from_model(model, tokenizer, step=200)   # in memory, no checkpoint round-trip
    check_lineage(policy, cfg)                        # DraftkitError naming each mismatch

A checkpoint that cannot be read (a missing shard or index, a truncated file, any error of
`from_pretrained`) raises `CheckpointError` naming the dir: `draftkit watch` retries it later.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from draftkit.core import hardware
from draftkit.core.artifacts import sha256_file
from draftkit.core.errors import DraftkitError
from draftkit.targets.lineage import (
    run_tokenizer_digest,
    shape_mismatches,
    shapes_of,
    target_shapes,
    tokenizer_digest,
)
from draftkit.targets.load import default_device

SHARD = re.compile(r"-(\d+)-of-(\d+)\.safetensors$")  # model-00001-of-00004.safetensors
INDEX = "model.safetensors.index.json"


class CheckpointError(DraftkitError):
    """A policy checkpoint dir that cannot be loaded (yet): incomplete or damaged."""


def shard_problems(path: Path) -> list[str]:
    """What a sharded HF dir lacks: its index, or shards the index or the names promise."""
    shards = sorted(f.name for f in path.glob("*.safetensors") if SHARD.search(f.name))
    if not shards:
        return []
    if not (path / INDEX).is_file():
        return [f"{len(shards)} shard(s) ({shards[0]}, ...) but no {INDEX}"]
    try:
        named = set(json.loads((path / INDEX).read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [f"{INDEX} is not a readable index ({e})"]
    of = SHARD.search(shards[0]).group(2)  # "00004": the names promise shards 1..4
    promised = {SHARD.sub(f"-{i:0{len(of)}d}-of-{of}.safetensors", shards[0])
                for i in range(1, int(of) + 1)}
    expected = named | promised
    missing = sorted(n for n in expected if not (path / n).is_file())
    return [f"missing shard(s) {', '.join(missing[:3])}"] if missing else []


@dataclass
class Policy:
    model: torch.nn.Module  # *ForCausalLM, eval, no grad
    tokenizer: object
    source: str  # checkpoint dir, or "memory"
    digest: str  # sha256 of the weights (files for a dir, tensors in memory)
    step: int | None = None


def dir_digest(path: str | Path) -> str:
    """sha256 over the weight files (names + contents) and config.json of an HF dir."""
    path = Path(path)
    files = sorted([*path.glob("*.safetensors"), *path.glob("*.bin"), path / "config.json"])
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f"{f.name}:{sha256_file(f)}\n".encode())
    return h.hexdigest()


def model_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def load_policy(path: str | Path, step: int | None = None, device: str | None = None,
                dtype: str = "auto") -> Policy:
    """The checkpoint's model (eval, frozen) on `device` (default: the GPU if there is one, as
    the target's), its tokenizer and content hash."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    device = device or default_device()
    if not (path / "config.json").is_file():
        raise DraftkitError(f"policy checkpoint {path} is not a Hugging Face model dir (no "
                            "config.json); point --policy at what the trainer saved with "
                            "save_pretrained (NeMo-RL/verl: the HF-converted checkpoint)")
    if problems := shard_problems(path):
        raise CheckpointError(f"policy checkpoint {path} is incomplete: {'; '.join(problems)}. "
                              "Wait until the trainer has written every shard and the index")
    torch_dtype = hardware.torch_dtype(dtype, device, key="policy dtype")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        digest = dir_digest(path)
    except Exception as e:  # noqa: BLE001 - truncated or missing files raise many types
        raise CheckpointError(f"policy checkpoint {path} could not be loaded "
                              f"({type(e).__name__}: {str(e)[:300]}); is it complete? A "
                              "trainer still writing it leaves it so: wait, or check the "
                              "files") from e
    model.to(device).eval().requires_grad_(False)
    return Policy(model, load_tokenizer(path), str(path.resolve()), digest, step)


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer; CheckpointError if it cannot be loaded."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - missing files raise many types
        raise CheckpointError(f"policy checkpoint {path} has no loadable tokenizer ({e}); "
                              "save the tokenizer next to the weights") from e


def from_model(model: torch.nn.Module, tokenizer, step: int | None = None) -> Policy:
    model.eval()
    return Policy(model, tokenizer, "memory", model_digest(model), step)


def check_lineage(policy: Policy, cfg) -> None:
    """The policy must have the run target's shapes and tokenizer (names are not compared)."""
    problems = shape_mismatches(shapes_of(policy.model.config), target_shapes(cfg))
    if tokenizer_digest(policy.tokenizer) != run_tokenizer_digest(cfg.target.name,
                                                                  cfg.target.revision):
        problems.append("tokenizer (vocab, special tokens or chat template) differs")
    if problems:
        raise DraftkitError(f"policy {policy.source} is not the lineage of run target "
                            f"{cfg.target.name}: {'; '.join(problems)} (policy vs run). A "
                            "draft refreshes only along one architecture and tokenizer; "
                            "start a new run (`draftkit init --target CKPT`) for another")
