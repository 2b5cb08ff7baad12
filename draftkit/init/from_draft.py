"""`draftkit init --target T --from-draft SRC`: a run whose current draft is a draft trained
elsewhere (speculators, SpecForge), ready for drift, eval, export, refresh and watch with no
prepare, harvest or train.

    draftkit init --target Qwen3-8B --from-draft RedHatAI/Qwen3-8B-speculator.eagle3
    draftkit init --target tiny-llama --from-draft path/to/speculators_draft --name imported

SRC is a local directory or a Hugging Face hub id. A hub id resolves through huggingface_hub with
the user's cache: a cached snapshot is used as it is (offline too); an uncached one downloads
unless HF_HUB_OFFLINE=1, where the error names the download command. init/foreign.py reads and
converts the draft and lists every field that does not fit the target; the verifier named in
the draft's config, where draftkit knows its shapes (a registry name or hub id, a local HF
dir), must match the target's shapes (lineage: shapes, not names; targets/lineage.py). Nothing
is written until every check passed, and then the whole run dir is built under a temp name and
renamed: `draftkit.yaml` (draft.* from the draft: kind, aux ids, vocab, widths, norm flags),
`drafts/v0000` (the draft as vLLM loads it, with `lineage.json`: source, revision, sha256 of
the files read) and `drafts/current -> v0000`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, snapshot_download

from draftkit.core import artifacts, config, provenance, registry
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.eagle_family import format as eagle3_fmt
from draftkit.drafts.eagle_family.export import portable
from draftkit.drafts.peagle import format as peagle_fmt
from draftkit.init import foreign
from draftkit.rl.publish import DraftStore
from draftkit.targets.lineage import SHAPE_KEYS
from draftkit.targets.load import target_dir

FIRST = "v0000"
# export's vLLM parity check compares with the AL training simulated: an imported draft has none
IMPORT_DEFAULTS = ("export.check=false",)


@dataclass
class Source:
    given: str  # what --from-draft said
    directory: Path  # where the files are
    revision: str | None  # the hub snapshot's commit, None for a local dir


def resolve_source(src: str) -> Source:
    """A local dir as it is; else a hub id through huggingface_hub (cache first)."""
    path = Path(src).expanduser()
    if path.is_dir():
        return Source(src, path.resolve(), None)
    if src.count("/") != 1 or path.exists() or src.startswith((".", "/", "~")):
        raise DraftkitError(f"--from-draft {src}: no such directory, and not a Hugging Face hub "
                            "id (owner/name)")
    try:  # the cache first: works offline, never touches the network
        snap = Path(snapshot_download(src, local_files_only=True))
    except Exception as cached_error:  # not cached (or only partly)
        if constants.HF_HUB_OFFLINE:
            raise DraftkitError(
                f"--from-draft {src}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                f"and HF_HUB_OFFLINE=1 forbids downloading it. On a machine with network access "
                f"run `huggingface-cli download {src}` (same cache), or pass the draft's "
                f"directory ({type(cached_error).__name__})") from None
        try:
            snap = Path(snapshot_download(src))
        except Exception as e:
            raise DraftkitError(f"--from-draft {src}: could not download it from the Hugging "
                                f"Face hub ({type(e).__name__}: {e}); check the id, or run "
                                f"`huggingface-cli download {src}` and try again") from e
    return Source(src, snap, snap.name if snap.parent.name == "snapshots" else None)


def files_sha256(directory: Path) -> str:
    """One sha256 over config.json and the weight files, names and bytes."""
    h = hashlib.sha256()
    for f in sorted(directory.iterdir()):
        if f.name == "config.json" or f.name.endswith((".safetensors", ".safetensors.index.json")):
            h.update(f.name.encode())
            h.update(artifacts.sha256_file(f).encode())
    return h.hexdigest()


def verifier_problems(name: str, info: registry.TargetInfo) -> list[str]:
    """The draft's verifier against the target, by shapes, where draftkit knows its shapes."""
    if not name:
        return []
    try:
        v = registry.resolve(name)
    except DraftkitError:
        return []  # a hub id outside the registry: the draft's own shapes were checked
    keys = (*SHAPE_KEYS, "head_dim")
    return [f"verifier {k}: draft's verifier {name} {getattr(v, k)}, target {info.name} "
            f"{getattr(info, k)} -> this draft was trained for another model; import a draft "
            "of the target's lineage" for k in keys if getattr(v, k) != getattr(info, k)]


