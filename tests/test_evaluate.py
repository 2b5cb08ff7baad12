"""`draftkit eval` without vLLM: bad inputs give clear errors before any engine starts, and the
reference engine writes the report files and plots from a tiny-llama run with a random EAGLE-3
export."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
from _runs import DRAFT, chat_prompts, make_run, random_draft, save_best

from draftkit.core import config, provenance
from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.eval import report
from draftkit.eval.stage import compare, evaluate
from draftkit.export import stage as export
from draftkit.serving import vllm_engine

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread


@pytest.fixture()
def run(tmp_path, tiny_target):
    """A tiny-llama run with 4 eval prompts and a random EAGLE-3 head, exported."""
    run = make_run(tmp_path, name="tiny-eval", prompts=chat_prompts(tiny_target.tokenizer, 4),
                   overrides=[*DRAFT, "data.source=local"])
    save_best(run, random_draft(run, tiny_target.model))
    export.export(run, ["export.check=false"])
    return run


def test_missing_export_names_the_export_command(tmp_path, tiny_target):
    run = make_run(tmp_path, prompts=chat_prompts(tiny_target.tokenizer, 4), overrides=DRAFT)
    with pytest.raises(DraftkitError, match=f"draftkit export {run}"):
        evaluate(run)


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", 64, "hidden size 64 != 128"),
    ("vocab_size", 1024, "vocab 1024 != 512"),
])
def test_a_draft_for_another_target_is_refused(run, field, value, message):
    path = RunPaths(run).export / "config.json"
    conf = json.loads(path.read_text())
    conf["transformer_layer_config"][field] = value
    conf.pop("target_hidden_size", None)
    path.write_text(json.dumps(conf))
    with pytest.raises(DraftkitError, match=message):
        evaluate(run, ["eval.engine=vllm"])


def test_engine_start_failure_says_what_to_check(run, tmp_path):
    with pytest.raises(vllm_engine.EngineStartError, match="does not exist(.|\n)*what to check"):
        evaluate(run, ["target.source=local", f"target.name={tmp_path / 'no-such-target'}",
                       f"eval.results_dir={tmp_path / 'results'}", "eval.batch_sizes=[1,4]"])


def test_a_batch_larger_than_the_eval_prompts_is_refused(run):
    # 4 eval prompts: a "batch 8" row would run 4 sequences and the choice would take it as 8's
    with pytest.raises(DraftkitError, match=r"eval.batch_sizes \[8, 16, 32\] exceed the 4 eval "
                       r"prompts(.|\n)*eval.batch_sizes=\[1\]"):
        evaluate(run)  # the default batches, 1 8 16 32


def test_bad_eval_settings_are_refused(run):
    with pytest.raises(DraftkitError, match="eval.engine"):
        evaluate(run, ["eval.engine=sglang"])
    with pytest.raises(DraftkitError, match="eval.k_values"):
        evaluate(run, ["eval.k_values=[0]"])


def test_reference_engine_writes_report_and_plots(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as from a repo root: nothing may land in ./results
    rep = evaluate(run, ["eval.engine=reference", "eval.k_values=[1,3]",
                         "eval.temperatures=[0,1]", "eval.num_prompts=3",
                         "eval.max_new_tokens=12", "eval.reference_prompts=2"])
    rows = rep["reference"]["rows"]
    assert [(r["k"], r["temperature"]) for r in rows] == [(1, 0.0), (1, 1.0), (3, 0.0), (3, 1.0)]
    for r in rows:
        assert r["prompts"] == 2 and r["drafts"] > 0 and r["draft_tokens"] == r["k"] * r["drafts"]
        assert r["acceptance_length"] == pytest.approx(1 + r["accepted"] / r["drafts"])
        # a step adds accepted + 1 tokens, the prefill one per prompt; EOS/max cuts only remove
        assert 0 < r["output_tokens"] <= r["prompts"] + r["drafts"] + r["accepted"]
        assert len(r["per_position"]) == r["k"]
        assert all(a >= b for a, b in pairwise(r["accepted_per_pos"]))
    files = rep["files"]
    assert set(files) == {"json", "md", "per_position", "al_vs_k"}  # no timings: no speedup plot
    for path in files.values():
        assert Path(path).is_file() and Path(path).stat().st_size > 0
        assert Path(path).parent == RunPaths(run).eval  # eval.results_dir '' = the run's eval/
    assert not (tmp_path / "results").exists()
    saved = json.loads(Path(files["json"]).read_text())
    assert saved["reference"]["rows"] == json.loads(json.dumps(rows))
    assert (RunPaths(run).eval / Path(files["md"]).name).is_file()
    assert json.loads((RunPaths(run).eval / "meta.json").read_text())["stage"] == "eval"
    assert "| 3 | 1 | 2 |" in Path(files["md"]).read_text()
    # the commit and machine it ran on, in the JSON and on the Markdown's "Ran on" line
    assert saved["git_sha"] == provenance.git_sha() and saved["hardware"]["cpu_model"]
    assert f"code {saved['git_sha'][:7]}" in Path(files["md"]).read_text()
    # eval.results_dir=DIR: the report files go there, the run's eval/ keeps json + md
    other = tmp_path / "elsewhere"
    moved = report.write(rep, config.load(run, [f"eval.results_dir={other}"]), RunPaths(run))
    assert {Path(p).parent for p in moved.values()} == {other}
    assert all((RunPaths(run).eval / Path(moved[k]).name).is_file() for k in ("json", "md"))


def test_compare_reports_match_rate_and_first_divergence():
    got = compare([[1, 2, 3], [4, 5, 6], [7, 8], [1, 1, 1]], [[1, 2, 3], [4, 9, 6], [7, 8, 9], [2]])
    assert got["exact"] == 1 and got["match_rate"] == 0.25
    assert got["first_divergence"] == {"min": 0, "median": 1, "mean": 1.0}


def test_projection_formula_and_costs(tiny_target, run):
    from draftkit.eval.costs import add_projections, project, step_costs

    # tokens/step 1 + 0.5 + 0.25 = 1.75; time/step 1.2 + 2 * 0.1 = 1.4 target steps
    assert project([0.5, 0.25], 2, 1.0, 1.2, 0.1) == pytest.approx(1.75 / 1.4)
    costs = {"rows": [{"batch_size": 1, "target_s": 1.0, "draft_s": 0.1,
                       "verify_s": {"2": 1.2}}]}
    rows = [{"method": "none", "batch_size": 1},
            {"method": "ngram", "k": 2, "batch_size": 1, "per_position": [0.5, 0.25]},
            {"method": "eagle3", "k": 2, "batch_size": 1, "per_position": [0.5, 0.25]}]
    add_projections(rows, costs)
    assert rows[0]["projected_speedup"] is None
    assert rows[1]["projected_speedup"] == pytest.approx(1.75 / 1.2)  # n-gram drafts for free
    assert rows[2]["projected_speedup"] == pytest.approx(1.75 / 1.4)
    cfg = config.load(run, ["eval.batch_sizes=[1,2]", "eval.k_values=[1,3]",
                            "eval.max_new_tokens=8"])
    draft = Eagle3Draft.from_pretrained(RunPaths(run).export, target_model=tiny_target.model)
    measured = step_costs(tiny_target.model, draft, cfg, [[1] * 20, [2] * 30])
    assert measured["context_tokens"] == 29
    assert [r["batch_size"] for r in measured["rows"]] == [1, 2]
    for r in measured["rows"]:
        assert r["target_s"] > 0 and r["draft_s"] > 0 and set(r["verify_s"]) == {"1", "3"}


def test_tokens_per_step_counts_the_steps_that_drafted_nothing():
    from draftkit.serving.counters import SpecCounters, target_steps, tokens_per_step

    # one request, six target steps: prefill (1 token), a draft with 2 accepted (3 tokens),
    # no match (1), 2 accepted (3), no match (1), 0 accepted (1): 10 tokens
    c = SpecCounters(drafts=3, draft_tokens=9, accepted=4, accepted_per_pos=[2, 2, 0])
    assert c.acceptance_length == pytest.approx(1 + 4 / 3)  # vLLM's AL: drafted steps only
    assert target_steps(10, c.accepted) == 6
    assert tokens_per_step(10, c.accepted) == pytest.approx(10 / 6)
    assert tokens_per_step(10, 0) == 1.0
