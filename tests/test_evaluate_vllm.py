"""`draftkit eval` end to end in vLLM: a tiny-llama run with a random EAGLE-3 export, k=2,
T=0, batch 1 and 2, both engines; report files, plots and consistent numbers. Three engines
(no speculation, n-gram and EAGLE-3) start once each."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path

import pytest
from test_evaluate import make_run

from draftkit.eval.stage import evaluate

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_target):
    root = tmp_path_factory.mktemp("eval-vllm")
    run = make_run(root, tiny_target.model, tiny_target.tokenizer, n_prompts=4)
    return evaluate(run, ["eval.engine=both", "eval.k_values=[2]", "eval.temperatures=[0]",
                          "eval.batch_sizes=[1,2]", "eval.max_new_tokens=16",
                          "eval.dtype=float32", "eval.reference_prompts=2",
                          f"eval.results_dir={root / 'results'}"])


def test_rows_cover_every_method_k_and_batch(report):
    rows = report["vllm"]["rows"]
    keys = {(r["method"], r["k"], r["batch_size"]) for r in rows}
    assert keys == {("none", None, 1), ("none", None, 2)} | {
        (m, 2, b) for m in ("ngram", "eagle3") for b in (1, 2)}
    assert all(r["temperature"] == 0.0 and r["prompts"] == 4 for r in rows)


def test_numbers_are_consistent(report):
    for r in report["vllm"]["rows"]:
        assert r["tokens_per_s"] > 0 and r["output_tokens"] > 0 and r["speedup"] > 0
        if r["method"] == "none":
            assert r["speedup"] == pytest.approx(1.0) and "acceptance_length" not in r
            continue
        if r["drafts"] == 0:  # n-gram found no match in these short prompts: nothing drafted
            assert r["method"] == "ngram" and math.isnan(r["acceptance_length"])
            continue
        assert r["acceptance_length"] >= 1.0 and len(r["per_position"]) == r["k"]
        assert r["acceptance_length"] == pytest.approx(1 + sum(r["per_position"]))
        pos = r["accepted_per_pos"]
        assert all(a >= b for a, b in pairwise(pos)) and sum(pos) == r["accepted"]
        if r["method"] == "eagle3":  # EAGLE-3 always drafts k; n-gram may find a shorter match
            assert r["draft_tokens"] == r["k"] * r["drafts"]
        else:
            assert r["drafts"] <= r["draft_tokens"] <= r["k"] * r["drafts"]
        assert r["projected_speedup"] > 0
    eagle = [r for r in report["vllm"]["rows"] if r["method"] == "eagle3"]
    assert all(r["drafts"] > 0 for r in eagle)


def test_lossless_check_and_reference(report):
    x = report["lossless_vllm"]
    assert x["source"] == "reused" and x["sequences"] == 4 and x["k"] == 2 and x["batch_size"] == 1
    assert 0.0 <= x["match_rate"] <= 1.0
    print("vLLM fp32 greedy exact-match rate:", x["match_rate"], x["first_divergence"])
    ref = report["reference"]["rows"]
    assert [(r["k"], r["temperature"]) for r in ref] == [(2, 0.0)]
    assert all(r["acceptance_length"] >= 1.0 for r in ref)
    costs = report["costs"]["rows"]
    assert [c["batch_size"] for c in costs] == [1, 2]
    assert all(c["target_s"] > 0 and c["draft_s"] > 0 and set(c["verify_s"]) == {"2"}
               for c in costs)


def test_files_and_plots_exist(report):
    files = report["files"]
    assert set(files) == {"json", "md", "per_position", "al_vs_k", "speedup_vs_k"}
    for path in files.values():
        assert Path(path).is_file() and Path(path).stat().st_size > 0
    saved = json.loads(Path(files["json"]).read_text())
    assert len(saved["vllm"]["rows"]) == 6 and saved["settings"]["dtype"] == "float32"
    md = Path(files["md"]).read_text()
    assert "| eagle3 | 2 | 0 | 2 |" in md and "| ngram | 2 | 0 | 1 |" in md
    assert "token-exact" in md
    run_eval = Path(report["run_dir"]) / "eval"
    assert (run_eval / Path(files["json"]).name).is_file()
    assert (run_eval / Path(files["md"]).name).is_file()
