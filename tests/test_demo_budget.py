"""scripts/demo.py's budget: every override is a valid config key of the smollm2 run, and the
bigger data applies only where `auto` resolves to bf16 (fp32-only CPUs keep the small one), the
biggest where bf16 runs on AMX tiles. Every bench_learning setting (benchmarks/learning/levers.py)
is a valid override set; benchmarks/learning/vocab.py counts the answer tokens a draft vocab
cannot propose, misses.py classifies the head's misses."""

from __future__ import annotations

import pytest
from _runs import script

from benchmarks.learning import levers, misses, vocab
from draftkit.core import config, hardware
from draftkit.init.stage import resolve


@pytest.fixture(scope="module")
def demo():
    return script("demo")


BOTH_SPLITS = ["seen-templates", "hand-written"]


@pytest.mark.parametrize("dtype,flags,samples,epochs,prompts,splits,answer,eval_tokens",
                         [("bfloat16", ("avx512_bf16", "amx_bf16"), 600, 3, 16, BOTH_SPLITS,
                           192, 96),
                          ("bfloat16", ("avx512_bf16",), 500, 3, 16, BOTH_SPLITS, 192, 96),
                          ("float32", ("avx2",), 240, 3, 8, ["hand-written"], 128, 64)])
def test_demo_budget_follows_the_resolved_dtype(demo, monkeypatch, dtype, flags, samples, epochs,
                                                prompts, splits, answer, eval_tokens):
    cpu = hardware.Hardware(device="cpu", cpu_model="test", cpu_flags=flags,
                            torch_cpu_capability="AVX512", torch_cpu_bf16=dtype == "bfloat16")
    monkeypatch.setattr(hardware, "detect", lambda: cpu)
    monkeypatch.setattr(hardware, "resolve", lambda name, *a, **k: dtype)
    cfg = resolve("smollm2-135m", "math", overrides=demo.demo_overrides())
    assert (cfg.data.max_samples, cfg.train.epochs, cfg.eval.num_prompts) == (samples, epochs,
                                                                              prompts)
    assert cfg.eval.splits == splits and not cfg.export.check
    # the fp32 tier regenerates no more answer than eval decodes past it is worth: eval's tokens
    assert (cfg.data.regen_max_new_tokens, cfg.eval.max_new_tokens) == (answer, eval_tokens)
    assert cfg.eval.max_new_tokens < cfg.data.regen_max_new_tokens
    # the serving choice must hold at RL's T=1 as at T=0; every batch has its eval prompts
    assert cfg.eval.temperatures == [0.0, 1.0] and len(cfg.eval.k_values) == 1
    assert max(cfg.eval.batch_sizes) <= cfg.eval.num_prompts and 8 in cfg.eval.batch_sizes
    assert cfg.eval.latency_prompts <= cfg.eval.num_prompts
    full = resolve("smollm2-135m", "math", overrides=demo.demo_overrides("full"))
    assert (full.data.max_samples, full.data.self_instruct, full.data.substitute_copies,
            full.train.epochs) == (1000, 120, 2, 5)
    assert (full.eval.num_prompts, full.eval.splits, full.data.eval_samples) == (
        prompts, cfg.eval.splits, cfg.data.eval_samples)


def test_demo_summary_records_the_commit_and_machine_its_eval_ran_on(demo):
    """As every results/ file does (results/demo/ is a demo summary and its eval report)."""
    hw = {"device": "cpu", "cpu_model": "Some CPU", "cpu_flags": ["avx2"]}
    summary = demo._summary({"git_sha": "1fb0c2b" + "0" * 33, "hardware": hw})
    assert summary["git_sha"].startswith("1fb0c2b") and summary["hardware"] == hw


def test_demo_full_tier_is_the_measured_bench_learning_recipe(demo):
    # The figures (README, docs/benchmarks.md) for `--tier full` come from bench_learning's `sub-2-e5` on `data-1120`
    bench = levers
    assert demo.FULL_OVERRIDES == [*bench.DATA_SETTINGS["data-1120"],
                                   *bench.REUSE_SETTINGS["sub-2-e5"]]


def test_every_bench_learning_setting_is_a_valid_override_set():
    bench = levers
    settings = {**bench.SETTINGS, **bench.OWN_STAGES}
    assert set(bench.DATA_SETTINGS) | set(bench.HARVEST_SETTINGS) | set(
        bench.REUSE_SETTINGS) == set(bench.OWN_STAGES)
    for name, overrides in settings.items():
        cfg = resolve("smollm2-135m", "math", overrides=overrides)
        for section, fields in config.parse_overrides(overrides).items():
            for field, value in fields.items():
                assert getattr(getattr(cfg, section), field) == value, (name, section, field)


def test_bench_vocab_counts_answer_tokens_outside_the_draft_vocab():
    import torch

    from draftkit.drafts.eagle_family.vocab import DraftVocab

    t2d = DraftVocab.build(torch.tensor([0, 5, 4, 3, 0, 0, 2, 1]), 3, must_include=[7]).t2d
    assert t2d.nonzero().flatten().tolist() == [1, 2, 7]
    # answers (mask 1): [3, 2, 5] and [6, 1, 7]; 3, 5, 6 are outside, 3 and 6 in their prompt
    got = vocab.coverage(
        [[3, 9, 3, 2, 5], [6, 4, 6, 1, 7]], [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1]],
        [[3, 9], [6, 4]], t2d)
    assert got == {"tokens": 6, "outside": 3, "outside_share": 0.5, "outside_in_prompt": 2}


def test_bench_misses_classifies_each_counted_target_token():
    # ids: prompt [1, 7, 3, 9] (loss 0), answer [5, 7, 5, 8, 3] (loss 1); digits {3, 8}.
    # Counted t: loss_mask[t + 2] set, t = 2..6; want[t] is the token the verifier wants there
    ids, mask = [1, 7, 3, 9, 5, 7, 5, 8, 3], [0, 0, 0, 0, 1, 1, 1, 1, 1]
    want = [0, 0, 7, 5, 4, 8, 3, 0, 0]
    got = misses.classify(ids, mask, want, {3, 8})
    # t=2: 7 in prompt; t=3: 5, the answer so far is [5] -> earlier; t=4: 4 -> new;
    # t=5: 8 is a digit, not in the prompt; t=6: 3 is a digit of the prompt
    assert got == ["in prompt", "earlier in answer", "new", "digit not in prompt",
                   "digit in prompt"]
