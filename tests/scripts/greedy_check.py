"""Speculation changes no output: fp32 greedy tokens through a TRL trainer's own engine (its
final policy synced in, its draft drafting) against an engine without speculation on the same
policy, started in a child process (TRL's colocated engine lives in the caller's). Used by
tests/test_trl_vllm.py and tests/scripts/trl_ranks.py; the child is this file:

    python tests/scripts/greedy_check.py POLICY_DIR PROMPTS_JSON TOKENS   # prints NO_SPEC [[...]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# what TRL and accelerate set for the caller's colocated engine; the child starts its own
LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
              "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


def chat_prompts(tok, questions: list[str]) -> list[list[int]]:
    """The questions as one-turn chat prompts (token ids), as TRL renders them."""
    return [tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                        add_generation_prompt=True),
                add_special_tokens=False)["input_ids"] for q in questions]


def through_trainer(trainer, prompts: list[list[int]], tokens: int, tmp: Path) -> dict:
    """{"spec": greedy token ids, "drafts": draft steps} through the trainer's engine, with the
    trainer's current policy synced in; the policy is saved to tmp/policy for the reference."""
    from draftkit.serving import policy_sync, vllm_engine
    from draftkit.serving.counters import SpecCounters

    llm, model = trainer.vllm_generation.llm, trainer.accelerator.unwrap_model(trainer.model)
    policy_sync.sync_policy(llm, model, tmp / "sync")
    before = SpecCounters.read(llm)
    spec = vllm_engine.generate(llm, prompts, vllm_engine.sampling(0.0, tokens)).token_ids
    model.save_pretrained(tmp / "policy")
    trainer.processing_class.save_pretrained(tmp / "policy")
    return {"spec": spec, "drafts": SpecCounters.read(llm).delta(before).drafts}


def without_speculation(policy: Path, prompts: list[list[int]], tokens: int):
    """Greedy token ids of an engine without speculation on `policy` (a child process); on
    failure the child's stderr tail (a string)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    child = subprocess.run([sys.executable, __file__, str(policy), json.dumps(prompts),
                            str(tokens)], capture_output=True, text=True, env=env, timeout=600)
    line = next((x for x in child.stdout.splitlines() if x.startswith("NO_SPEC ")), None)
    return json.loads(line[len("NO_SPEC "):]) if line else child.stderr[-3000:]


def main(policy: str, prompts: list[list[int]], tokens: int) -> None:
    from draftkit.serving import vllm_engine

    spec = vllm_engine.EngineSpec(model=policy, speculative_config=None, dtype="float32",
                                  max_model_len=512)
    with vllm_engine.engine(spec) as llm:
        out = vllm_engine.generate(llm, prompts, vllm_engine.sampling(0.0, tokens))
    print("NO_SPEC " + json.dumps(out.token_ids))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
