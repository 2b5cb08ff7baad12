"""RL step projection against hand-computed Amdahl on cases it was not fitted to, the published
NeMo-RL 8B synchronous case as an out-of-sample prediction, async overlap, bad inputs."""

from __future__ import annotations

import pytest

from draftkit.cli import run
from draftkit.core.errors import DraftkitError
from draftkit.step_projection import project_step, render


@pytest.mark.parametrize("share, speedup", [(0.6, 2.0), (0.3, 3.0), (0.9, 1.25), (1.0, 2.5),
                                            (0.5, 1.0), (0.75, 1e9)])
def test_sync_is_amdahl(share, speedup):
    """Amdahl by hand: a fraction f of the step speeds up s times -> 1 / ((1 - f) + f / s)."""
    step = 80.0
    p = project_step(share * step, step, speedup, "sync")
    assert p["step_speedup"] == pytest.approx(1 / ((1 - share) + share / speedup), rel=1e-9)
    assert p["step_new_s"] == pytest.approx(step * ((1 - share) + share / speedup), rel=1e-9)
    assert p["generation_new_s"] == pytest.approx(share * step / speedup)
    assert p["rollout_share"] == pytest.approx(share)


def test_sync_by_hand_with_a_non_generation_change():
    # 60 s of a 100 s step generates; 2x faster rollouts -> 30 s; a 5 s draft refit on top:
    # 30 + 40 + 5 = 75 s, 100 / 75 = 1.333x
    p = project_step(60.0, 100.0, 2.0, "sync", other_delta_s=5.0)
    assert (p["generation_new_s"], p["other_s"], p["other_new_s"]) == (30.0, 40.0, 45.0)
    assert p["step_new_s"] == pytest.approx(75.0) and p["step_speedup"] == pytest.approx(4 / 3)


def test_predicts_the_published_nemo_rl_8b_step():
    """Generation 100.0 -> 56.6 s in a 151.2 s step (Iso et al., arXiv:2604.26779): the paper
    reports the step at 107.5 s (1.41x). Pure Amdahl, fed only the generation times, predicts
    it to 0.3 s (0.3%); nothing here is solved back from 107.5."""
    p = project_step(100.0, 151.2, 100.0 / 56.6, "sync")
    assert p["step_new_s"] == pytest.approx(151.2 - 100.0 + 56.6)  # 107.8 by hand
    assert abs(p["step_new_s"] - 107.5) < 0.5
    assert abs(p["step_speedup"] - 1.41) < 0.01


def test_async_is_the_max_of_the_overlapped_parts():
    # generation 100 s, training side 51.2 s: async step = 100 s before, max(56.6, 51.2) after
    p = project_step(100.0, 151.2, 100.0 / 56.6, "async")
    assert p["step_s"] == pytest.approx(100.0) and p["step_new_s"] == pytest.approx(56.6)
    assert p["bound_by"] == "generation" and p["step_speedup"] == pytest.approx(100.0 / 56.6)
    assert p["speedup_vs_sync"] == pytest.approx(151.2 / 56.6)
    # a faster rollout than the training side: training bounds the step
    q = project_step(100.0, 151.2, 4.0, "async")
    assert q["bound_by"] == "training" and q["step_new_s"] == pytest.approx(51.2)
    assert "bound by training" in render(q)
    # training-bound already before speculation: 30 s of generation beside 70 s of training
    r = project_step(30.0, 100.0, 3.0, "async", other_delta_s=2.0)
    assert (r["step_s"], r["step_new_s"], r["bound_by"]) == (70.0, 72.0, "training")
    assert r["step_speedup"] == pytest.approx(70 / 72) and r["speedup_vs_sync"] == pytest.approx(100 / 72)


def test_bad_inputs_name_the_fix():
    with pytest.raises(DraftkitError, match="--step-s"):
        project_step(100.0, 50.0, 1.8)
    with pytest.raises(DraftkitError, match="> 0"):
        project_step(100.0, 150.0, 0.0)
    with pytest.raises(DraftkitError, match="mode"):
        project_step(100.0, 150.0, 1.8, "overlap")
    with pytest.raises(DraftkitError, match="negative"):
        project_step(100.0, 150.0, 1.8, other_delta_s=-60.0)


def test_cli_prints_the_projection(capsys):
    # 60 s of 100 s at 2x -> 70 s (1.43x), hand-computed above
    assert run(["project", "--generation-s", "60", "--step-s", "100",
                "--rollout-speedup", "2"]) == 0
    out = capsys.readouterr().out
    assert "100.0 s ->     70.0 s (1.43x)" in out and "60.0 s ->     30.0 s (2.00x)" in out
