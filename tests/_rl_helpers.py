"""A tiny-llama refresh setup: a run with an exported (random-init) EAGLE-3 head, a policy
checkpoint dir and rollouts of the policy's own greedy continuations; for the swap tests, a run
whose export is the session's trained head (`trained_export`), published versions copied from
it (`publish_copy`, with `zeroed`: hashes fine, AL 1.0) and a rollout file of its prompts."""

from __future__ import annotations

import json
import shutil
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


def trained_export(root: Path, trained_draft: dict, name: str = "rl", probe_tokens: int = 40,
                   prompts: bool = True, overrides: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """(run, export dir): a run under `root` whose export is conftest's `trained_draft` head
    (accepted often: AL ~2.2 at k=3); `prompts`: its eval split is the head's prompts."""
    from _runs import DRAFT, save_best
    from _runs import make_run as run_dir

    from draftkit.export.stage import export

    run = run_dir(root, prompts=trained_draft["prompts"] if prompts else None, name=name,
                  overrides=[*DRAFT, "train.ttt_steps=3", "tracking.backend=none",
                             f"refresh.probe_max_tokens={probe_tokens}", *overrides])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    return run, export(run, ["export.check=false"])


def rollout_file(path: Path, prompt_ids: list[list[int]]) -> Path:
    """A rollout JSONL of `prompt_ids` (a short response each): what probes read."""
    path.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": [5, 6]}) + "\n"
                            for p in prompt_ids))
    return path


def zeroed(name: str, t: torch.Tensor) -> torch.Tensor:
    """A `publish_copy` change: every float tensor zeroed (the hashes match the files, AL 1.0)."""
    return torch.zeros_like(t) if t.is_floating_point() else t


LINEAGE = {"parent": None, "decided_on": "T=0", "rollouts": [], "al_after": {"T=0": {"al": 2.0}},
           "policy": {"step": 1}}


def publish_copy(store, version: str, src: Path, lineage: dict | None = None,
                 change=None) -> Path:
    """Publish `version` in `store` as a copy of `src`'s files (its lineage.json left out),
    each tensor of model.safetensors passed through `change(name, tensor)` when given."""
    from safetensors.torch import load_file, save_file

    def write(tmp, final):
        for f in Path(src).iterdir():
            if f.is_file() and f.name != "lineage.json":
                shutil.copy(f, tmp / f.name)
        if change is not None:
            t = load_file(str(tmp / "model.safetensors"))
            save_file({k: change(k, v) for k, v in t.items()}, str(tmp / "model.safetensors"))

    store.publish(version, write, lineage or LINEAGE)
    return store.root / version


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
