"""The demo's DFlash row (scripts/demo.py `dflash_run`, eval.compare_runs): the sibling run reads
the head run's prepared data and harvest without computing a shard again, trains and exports a
DFlash draft; eval then serves that export beside the head's as its own method, outside the
serving choice. Bad compare runs are refused before any engine starts. tiny-llama, no vLLM."""

from __future__ import annotations

import hashlib

import pytest
from _runs import DRAFT, make_run, script, write_token_counts

from draftkit import api
from draftkit.core import config
from draftkit.core.errors import DraftkitError
from draftkit.eval import compare
from draftkit.eval import stage as eval_stage
from draftkit.harvest import stage as harvest_stage

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread

# the demo passes one override list to both runs: the harvest settings included
SMALL = [*DRAFT, "harvest.shard_tokens=256", "harvest.batch_tokens=128", "harvest.dtype=float32",
         "train.max_steps=2", "train.batch_tokens=256", "train.num_workers=0",
         "tracking.backend=none"]


def digests(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*.safetensors"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_target):
    root = tmp_path_factory.mktemp("demo-dflash")
    head = make_run(root, tiny_target.tokenizer, name="demo", n_train=8, n_eval=4,
                    overrides=SMALL)
    write_token_counts(head)
    api.harvest(head)
    return head


@pytest.fixture(scope="module")
def sibling(runs):
    before = digests(runs / "harvest")
    mp = pytest.MonkeyPatch()
    # the sibling's harvest may only verify the head's shards: computing one is a failure
    mp.setattr(harvest_stage, "harvest_shard",
               lambda *a, **k: pytest.fail("the DFlash sibling recomputed a harvest shard"))
    try:
        sib = script("demo").dflash_run(runs, SMALL)
        api.harvest(sib, overrides=SMALL)
    finally:
        mp.undo()
    assert digests(runs / "harvest") == before  # the head's shards untouched
    api.train(sib, overrides=SMALL)
    api.export(sib, overrides=[*SMALL, "export.check=false"])
    return sib


def test_the_sibling_is_a_dflash_run_on_the_heads_data_and_harvest(runs, sibling):
    cfg = config.load(sibling)
    assert (cfg.draft.kind, cfg.target.name, sibling.name) == ("dflash", "tiny-llama",
                                                               "demo-dflash")
    assert cfg.harvest.dir == str(runs.resolve() / "harvest")
    # the DFlash row's trade for the demo's budget: half the head's epochs, user overrides kept
    assert (config.load(runs).train.epochs, cfg.train.epochs) == (4, 2)
    demo = script("demo")
    assert demo.dflash_overrides(runs, [*SMALL, "train.epochs=6"])[-1] == "train.epochs=3"
    assert demo.dflash_overrides(runs, SMALL, 1.0)[-1] == "train.epochs=4"
    assert demo.parser().parse_args(["--dflash-epochs-share", "1"]).dflash_epochs_share == 1.0
    data = lambda run: {p.relative_to(run / "data"): p.read_bytes()  # noqa: E731
                        for p in sorted((run / "data").rglob("*")) if p.is_file()}
    assert data(sibling) == data(runs)
    exported = config.load(sibling)  # what eval reads of it
    assert (sibling / "export" / "config.json").is_file() and exported.draft.kind == "dflash"
    # rerunning the demo reuses the sibling as it is (its config is not rewritten)
    stamp = (sibling / config.CONFIG_NAME).stat().st_mtime_ns
    script("demo").dflash_run(runs, SMALL)
    assert (sibling / config.CONFIG_NAME).stat().st_mtime_ns == stamp


def test_eval_serves_the_compared_export_as_its_own_method_outside_the_choice(runs, sibling):
    cfg = config.load(runs, [f"eval.compare_runs=[{sibling}]", "eval.k_values=[3]"])
    compared = compare.compared_drafts(cfg)
    assert list(compared) == ["dflash"] and compared["dflash"][1] == sibling / "export"
    assert eval_stage.methods(cfg, compared) == [("none", None), ("ngram", 3), ("suffix", 3),
                                                 ("eagle3", 3), ("dflash", 3)]
    spec = eval_stage.engine_config(cfg, "dflash", 3, {"eagle3": (None, None), **compared})
    assert (spec["method"], spec["model"], spec["num_speculative_tokens"]) == (
        "dflash", str(sibling / "export"), 3)
    rows = [{"method": m, "k": k} for m, k in eval_stage.methods(cfg, compared)]
    assert [r["method"] for r in compare.candidates(rows, cfg)] == [
        "none", "ngram", "suffix", "eagle3"]


def test_bad_compare_runs_are_refused_with_the_fix(runs, sibling, tmp_path):
    same = config.load(runs, [f"eval.compare_runs=[{runs}]"])
    with pytest.raises(DraftkitError, match="compare drafts of another kind"):
        compare.compared_drafts(same)
    missing = config.load(runs, [f"eval.compare_runs=[{tmp_path / 'nope'}]"])
    with pytest.raises(DraftkitError, match="is not a draftkit run"):
        compare.compared_drafts(missing)
    twice = config.load(runs, [f"eval.compare_runs=[{sibling},{sibling}]"])
    with pytest.raises(DraftkitError, match="like another row"):
        compare.compared_drafts(twice)
