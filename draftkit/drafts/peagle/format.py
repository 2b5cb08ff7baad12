"""The speculators P-EAGLE checkpoint: an EAGLE-3 config.json plus what parallel drafting needs.

vLLM 0.32 reads it (transformers_utils/configs/speculators/algos.py `update_peagle`,
models/llama_eagle3.py) as the EAGLE-3 format of drafts/eagle_family/format.py with:
- `speculators_model_type: "peagle"` -> architecture Peagle{Llama,Qwen3}ForCausalLM (vLLM's
  Eagle3 classes) and, where vLLM reads the speculators config itself, `method: eagle3,
  parallel_drafting: true`;
- `mask_token_id` (required) -> the draft config's `pard_token`: the token id of every
  parallel slot after the first;
- a `mask_hidden` tensor [1, 1, A*Ht] in model.safetensors (the speculators package's shape;
  vLLM views any shape as [1, A*Ht]): the aux features of a parallel slot,
  fused by the head's fc like real ones (vLLM fails to load a parallel drafter without it).
`update_peagle` copies only draft_vocab_size, target_hidden_size, norm_before_residual,
norm_before_fc and the aux ids from the top level: `fc_norm` and `norm_output` reach vLLM only
through `transformer_layer_config`, so they are written there too (norm_output is unused by a
parallel drafter: its hidden_out is never fed back).
"""

from __future__ import annotations

import torch

from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import format as eagle3_fmt
from draftkit.drafts.eagle_family.format import DraftSpec

TYPE = "peagle"
MASK_HIDDEN = "mask_hidden"


def to_config(spec: DraftSpec, mask_token_id: int) -> dict:
    """The speculators-format P-EAGLE config.json."""
    conf = eagle3_fmt.to_config(spec)
    conf["architectures"] = ["PEagleSpeculator"]
    conf["speculators_model_type"] = TYPE
    conf["speculators_config"]["algorithm"] = TYPE
    conf["mask_token_id"] = int(mask_token_id)
    layer = conf["transformer_layer_config"]
    layer["fc_norm"], layer["norm_output"] = bool(spec.fc_norm), bool(spec.norm_output)
    return conf


def from_config(conf: dict) -> tuple[DraftSpec, int | None]:
    """(spec, mask token id) of a P-EAGLE config.json, or of an EAGLE-3 one (id None: a warm
    start from an EAGLE-3 head, whose parallel slots are not trained yet)."""
    kind = conf.get("speculators_model_type")
    if kind not in (TYPE, "eagle3"):
        raise DraftkitError(f"config.json is neither a speculators P-EAGLE nor an EAGLE-3 config "
                            f"(speculators_model_type={kind!r})")
    spec = eagle3_fmt.from_config({**conf, "speculators_model_type": "eagle3"})
    if kind == "eagle3":
        return spec, None
    if "mask_token_id" not in conf:
        raise DraftkitError("a P-EAGLE config.json needs `mask_token_id` (vLLM refuses it "
                            "without one); re-export the head with draftkit")
    return spec, int(conf["mask_token_id"])


def check_state_dict(spec: DraftSpec, tensors: dict[str, torch.Tensor],
                     mask_token_id: int | None) -> None:
    """The EAGLE-3 checks (drafts/eagle_family/format.py) plus `mask_hidden` [A*Ht] and a mask token
    inside the target vocab."""
    width = spec.num_aux * spec.target_hidden_size
    mask = tensors.get(MASK_HIDDEN)
    if mask is None or mask.numel() != width:
        got = None if mask is None else tuple(mask.shape)
        raise DraftkitError(f"a P-EAGLE checkpoint needs `{MASK_HIDDEN}` of {width} values "
                            f"(aux layers x target hidden size), got {got}: vLLM refuses to "
                            "load a parallel drafter without it")
    if mask_token_id is None or not 0 <= mask_token_id < spec.target_vocab_size:
        raise DraftkitError(f"mask_token_id={mask_token_id} is outside the target vocab "
                            f"(0..{spec.target_vocab_size - 1})")
    eagle3_fmt.check_state_dict(spec, {k: v for k, v in tensors.items() if k != MASK_HIDDEN})
