"""`draftkit eval` without vLLM: bad inputs give clear errors before any engine starts, and the
reference engine writes the report files and plots from a tiny-llama run with a random EAGLE-3
export."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from draftkit.core import artifacts, config
from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError
from draftkit.core.init import init_run
from draftkit.drafts.eagle3.model import Eagle3Draft
from draftkit.drafts.eagle3.vocab import DraftVocab
from draftkit.eval.stage import compare, evaluate
from draftkit.export import stage as export
from draftkit.serving import vllm_engine

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread


AUX = [1, 3, 5]




def make_run(root: Path, target_model, tokenizer, n_prompts: int = 4, export_draft: bool = True):
    """A tiny-llama eagle3 run with an eval split and (optionally) a random EAGLE-3 export."""
    import datasets

    run = init_run("tiny-llama", "math", runs_dir=root, name="tiny-eval", overrides=[
        f"draft.aux_layer_ids={AUX}", "draft.draft_vocab_size=256", "data.source=offline"])
    words = "apples books cookies students dollars hours".split()
    prompts = []
    for i in range(n_prompts):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{words[i % 6]} {i * 7} each day, how many?"}],
            add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    rows = {"id": [str(i) for i in range(n_prompts)], "prompt_ids": prompts,
            "length": [len(p) for p in prompts]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(RunPaths(run).data / "eval"))
    if export_draft:
        cfg = config.load(run)
        counts = torch.randint(0, 1000, (512,), generator=torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        draft = Eagle3Draft.from_run_config(cfg, DraftVocab.build(counts, 256), target_model)
        out = RunPaths(run).export
        draft.save_pretrained(out)
        artifacts.write_json_atomic(out / "speculative_config.json",
                                    export.speculative_config(cfg.draft.num_speculative_tokens))
    return run


@pytest.fixture()
def run(tmp_path, tiny_target):
    return make_run(tmp_path, tiny_target.model, tiny_target.tokenizer)


def test_missing_export_names_the_export_command(tmp_path, tiny_target):
    run = make_run(tmp_path, tiny_target.model, tiny_target.tokenizer, export_draft=False)
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
                       f"eval.results_dir={tmp_path / 'results'}"])


def test_bad_eval_settings_are_refused(run):
    with pytest.raises(DraftkitError, match="eval.engine"):
        evaluate(run, ["eval.engine=sglang"])
    with pytest.raises(DraftkitError, match="eval.k_values"):
        evaluate(run, ["eval.k_values=[0]"])


def test_reference_engine_writes_report_and_plots(run, tmp_path):
    results = tmp_path / "results"
    rep = evaluate(run, ["eval.engine=reference", "eval.k_values=[1,3]",
                         "eval.temperatures=[0,1]", "eval.num_prompts=3",
                         "eval.max_new_tokens=12", "eval.reference_prompts=2",
                         f"eval.results_dir={results}"])
    rows = rep["reference"]["rows"]
    assert [(r["k"], r["temperature"]) for r in rows] == [(1, 0.0), (1, 1.0), (3, 0.0), (3, 1.0)]
    for r in rows:
        assert r["acceptance_length"] >= 1.0 and r["prompts"] == 2 and r["drafts"] > 0
        assert len(r["per_position"]) == r["k"]
        assert all(a >= b for a, b in pairwise(r["accepted_per_pos"]))
    files = rep["files"]
    assert set(files) == {"json", "md", "per_position", "al_vs_k"}  # no timings: no speedup plot
    for path in files.values():
        assert Path(path).is_file() and Path(path).stat().st_size > 0
        assert Path(path).parent == results
    saved = json.loads(Path(files["json"]).read_text())
    assert saved["reference"]["rows"] == json.loads(json.dumps(rows))
    assert (RunPaths(run).eval / Path(files["md"]).name).is_file()
    assert json.loads((RunPaths(run).eval / "meta.json").read_text())["stage"] == "eval"
    assert "| 3 | 1 | 2 |" in Path(files["md"]).read_text()


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
