"""`make demo`'s summary: the head's vLLM tokens per target step at T=0 and T=1 per batch come
first (and as one printed line); the DFlash sibling is trained only with `--dflash`. The flow
runs scripts/demo.py's main with the stages replaced by recorders (no training, no vLLM)."""

from __future__ import annotations

import json
import types

from _runs import script


def _row(method, t, b, tps, k=3):
    return {"method": method, "k": k, "temperature": t, "batch_size": b, "tokens_per_step": tps,
            "acceptance_length": tps, "per_position": [0.5], "tokens_per_s": 10.0,
            "speedup": 1.0}


REPORT = {"draft": {"kind": "eagle3", "sample_method": "probabilistic"},
          "vllm": {"rows": [_row("none", 0.0, 8, None, None), _row("ngram", 1.0, 8, 1.3),
                            _row("eagle3", 0.0, 1, 2.05), _row("eagle3", 0.0, 8, 1.9),
                            _row("eagle3", 1.0, 1, 1.7), _row("eagle3", 1.0, 8, 1.62),
                            _row("eagle3", 1.0, 8, 1.4, k=2)]}}


def test_summary_leads_with_the_heads_tokens_per_target_step_at_t0_and_t1():
    demo = script("demo")
    tps = demo._summary(REPORT)["tokens_per_target_step"]
    assert tps == {"method": "eagle3", "draft_sample_method": "probabilistic",
                   "T=0": {"batch_1": 2.05, "batch_8": 1.9},
                   "T=1": {"batch_1": 1.7, "batch_8": 1.62}}
    line = demo.headline(tps)
    assert "T=1 b1 1.70, b8 1.62" in line and "T=0 b1 2.05, b8 1.90" in line
    assert "not measured" in demo.headline(demo.tokens_per_step({"vllm": {"rows": []}}))


def test_demo_trains_the_dflash_sibling_only_with_the_flag(tmp_path, monkeypatch, capsys):
    demo = script("demo")
    calls = []

    def stage(name):
        def run(run_dir, overrides=()):
            calls.append((name, run_dir.name, [o for o in overrides if "compare_runs" in o]))
            return REPORT if name == "evaluate" else None
        return run

    fake = types.SimpleNamespace(init=lambda *a, **k: None,
                                 **{s: stage(s) for s in ("prepare", "harvest", "train",
                                                          "export", "evaluate")})
    monkeypatch.setattr(demo, "api", fake)
    monkeypatch.setattr(demo, "dflash_run", lambda run, *a: calls.append(("sibling",)) or
                        run.parent / f"{run.name}-dflash")
    monkeypatch.setattr(demo, "dflash_overrides", lambda run, o, *a: list(o))
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "draftkit.yaml").write_text("{}")  # init is skipped: the run exists
    assert demo.main(["--dir", str(tmp_path), "--name", "demo"]) == 0
    # the last export copies eval's pick (<run>/eval/choice.json) into the export
    assert [c[0] for c in calls] == ["prepare", "harvest", "train", "export", "evaluate",
                                     "export"]
    assert calls[-2][2] == []  # no compared run
    out = capsys.readouterr().out
    assert "eagle3 tokens per target step" in out and "T=1 b1 1.70, b8 1.62" in out
    saved = json.loads((tmp_path / "demo" / "demo-summary.json").read_text())
    assert saved["tokens_per_target_step"]["T=1"]["batch_8"] == 1.62
    calls.clear()
    assert demo.main(["--dir", str(tmp_path), "--name", "demo", "--dflash"]) == 0
    names = [c[0] for c in calls]
    assert names[:5] == ["prepare", "harvest", "train", "export", "sibling"]
    assert [(c[0], c[1]) for c in calls[5:8]] == [("harvest", "demo-dflash"),
                                                  ("train", "demo-dflash"),
                                                  ("export", "demo-dflash")]
    assert calls[-2][0] == "evaluate" and "demo-dflash" in calls[-2][2][0]
    assert calls[-1][:2] == ("export", "demo")
