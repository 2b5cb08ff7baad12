"""The controlled drift (benchmarks/rl/style_shift.py) and the from-scratch baseline
(benchmarks/rl/scratch.py) on tiny-llama: the layout is built from the problem's own fields; the SFT masks the prompt; the
fine-tuned policy's greedy answers follow the layout where v0's do not, and its meta.json says
so; the scratch run on vN has v0's prompts, conversations and step count and exports a draft;
a policy of another architecture is refused. With vLLM: vN's T=1 rollouts in the RL loop's
format, and the scratch export drafting for vN in the engine as bench_refresh measures it."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.rl import scratch, style_shift
from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError

SHIFT = ["policy=tiny-llama", "examples=32", "steps=30", "batch_size=8", "lr=3e-3",
         "warmup_steps=5", "heldout=4", "measure_tokens=24", "rollout_prompts=3",
         "group_size=2", "max_tokens=24", "max_model_len=512"]
V0 = ["data.source=local", "data.max_samples=16", "data.eval_samples=4",
      "data.regen_engine=hf", "data.regen_max_new_tokens=16", "data.regen_temperature=0.0",
      "draft.draft_vocab_size=256", "harvest.dtype=float32", "harvest.eval_sequences=4",
      "train.max_steps=3", "train.eval_every=3", "train.save_every=3", "train.batch_tokens=1024",
      "tracking.backend=none", "export.check=false"]


def test_styled_answer_and_layout():
    q = "Aisha has 12 quarters, 10 dimes and 3 nickels. What is the total in cents?"
    a = ("Quarters: 12 * 25 = 300 cents.\nDimes: 10 * 10 = 100 cents.\n"
         "So she has enough.\nTotal: 300 + 100 + 15 = $415.\n#### 415")
    text = style_shift.styled_answer(q, a)
    assert text.splitlines() == ["Given: 12, 10, 3", "Step 1: 12 * 25 = 300",
                                 "Step 2: 10 * 10 = 100", "Step 3: So she has enough.",
                                 "Step 4: 300 + 100 + 15 = $415", "Answer: 415", "#### 415"]
    assert style_shift.follows_layout(text)
    assert not style_shift.follows_layout(a)
    assert not style_shift.follows_layout("Given: 3 apples\nSo the answer is 4")
    with pytest.raises(DraftkitError, match="examples"):
        style_shift.load_config(None, ["examples=4", "batch_size=8"])


def test_sft_rows_mask_the_prompt(tiny_target):
    from benchmarks.rl.grpo_loop import prompt_ids
    from draftkit.prepare import mathgen
    from draftkit.targets.tokens import end_of_turn_ids

    tok = tiny_target.tokenizer
    probs = mathgen.generate("train", 3, seed=0)
    rows = style_shift.sft_rows(tok, probs)
    for r, p in zip(rows, probs, strict=True):
        assert r["prompt_ids"] == prompt_ids(tok, p.question)  # the RL loop's prompt
        assert tok.decode(r["response_ids"], skip_special_tokens=True).strip() == r["response"]
        assert set(r["response_ids"]) & set(end_of_turn_ids(tok))  # learns to stop
    batch = style_shift.pad_sft(rows, pad_id=0)
    n = len(rows[0]["prompt_ids"])
    assert (batch["labels"][0, :n] == -100).all()  # [B, T]: no loss on the prompt
    assert batch["labels"][0, n:n + len(rows[0]["response_ids"])].tolist() == \
        rows[0]["response_ids"]
    assert int((batch["labels"] != -100).sum()) == sum(len(r["response_ids"]) for r in rows)


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("shift")
    cfg = style_shift.load_config(None, SHIFT)
    try:
        summary = style_shift.run(cfg, out, rollouts=False)
    finally:
        torch.set_num_threads(threads)
    return {"cfg": cfg, "out": out, "summary": summary}


def test_shift_moves_the_policy_into_the_layout(shifted):
    from draftkit.rl.policy import load_policy
    from draftkit.targets.lineage import same_lineage

    policy = shifted["out"] / "policy"
    meta = artifacts.read_json(policy / "meta.json")
    drift = meta["drift"]
    assert drift["layout_rate"]["vN"] > drift["layout_rate"]["v0"]  # v0 never writes it
    assert drift["layout_rate"]["vN"] >= 0.5
    assert drift["kl_vn_v0_per_token"] > 0.1
    assert len(meta["loss"]) == meta["steps"] == 30 and meta["loss"][-1] < meta["loss"][0] / 2
    assert meta["base"]["name"] == "tiny-llama" and meta["lr"] == 3e-3
    assert meta["data"]["examples"] == 32 and meta["data"]["response_tokens"] > 0
    assert style_shift.follows_layout(meta["data"]["example"]["response"])
    assert same_lineage("tiny-llama", str(policy)) == []  # one lineage: a refresh may use it
    loaded = load_policy(policy, dtype="float32")
    assert loaded.tokenizer.chat_template
    # a rerun with the same settings reuses the finished policy
    stamp = (policy / "meta.json").stat().st_mtime_ns
    style_shift.shift_policy(shifted["cfg"], shifted["out"])
    assert (policy / "meta.json").stat().st_mtime_ns == stamp


@pytest.fixture(scope="module")
def scratch_runs(tmp_path_factory, shifted):
    from draftkit import api

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("scratch")
    try:
        v0 = api.init("tiny-llama", "math", name="v0", runs_dir=root,
                      overrides=[*V0, "train.init_from=nowhere-to-be-cleared"])
        for stage in (api.prepare, api.harvest):
            stage(v0)
        api.train(v0, ["train.init_from=''"])
        report = scratch.build(v0, shifted["out"] / "policy", root / "vn")
    finally:
        torch.set_num_threads(threads)
    return {"v0": v0, "vn": root / "vn", "report": report}


def test_scratch_run_has_v0_budget_and_exports(scratch_runs, shifted):
    import datasets

    rep, vn = scratch_runs["report"], scratch_runs["vn"]
    assert rep["same_budget"] == {"conversations": True, "prompts": True, "steps": True}
    assert rep["scratch"]["conversations"] == {"train": 16, "eval": 4}
    assert rep["v0"]["steps"] == rep["scratch"]["steps"] == 3
    cfg, v0 = config.load(vn), config.load(scratch_runs["v0"])
    assert cfg.target.name == str((shifted["out"] / "policy").resolve())
    assert cfg.target.source == "local" and cfg.train.init_from == ""
    assert cfg.draft == v0.draft and cfg.harvest == v0.harvest  # v0's settings
    assert (cfg.train.max_steps, cfg.data.regenerate) == (3, True)
    # vN wrote the answers: the scratch run's assistant tokens are not v0's
    a = datasets.load_from_disk(str(scratch_runs["v0"] / "data" / "train"))
    b = datasets.load_from_disk(str(vn / "data" / "train"))
    assert sorted(map(tuple, a["input_ids"])) != sorted(map(tuple, b["input_ids"]))
    assert (vn / "export" / "config.json").is_file()
    assert json.loads((vn / "scratch.json").read_text())["v0"] == rep["v0"]
    from benchmarks.rl.refresh import scratch_compute

    compute = scratch_compute(str(vn))  # what bench_refresh reads
    assert compute["steps"] == 3 and min(compute["prepare_s"], compute["harvest_s"],
                                         compute["train_s"]) > 0
    assert compute["total_s"] == pytest.approx(
        compute["prepare_s"] + compute["harvest_s"] + compute["train_s"])


def test_scratch_refuses_another_lineage(scratch_runs, tmp_path):
    from draftkit.targets.load import target_dir

    with pytest.raises(DraftkitError, match="not the lineage"):
        scratch.create(scratch_runs["v0"], target_dir("tiny-qwen3"), tmp_path / "other")
    with pytest.raises(DraftkitError, match="new directory"):
        scratch.create(scratch_runs["v0"], scratch_runs["vn"], scratch_runs["v0"])


@pytest.mark.slow
@pytest.mark.vllm
def test_rollouts_and_scratch_draft_in_vllm(shifted, scratch_runs):
    from transformers import AutoTokenizer

    from benchmarks.rl import refresh as bench
    from draftkit.rl import rollouts
    from draftkit.serving import policy_sync, speculative, vllm_engine

    cfg, out = shifted["cfg"], shifted["out"]
    stats = style_shift.sample_rollouts(cfg, out)
    assert stats["rows"] == 3 * 2 and stats["policy_step"] == 30 and stats["rollout_tokens"] > 0
    tok = AutoTokenizer.from_pretrained(out / "policy")
    rows = rollouts.read_rollouts([out / "rollouts"], tok, len(tok))
    assert len(rows) == 6 and {r.policy_step for r in rows} == {30}
    assert {r.temperature for r in rows} == {1.0}
    summary = style_shift.run(cfg, out)  # the policy and the rollouts are reused
    assert summary["rollouts"] == stats and artifacts.read_json(out / "meta.json")["drift"]
    # bench_refresh's scratch row: vN with the scratch run's export as EAGLE-3 draft
    bcfg = bench.BenchConfig(prompts=4, max_tokens=16, batch_size=4, temperatures=[0.0])
    spec = vllm_engine.EngineSpec(
        model=str(out / "policy"), dtype="float32", max_model_len=512,
        speculative_config=speculative.method_config("eagle3", 3, scratch_runs["vn"] / "export"),
        extra=policy_sync.engine_kwargs())
    with vllm_engine.engine(spec) as llm:
        row = bench.measure(llm, bench.heldout_prompts(tok, 4, 0), bcfg)
    assert row["T=0"]["output_tokens"] > 0 and row["T=0"]["al"] >= 1.0
    assert row["T=0"]["per_position"]  # the engine drafted with the scratch head
