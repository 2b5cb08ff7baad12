"""`draftkit diagnose` on tiny-llama heads fitted to the target's greedy continuations: a head
whose draft vocab was made to miss the most common answer tokens must have the vocabulary named
as its first cause; the same head trained with its full vocab must not. Bad input: a run with
no export, rollouts of another tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from _rl_helpers import write_rollouts
from _runs import AUX, DRAFT, chat_prompts, fit, greedy_batch, make_run, save_best

from draftkit import cli
from draftkit.core import config
from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.eval import diagnose
from draftkit.export.stage import export
from draftkit.targets.tokens import end_of_turn_ids

OVERRIDES = [*DRAFT, "train.ttt_steps=3", "tracking.backend=none", "eval.num_prompts=4",
             "eval.max_new_tokens=24"]


def _head(run, target, miss_common: bool):
    """A head fitted for 100 full-batch steps; with `miss_common` its vocab lacks the answer
    tokens that make up over 60% of the answers."""
    cfg = config.load(run)
    prompts = chat_prompts(target.tokenizer, 12)
    batch = greedy_batch(target, prompts, 32, AUX)
    counts = torch.bincount(batch["input_ids"][batch["loss_mask"].bool()],
                            minlength=cfg.target.vocab_size)
    must = end_of_turn_ids(target.tokenizer)
    if miss_common:
        order = counts.argsort(descending=True)
        share = counts[order].cumsum(0).float() / counts.sum()
        common = [int(t) for t in order[: int((share < 0.6).sum()) + 1] if int(t) not in must]
        counts[common] = -1  # ranked below every unseen token
    vocab = DraftVocab.build(counts, cfg.draft.draft_vocab_size, must_include=must)
    torch.manual_seed(0)
    model = Eagle3Draft.from_run_config(cfg, vocab, target_model=target.model)
    fit(model, batch, 100, 4)
    return model


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_target):
    import _runs

    out = {}
    with _runs.one_thread():
        for name, miss in (("full", False), ("missing", True)):
            root = tmp_path_factory.mktemp(name)
            run = make_run(root, prompts=chat_prompts(tiny_target.tokenizer, 4), name=name,
                           overrides=OVERRIDES)
            save_best(run, _head(run, tiny_target, miss))
            export(run, ["export.check=false"])
            out[name] = run
        rollouts = write_rollouts(tiny_target, root / "rollouts.jsonl", 6, gen=32)
    return out, rollouts


def _diagnose(run, rollouts) -> dict:
    import _runs

    with _runs.one_thread():
        return diagnose.diagnose(run, ["eval.choice_temperature=1.0"], rollouts=[str(rollouts)])


def test_vocab_missing_common_tokens_is_named_first(runs):
    (by_name, rollouts) = runs
    rep = _diagnose(by_name["missing"], rollouts)
    first = rep["causes"][0]
    assert first["cause"] == "vocabulary", rep["causes"]
    assert rep["first_position"]["vocab"]["sampled_outside"] > 0.5
    assert "draft.draft_vocab_size" in first["fix"]
    for kind in ("json", "md", "png"):  # one report, three files
        assert (rep["files"][kind]) and open(rep["files"][kind], "rb").read()
    saved = json.loads(open(rep["files"]["json"]).read())
    assert saved["causes"][0]["cause"] == "vocabulary"
    assert set(saved["per_position"]) == {"T=0", "T=1"}
    assert "vocabulary" in open(rep["files"]["md"]).read().split("\n")[6]


def test_full_vocab_head_is_not_blamed_on_its_vocab(runs):
    (by_name, rollouts) = runs
    rep = _diagnose(by_name["full"], rollouts)
    vocab = next(c for c in rep["causes"] if c["cause"] == "vocabulary")
    assert rep["causes"][0]["cause"] != "vocabulary"
    assert vocab["cost"] < 0.05
    # the fitted head accepts on these rollouts: a real comparison, not AL 1.0 everywhere
    assert rep["per_position"]["T=0"]["al"] > 1.5
    classes = rep["first_position"]["classes"]
    assert abs(sum(c["share"] for c in classes.values()) - 1) < 1e-6


def test_cli_verb_writes_the_report(runs, capsys):
    (by_name, rollouts) = runs
    import _runs

    with _runs.one_thread(), pytest.raises(SystemExit) as done:
        cli.main(["diagnose", str(by_name["missing"]), "--rollouts", str(rollouts),
                  "eval.choice_temperature=0"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "| 1 | vocabulary |" in out


def test_run_without_export_is_refused(tmp_path, tiny_target):
    run = make_run(tmp_path, prompts=chat_prompts(tiny_target.tokenizer, 2), overrides=OVERRIDES)
    with pytest.raises(DraftkitError, match="draftkit export"):
        diagnose.diagnose(run)


def test_rollouts_of_another_tokenizer_are_refused(runs, tmp_path, tiny_target):
    """tiny-qwen3's ids (Qwen's BPE) for the same chats: past tiny-llama's vocab, refused
    with the reason; in-range ids of another vocabulary fail the round trip or the policy's
    likelihood."""
    from draftkit.rl.rollouts import Rollout
    from draftkit.targets.load import load_target

    (by_name, _) = runs
    qwen = load_target("tiny-qwen3", device="cpu", dtype="float32").tokenizer
    rows = [{"prompt_ids": p, "response_ids": p[-8:]} for p in chat_prompts(qwen, 4)]
    path = tmp_path / "qwen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DraftkitError, match="different tokenizer"):
        diagnose.diagnose(by_name["full"], rollouts=[str(path)])
    shifted = [Rollout([(t + 7) % len(qwen) for t in p], [0] * len(p), len(p), f"x:{i}")
               for i, p in enumerate(chat_prompts(qwen, 4))]
    with pytest.raises(DraftkitError, match="another one"):
        diagnose.check_tokenizer(shifted, qwen)
    diagnose.check_tokenizer([Rollout(p, [0] * len(p), len(p), "ok")
                              for p in chat_prompts(qwen, 4)], qwen)  # its own ids pass
    with pytest.raises(DraftkitError, match="not written by this policy's tokenizer"):
        diagnose.check_likelihood({"mean_p_token": 1e-5, "mean_p_sample": 0.2,
                                   "ratio": 5e-5}, shifted)


def test_eval_links_diagnose_where_acceptance_is_below_the_threshold(tmp_path):
    from draftkit.eval.stage import diagnose_link

    run = make_run(tmp_path, overrides=[*OVERRIDES, "eval.diagnose_below=1.5"])
    cfg = config.load(run)

    def rep(al_t1: float) -> dict:
        return {"vllm": {"rows": [
            {"method": "eagle3", "temperature": 0.0, "batch_size": 8, "acceptance_length": 1.9},
            {"method": "eagle3", "temperature": 1.0, "batch_size": 8, "acceptance_length": al_t1},
            {"method": "ngram", "temperature": 1.0, "batch_size": 8, "acceptance_length": 1.1},
            {"method": "none", "temperature": 1.0, "batch_size": 8}]}}

    link = diagnose_link(rep(1.42), cfg, run)
    assert link["command"] == f"draftkit diagnose {run}"
    assert "AL 1.42 at T=1, batch 8" in link["why"]
    assert diagnose_link(rep(1.62), cfg, run) is None  # n-gram's low AL is not the draft's
    assert diagnose_link(rep(1.42), config.load(run, ["eval.diagnose_below=0"]), run) is None


def test_the_eval_markdown_report_shows_the_diagnose_link(tmp_path):
    """The link eval prints and stores in its JSON is in its Markdown report too (the report a
    reader opens), and only where eval made one."""
    from draftkit.eval import report
    from draftkit.eval.stage import diagnose_link

    run = make_run(tmp_path, overrides=OVERRIDES)
    rep = {"run": "r", "target": {"name": "tiny-llama"}, "created": "now",
           "draft": {"kind": "eagle3", "dir": "runs/r/export"},
           "settings": {"prompts": 4, "mean_prompt_tokens": 30.0, "max_new_tokens": 16,
                        "dtype": "float32", "seed": 0},
           "reference": {"rows": [{"k": 3, "temperature": 1.0, "batch_size": 1, "prompts": 4,
                                   "acceptance_length": 1.1, "per_position": [0.1, 0.0, 0.0],
                                   "output_tokens": 64}]}}
    rep["diagnose"] = diagnose_link(rep, config.load(run), run)
    md = report.markdown(rep)
    assert f"`draftkit diagnose {run}`" in md and "AL 1.10 at T=1, batch 1" in md
    rep["diagnose"] = None
    assert "draftkit diagnose" not in report.markdown(rep)


def test_a_stale_engine_config_is_the_first_cause(runs, tmp_path):
    """The export's speculative_config.json drafting another k than the run's: a settings
    mismatch, ranked above every measured cause."""
    import shutil

    from draftkit.core import artifacts

    (by_name, rollouts) = runs
    run = tmp_path / "stale"
    shutil.copytree(by_name["full"], run)
    spec = run / "export" / "speculative_config.json"
    artifacts.write_json_atomic(spec, {**artifacts.read_json(spec), "num_speculative_tokens": 5})
    rep = _diagnose(run, rollouts)
    assert rep["causes"][0]["cause"] == "settings" and rep["causes"][0]["cost"] == 1.0
    assert "k=5" in rep["causes"][0]["figure"]
