"""RL step projection: the published NeMo-RL 8B synchronous case, async overlap, bad inputs."""

from __future__ import annotations

import pytest

from draftkit.cli import run
from draftkit.core.errors import DraftkitError
from draftkit.rl.project import project_step, render


def test_reproduces_the_nemo_rl_8b_synchronous_case():
    # Inputs: step 151.2 s of which generation 100.0 s; generation 100.0 -> 56.6 s with EAGLE-3;
    # the non-generation stages took 0.3 s less in the speculative run (see project.py).
    p = project_step(100.0, 151.2, 100.0 / 56.6, "sync", other_delta_s=-0.3)
    assert p["generation_new_s"] == pytest.approx(56.6)
    assert p["step_new_s"] == pytest.approx(107.5)
    assert round(p["step_speedup"], 2) == 1.41
    # Pure Amdahl (no change outside generation) gives 107.8 s, 1.40x: the 0.3 s is real input.
    pure = project_step(100.0, 151.2, 100.0 / 56.6, "sync")
    assert pure["step_new_s"] == pytest.approx(107.8)
    assert round(pure["step_speedup"], 2) == 1.40


def test_async_is_the_max_of_the_overlapped_parts():
    # generation 100 s, training side 51.2 s: async step = 100 s before, max(56.6, 51.2) after
    p = project_step(100.0, 151.2, 100.0 / 56.6, "async")
    assert p["step_s"] == pytest.approx(100.0) and p["step_new_s"] == pytest.approx(56.6)
    assert p["bound_by"] == "generation"
    assert p["speedup_vs_sync"] == pytest.approx(151.2 / 56.6)
    # a faster rollout than the training side: training bounds the step
    q = project_step(100.0, 151.2, 4.0, "async")
    assert q["bound_by"] == "training" and q["step_new_s"] == pytest.approx(51.2)
    assert "bound by training" in render(q)


def test_bad_inputs_name_the_fix():
    with pytest.raises(DraftkitError, match="--step-s"):
        project_step(100.0, 50.0, 1.8)
    with pytest.raises(DraftkitError, match="> 0"):
        project_step(100.0, 150.0, 0.0)
    with pytest.raises(DraftkitError, match="mode"):
        project_step(100.0, 150.0, 1.8, "overlap")


def test_cli_prints_the_projection(capsys):
    assert run(["project", "--generation-s", "100", "--step-s", "151.2",
                "--rollout-speedup", str(100 / 56.6), "--other-delta-s", "-0.3"]) == 0
    out = capsys.readouterr().out
    assert "151.2 s ->    107.5 s (1.41x)" in out
