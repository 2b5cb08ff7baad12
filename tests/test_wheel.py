"""A wheel that works: `pip wheel` of a copy of the repository, installed with `pip install
--target` into a fresh directory (no editable install), used from elsewhere. `draftkit init`
must find configs/ and data_recipes/ (and the recipes' offline samples) inside the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".git", ".venv", "runs", "wandb", "results", "build", "*.egg-info",
                              "__pycache__", ".pytest_cache", ".ruff_cache", "tests")

CHECK = """
import json, sys, tempfile
import draftkit
from draftkit.core.config import DataConfig
from draftkit.core.resources import recipes_dir
from draftkit.prepare import recipes, sources

recipe = recipes.load_recipe("chat")  # local samples: jsonl files beside the recipe
with tempfile.TemporaryDirectory() as tmp:
    mix = sources.load_mix(recipe, DataConfig(source="local", eval_samples=2), tmp)
print(json.dumps({"package": draftkit.__file__, "recipes": str(recipes_dir()),
                  "recipe": str(recipe.path), "train": len(mix.train), "eval": len(mix.eval)}))
"""


def _run(args: list[str], cwd: Path, env: dict) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{args} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.mark.slow
def test_installed_wheel_inits_offline(tmp_path):
    src, wheels, site, work = (tmp_path / n for n in ("src", "wheels", "site", "work"))
    shutil.copytree(REPO, src, symlinks=True, ignore=SKIP)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
         tmp_path, env)
    (wheel,) = wheels.glob("draftkit-*.whl")
    _run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], tmp_path, env)
    assert (site / "bin" / "draftkit").is_file()
    shutil.rmtree(src)  # nothing may read the source tree any more
    work.mkdir()
    env["PYTHONPATH"] = str(site)  # ahead of the venv's editable draftkit (a meta-path finder)

    info = json.loads(_run([sys.executable, "-c", CHECK], work, env))
    assert Path(info["package"]).is_relative_to(site), info
    assert Path(info["recipes"]).is_relative_to(site) and info["recipe"].startswith(str(site))
    assert info["train"] > 0 and info["eval"] == 2

    cli = [sys.executable, "-m", "draftkit.cli", "init"]
    out = _run([*cli, "--target", "Qwen3-8B", "--data", "math"], work, env)
    assert "needs downloading before prepare: Qwen/Qwen3-8B" in out
    qwen = (work / "runs" / "qwen3-8b-math-eagle3" / "draftkit.yaml").read_text()
    assert "max_seq_len: 4096" in qwen  # configs/eagle3-qwen3.yaml was applied
    _run([*cli, "--target", "smollm2-135m", "--data", "math"], work, env)
    smol = (work / "runs" / "smollm2-135m-math-eagle3" / "draftkit.yaml").read_text()
    assert "draft_vocab_size: 4096" in smol  # configs/eagle3-smollm2-135m.yaml was applied
