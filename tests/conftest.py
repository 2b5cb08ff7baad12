"""Shared fixtures. Markers: `slow` (embedded SmolLM2 target / real training), `vllm` (starts a
vLLM engine), `dist` (accelerate multi-process). Every marker runs in CI (`make test`)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# dtype `auto` as on a CPU without native bf16 (fp32), in every process tests start: results do
# not depend on the CI machine's CPU (tests/test_hardware.py covers the resolution itself).
os.environ.setdefault("DRAFTKIT_CPU_BF16", "0")
# a process a test starts (a launched rank, a CLI run) that dies prints its Python stack
os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.fixture
def one_thread():
    """Tiny models and toy tensors are overhead-bound: intra-op threads only add contention
    (10x slower on a busy 2-core box)."""
    import _runs

    with _runs.one_thread():
        yield


@pytest.fixture(scope="session")
def tiny_target():
    """The in-process random tiny-llama target (built once into the draftkit cache)."""
    from draftkit.targets.load import load_target

    return load_target("tiny-llama", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def smollm2_target():
    """The embedded SmolLM2-135M-Instruct target in fp32 (converted once from the GGUF)."""
    from draftkit.targets.load import load_target

    return load_target("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def trained_draft(tmp_path_factory, tiny_target):
    """An EAGLE-3 head fitted to tiny-llama's greedy continuations of 8 chat prompts (the
    prompts come along: eval splits of the vLLM tests use them). See tests/_runs.py."""
    from _runs import DRAFT, chat_prompts, make_run, one_thread, train_draft

    prompts = chat_prompts(tiny_target.tokenizer, 8)
    run = make_run(tmp_path_factory.mktemp("trained"), prompts=prompts,
                   overrides=[*DRAFT, "train.ttt_steps=3"])
    with one_thread():
        model, metrics = train_draft(run, tiny_target, prompts, new_tokens=40)
    return {"model": model, "metrics": metrics, "prompts": prompts, "new_tokens": 40}
