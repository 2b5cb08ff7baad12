"""benchmarks/serving/goals.py (scripts/bench_goals.py): the draft each (T, batch) gets is
chosen on the own split only, and the goal ratio is its tokens/s over the better of n-gram and
suffix decoding in each split."""

from __future__ import annotations

import pytest

from benchmarks.serving import goals as goals_module


def _row(label, method, k, split, temp, b, tps):
    return {"label": label, "method": method, "k": k, "split": split, "temperature": temp,
            "batch_size": b, "tokens_per_s": tps, "tokens_per_step": 1.5,
            "acceptance_length": None if method == "none" else 2.0}


@pytest.fixture(scope="module")
def goals():
    return goals_module


def test_choice_on_the_own_split_and_ratio_over_the_better_free_method(goals, tmp_path):
    rows = []
    for split in ("unseen-templates", "hand-written"):
        rows += [_row("none", "none", None, split, 0.0, 8, 100.0),
                 _row("ngram", "ngram", 3, split, 0.0, 8, 120.0),
                 _row("suffix", "suffix", 3, split, 0.0, 8, 110.0)]
    # on the own split k=1 wins (140 > 130); on hand-written k=3 would win, but is not chosen
    rows += [_row("demo (eagle3)", "eagle3", 1, "unseen-templates", 0.0, 8, 140.0),
             _row("demo (eagle3)", "eagle3", 3, "unseen-templates", 0.0, 8, 130.0),
             _row("demo (eagle3)", "eagle3", 1, "hand-written", 0.0, 8, 126.0),
             _row("demo (eagle3)", "eagle3", 3, "hand-written", 0.0, 8, 200.0),
             {"label": "suffix", "method": "suffix", "k": 3, "split": "hand-written",
              "temperature": 1.0, "batch_size": 8, "unavailable": "no arctic"}]
    choice = goals.choose(rows)
    assert choice == {"0/8": {"label": "demo (eagle3)", "k": 1}}
    out = {g["split"]: g for g in goals.goals(rows, choice)}
    assert out["unseen-templates"]["ratio"] == pytest.approx(140 / 120)
    assert out["unseen-templates"]["met"] and out["unseen-templates"]["goal"] == 1.1
    assert out["hand-written"]["ratio"] == pytest.approx(126 / 120)
    assert not out["hand-written"]["met"] and out["hand-written"]["best_free"] == "ngram"
    bench = {"rows": rows, "choice": choice, "goals": list(out.values()), "argv": ["x"],
             "smoke": False, "target": "tiny", "k_free": 3, "git_sha": "abcdef0",
             "hardware": {"cpu_model": "cpu", "cpu_count": 2, "cpu_native_bf16": True},
             "seconds": 60.0, "dtype": "bfloat16", "prompts": {"batch_1": 4, "batch_gt_1": 16},
             "max_new_tokens": 128}
    md = goals.markdown(bench)
    assert "| 0 | 8 | hand-written | demo (eagle3) k=1 | 126.0 (1.26x;" in md
    assert "**1.05x** | 1.1x | no |" in md and "1 of 2 cells meet their goal" in md
    assert "not measured: no arctic" in md
    goals.plot(bench, tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 0


def test_batch_one_goal_is_higher(goals):
    rows = [_row("none", "none", None, "unseen-templates", 0.0, 1, 10.0),
            _row("ngram", "ngram", 3, "unseen-templates", 0.0, 1, 15.0),
            _row("suffix", "suffix", 3, "unseen-templates", 0.0, 1, 20.0),
            _row("d", "eagle3", 3, "unseen-templates", 0.0, 1, 24.0)]
    (g,) = goals.goals(rows, goals.choose(rows))
    assert g["goal"] == 1.3 and g["ratio"] == pytest.approx(1.2) and not g["met"]
    assert g["best_free"] == "suffix"


def test_the_exported_choice_is_a_row_against_none_and_the_free_methods(goals):
    """serving.json's engine (label CHOICE) is measured beside the rest: it is no candidate
    draft and no free method, and each cell says its speed over no speculation (goal 1.0x
    everywhere) and over the better free method (1.1x at batch 8 and 16)."""
    rows = []
    for temp, none, ngram, mine in ((0.0, 100.0, 120.0, 140.0), (1.0, 100.0, 95.0, 99.0)):
        rows += [_row("none", "none", None, "unseen-templates", temp, 8, none),
                 _row("ngram", "ngram", 3, "unseen-templates", temp, 8, ngram),
                 _row("demo (eagle3)", "eagle3", 1, "unseen-templates", temp, 8, 90.0),
                 _row(goals.CHOICE, "eagle3", 3, "unseen-templates", temp, 8, mine)]
    rows.append(_row(goals.CHOICE, "eagle3", 3, "unseen-templates", 0.0, 32, 50.0))  # no none
    assert goals.choose(rows) == {"0/8": {"label": "demo (eagle3)", "k": 1},
                                  "1/8": {"label": "demo (eagle3)", "k": 1}}
    assert all(g["best_free"] == "ngram" for g in goals.goals(rows, goals.choose(rows)))
    got = {g["temperature"]: g for g in goals.choice_goals(rows)}
    assert set(got) == {0.0, 1.0}  # batch 32 has no none row: no cell
    assert got[0.0]["vs_none"] == pytest.approx(1.4) and got[0.0]["met_none"]
    assert got[0.0]["vs_free"] == pytest.approx(140 / 120) and got[0.0]["met_free"]
    assert got[1.0]["vs_none"] == pytest.approx(0.99) and not got[1.0]["met_none"]
    bench = {"exported": {"schedule": {"speculative_config": {
        "method": "eagle3", "num_speculative_tokens_per_batch_size": [[1, 7, 3], [8, 8, 0]]}},
        "rule": "the rule", "measured": {"temperatures": [0, 1]}},
        "choice_goals": goals.choice_goals(rows)}
    md = "\n".join(goals.choice_markdown(bench))
    assert "[[1, 7, 3], [8, 8, 0]]" in md and "the rule" in md
    assert "| 1 | 8 | unseen-templates | 99.0 (0.99x;" in md and "**0.99x** | ngram | 1.04x" in md
    assert "No slower than no speculation in 1 of 2 cells; every goal met in 1 of 2." in md
    assert "Not measured: run eval" in "\n".join(goals.choice_markdown(
        {"exported": None, "exported_missing": "run eval"}))
