"""A tiny-llama refresh setup: a run with an exported (random-init) EAGLE-3 head, a policy
checkpoint dir and rollouts of the policy's own greedy continuations."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftkit.core import artifacts, config
from draftkit.init.stage import init_run

AUX = [1, 3, 5]
OVERRIDES = ["draft.draft_vocab_size=256", f"draft.aux_layer_ids={AUX}", "train.ttt_steps=3",
             "tracking.backend=none"]


def make_run(tmp: Path, target, name: str = "rl") -> Path:
    from draftkit.drafts.eagle_family.model import Eagle3Draft
    from draftkit.drafts.eagle_family.vocab import DraftVocab
    from draftkit.export.stage import export
    from draftkit.targets.tokens import end_of_turn_ids

    run = init_run("tiny-llama", "math", name=name, runs_dir=tmp, overrides=OVERRIDES)
    cfg = config.load(run)
    counts = torch.ones(cfg.target.vocab_size, dtype=torch.long)
    vocab = DraftVocab.build(counts, 256, must_include=end_of_turn_ids(target.tokenizer))
    torch.manual_seed(0)
    model = Eagle3Draft.from_run_config(cfg, vocab, target_model=target.model)
    best = artifacts.RunPaths(run).train / "best"
    model.save_pretrained(best)
    artifacts.write_json_atomic(best / "meta.json", {"step": 0, "eval": {}})
    export(run, ["export.check=false"])
    return run


def save_policy(target, path: Path) -> Path:
    target.model.save_pretrained(path)
    target.tokenizer.save_pretrained(path)
    return path


def prompts(tok, n: int, offset: int = 0) -> list[list[int]]:
    words = "apples books cookies students dollars hours".split()
    return [tok(f"<|im_start|>user\n{words[i % 6]} {i * 7} per day, how many {words[i % 5]}?"
                "<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
            for i in range(offset, offset + n)]


def write_rollouts(target, path: Path, n: int, offset: int = 0, gen: int = 24,
                   step: int = 1) -> Path:
    rows = []
    for p in prompts(target.tokenizer, n, offset):
        with torch.no_grad():
            out = target.model.generate(torch.tensor([p]), max_new_tokens=gen, do_sample=False,
                                        eos_token_id=None)[0].tolist()
        rows.append({"prompt_ids": p, "response_ids": out[len(p):], "policy_step": step})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
