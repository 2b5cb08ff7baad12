"""Drafts trained elsewhere, read and checked against a target before `init --from-draft` writes
anything: the format is detected from `config.json`, converted once at this edge, and every
mismatch with the target becomes one line naming the field, both values and the fix.

Formats (draft kind in brackets):
- speculators EAGLE-3, `speculators_model_type: "eagle3"` (eagle3): read as it is;
- speculators P-EAGLE, `speculators_model_type: "peagle"` (peagle): as it is;
- SpecForge EAGLE-3, `architectures: ["LlamaForCausalLMEagle3"]` (eagle3): a plain Llama config
  of the draft layer with `draft_vocab_size`; its aux ids number layer OUTPUTS (SpecForge's
  default [1, N//2-1, N-4]), so each moves up by one to vLLM's numbering (id k = the state
  entering layer k; default [2, N//2, N-3]); weights `midlayer.*` become `layers.0.*`. No aux
  ids in the config = SpecForge's default.
Not imported (one error naming it): speculators' DFlash, DFlash2, DSpark, MTP and XPress
layouts (draftkit's DFlash kind reads vLLM's `DFlashDraftModel` layout, a different one), and
a draft that trains its own token embedding (`embed_requires_grad: true`): draftkit's drafts
share the target's embedding, as vLLM serves them, so such a draft would serve differently.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError
from draftkit.core.registry import TargetInfo
from draftkit.drafts.eagle_family import format as eagle3_fmt
from draftkit.drafts.eagle_family.format import DraftSpec
from draftkit.drafts.peagle import format as peagle_fmt

SPECFORGE_ARCH = "LlamaForCausalLMEagle3"
NOT_IMPORTED = ("dflash", "dflash2", "dspark", "mtp", "xpress")
FORMATS = ("speculators eagle3", "speculators peagle", f"SpecForge {SPECFORGE_ARCH}")


@dataclass
class Foreign:
    kind: str  # the draftkit draft kind it becomes: eagle3 | peagle
    format: str  # one of FORMATS
    spec: DraftSpec  # vLLM's aux numbering, the embedding left to the target
    mask_token_id: int | None  # P-EAGLE only
    tensors: dict[str, torch.Tensor]  # checked: exactly what the kind's format holds
    notes: list[str]  # conversions made at this edge


# ----------------------------------------------------------------------------- reading


def read(directory: Path) -> Foreign:
    """The draft in `directory`, its format detected and converted, its tensors checked."""
    conf_path = directory / "config.json"
    if not conf_path.is_file():
        raise DraftkitError(f"{directory} has no config.json, so it is no draft checkpoint. "
                            "Point --from-draft at the directory holding the draft's config.json "
                            "and model.safetensors (or at its Hugging Face id)")
    conf = json.loads(conf_path.read_text())
    stype, archs = conf.get("speculators_model_type"), conf.get("architectures") or []
    if stype in ("eagle3", "peagle"):
        found = _speculators(conf, stype, load_tensors(directory))
    elif SPECFORGE_ARCH in archs:
        found = _specforge(conf, load_tensors(directory))
    elif stype in NOT_IMPORTED:
        raise DraftkitError(
            f"{directory} is a speculators '{stype}' draft, a format draftkit does not import "
            f"(it imports: {', '.join(FORMATS)}); train a draftkit draft of that kind instead "
            "(`draftkit init --draft dflash`, then prepare, harvest, train)")
    else:
        raise DraftkitError(
            f"{directory}/config.json names no format draftkit knows (speculators_model_type="
            f"{stype!r}, architectures={archs}); it imports: {', '.join(FORMATS)}")
    _check_tensors(found)
    return found


def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards a model.safetensors.index.json names."""
    from safetensors.torch import load_file  # as every draftkit module reads safetensors

    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for s in shards for k, v in load_file(str(directory / s)).items()}
    raise DraftkitError(f"{directory} has no model.safetensors (nor an index of shards): "
                        "draftkit imports safetensors weights only; re-save the draft with "
                        "safetensors (save_pretrained does by default)")


def _own_embedding(conf: dict, tensors: dict, where: str) -> None:
    """Drop a copy of the target's embedding; refuse a trained one (module doc)."""
    if "embed_tokens.weight" in tensors and conf.get("embed_requires_grad", False):
        raise DraftkitError(
            f"{where} trains its own token embedding (embed_requires_grad: true in config.json): "
            "draftkit's drafts share the target's embedding, as vLLM serves them, so this "
            "draft would serve differently after import. Import a draft saved with "
            "embed_requires_grad: false (its embedding is then the target's)")
    tensors.pop("embed_tokens.weight", None)


def _speculators(conf: dict, stype: str, tensors: dict) -> Foreign:
    _own_embedding(conf, tensors, f"this speculators {stype} draft")
    if stype == "eagle3":
        spec, mask = eagle3_fmt.from_config(conf), None
    else:
        spec, mask = peagle_fmt.from_config(conf)
    return Foreign(stype, f"speculators {stype}", spec, mask, tensors, [])


