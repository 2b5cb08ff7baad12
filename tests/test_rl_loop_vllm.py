"""The GRPO loop end to end on the tiny target in vLLM (fp32): 2 steps with an EAGLE-3 draft
from a run dir, refreshed after every step. The log has every field per step, the refresh
events carry their cost, the KL says the policy moved away from the initial one (the engine
getting the weights is tests/test_policy_sync_vllm.py), the plot is written. Plus config
validation without vLLM."""

from __future__ import annotations

import json

import pytest
import torch
from _rl_helpers import make_run

from benchmarks.rl import grpo_loop
from draftkit.core.errors import DraftkitError

FIELDS = {"step", "reward", "correct", "formatted", "al", "per_position", "rollout_tokens",
          "rollout_s", "tokens_per_s", "kl_ref", "loss", "update_s", "sync_s", "refresh"}


def test_config_defaults_overrides_and_errors(tmp_path):
    cfg = grpo_loop.load_config(None, ["draft=ngram", "steps=3", "refresh_overrides=[a=1]"])
    assert (cfg.steps, cfg.draft, cfg.refresh_overrides) == (3, "ngram", ["a=1"])
    assert not cfg.refreshing
    y = tmp_path / "c.yaml"
    y.write_text("draft: none\ngroup_size: 8\ntracking: {backend: none}\n")
    cfg = grpo_loop.load_config(y, ["lr=1e-4"])
    assert (cfg.group_size, cfg.lr, cfg.tracking.backend) == (8, 1e-4, "none")
    with pytest.raises(DraftkitError, match="draft_run"):
        grpo_loop.load_config(None, ["draft=draft"])
    with pytest.raises(DraftkitError, match="refresh needs draft=draft"):
        grpo_loop.load_config(None, ["draft=ngram", "refresh_every=2"])
    with pytest.raises(DraftkitError, match="group_size"):
        grpo_loop.load_config(None, ["draft=none", "group_size=1"])
    with pytest.raises(DraftkitError, match="unknown config key"):
        grpo_loop.load_config(None, ["draft=none", "stpes=2"])


@pytest.mark.slow
@pytest.mark.vllm
def test_loop_updates_policy_in_engine_and_refreshes_draft(tmp_path, tiny_target, monkeypatch):
    def varied(text, reference, format_weight):  # a random tiny model never answers right
        return {"reward": float(len(text) % 3), "correct": 0.0, "formatted": 0.0}

    monkeypatch.setattr(grpo_loop.reward, "math_reward", varied)
    run = make_run(tmp_path / "runs", tiny_target)
    cfg = grpo_loop.load_config(None, [
        "target=tiny-llama", "draft=draft", f"draft_run={run}", "steps=2",
        "prompts_per_step=2", "group_size=3", "max_tokens=24", "lr=1e-2", "max_model_len=512",
        "refresh_every=1", "tracking.backend=none",
        "refresh_overrides=[refresh.budget_steps=20, refresh.lr=3e-3, refresh.gate=false,"
        " refresh.probe_max_tokens=16]"])
    out = tmp_path / "out"
    records = grpo_loop.run(cfg, out)
    assert [r["step"] for r in records] == [0, 1]
    assert grpo_loop.read_log(out / "log.jsonl") == records
    for r in records:
        assert FIELDS <= set(r) and r["rollout_tokens"] > 0 and r["tokens_per_s"] > 0
        assert r["al"] is not None and r["al"] >= 1.0  # speculative rollouts: counters moved
    assert records[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # step 0: the initial policy
    assert records[1]["kl_ref"] > 0  # lr 1e-2 moves a random tiny model at once
    assert len(list((out / "rollouts").glob("step-*.jsonl"))) == 2
    assert (out / "policy" / "config.json").is_file()
    events = [r["refresh"] for r in records if r["refresh"]]
    assert events and events[0]["status"] in ("published", "swap_failed")
    assert events[0]["tokens_trained"] > 0 and events[0]["refresh_s"] > 0
    assert (run / "drafts" / "v0001").is_dir()
    png = grpo_loop.plot({"refresh": out / "log.jsonl"}, tmp_path / "plot.png")
    assert png.stat().st_size > 1000
    # rollouts at T=1 draft as the draft run says (its default: sampled from the head)
    assert json.loads((out / "meta.json").read_text())["speculative"][
        "draft_sample_method"] == "probabilistic"
    assert torch.is_tensor(tiny_target.model.lm_head.weight)  # the shared fixture untouched


def test_samples_advantages_rollout_rows_and_plot(tmp_path):
    rows = [{"prompt_ids": [1, 2], "response_ids": r, "reward": w, "temperature": 1.0}
            for r, w in (([3], 1.0), ([4], 0.0), ([], 0.0), ([5, 6], 0.0))]
    todo, rewards = grpo_loop.samples(rows, group_size=2)
    assert rewards.tolist() == [[1.0, 0.0], [0.0, 0.0]]
    # group 0: mean 0.5, std sqrt(0.5); group 1 has no signal; the empty response is dropped
    assert [s.response_ids for s in todo] == [[3], [4], [5, 6]]
    assert [round(s.advantage, 4) for s in todo] == [0.7071, -0.7071, 0.0]
    grpo_loop.write_rollouts(tmp_path / "r.jsonl", rows, step=7)
    back = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(back) == 3 and all(r["policy_step"] == 7 for r in back)
    logs = {}
    for name, al in (("refresh", [1.5, 1.4, 1.8]), ("stale", [1.5, 1.4, 1.3])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(
            {"step": i, "al": a, "reward": 0.1 * i,
             "refresh": {"status": "published"} if name == "refresh" and i == 2 else None})
            + "\n" for i, a in enumerate(al)))
        logs[name] = tmp_path / f"{name}.jsonl"
    assert grpo_loop.plot(logs, tmp_path / "p.png").stat().st_size > 1000
