"""Step timers (benchmarks/serving/step_timers.py) inside a live vLLM engine: tiny-llama with a
trained EAGLE-3 export, k=3, fp32 greedy. One engine: outputs before the timers are installed,
with them, and after they are removed must be equal; every timed step splits into
non-negative parts whose sum is its wall time, the drafter runs k forwards per step (the first
over every scheduled token, the rest over one token per request), and the profiler reads back
the draft's ops. The pure summary functions are checked on hand-made records."""

from __future__ import annotations

import pytest
from _runs import DRAFT, make_run, save_best

from benchmarks.serving import step, step_timers

K, GEN = 3, 24


def _step(wall, parts, forwards=(), decode=True, profiled=False, gap=0.001):
    return {"wall": wall, "gap": gap, "num_reqs": 2, "num_tokens": 8, "num_draft_tokens": 6,
            "decode": decode, "parts": parts, "draft_forwards": [list(f) for f in forwards],
            "draft_logits": [], **({"profiled": True} if profiled else {})}


def test_split_and_summary_of_hand_made_steps():
    parts = {"target_forward": 0.010, "target_logits": 0.001, "sample": 0.001,
             "propose": 0.008, "draft_forward": 0.006, "draft_logits": 0.001}
    s = step_timers.split(_step(0.025, parts))
    assert s["draft_other"] == pytest.approx(0.001)  # propose less forwards and logits
    assert s["other"] == pytest.approx(0.005)  # wall less target, sample and propose
    assert sum(s[p] for p in step_timers.PARTS) == pytest.approx(s["wall"])
    steps = [_step(0.025, parts, [(8, 0.004), (2, 0.001), (2, 0.001)]),
             _step(0.5, parts, [(90, 0.2)], decode=False),  # prefill: left out
             _step(0.5, parts, [(8, 0.2)], profiled=True, gap=None)]  # profiled: left out
    summary = step_timers.summarize(steps)
    assert summary["steps"] == 1 and summary["draft_forwards_per_step"] == 3
    assert summary["first_draft_forward"] == {"calls": 1, "ms": pytest.approx(4.0), "tokens": 8}
    assert summary["later_draft_forwards"]["tokens"] == 2
    assert summary["ms"]["wall"] == pytest.approx(25.0)
    assert step_timers.summarize(steps, decode_only=False)["steps"] == 2
    assert step_timers.summarize([])["steps"] == 0


def test_a_suffix_engine_gets_the_cache_reset_too():
    from draftkit.serving import speculative, vllm_engine

    assert step_timers.engine_kwargs(None)["worker_extension_cls"] == step_timers.EXTENSION
    suffix = step_timers.engine_kwargs(speculative.suffix_config(K))["worker_extension_cls"]
    assert suffix == step_timers.SUFFIX_EXTENSION
    assert hasattr(vllm_engine.SuffixCacheReset, "draftkit_reset_suffix_cache")


