"""The draft LM on the refresh path (draftkit/rl, `DraftKind` protocol): teacher-forced drift
AL, a published refresh of a truncated tiny-llama draft, and the tensors a live swap is
checked against."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from _runs import one_thread, save_best

from draftkit.core import artifacts, config
from draftkit.drafts import kind as kinds
from draftkit.drafts.lm_family import build
from draftkit.drafts.lm_family.model import DraftLM
from draftkit.init.stage import init_run

K = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target):
    from _rl_helpers import save_policy, write_rollouts

    from draftkit.export.stage import export

    with one_thread():
        tmp = tmp_path_factory.mktemp("dlm-refresh")
        run = init_run("tiny-llama", "math", kind="draft-lm", name="dlm-rl",
                       runs_dir=tmp / "runs",
                       overrides=["draft.num_layers=2", "tracking.backend=none"])
        cfg = config.load(run)
        save_best(run, DraftLM.for_target(build.truncate(tiny_target.path, 2), tiny_target.model,
                                          cfg), step=0)
        export(run, ["export.check=false"])
        yield {"run": run, "cfg": cfg,
               "policy": save_policy(tiny_target, tmp / "ckpt" / "step_1"),
               "r1": write_rollouts(tiny_target, tmp / "rollouts" / "step_1.jsonl", 48, 0)}


def test_the_target_as_its_own_draft_lm_drifts_to_full_acceptance(setup, tiny_target):
    from draftkit.rl import drift, rollouts

    kind = kinds.get("draft-lm")
    assert (kind.name, kind.method) == ("draft-lm", "draft_model")
    model = DraftLM(copy.deepcopy(tiny_target.model).float(),
                    tiny_target.model.model.norm.weight, tiny_target.model.lm_head.weight,
                    tiny_target.model.config.rms_norm_eps, K)
    rows = rollouts.read_rollouts([setup["r1"]], tiny_target.tokenizer, 512)
    est = drift.estimate(kind, model, tiny_target.model, rows, K, temperatures=[0.0])
    est.update(drift.estimate(kind, model, tiny_target.model, rows, K, temperatures=[1.0],
                              draft_sampling="sampled"))
    # every draft is accepted (T=1: q == p) except past a rollout's end, where a chain of j+1
    # drafts from the last j start indices has no token to check (one per rollout and j)
    n = est["T=0"]["starts"]
    want = [(n - len(rows) * j) / n for j in range(K)]
    for temp in ("T=0", "T=1"):
        assert est[temp]["per_position"] == pytest.approx(want), temp


def test_step_logits_are_the_drafts_later_positions(setup, tiny_target):
    kind = kinds.get("draft-lm")
    model = kind.load(artifacts.RunPaths(setup["run"]).export, tiny_target.model, K)
    ids = torch.randint(0, 512, (2, 10))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    steps, vocab_ids = kind.step_logits(model, batch)
    logits = model.lm(input_ids=ids).logits  # [2, 10, V]
    assert len(steps) == K and torch.equal(vocab_ids, torch.arange(512))
    for j in range(K):  # step j at index t: the draft's prediction at t+1+j
        torch.testing.assert_close(steps[j][:, : 9 - j], logits[:, 1 + j:])
        assert not steps[j][:, 10 - 1 - j:].any()
    feats = kind.features(model, tiny_target.model, ids, batch["attention_mask"])
    with torch.no_grad():
        want = tiny_target.model(input_ids=ids).logits
    torch.testing.assert_close(model.target_logits(feats["last"].flatten(0, 1)),
                               want.flatten(0, 1), rtol=1e-4, atol=1e-4)


REFRESH = ["refresh.budget_steps=40", "refresh.lr=1e-3", "refresh.batch_tokens=2048"]


@pytest.fixture(scope="module")
def published(setup):
    from draftkit.rl.job import refresh

    with one_thread():
        return refresh(setup["run"], setup["policy"], [setup["r1"]], REFRESH)


def test_refresh_publishes_a_better_draft_lm_with_engine_view(setup, published):
    from safetensors.torch import load_file

    from draftkit.rl import publish

    assert published["status"] == "published", published
    store = publish.DraftStore(setup["run"])
    pub = store.root / published["version"]
    lin = store.lineage(published["version"])
    assert lin["al_after"]["T=0"]["al"] > lin["al_before"]["T=0"]["al"]
    sc = json.loads((pub / "speculative_config.json").read_text())
    assert sc == {"method": "draft_model", "model": ".", "num_speculative_tokens": K,
                  "draft_sample_method": "probabilistic"}  # relocatable
    assert (pub / "tokenizer.json").is_file()
    view = kinds.get("draft-lm").engine_view(pub)
    raw = load_file(str(pub / "model.safetensors"))
    qkv = view["model.layers.1.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv, torch.cat([raw[f"model.layers.1.self_attn.{x}_proj.weight"]
                                       for x in "qkv"]))
    assert "model.layers.0.mlp.gate_up_proj.weight" in view and "model.norm.weight" in view


def test_harvest_capture_trains_the_same_draft_lm(setup, published, tmp_path):
    """refresh.capture=harvest stores the policy's `last` only (aux [T, 0]) and, in fp32
    shards, trains the draft LM the online capture trained, bit for bit."""
    import shutil

    from safetensors.torch import load_file

    from draftkit.rl import publish
    from draftkit.rl.job import refresh

    run = tmp_path / "dlm-harvest"  # the same run before its refresh, captured on disk
    shutil.copytree(setup["run"], run, ignore=shutil.ignore_patterns("drafts"))
    res = refresh(run, setup["policy"], [setup["r1"]],
                  [*REFRESH, "refresh.capture=harvest", "harvest.dtype=float32"])
    # refresh.capture is part of the job key (rl/reruns.py): same inputs otherwise, another job
    assert res["job"] != published["job"] and res["status"] == "published"
    cap = res["lineage"]["capture"]
    assert cap["mode"] == "harvest" and published["lineage"]["capture"]["mode"] == "online"
    assert cap["tokens"] == published["lineage"]["capture"]["tokens"]
    hidden = setup["cfg"].target.hidden_size
    assert cap["tokens"] * hidden * 4 < cap["bytes"] < cap["tokens"] * hidden * 5  # no aux
    mine = load_file(str(run / "drafts" / res["version"] / "model.safetensors"))
    ref = load_file(str(publish.DraftStore(setup["run"]).root / published["version"]
                        / "model.safetensors"))
    assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in ref)


@pytest.mark.vllm
def test_swap_into_a_live_engine_applies_the_refreshed_draft_lm(setup, published, tiny_target):
    from _rl_helpers import prompts

    from draftkit.rl import publish
    from draftkit.serving import drafter_swap, speculative, vllm_engine

    export_dir = artifacts.RunPaths(setup["run"]).export
    spec = vllm_engine.EngineSpec(
        model=str(tiny_target.path), dtype="float32", max_model_len=256,
        speculative_config=speculative.method_config("draft-lm", K, export_dir),
        extra=drafter_swap.engine_kwargs())
    probes = prompts(tiny_target.tokenizer, 8, 0)  # prompts of the rollouts trained on
    params = vllm_engine.sampling(0.0, 24)
    with vllm_engine.engine(spec) as llm:
        before = vllm_engine.measure(llm, probes, params, batch_size=8)
        report = drafter_swap.swap_into(llm, publish.DraftStore(setup["run"]).current_dir(),
                                        kinds.get("draft-lm"), probes, min_al=1.1,
                                        max_tokens=24)
        after = vllm_engine.measure(llm, probes, params, batch_size=8)
    print(f"swap {report['swap_s']:.2f} s: vLLM AL {before['spec']['acceptance_length']:.3f} "
          f"-> {after['spec']['acceptance_length']:.3f}")
    assert report["ok"] and not report["hash_problems"]
    assert after["spec"]["acceptance_length"] > before["spec"]["acceptance_length"] + 0.2
    assert after["outputs"] == before["outputs"]  # lossless: only the speed changed
