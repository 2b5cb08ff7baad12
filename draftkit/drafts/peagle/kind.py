"""The P-EAGLE head as a draft kind (drafts/kind.py): an EAGLE-3 head whose one forward drafts
all k tokens (model.py), served by vLLM 0.32 as `method: eagle3, parallel_drafting: true` from
a speculators `peagle` dir. Everything but the parallel slots is EAGLE-3's: the same harvest
(aux + last), vocab, decoder layer, loss and refresh features, so it subclasses the EAGLE
family's kind base (drafts/eagle_family/kind_base.py), as the EAGLE-3 kind does.
Its speculative config is EAGLE-3's with `parallel_drafting`; eval rows read `method` "peagle"
beside "eagle3". After an in-place reload in vLLM, `after_load` recomputes the mask slots' cached
hidden state (vLLM derives it from `mask_hidden` once, at load).
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError
from draftkit.drafts.eagle_family import format as eagle3_fmt
from draftkit.drafts.eagle_family.kind_base import EagleFamilyKind
from draftkit.drafts.kind import device_of, register
from draftkit.drafts.peagle import format as fmt
from draftkit.drafts.peagle.build import build
from draftkit.drafts.peagle.drafter import PEagleDrafter
from draftkit.drafts.peagle.export import export_run, write_files
from draftkit.drafts.peagle.model import PEagleDraft


class PEagleKind(EagleFamilyKind):
    name, method = "peagle", "peagle"

    # ----------------------------------------------------------------- init, train

    def describe(self, cfg) -> str | None:
        k = cfg.draft.num_speculative_tokens
        return (f"P-EAGLE: one draft forward proposes all k={k} tokens (vLLM parallel_drafting); "
                "train.init_from=RUN starts it from a trained EAGLE-3 head of the same target")

    def check_train(self, cfg) -> None:
        k, steps = cfg.draft.num_speculative_tokens, cfg.train.ttt_steps
        if steps < k:
            raise DraftkitError(
                f"train.ttt_steps={steps} trains {steps} parallel slots but the head drafts "
                f"k={k} (draft.num_speculative_tokens): vLLM would serve slots it never "
                f"learned. Set train.ttt_steps={k} (or more, for a larger k at serving time)")

    def build(self, cfg, data_runs: list, target) -> torch.nn.Module:
        return build(cfg, data_runs, target)

    # ----------------------------------------------------------------- export, eval

    def export_run(self, run) -> Path:
        return export_run(run)

    def speculative_config(self, directory: str | Path, k: int | None,
                           sample: str = "greedy") -> dict:
        return {**super().speculative_config(directory, k, sample), "parallel_drafting": True}

    def export_shapes(self, conf: dict, cfg) -> dict[str, tuple]:
        spec, _ = fmt.from_config(conf)
        t = cfg.target
        return {"hidden size": (spec.hidden_size, t.hidden_size),
                "target hidden size": (spec.target_hidden_size, t.hidden_size),
                "vocab": (spec.target_vocab_size, t.vocab_size)}

    def load_export(self, directory: Path, target_model) -> torch.nn.Module:
        return _load(directory, target_model)

    def reference_drafter(self, draft, target):
        return PEagleDrafter(draft, target)

    # ----------------------------------------------------------------- refresh

    def load(self, directory: Path, policy_model, k: int):
        """The published head with k parallel slots; `step_logits` (EAGLE-3's ttt_unroll over
        the overridden ttt_states) then gives k x [B, T, Vd] for those slots."""
        return _load(directory, policy_model, ttt_steps=k).float().to(device_of(policy_model))

    def export(self, model, tmp: Path, final: Path, cfg) -> None:
        spec = eagle3_fmt.with_k(model.spec, cfg.draft.num_speculative_tokens)
        tensors = model.export_state_dict()
        fmt.check_state_dict(spec, tensors, model.mask_token_id)
        write_files(tmp, final, spec, tensors, model.mask_token_id, cfg)

    def engine_view(self, directory: Path) -> dict[str, torch.Tensor]:
        """EAGLE-3's view plus vLLM's `mask_hidden` buffer [1, A*Ht] (top level of the model).
        vLLM derives the parallel slots' hidden state from it (fc applied) once, at load."""
        out = super().engine_view(directory)
        mask = out.pop("model." + fmt.MASK_HIDDEN)
        out[fmt.MASK_HIDDEN] = mask.reshape(1, -1)
        return out

    # ----------------------------------------------------------------- inside vLLM

    @torch.no_grad()
    def after_load(self, drafter) -> bool:
        """A P-EAGLE drafter's mask slots read `parallel_drafting_hidden_state_tensor`, which
        vLLM computes from `mask_hidden` once, in the proposer's load_model (fc over the aux
        states for EAGLE-3): an in-place reload leaves it stale. Worse, vLLM's layerwise
        reload (both swap paths) puts the old `mask_hidden` back: it is a non-persistent
        buffer of the top-level model, which `load_weights` copies into while the reload holds
        it on the meta device. So the buffer is read again from the dir the drafter was just
        loaded from (`draftkit_path`, recorded by either load), then the cached state is
        recomputed as load_model does; False where the drafter has none."""
        cached = getattr(drafter, "parallel_drafting_hidden_state_tensor", None)
        model = drafter.model
        if cached is None or not getattr(drafter, "pass_hidden_states_to_model", False) \
                or not hasattr(model, "mask_hidden"):
            return False
        path = getattr(model, "draftkit_path", None)
        if path is not None:
            model.mask_hidden.copy_(_mask_hidden(Path(path)).view_as(model.mask_hidden))
        flat = model.mask_hidden.view(-1)  # [A*H] the learned aux states of a mask slot
        cached.copy_(model.combine_hidden_states(flat)
                     if getattr(drafter, "eagle3_use_aux_hidden_state", False) else flat)
        return True


def _mask_hidden(directory: Path) -> torch.Tensor:
    """The published `mask_hidden` of a P-EAGLE dir, read alone from its safetensors."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        if fmt.MASK_HIDDEN not in f.keys():
            raise DraftkitError(f"{directory} has no `{fmt.MASK_HIDDEN}`: not a P-EAGLE draft")
        return f.get_tensor(fmt.MASK_HIDDEN)


def _load(directory: Path, target_model, ttt_steps: int | None = None):
    kwargs = {} if ttt_steps is None else {"ttt_steps": ttt_steps}
    model = PEagleDraft.from_pretrained(directory, target_model, **kwargs)
    if model.mask_token_id is None:
        raise DraftkitError(f"{directory} holds an EAGLE-3 head, not a P-EAGLE one; serve it "
                            "with the eagle3 kind, or train a P-EAGLE head from it "
                            "(train.init_from)")
    return model


KIND = register(PEagleKind())