def _local_tokenizer(path: Path):
    from transformers import AutoTokenizer  # heavy: only when a tokenizer is compared

    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(path)


def _target_files(info: registry.TargetInfo) -> Path | None:
    """The target's HF dir where it is on this machine: a hub target only from the cache (init
    never downloads weights), the embedded and local ones as draftkit builds them."""
    if info.source != registry.SOURCE_HUB:
        return target_dir(info)
    try:
        return Path(snapshot_download(info.hub_id, local_files_only=True))
    except Exception:  # not cached (huggingface_hub raises several kinds): nothing to compare
        return None


def tokenizer_problems(directory: Path, verifier: str, info: registry.TargetInfo) -> list[str]:
    """The tokenizer that ships with the draft (else its verifier's, a local dir) against the
    target's, token by token, where both are on this machine (nothing is downloaded)."""
    verifier_dir = Path(verifier).expanduser() if verifier else None
    for where in (directory, verifier_dir):
        theirs = _local_tokenizer(where) if where is not None and where.is_dir() else None
        if theirs is not None:
            break
    else:
        return []
    here = _target_files(info)
    ours = _local_tokenizer(here) if here is not None else None
    if ours is None:  # a hub target not downloaded yet: its shapes were checked
        return []
    a, b = theirs.get_vocab(), ours.get_vocab()
    differ = sum(a.get(t) != i for t, i in b.items()) + len(set(a) - set(b))
    if not differ:
        return []
    return [f"tokenizer: the draft's ({where}) and target {info.name}'s differ in {differ} of "
            f"{len(b)} tokens -> the draft was built for another tokenizer; import a draft "
            "trained for this target"]


def draft_overrides(f: foreign.Foreign, k: int | None) -> list[str]:
    """The run's draft.* fields as the imported draft has them (the command line's come after)."""
    s = f.spec
    fields = {"aux_layer_ids": s.aux_layer_ids, "draft_vocab_size": s.draft_vocab_size,
              "hidden_size": s.hidden_size, "intermediate_size": s.intermediate_size,
              "num_attention_heads": s.num_attention_heads,
              "num_key_value_heads": s.num_key_value_heads, "head_dim": s.head_dim,
              "num_layers": s.num_layers, "num_speculative_tokens": k or s.num_speculative_tokens,
              **{flag: getattr(s, flag) for flag in eagle3_fmt.NORM_FLAGS}}
    return [f"draft.{key}={json.dumps(v)}" for key, v in fields.items()]


def check(f: foreign.Foreign, info: registry.TargetInfo, source: Source) -> None:
    problems = foreign.mismatches(f.spec, info) + verifier_problems(
        f.spec.verifier_name_or_path, info)
    if not problems:
        problems = tokenizer_problems(source.directory, f.spec.verifier_name_or_path, info)
    src = source.given
    if problems:
        raise DraftkitError(f"--from-draft {src} does not fit target {info.name} "
                            f"({len(problems)} problems):\n  " + "\n  ".join(problems))