def _specforge(conf: dict, tensors: dict) -> Foreign:
    """A SpecForge head as a speculators EAGLE-3 spec: aux ids +1, midlayer -> layers.0."""
    _own_embedding(conf, tensors, "this SpecForge draft")
    eagle = conf.get("eagle_config") or {}
    given = eagle.get("eagle_aux_hidden_state_layer_ids") or conf.get(
        "eagle_aux_hidden_state_layer_ids")
    decoder = eagle3_fmt.decoder_from_config(conf, conf, 10000.0)
    spec = DraftSpec(
        family="llama", **decoder, aux_layer_ids=[],
        norm_before_residual=bool(conf.get("norm_before_residual", False)),
        norm_before_fc=bool(conf.get("norm_before_fc", False)),
        fc_norm=bool(conf.get("fc_norm", False)), norm_output=bool(conf.get("norm_output", False)),
        num_speculative_tokens=3, verifier_name_or_path="", verifier_architecture="",
        num_layers=int(conf.get("num_hidden_layers", 1)))
    notes = []
    if given:
        spec.aux_layer_ids = [int(i) + 1 for i in given]
        notes.append(f"aux layer ids {list(given)} (SpecForge: layer outputs) -> "
                     f"{spec.aux_layer_ids} (vLLM: the state entering each layer)")
    renamed = {}
    for name, value in tensors.items():
        renamed[name.replace("midlayer.", "layers.0.", 1) if name.startswith("midlayer.")
                else name] = value
    if renamed.keys() != tensors.keys():
        notes.append("weights midlayer.* -> layers.0.*")
    return Foreign("eagle3", FORMATS[2], spec, None, renamed, notes)


def default_specforge_aux(info: TargetInfo) -> list[int]:
    """SpecForge's default taps [1, N//2-1, N-4] in vLLM's numbering: [2, N//2, N-3]."""
    n = info.num_hidden_layers
    return [i + 1 for i in (1, n // 2 - 1, n - 4)]


# ----------------------------------------------------------------------------- checks


def _check_tensors(f: Foreign) -> None:
    """Missing, extra or misshapen tensors, and a d2t that maps outside the vocab, first in
    the words of the vocab map (the format's own check follows with the full lists)."""
    if "d2t" in f.tensors:
        d2t = f.tensors["d2t"].to(torch.int64)
        ids = torch.arange(d2t.numel()) + d2t  # [Vd] target ids
        bad = ((ids < 0) | (ids >= f.spec.target_vocab_size)).nonzero().flatten()
        if bad.numel():
            i = int(bad[0])
            raise DraftkitError(
                f"d2t maps {bad.numel()} draft ids outside the target vocab 0.."
                f"{f.spec.target_vocab_size - 1} (draft id {i} -> target id {int(ids[i])}): d2t "
                "holds offsets (target id = draft id + d2t[id]); the draft's vocab map is broken "
                "or is for another vocabulary. Import a draft whose d2t/t2d were built for this "
                "target's tokenizer")
    if not f.spec.aux_layer_ids:
        return  # SpecForge without ids: checked once the target's default is filled in
    if f.kind == "peagle":
        peagle_fmt.check_state_dict(f.spec, f.tensors, f.mask_token_id)
    else:
        eagle3_fmt.check_state_dict(f.spec, f.tensors)


def fill_default_aux(f: Foreign, info: TargetInfo) -> None:
    """A SpecForge draft without aux ids: SpecForge's default for this target, then the tensor
    checks that needed them."""
    if not f.spec.aux_layer_ids:
        f.spec.aux_layer_ids = default_specforge_aux(info)
        f.notes.append(f"aux layer ids: SpecForge's default, {f.spec.aux_layer_ids} in vLLM's "
                       "numbering")
        _check_tensors(f)


def mismatches(spec: DraftSpec, info: TargetInfo) -> list[str]:
    """One line per field where the draft does not fit the target: field, both values, fix."""
    n, out = info.num_hidden_layers, []

    def line(field: str, draft, target, fix: str) -> None:
        out.append(f"{field}: draft {draft}, target {info.name} {target} -> {fix}")

    other = "import a draft trained for this target (or pass the target it was trained for)"
    if spec.hidden_size != info.hidden_size:
        line("hidden_size", spec.hidden_size, info.hidden_size, other)
    if spec.target_hidden_size != info.hidden_size:
        line("target_hidden_size", spec.target_hidden_size, info.hidden_size, other)
    if spec.target_vocab_size != info.vocab_size:
        line("vocab_size", spec.target_vocab_size, info.vocab_size,
             "the draft was built for another tokenizer; " + other)
    if spec.draft_vocab_size > spec.target_vocab_size:
        line("draft_vocab_size", spec.draft_vocab_size, f"<= {info.vocab_size}", other)
    outside = [i for i in spec.aux_layer_ids if not 0 <= i <= n]
    if outside:
        line("eagle_aux_hidden_state_layer_ids", spec.aux_layer_ids, f"within [0, {n}]",
             f"ids {outside} name layers the target does not have; " + other)
    if spec.family != info.family:
        line("transformer_layer_config.model_type", spec.family, info.family,
             "vLLM builds the draft layer of the target's family; " + other)
    return out


def with_verifier(spec: DraftSpec, name_or_path: str) -> DraftSpec:
    return dataclasses.replace(spec, verifier_name_or_path=name_or_path)
