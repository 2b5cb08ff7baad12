"""The run's held-out eval prompts, and prompt splits beyond them for measuring how a draft
generalises. A run that never ran prepare (an imported draft's: `init --from-draft`) still has
its held-out prompts: the recipe's eval conversations, templated as prepare templates them
(a prompt is the user's turn: prepare's regeneration rewrites only the answers).

  unseen-templates  the run's held-out prompts (math recipe, data.source=local: mathgen's eval-only templates);
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
from draftkit.prepare import chat_mask, mathgen, recipes, sources
from draftkit.prepare.stage import load_tokenizer
from draftkit.targets.load import run_target_dir

HANDWRITTEN = recipes_dir() / "eval" / "handwritten-math.jsonl"
NAMES = ("unseen-templates", "seen-templates", "hand-written")
OWN = NAMES[0]  # the run's own eval split (what `draftkit eval` measures first)


def build(run_dir: str | Path, cfg, n: int, names: tuple[str, ...] = NAMES
          ) -> dict[str, list[list[int]]]:
    """{split: up to `n` prompt_ids} for the named splits of the run."""
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise DraftkitError(f"unknown eval splits {unknown}; choose from {list(NAMES)}")
    run_dir = Path(run_dir)
    makers = {"unseen-templates": lambda: own_prompts(run_dir, cfg, n),
              "seen-templates": lambda: seen_templates(run_dir, cfg, n),
              "hand-written": lambda: hand_written(run_dir, cfg, n)}
    return {name: makers[name]() for name in names}


def own_prompts(run_dir: str | Path, cfg, n: int) -> list[list[int]]:
    """The run's first `n` held-out prompt_ids: prepare's eval split; in a run never prepared,
    the recipe's held-out conversations (sources.load_held_out: the ones prepare would keep,
    before regeneration) up to their first answer, said in one line."""
    run_dir, d = Path(run_dir), cfg.data
    data = run_dir / "data"
    if (data / "eval").is_dir():
        return load_prompts(data, n)
    recipe = recipes.load_recipe(d.recipe)
    system = d.system_prompt or recipe.system_prompt
    tok = load_tokenizer(run_target_dir(cfg.target))
    prompts = []
    for conv in sources.load_held_out(recipe, d, data / ".cache"):
        msgs = conv.messages
        if system and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": system}, *msgs]
        first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
        ids = chat_mask.prompt_ids(tok, msgs, first)
        if len(ids) < d.max_seq_len:  # prepare drops the others (_first_prompt_fits)
            prompts.append(ids)
        if len(prompts) == n:
            break
    if not prompts:
        raise DraftkitError(f"recipe {recipe.name!r} (data.source={d.source}) gave no held-out "
                            f"prompt shorter than data.max_seq_len={d.max_seq_len}; raise it, "
                            "or pick another recipe (data.recipe=...)")
    print(f"eval: {run_dir} was never prepared; its {len(prompts)} eval prompts are recipe "
          f"{recipe.name!r}'s held-out prompts (data.source={d.source}), templated as prepare "
          "does (no prepare needed)")
    return prompts


def seen_templates(run_dir: Path, cfg, n: int) -> list[list[int]]:
    """`n` new problems of the training templates (mathgen train split, another seed), none
    a training prompt (a run never prepared has none)."""
    data = run_dir / "data"
    rows = load_split(data, "train")["messages"] if (data / "train").is_dir() else []
    seen = {m["content"].strip() for row in rows for m in json.loads(row) if m["role"] == "user"}
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
