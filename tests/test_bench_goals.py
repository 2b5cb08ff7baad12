"""benchmarks/serving/goals.py and goals_report.py (scripts/bench_goals.py): the draft each
(T, batch) gets is chosen on the own split only, and the goal ratio is its tokens/s over the
better of n-gram and suffix decoding in each split."""

from __future__ import annotations

import pytest

from benchmarks.serving import goals as goals_module
from benchmarks.serving import goals_report


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
    md = goals_report.markdown(bench)
    assert "| 0 | 8 | hand-written | demo (eagle3) k=1 | 126.0 (1.26x;" in md
    assert "**1.05x** | 1.1x | no |" in md and "1 of 2 cells meet their goal" in md
    assert "not measured: no arctic" in md
    goals_report.plot(bench, tmp_path / "g.png")
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
    md = "\n".join(goals_report.choice_markdown(bench))
    assert "[[1, 7, 3], [8, 8, 0]]" in md and "the rule" in md
    assert "| 1 | 8 | unseen-templates | 99.0 (0.99x;" in md and "**0.99x** | ngram | 1.04x" in md
    assert "No slower than no speculation in 1 of 2 cells; every goal met in 1 of 2." in md
    assert "Not measured: run eval" in "\n".join(goals_report.choice_markdown(
        {"exported": None, "exported_missing": "run eval"}))


SERVING = {"schedule": None, "rule": "the rule", "measured": {},
           "ranges": [{"batch_from": 1, "batch_to": 7, "method": "eagle3", "k": 3},
                      {"batch_from": 8, "batch_to": 15, "method": "suffix", "k": 3},
                      {"batch_from": 16, "batch_to": None, "method": "none", "k": None}]}


def _ranged_rows(goals):
    rows = []
    for b, none, suffix, mine, other in ((1, 10.0, 12.0, 15.0, 30.0), (8, 80.0, 84.0, 60.0, 90.0),
                                         (16, 120.0, 90.0, 70.0, 130.0)):
        rows += [_row("none", "none", None, "hand-written", 1.0, b, none),
                 _row("suffix", "suffix", 3, "hand-written", 1.0, b, suffix),
                 _row("demo (eagle3)", "eagle3", 3, "hand-written", 1.0, b, mine),
                 _row("demo (eagle3)", "eagle3", 1, "hand-written", 1.0, b, mine + 1),
                 _row("other (eagle3)", "eagle3", 3, "hand-written", 1.0, b, other)]
    return rows


def test_serving_json_ranges_are_the_rows_of_the_method_each_range_names(goals):
    """No engine of their own: per batch the run's draft at the range's k (never another run's
    draft of the same method, never another k), the free method, or no speculation; a range
    this run did not measure is a row saying so."""
    rows = _ranged_rows(goals)
    got = {r["batch_size"]: r for r in goals.range_rows(SERVING, rows, "demo (eagle3)")}
    assert {b: r["tokens_per_s"] for b, r in got.items()} == {1: 15.0, 8: 84.0, 16: 120.0}
    assert {r["label"] for r in got.values()} == {goals.PER_RANGE}
    assert (got[8]["method"], got[16]["method"]) == ("suffix", "none")
    cells = {g["batch_size"]: g for g in goals.choice_goals([*rows, *got.values()],
                                                            goals.PER_RANGE)}
    assert cells[1]["vs_none"] == pytest.approx(1.5) and cells[1]["met_none"]
    assert cells[8]["vs_none"] == pytest.approx(84 / 80) and not cells[8]["met_free"]  # 1.0x
    assert cells[16]["vs_none"] == 1.0 and cells[16]["met_free"]  # 120 / 90 >= 1.1
    unmeasured = {**SERVING, "ranges": [{"batch_from": 1, "batch_to": None, "method": "eagle3",
                                         "k": 2}]}
    (r, *_) = goals.range_rows(unmeasured, rows, "demo (eagle3)")
    assert "did not measure it" in r["unavailable"] and r["k"] == 2
    assert goals.range_rows({**SERVING, "ranges": []}, rows, "demo (eagle3)") == []
    # the derived rows are no candidate draft and no free method
    assert goals.choose([*rows, *got.values()]) == goals.choose(rows)


def test_render_rebuilds_the_analysis_from_a_written_result(goals, tmp_path):
    """scripts/bench_goals.py --render: a result written before the ranges were rows gets them
    (its --run read from its argv), twice gives the same rows, the report names both commits,
    and the README's headline shows the ranges as one row."""
    from benchmarks import headline
    from draftkit.core import artifacts

    old = {"rows": _ranged_rows(goals), "argv": ["scripts/bench_goals.py", "--run", "runs/demo"],
           "smoke": False, "exported": SERVING, "exported_missing": None, "target": "tiny",
           "k_free": 3, "git_sha": "1234567abc", "seconds": 60.0, "dtype": "float32",
           "hardware": {"cpu_model": "cpu", "cpu_count": 2, "cpu_native_bf16": False},
           "prompts": {"batch_1": 2, "batch_gt_1": 16}, "max_new_tokens": 64}
    artifacts.write_json_atomic(tmp_path / "in.json", old)
    argv = ["scripts/bench_goals.py", "--render", "in.json"]
    assert goals_report.render(tmp_path / "in.json", tmp_path / "out", argv) == 0
    first = artifacts.read_json(tmp_path / "out" / "bench_goals.json")
    ranged = [r for r in first["rows"] if r["label"] == goals.PER_RANGE]
    assert len(ranged) == 3 and len(first["range_goals"]) == 3
    goals_report.render(tmp_path / "out" / "bench_goals.json", tmp_path / "again", argv)
    assert artifacts.read_json(tmp_path / "again" / "bench_goals.json")["rows"] == first["rows"]
    md = (tmp_path / "out" / "bench_goals.md").read_text()
    assert "at code `1234567`. Analysis rebuilt from its rows by `python scripts/bench_goals.py " \
           "--render in.json`" in md
    assert "serving.json's ranges: eagle3 k=3 at batch 1-7, suffix k=3 at batch 8-15, none at " \
           "batch 16+" in md
    assert "| 1 | 16 | hand-written | 120.0 (1.00x; 1.50 tok/step; AL –) | **1.00x** | suffix " \
           "| 1.33x" in md
    table = headline.table(first)
    assert "| exported per range | 1.50x (1.50) | 1.05x (1.50) | 1.00x (1.50) |" in table
    assert "| no speculation (tok/s) | 10.0 | 80.0 | 120.0 |" in table


def test_bench_goals_takes_run_or_render(goals):
    from _runs import script

    bench = script("bench_goals")
    assert bench.parse(["--render", "r.json"]).render.name == "r.json"
    for argv in ([], ["--run", "runs/demo", "--render", "r.json"]):
        with pytest.raises(SystemExit):
            bench.parse(argv)
