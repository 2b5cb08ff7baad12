"""The README's Python examples, run as written (tests/test_docs.py checks that every python block
of the README and docs/ is run by a test or labelled as why not):
- `readme-python`: the smoke lifecycle, init -> prepare -> harvest -> train -> export -> eval on
  tiny-llama with the block's own small budgets (no vLLM), in a temp working dir: each stage's
  artifacts exist, and eval's Markdown report links `draftkit diagnose` exactly when its JSON
  does;
- `export-in-vllm` (README and docs/lifecycle.md): the `LLM(...)` line, with `LLM` recording
  what it is given and `<name>` the smoke run: it names that run's export, and the method, k
  and draft sampling its speculative_config.json holds."""

from __future__ import annotations

import json

import pytest
from _runs import one_thread
from test_docs import example

from draftkit.core import config
from draftkit.core.artifacts import RunPaths


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The README's Python example, exec'd in a fresh working dir: its run dir."""
    import os

    cwd, old = tmp_path_factory.mktemp("readme-python"), os.getcwd()
    names: dict = {}
    os.chdir(cwd)
    try:
        with one_thread():
            exec(example("README.md", "readme-python"), names)  # noqa: S102 - the README's code
    finally:
        os.chdir(old)
    return cwd / names["run"]


@pytest.mark.slow
def test_readme_python_example_runs_the_lifecycle(smoke_run):
    paths = RunPaths(smoke_run)
    cfg = config.load(smoke_run)
    assert (cfg.target.name, cfg.data.source, cfg.train.max_steps) == ("tiny-llama", "local", 4)
    assert (paths.data / "train").is_dir() and list(paths.harvest.rglob("*.safetensors"))
    assert (paths.train / "best" / "meta.json").is_file()
    assert (paths.export / "speculative_config.json").is_file()
    reports = sorted(paths.eval.glob("eval-*.json"))
    assert len(reports) == 1
    rep = json.loads(reports[0].read_text())
    assert [r["k"] for r in rep["reference"]["rows"]] == [3, 3]  # the block's eval budget
    md = reports[0].with_suffix(".md").read_text()
    assert (rep["diagnose"] is not None) == ("draftkit diagnose" in md)
    if rep["diagnose"]:
        assert rep["diagnose"]["command"] in md


@pytest.mark.slow
def test_the_llm_line_names_what_the_export_writes(smoke_run):
    written = json.loads((RunPaths(smoke_run).export / "speculative_config.json").read_text())
    seen: list[dict] = []
    for page in ("README.md", "docs/lifecycle.md"):  # the same line on both pages
        exec(example(page, "export-in-vllm"),  # noqa: S102 - the page's own line
             {"LLM": lambda **kw: seen.append(kw), "TARGET": "tiny-llama"})
    assert example("README.md", "export-in-vllm") == example("docs/lifecycle.md", "export-in-vllm")
    spec = dict(seen[0]["speculative_config"])
    model = spec.pop("model").replace("runs/<name>", str(smoke_run))
    assert model == str(RunPaths(smoke_run).export) and len(seen) == 2
    assert spec == {k: written[k] for k in spec}, (spec, written)
