"""scripts/demo.py's budget: every override is a valid config key of the smollm2 run, and the
bigger data applies only where `auto` resolves to bf16 (fp32-only CPUs keep the small one)."""

from __future__ import annotations

import pytest
from _runs import script

from draftkit.core import hardware
from draftkit.core.init import resolve


@pytest.fixture(scope="module")
def demo():
    return script("demo")


@pytest.mark.parametrize("dtype,samples,epochs,prompts",
                         [("bfloat16", 600, 3, 16), ("float32", 280, 4, 8)])
def test_demo_budget_follows_the_resolved_dtype(demo, monkeypatch, dtype, samples, epochs,
                                                prompts):
    monkeypatch.setattr(hardware, "resolve", lambda name, *a, **k: dtype)
    cfg = resolve("smollm2-135m", "math", overrides=demo.demo_overrides())
    assert (cfg.data.max_samples, cfg.train.epochs, cfg.eval.num_prompts) == (samples, epochs,
                                                                              prompts)
    assert cfg.eval.splits == ["seen-templates", "hand-written"] and not cfg.export.check
