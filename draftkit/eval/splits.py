"""Eval prompt splits beyond a run's own held-out split, for measuring how a draft generalises:

  unseen-templates  the run's eval split (math recipe, data.source=local: mathgen's eval-only templates);
  seen-templates    new problems of the *training* templates, none of them a training prompt:
                    what RL rollouts look like (they reuse the prompt distribution);
  hand-written      word problems written by hand in everyday phrasing, no template at all
                    (data_recipes/eval/handwritten-math.jsonl, shipped with the project).

Every split comes back as prompt_ids rendered like the run's eval prompts (the same system
turn, if any, then the chat template's generation prompt).
"""

from __future__ import annotations

import json
from pathlib import Path

from draftkit.core.errors import DraftkitError
from draftkit.core.prepared_data import load_prompts, load_split
from draftkit.core.resources import recipes_dir
from draftkit.prepare import chat_mask, mathgen, recipes
from draftkit.prepare.stage import load_tokenizer
from draftkit.targets.load import run_target_dir

HANDWRITTEN = recipes_dir() / "eval" / "handwritten-math.jsonl"
NAMES = ("unseen-templates", "seen-templates", "hand-written")
OWN = NAMES[0]  # the run's own eval split (what `draftkit eval` measures first)


def build(run_dir: str | Path, cfg, n: int, names: tuple[str, ...] = NAMES
          ) -> dict[str, list[list[int]]]:
    """{split: up to `n` prompt_ids} for the named splits of a prepared run."""
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise DraftkitError(f"unknown eval splits {unknown}; choose from {list(NAMES)}")
    run_dir = Path(run_dir)
    makers = {"unseen-templates": lambda: _own_eval(run_dir, n),
              "seen-templates": lambda: seen_templates(run_dir, cfg, n),
              "hand-written": lambda: hand_written(run_dir, cfg, n)}
    return {name: makers[name]() for name in names}


def _own_eval(run_dir: Path, n: int) -> list[list[int]]:
    return load_prompts(run_dir / "data", n)


def seen_templates(run_dir: Path, cfg, n: int) -> list[list[int]]:
    """`n` new problems of the training templates (mathgen train split, another seed), none
    a training prompt."""
    seen = {m["content"].strip() for row in load_split(run_dir / "data", "train")["messages"]
            for m in json.loads(row) if m["role"] == "user"}
    fresh = [p.question for p in mathgen.generate("train", 4 * n, seed=10_000 + cfg.data.seed)
             if p.question.strip() not in seen][:n]
    return _render(run_dir, cfg, fresh)


def hand_written(run_dir: Path, cfg, n: int, path: Path = HANDWRITTEN) -> list[list[int]]:
    """The first `n` hand-written problems of `path` (JSONL, one {"prompt": ...} per line)."""
    if not path.is_file():
        raise DraftkitError(f"the hand-written eval prompts are missing: {path}; restore "
                            "data_recipes/eval/ from the repository")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    bad = [i for i, r in enumerate(rows) if not str(r.get("prompt", "")).strip()]
    if bad:
        raise DraftkitError(f"{path}: lines {[i + 1 for i in bad]} have no \"prompt\" text")
    return _render(run_dir, cfg, [r["prompt"] for r in rows[:n]])


def _render(run_dir: Path, cfg, questions: list[str]) -> list[list[int]]:
    """User turns rendered like the run's prompts: the system prompt prepare adds (data.
    system_prompt, else the recipe's), then the chat template's generation prompt."""
    text = cfg.data.system_prompt or recipes.load_recipe(cfg.data.recipe).system_prompt
    system = [{"role": "system", "content": text}] if text else []
    tok = load_tokenizer(run_target_dir(cfg.target))
    return [chat_mask.prompt_ids(tok, [*system, {"role": "user", "content": q}], len(system) + 1)
            for q in questions]
