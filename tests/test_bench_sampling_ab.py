"""The #54 A/B (benchmarks/learning/sampling_ab.py, scripts/bench_sampling_ab.py): arms are
checked against the config before anything trains (an arm whose loss option this draftkit lacks
is named), the summary gives each arm's mean and seed band, and a tiny end-to-end run (tiny-llama:
prepare with HF regeneration, harvest, train, then the bench's T=1 data, training under the
source's CPU budget and vLLM at T=0 and T=1) writes the report."""

from __future__ import annotations

import dataclasses
import json

import pytest
from _runs import DRAFT, script

from benchmarks.learning import sampling_ab
from draftkit import api
from draftkit.core.config import TrainConfig
from draftkit.init.stage import init_run

SOURCE = [*DRAFT, "data.source=local", "data.max_samples=8", "data.eval_samples=4",
          "data.self_instruct=0", "data.regen_engine=hf", "data.regen_temperature=0.0",
          "data.regen_max_new_tokens=24", "harvest.shard_tokens=256", "harvest.batch_tokens=256",
          "train.max_steps=4", "train.batch_tokens=256", "train.num_workers=0",
          "train.eval_every=2", "tracking.backend=none", "eval.num_prompts=4",
          "eval.max_new_tokens=16", "eval.dtype=float32"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    run = init_run("tiny-llama", "math", name="src", runs_dir=tmp_path_factory.mktemp("ab"),
                   overrides=SOURCE)
    for stage in (api.prepare, api.harvest, api.train):
        stage(run)
    return run


def test_arms_are_checked_before_training(source):
    problems = sampling_ab.check_arms(source, ["baseline", "regen-t1", "nope", "tv", "mix"])
    assert problems[0].startswith("unknown arm 'nope'")
    has_loss = "loss" in {f.name for f in dataclasses.fields(TrainConfig)}
    named = [p for p in problems if p.startswith(("arm tv", "arm mix"))]
    assert (named == []) if has_loss else (len(named) == 2 and "loss" in named[0])
    assert not [p for p in problems if p.startswith(("arm baseline", "arm regen-t1:"))]
    assert len(problems) == 1 + len(named)


def test_summary_is_the_mean_and_band_over_seeds():
    rows = [{"arm": "tv", "seed": s, "split": "hand-written", "temperature": 1.0,
             "tokens_per_step": x} for s, x in enumerate([1.6, 1.7, 1.9])]
    rows.append({"arm": "tv", "seed": 0, "split": "hand-written", "temperature": 0.0,
                 "tokens_per_step": None})  # not measured: left out
    got = sampling_ab.summarize(rows, ["tv"], [0.0, 1.0])
    assert got == [{"arm": "tv", "split": "hand-written", "temperature": 1.0,
                    "tokens_per_step": 1.733, "band": [1.6, 1.9], "seeds": 3}]


@pytest.mark.slow
@pytest.mark.vllm
def test_tiny_ab_runs_end_to_end(source, tmp_path):
    bench = script("bench_sampling_ab")  # the driver, as `python scripts/bench_sampling_ab.py`
    out = tmp_path / "results"
    code = bench.main(["--source", str(source), "--dir", str(tmp_path / "runs"),
                       "--arms", "baseline,regen-t1", "--seeds", "0,1", "--prompts", "2",
                       "--splits", "unseen-templates", "--out", str(out)])
    assert code == 0
    rep = json.loads((out / "bench_sampling_ab.json").read_text())
    assert rep["budget_cpu_s"] > 0  # the source's own training CPU-seconds
    assert {(s["arm"], s["temperature"]) for s in rep["summary"]} == {
        (a, t) for a in ("baseline", "regen-t1") for t in (0.0, 1.0)}
    assert all(s["seeds"] == 2 for s in rep["summary"])
    assert rep["vllm"]["batch_size"] == 8 and rep["vllm"]["draft_sample_method"] == "probabilistic"
    assert "T=1" in (out / "bench_sampling_ab.md").read_text()


def test_the_plot_draws_each_split_from_the_summary(tmp_path):
    bench = {"splits": {"hand-written": 8}, "arms": {"baseline": [], "tv": []},
             "vllm": {"temperatures": [0.0, 1.0]},
             "summary": [{"arm": a, "split": "hand-written", "temperature": t,
                          "tokens_per_step": 1.5, "band": [1.4, 1.6], "seeds": 2}
                         for a in ("baseline", "tv") for t in (0.0, 1.0)]}
    sampling_ab.plot(bench, tmp_path / "ab.png")
    assert (tmp_path / "ab.png").read_bytes()[:4] == b"\x89PNG"
