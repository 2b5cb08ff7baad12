"""`draftkit init`: resolve a target + data recipe + draft kind into one run config on disk.

    draftkit init --target Qwen3-8B --data math            # offline: shapes come from the registry
    draftkit init --target smollm2-135m --data math data.source=local   # tiny CPU run
    draftkit init --target Qwen3-8B --from-draft RedHatAI/Qwen3-8B-speculator.eagle3  # a published draft

`--from-draft SRC` starts from a draft trained elsewhere (init/from_draft.py): the run's
`drafts/current` is that draft, and drift, eval, export, refresh and watch follow directly.

It prints the run's plan (init/plan.py: tokens, disk, memory, time on this machine) and, when
a stored harvest would not fit the free disk, writes train.mode=online and says why.

Layers, lowest first: dataclass defaults, `configs/<kind>.yaml`, `configs/<kind>-<family>.yaml`
or `configs/<kind>-<target>.yaml` when present, then everything derived from the target (aux
ids, draft vocab, draft decoder shapes, optimizer scale) unless a template or override set it,
then the command line's `key=value` overrides. The result has every field present.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml

from draftkit.core import artifacts, config, registry
from draftkit.core.config import RunConfig
from draftkit.core.errors import DraftkitError
from draftkit.core.registry import TargetInfo
from draftkit.core.resources import configs_dir
from draftkit.drafts import kind as kinds
from draftkit.init import from_draft as from_draft_run
from draftkit.init import plan
from draftkit.prepare.recipes import check_recipe
from draftkit.targets.capture import check_layer_ids
from draftkit.targets.load import target_dir


def template_layers(kind: str, info: TargetInfo) -> list[Path]:
    names = [f"{kind}.yaml", f"{kind}-{info.family}.yaml", f"{kind}-{info.name}.yaml"]
    return [configs_dir() / n for n in names if (configs_dir() / n).is_file()]


def fill_target(cfg: RunConfig, info: TargetInfo) -> None:
    t = cfg.target
    for key in ("hub_id", "family", "architecture", "num_hidden_layers", "hidden_size",
                "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "vocab_size", "max_position_embeddings", "rope_theta", "rope_scaling",
                "rms_norm_eps", "tie_word_embeddings", "source", "params_b"):
        setattr(t, key, getattr(info, key))
    t.name = info.name


def _derive(cfg: RunConfig, info: TargetInfo, explicit: dict) -> None:
    """Fill every target-dependent field the templates and overrides left unset."""
    d, tr = cfg.draft, cfg.train
    if not d.draft_vocab_size:
        d.draft_vocab_size = registry.draft_vocab_rule(info.vocab_size)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim"):
        if not getattr(d, key):
            setattr(d, key, getattr(info, key))
    if "lr" not in explicit.get("train", {}):
        # EAGLE-3 heads: ~1e-4 at 8B (SpecForge/speculators), higher for small targets.
        scale = min(5.0, max(0.5, (8.0 / max(info.params_b, 1e-3)) ** 0.25))
        tr.lr = float(f"{1e-4 * scale:.1g}")
    if "max_seq_len" not in explicit.get("data", {}):
        cfg.data.max_seq_len = 2048 if info.params_b >= 1 else 1024
    if info.params_b >= 1 and "batch_tokens" not in explicit.get("train", {}):
        tr.batch_tokens = 16384


def _resolve_kind(cfg: RunConfig, info: TargetInfo) -> None:
    """The draft kind fills and checks its own fields (its harvest needs: aux layer ids)."""
    kinds.of(cfg).resolve(cfg, info)
    check_layer_ids(cfg.draft.aux_layer_ids, info.num_hidden_layers)


def resolve(target: str, data: str, kind: str = config.DEFAULT_KIND, k: int | None = None,
            name: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """The fully resolved run config for (target, recipe, kind); nothing is written."""
    info = registry.resolve(target)
    check_recipe(data)
    kinds.get(kind)  # an unknown kind fails here, naming the known ones
    cfg = RunConfig()
    explicit: dict = {}
    for layer in template_layers(kind, info):
        data_layer = yaml.safe_load(layer.read_text()) or {}
        config.merge(cfg, data_layer, prefix="")
        config.deep_update(explicit, data_layer)
    cli = {"draft": {"kind": kind}, "data": {"recipe": data}}
    if k is not None:
        cli["draft"]["num_speculative_tokens"] = k
    cli = config.deep_update(cli, config.parse_overrides(overrides or []))
    config.merge(cfg, cli)
    config.deep_update(explicit, cli)
    fill_target(cfg, info)
    cfg.name = name or f"{info.name.split('/')[-1].lower()}-{data}-{kind}"
    _derive(cfg, info, explicit)
    _resolve_kind(cfg, info)
    return cfg


def init_run(target: str, data: str | None, kind: str | None = None, k: int | None = None,
             name: str | None = None, runs_dir: str | Path = "runs", force: bool = False,
             overrides: list[str] | None = None, from_draft: str | None = None) -> Path:
    """Write runs/<name>/draftkit.yaml and return the run dir. `kind` None: config's default
    kind; with `from_draft`, the run of an imported draft, whose kind is the draft's (a `kind`
    given must be that one)."""
    if from_draft:
        return from_draft_run.import_run(resolve, target, from_draft, data, k, name, runs_dir,
                                         force, overrides, kind=kind)
    if not data:
        raise DraftkitError("init needs --data RECIPE (data_recipes/*.yaml), or --from-draft SRC "
                            "to start from a trained draft")
    cfg = resolve(target, data, kind or config.DEFAULT_KIND, k, name, overrides)
    run_dir = Path(runs_dir) / cfg.name
    paths = artifacts.RunPaths(run_dir, harvest_dir=cfg.harvest.dir or None)
    if "mode" not in config.parse_overrides(overrides or []).get("train", {}):
        # a stored harvest that cannot fit the disk: online training (the plan says why)
        with contextlib.suppress(plan.NoDevice):  # a config for another machine: no plan here
            plan.choose_mode(cfg, plan.make(cfg, paths))
    if paths.config.exists() and not force:
        raise DraftkitError(f"run dir {run_dir} already holds a run config; pass --force to "
                            "overwrite it, or --name to start another run")
    info = registry.resolve(cfg.target.name)
    if info.source in (registry.SOURCE_GGUF, registry.SOURCE_RANDOM):
        target_dir(info)  # embedded targets: convert/build once into the cache now
    run_dir.mkdir(parents=True, exist_ok=True)
    artifacts.write_text_atomic(paths.config, config.dump(cfg))
    return run_dir


def next_steps(run_dir: Path, cfg: RunConfig) -> str:
    info = registry.resolve(cfg.target.name)
    lines = [f"wrote {run_dir / config.CONFIG_NAME}"]
    if (Path(run_dir) / "drafts" / "current").is_symlink():  # an imported draft
        return "\n".join(lines + from_draft_run.describe(Path(run_dir)))
    if info.source == registry.SOURCE_HUB:
        lines.append(f"needs downloading before prepare: {info.hub_id} (target weights)"
                     + ("" if cfg.data.source == "local" else
                        f"; the '{cfg.data.recipe}' recipe's Hugging Face datasets"))
    elif info.source == registry.SOURCE_GGUF:
        lines.append(f"target {info.name}: embedded GGUF, converted once into "
                     f"{artifacts.home() / 'targets' / info.name}")
    if line := kinds.of(cfg).describe(cfg):
        lines.append(line)
    try:
        lines.append(plan.render(plan.make(cfg, config.run_paths(run_dir), [Path("results")])))
    except plan.NoDevice as e:
        lines.append(f"no plan on this machine: {e}")
    verbs = ("prepare", "harvest", "train", "export", "eval")
    lines += ["next:"] + [f"  draftkit {verb} {run_dir}" for verb in verbs
                          if verb != "harvest" or cfg.train.mode == "stored"]
    return "\n".join(lines)