def test_bench_step_report_of_hand_made_rows(tmp_path):
    """benchmarks/serving/step.py's (scripts/bench_step.py) tables and plot from summaries of
    hand-made steps."""
    bench_step = step
    parts = {"target_forward": 0.010, "propose": 0.008, "draft_forward": 0.006}
    eagle = step_timers.summarize([_step(0.025, parts, [(8, 0.004), (2, 0.001), (2, 0.001)])])
    none = step_timers.summarize([_step(0.012, {"target_forward": 0.011})])
    row = {"k": 3, "compiled": False, "tokens_per_step": 1.5, "step_share": 0.9}
    bench = {"target": "tiny", "run": "r", "k": 3, "dtype": "float32", "max_new_tokens": 8,
             "smoke": True, "argv": ["scripts/bench_step.py", "--smoke"],
             "prompts": {"batch_1": 2, "batch_gt_1": 8}, "hardware": {"cpu_model": "x"},
             "engines": [{"method": "suffix", "compiled": False, "start_s": 1.0,
                          "error": "no arctic"}],
             "profiles": [{"method": "eagle3", "batch_size": 8, "mode": "torch", "proposes": 2,
                           "regions": [{"name": "draftkit.draft_forward[0]", "total_ms": 1.0}],
                           "top": [{"name": "aten::argmax", "shapes": "[[8, 49152]]",
                                    "self_ms": 1.5, "total_ms": 1.5, "calls": 3.0}]}],
             "rows": [{**row, "method": "none", "batch_size": 8, "tokens_per_s": 100.0,
                       "speedup": 1.0, "timers": none},
                      {**row, "method": "eagle3", "batch_size": 8, "tokens_per_s": 90.0,
                       "speedup": 0.9, "acceptance_length": 1.5, "timers": eagle},
                      {"method": "suffix", "batch_size": 8, "compiled": False,
                       "unavailable": "no arctic"}]}
    md = bench_step.markdown(bench)
    assert "| eagle3 k=3 | 8 | +13.0 | -1.0 |" in md  # 25 - 12 ms per step; target 10 - 11 ms
    assert "| suffix | 8 | not measured: no arctic |" in md and "SMOKE" in md
    assert "| `aten::argmax` | [[8, 49152]] | 1.500 |" in md
    bench_step.plot(bench, tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 0


@pytest.fixture(scope="module")
def timed(tmp_path_factory, trained_draft):
    """One timed EAGLE-3 engine: outputs without timers, with them (+ records and generate's
    wall time), the profiles, and outputs after uninstalling."""
    from draftkit.core import config
    from draftkit.export import stage as export
    from draftkit.serving import speculative, vllm_engine

    run = make_run(tmp_path_factory.mktemp("step-timers"), name="timers",
                   prompts=trained_draft["prompts"], overrides=DRAFT)
    save_best(run, trained_draft["model"], trained_draft["metrics"])
    out = export.export(run, ["export.check=false"])
    prompts = trained_draft["prompts"][:4]
    spec = speculative.method_config("eagle3", K, out)
    es = vllm_engine.run_engine_spec(config.load(run), spec, prompts, dtype="float32",
                                     batch_size=len(prompts))
    es.extra = step_timers.engine_kwargs(spec)
    params = vllm_engine.sampling(0.0, GEN)
    with vllm_engine.engine(es) as llm:
        plain = vllm_engine.generate(llm, prompts, params).token_ids  # no timers installed yet
        step_timers.reset(llm)
        gen = vllm_engine.generate(llm, prompts, params)
        records = step_timers.read(llm)
        profiles = {}
        for mode in ("torch", "python"):
            step_timers.profile(llm, 2, mode)
            vllm_engine.generate(llm, prompts, vllm_engine.sampling(0.0, 8))
            profiles[mode] = step_timers.profile_read(llm, 10)
        removed = step_timers.uninstall(llm)
        after = vllm_engine.generate(llm, prompts, params).token_ids
    return {"plain": plain, "gen": gen, "records": records, "profiles": profiles,
            "removed": removed, "after": after}


@pytest.mark.vllm
def test_timers_leave_greedy_outputs_unchanged(timed):
    assert timed["gen"].token_ids == timed["plain"] == timed["after"]
    assert all(len(t) == GEN for t in timed["plain"])
    assert timed["removed"] >= 10  # every wrap was undone


@pytest.mark.vllm
def test_every_step_splits_into_non_negative_parts_within_the_wall_time(timed):
    steps = [s for s in timed["records"] if s["num_reqs"]]
    assert len(steps) >= GEN // (K + 1)
    for s in steps:
        assert all(v >= 0 for v in s["parts"].values()) and s["wall"] > 0
        assert s["parts"]["target_forward"] > 0
        parts = step_timers.split(s)
        counted = sum(parts[p] for p in step_timers.PARTS if p != "other")
        assert counted <= s["wall"]  # nested timers never exceed the step's own
        assert sum(parts[p] for p in step_timers.PARTS) == pytest.approx(s["wall"])
    assert sum(s["wall"] for s in timed["records"]) <= timed["gen"].seconds


@pytest.mark.vllm
def test_the_drafter_runs_k_forwards_per_step(timed):
    """What vLLM 0.32 runs (padded drafter batch): the first forward over every token the
    target verified (k+1 per request at decode, the prompt at prefill), then k-1 forwards of
    one token per request; k draft lm_head calls of one row per request."""
    steps = [s for s in timed["records"] if s["num_reqs"]]
    decode = [s for s in steps if s["decode"]]
    assert decode
    for s in steps:
        tokens = [f[0] for f in s["draft_forwards"]]
        assert tokens == [s["num_tokens"]] + [s["num_reqs"]] * (K - 1)
        assert [c[0] for c in s["draft_logits"]] == [s["num_reqs"]] * K
        assert all(f[1] > 0 for f in s["draft_forwards"])
        assert s["parts"]["draft_sample"] >= s["parts"]["draft_logits"]  # lm_head + argmax
    for s in decode:
        assert s["num_tokens"] == s["num_reqs"] + s["num_draft_tokens"]
    summary = step_timers.summarize(timed["records"])
    assert summary["steps"] == len(decode) and summary["draft_forwards_per_step"] == K
    assert summary["ms"]["draft_forward"] > 0 and summary["ms"]["target_forward"] > 0


@pytest.mark.vllm
def test_profiles_of_the_draft_propose(timed):
    torch_prof, py_prof = timed["profiles"]["torch"], timed["profiles"]["python"]
    assert torch_prof["proposes"] == 2 and py_prof["proposes"] == 2
    assert torch_prof["top"] and all(r["self_ms"] >= 0 for r in torch_prof["top"])
    assert [r["name"] for r in torch_prof["regions"]] == [
        f"draftkit.draft_forward[{i}]" for i in range(K)]
    assert any("vllm/" in r["name"] and r["self_ms"] > 0 for r in py_prof["top"])
