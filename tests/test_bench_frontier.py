"""benchmarks/learning/frontier.py (scripts/bench_frontier.py): the cost of each bench_learning
setting, the AL frontier over cost, its log-linear fit and projections, on hand-built JSONs."""

import json
import math

import pytest
from _runs import script

from benchmarks.learning import frontier as frontier_mod


def _rows(setting: str, als: dict[str, float], method: str = "eagle3", tokens: int = 100) -> list:
    return [{"setting": setting, "split": s, "method": method, "temperature": 0.0, "prompts": 16,
             "output_tokens": tokens, "acceptance_length": al} for s, al in als.items()]


def _setting(data: str, prepare: float, harvest: float, cpu: float, n: int = 100) -> dict:
    return {"run": f"runs/x-{data}-{cpu}", "data": data, "harvest": "own", "conversations": n,
            "prepare_s": prepare, "harvest_s": harvest, "cpu_s": cpu}


def _bench(source: str, settings: dict, als: dict, ngram_tokens: int = 100) -> dict:
    rows = _rows("ngram", {"unseen-templates": 2.2, "seen-templates": 2.1}, "ngram", ngram_tokens)
    for name, a in als.items():
        rows += _rows(name, a, tokens=ngram_tokens)
    return {"source": source, "hardware": {"cpu_count": 2, "cpu_model": "Test CPU"},
            "settings": settings, "vllm": {"rows": rows}}


def _als(unseen: float, seen: float) -> dict:
    return {"unseen-templates": unseen, "seen-templates": seen}


def test_costs_frontier_fit_and_projection():
    # unseen AL rises by exactly 0.1 per doubling of total cost from the baseline (1000 CPU-s)
    a = _bench("runs/src", {
        "baseline": _setting("source", 300, 100, 200),  # 2 * 400 + 200 = 1000
        "worse": _setting("source", 300, 100, 250),  # 1050, lower AL: off the frontier
        "big": _setting("own", 700, 300, 2000),  # 2 * 1000 + 2000 = 4000
    }, {"baseline": _als(1.8, 2.0), "worse": _als(1.7, 1.9), "big": _als(2.0, 2.3)})
    b = _bench("runs/src", {
        # reuses the source's regeneration: charged its prepare (300, from file a) too
        "copies": _setting("source + copies", 5, 295, 800),  # 2 * (300 + 5 + 295) + 800 = 2000
        "baseline": _setting("source", 300, 100, 210),  # a rerun: same AL, kept once (cheapest)
    }, {"copies": _als(1.9, 2.2), "baseline": _als(1.8, 2.0)})
    other = _bench("runs/src", {"x": _setting("own", 1, 1, 1)}, {"x": _als(3.0, 3.0)},
                   ngram_tokens=99)  # other prompts
    out = frontier_mod.frontier({"a.json": a, "b.json": b, "o.json": other}, "a.json", 0.0,
                                goal=2.8, demo="baseline")

    costs = {p["setting"]: p["total_cpu_s"] for p in out["points"]}
    assert costs == {"baseline": 1000.0, "worse": 1050.0, "big": 4000.0, "copies": 2000.0}
    assert out["skipped"] == {"o.json": "other eval prompts or temperature"}
    assert out["demo_cpu_s"] == 1000.0
    unseen = out["splits"]["unseen-templates"]
    assert [n for n, _, _ in unseen["frontier"]] == ["baseline (100)", "copies (100)", "big (100)"]
    assert unseen["fit"]["per_doubling"] == pytest.approx(0.1)
    assert unseen["ngram_al"] == 2.2
    assert unseen["cpu_s_at_ngram"] == pytest.approx(1000 * 2 ** 4)  # 1.8 + 4 * 0.1 = 2.2
    assert unseen["cpu_s_at_goal"] == pytest.approx(1000 * 2 ** 10)
    seen = out["splits"]["seen-templates"]
    assert seen["fit"]["per_doubling"] == pytest.approx(0.15)  # 2.0, 2.2, 2.3: least squares
    md = frontier_mod.markdown(out)
    assert "| copies | b | 100 | 600 | 800 | 2000 | 1.90 | 2.20 |" in md


def test_reused_source_without_a_recorded_prepare_is_skipped_not_guessed():
    a = _bench("runs/src", {"copies": _setting("source + copies", 5, 295, 800)},
               {"copies": _als(1.9, 2.2)})
    out = frontier_mod.frontier({"a.json": a}, "a.json", 0.0, goal=2.8, demo="baseline")
    assert out["points"] == []
    assert out["skipped"] == {"a.json:copies": "its source's prepare time is not on record"}
    a["settings"]["copies"]["source_prepare_s"] = 300  # the record names it: used
    out = frontier_mod.frontier({"a.json": a}, "a.json", 0.0, goal=2.8, demo="baseline")
    assert [p["total_cpu_s"] for p in out["points"]] == [2000.0]
    assert out["splits"]["unseen-templates"]["fit"] is None  # one point: no slope


def test_fit_that_never_rises_projects_nothing():
    f = frontier_mod.fit([{"total_cpu_s": 1000, "al": {"s": 2.0}},
                          {"total_cpu_s": 2000, "al": {"s": 1.9}}], "s")
    assert f["per_doubling"] == pytest.approx(-0.1)
    assert frontier_mod.cpu_for(f, 2.5) is None
    assert math.isclose(frontier_mod.cpu_for({"a": 0.0, "per_doubling": 1.0}, 3.0), 8.0)


def test_main_writes_the_report(tmp_path, capsys):
    a = _bench("runs/src", {"baseline": _setting("source", 300, 100, 200),
                            "big": _setting("own", 700, 300, 2000)},
               {"baseline": _als(1.8, 2.0), "big": _als(2.0, 2.3)})
    path = tmp_path / "a.json"
    path.write_text(json.dumps(a))
    driver = script("bench_frontier")  # the thin driver: its flags, then the report
    assert driver.main([str(path), "--like", str(path), "--out", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / "bench_frontier.json").read_text())
    assert saved["splits"]["unseen-templates"]["fit"]["per_doubling"] == pytest.approx(0.1)
    assert (tmp_path / "out" / "bench_frontier.png").stat().st_size > 0
    assert driver.main(["--like", str(tmp_path / "missing.json")]) == 2
    assert "cannot read a bench_learning JSON" in capsys.readouterr().err
