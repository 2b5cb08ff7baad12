"""docs/qwen3-8b.md runs as written: its plan commands (in a fresh working directory, offline:
Qwen3-8B's shapes come from the registry) print the plan lines the page shows for the
machine-independent parts (tokens, bytes, disk arithmetic), and its own-prompts recipe and
JSONL row load and init a run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from test_docs import split_fences

from draftkit import cli
from draftkit.core import config
from draftkit.prepare.recipes import load_recipe

PAGE = Path(__file__).resolve().parents[1] / "docs" / "qwen3-8b.md"


def blocks(info: str) -> list[list[str]]:
    return [lines for kind, lines in split_fences(PAGE.read_text())[1] if kind == info]


def run_cli(capsys, line: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(shlex.split(line, comments=True)[1:])
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    return out.out


def test_the_plan_commands_print_the_plan_the_page_shows(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = next(b for b in blocks("bash") if b[0].startswith("draftkit init --target Qwen3"))
    outs = [run_cli(capsys, line) for line in commands]
    shown = next(b for b in blocks("text") if b[0].startswith("plan for qwen3-8b-math-eagle3"))
    for prefix in ("plan for", "  data", "  regenerate", "  harvest"):
        line = next(x for x in shown if x.startswith(prefix))
        assert line in outs[0].splitlines(), line
    assert "ESTIMATE" in outs[1] and "4,000 train + 200 eval" in outs[2]
    assert "  time " in outs[0] and "  speeds " in outs[0]


def test_the_h200_plan_is_the_stored_profile_s(tmp_path, monkeypatch, capsys):
    """The page's H200 lines are what `--hardware h200` prints from the stored profile, and the
    commits it names are the profile's runs."""
    from draftkit.init import profiles

    monkeypatch.chdir(tmp_path)
    run_cli(capsys, "draftkit init --target Qwen3-8B --data math")
    commands = next(b for b in blocks("bash") if "--hardware h200" in b[0])
    outs = [run_cli(capsys, line) for line in commands]
    shown = next(b for b in blocks("text") if b[0].startswith("  memory      harvest 18"))
    for line in shown:
        assert line in outs[0].splitlines(), line
    assert "16,416 B" in outs[1] and "16,416 B per token" in PAGE.read_text()
    commits = [r["commit"] for r in profiles.get("h200")["runs"]]
    text = " ".join(PAGE.read_text().split())
    assert f"from the runs at commits {', '.join(commits[:-1])} and {commits[-1]}" in text


def test_the_own_prompts_recipe_loads_and_inits(tmp_path, monkeypatch, capsys):
    recipe = next(b for b in blocks("yaml") if b[0] == "# my-prompts.yaml")
    (tmp_path / "my-prompts.yaml").write_text("\n".join(recipe) + "\n")
    row = json.loads("\n".join(blocks("json")[0]))
    assert row["messages"][-1]["role"] == "user"  # a prompt: the target writes the answer
    (tmp_path / "my_prompts.jsonl").write_text(json.dumps(row) + "\n")
    rec = load_recipe(str(tmp_path / "my-prompts.yaml"))
    assert rec.resolve(rec.sources[0].files[0]).is_file()
    assert yaml.safe_load("\n".join(recipe))["max_samples"] == rec.max_samples == 20000
    monkeypatch.chdir(tmp_path)
    line = next(x for b in blocks("bash") for x in b if "--data my-prompts.yaml" in x)
    out = run_cli(capsys, line)
    assert "plan for q8-mine" in out
    assert config.load(tmp_path / "runs" / "q8-mine").data.recipe == "my-prompts.yaml"