def import_run(resolve, target: str, src: str, data: str | None = None, k: int | None = None,
               name: str | None = None, runs_dir: str | Path = "runs", force: bool = False,
               overrides: list[str] | None = None, kind: str | None = None) -> Path:
    """Check the draft at `src` against `target`, then write the run (module doc); `resolve`
    is init's (init/stage.py: the run config of target, recipe, kind, k, name, overrides).
    The kind is the draft's own; `kind` (init's --draft), where given, must name it."""
    info = registry.resolve(target)
    source = resolve_source(src)
    found = foreign.read(source.directory)
    if kind is not None and kind != found.kind:
        raise DraftkitError(f"--draft {kind}: the draft at {src} is a {found.kind} draft "
                            f"({found.format}), and an imported draft keeps its kind; drop "
                            f"--draft, or pass --draft {found.kind}")
    foreign.fill_default_aux(found, info)
    check(found, info, source)
    base = name or f"{info.name.split('/')[-1].lower()}-{Path(src.rstrip('/')).name.lower()}"
    cfg = resolve(target, data or config.DataConfig().recipe, found.kind, None, base,
                  [*IMPORT_DEFAULTS, *draft_overrides(found, k), *(overrides or [])])
    spec = portable(eagle3_fmt.with_k(found.spec, cfg.draft.num_speculative_tokens), cfg)
    if spec.aux_layer_ids != cfg.draft.aux_layer_ids:
        raise DraftkitError(f"draft.aux_layer_ids={cfg.draft.aux_layer_ids} differs from the "
                            f"imported draft's {spec.aux_layer_ids}: a draft reads the taps it "
                            "was trained on; drop the override")
    run_dir = Path(runs_dir) / cfg.name
    if run_dir.exists() and not force:
        raise DraftkitError(f"run dir {run_dir} already exists; pass --force to replace it, or "
                            "--name to start another run")
    lineage = {"source": src, "resolved": str(source.directory), "revision": source.revision,
               "sha256": files_sha256(source.directory), "format": found.format,
               "converted": found.notes, "draft_kind": found.kind,
               "k": cfg.draft.num_speculative_tokens, "parent": None, "imported": True}
    with artifacts.atomic_dir(run_dir, overwrite=force) as tmp:
        artifacts.write_text_atomic(tmp / config.CONFIG_NAME, config.dump(cfg))
        store = DraftStore(tmp)
        store.publish(FIRST, lambda d, _final: write_version(d, found, spec, cfg, lineage),
                      lineage)
        store.set_current(FIRST)
        store.log("imported", version=FIRST, source=src, revision=source.revision,
                  sha256=lineage["sha256"], format=found.format)
    return run_dir


def write_version(d: Path, f: foreign.Foreign, spec, cfg, lineage: dict) -> None:
    """drafts/v0000: the draft's format files as draftkit exports them (config.json,
    model.safetensors, speculative_config.json) and meta.json."""
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in f.tensors.items()}
    conf = (peagle_fmt.to_config(spec, f.mask_token_id) if f.kind == "peagle"
            else eagle3_fmt.to_config(spec))
    artifacts.write_bytes_atomic(d / "model.safetensors", save(tensors, metadata={"format": "pt"}))
    artifacts.write_json_atomic(d / "config.json", conf)
    sc = kinds.of(cfg).speculative_config(".", spec.num_speculative_tokens,
                                          cfg.draft.draft_sample_method)
    artifacts.write_json_atomic(d / "speculative_config.json", sc)
    provenance.write_meta(d, "import", cfg.to_dict(), None, imported=lineage)


def describe(run_dir: Path) -> list[str]:
    """init's lines for an imported run: what was imported, and the verbs that come next."""
    store = DraftStore(run_dir)
    lin = store.lineage(FIRST)
    rev = f" at {lin['revision'][:12]}" if lin.get("revision") else ""
    lines = [f"imported {lin['source']}{rev} ({lin['format']}) as {store.root / FIRST} "
             f"(drafts/current)"]
    lines += [f"  converted: {n}" for n in lin.get("converted") or []]
    r = run_dir
    return lines + [
        "next (no prepare, harvest or train needed):",
        f"  draftkit drift {r} --policy CKPT --rollouts ROLLOUTS.jsonl   # how well it fits",
        f"  draftkit export {r}                                          # serve it",
        f"  draftkit eval {r}                                            # measure it in vLLM",
        f"  draftkit refresh {r} --policy CKPT --rollouts ROLLOUTS.jsonl # fit it to the policy",
        f"  draftkit watch {r} --checkpoints DIR --rollouts DIR          # refresh as RL moves"]
