"""Greedy losslessness of the reference decoder with real models: tiny-llama target (fp32), and
as drafter (a) a small random Llama sharing the vocab, (b) the target itself, (c) a random
EAGLE-3 head. Output must equal plain greedy decoding token for token for k = 1..5."""

from __future__ import annotations

import importlib
from itertools import pairwise

import pytest
import torch

from draftkit.drafts.draft_lm.drafter import HFDraftLM
from draftkit.drafts.eagle_family.drafter import Eagle3Drafter
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.eval.spec_decode import HFTarget, greedy_decode, speculative_decode

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread

init = importlib.import_module("draftkit.init.stage")

AUX = [1, 3, 5]  # distinct ascending ids within tiny-llama's layers (vLLM collects each once)
MAX_NEW = 24




@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 512, (n,), generator=g).tolist() for n in (5, 11, 17)]


@pytest.fixture(scope="module")
def reference(tiny_target, prompts):
    """Plain greedy continuation of each prompt (model(...).logits, no capture hooks)."""
    model = tiny_target.model

    def plain(ids):
        return model(input_ids=ids[None], use_cache=False).logits[0]

    return [greedy_decode(plain, p, MAX_NEW) for p in prompts]


@pytest.fixture(scope="module")
def draft_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=256)
    torch.manual_seed(1)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    return model.eval()


@pytest.fixture(scope="module")
def eagle3(tiny_target):
    cfg = init.resolve("tiny-llama", "math", overrides=[
        f"draft.aux_layer_ids={AUX}", "draft.draft_vocab_size=256"])
    counts = torch.randint(0, 1000, (512,), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(3)
    draft = Eagle3Draft.from_run_config(cfg, DraftVocab.build(counts, 256), tiny_target.model)
    return draft.eval()


def check_lossless(target, make_drafter, prompts, reference):
    """Returns the AL at each k; asserts token-exact equality with plain greedy."""
    als = {}
    for k in range(1, 6):
        accepted = drafts = 0
        for prompt, ref in zip(prompts, reference, strict=True):
            out = speculative_decode(target, make_drafter(), prompt, k=k, max_new_tokens=MAX_NEW)
            assert out.tokens == ref, (k, prompt)
            c = out.counters
            assert all(a >= b for a, b in pairwise(c.accepted_per_pos))
            accepted, drafts = accepted + c.accepted, drafts + c.drafts
        als[k] = 1 + accepted / drafts
    return als


def test_greedy_lossless_with_a_draft_lm(tiny_target, prompts, reference, draft_lm):
    als = check_lossless(HFTarget(tiny_target.model), lambda: HFDraftLM(draft_lm), prompts,
                         reference)
    print("random draft LM AL by k:", als)
    assert all(1.0 <= al <= k + 1 for k, al in als.items())


def test_the_target_as_its_own_draft_lm_accepts_everything(tiny_target, prompts, reference):
    als = check_lossless(HFTarget(tiny_target.model), lambda: HFDraftLM(tiny_target.model),
                         prompts, reference)
    assert als == {k: k + 1.0 for k in range(1, 6)}


class NoisyTarget(HFDraftLM):
    """The target plus seeded noise on its logits: agrees with it only part of the time, so
    verification steps mix accepted drafts, rejections and bonus tokens."""

    def _next_logits(self):
        noise = torch.randn(512, generator=torch.Generator().manual_seed(self._ids.numel()))
        return super()._next_logits() + 0.3 * noise


def test_greedy_lossless_with_a_partly_right_drafter(tiny_target, prompts, reference):
    als = check_lossless(HFTarget(tiny_target.model), lambda: NoisyTarget(tiny_target.model),
                         prompts, reference)
    print("noisy-target drafter AL by k:", als)
    assert all(1.2 < al < k + 1 for k, al in als.items())


def test_greedy_lossless_with_an_eagle3_head(tiny_target, prompts, reference, eagle3):
    target = HFTarget(tiny_target.model, aux_layer_ids=AUX)
    als = check_lossless(target, lambda: Eagle3Drafter(eagle3, target), prompts, reference)
    print("EAGLE-3 random head AL by k:", als)
    assert all(1.0 <= al <= k + 1 for k, al in als.items())


def test_eagle3_first_draft_matches_the_trainers_alignment(tiny_target, eagle3):
    """begin(x_0..x_{L-1}) must score what TTT step 0 scores at index L-2 (token x_{L-1} with
    feature h_{L-2}, position L-2), and extend() must not change the earlier rows."""
    from draftkit.targets.capture import capture

    ids = torch.randint(3, 512, (9,), generator=torch.Generator().manual_seed(4))
    target = HFTarget(tiny_target.model, aux_layer_ids=AUX)
    drafter = Eagle3Drafter(eagle3, target)
    got = drafter.begin(ids)  # [V]
    aux, _ = capture(tiny_target.model, ids[None], AUX)  # [1, 9, A*H]
    with torch.no_grad():
        step0 = eagle3.ttt_unroll(aux, ids[None], torch.ones(1, 9, dtype=torch.long))[0]
    want = eagle3.target_logits(step0[0, 7])  # [V]
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)) and int(finite.sum()) == 256
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-4)
    before = drafter._hidden.clone()
    drafter.extend(int(got.argmax()))
    assert torch.equal(drafter._hidden[:, :8], before) and drafter._pos[0, -1].item() == 8


def test_eagle3_reads_features_from_the_verification_pass(tiny_target, prompts, eagle3):
    """No extra target passes for features: one prefill + one verification per step."""

    class Counting(HFTarget):
        calls = 0

        def __call__(self, ids):
            Counting.calls += 1
            return super().__call__(ids)

    target = Counting(tiny_target.model, aux_layer_ids=AUX)
    out = speculative_decode(target, Eagle3Drafter(eagle3, target), prompts[1], k=3,
                             max_new_tokens=MAX_NEW, temperature=1.0,
                             generator=torch.Generator().manual_seed(0))
    assert Counting.calls == 1 + out.steps


@pytest.mark.slow
def test_greedy_lossless_on_smollm2_with_a_partly_right_drafter(smollm2_target):
    """The real 49k-vocab target and its chat template, stopping at <|im_end|>."""
    tok, model = smollm2_target.tokenizer, smollm2_target.model
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 12 times 7?"}],
                                     add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)

    class Noisy(HFDraftLM):
        def _next_logits(self):
            noise = torch.randn(model.config.vocab_size,
                                generator=torch.Generator().manual_seed(self._ids.numel()))
            return super()._next_logits() + 2.0 * noise

    target = HFTarget(model)
    ref = greedy_decode(target, prompt, 32, eos_id=tok.eos_token_id)
    out = speculative_decode(target, Noisy(model), prompt, k=3, max_new_tokens=32,
                             eos_id=tok.eos_token_id)
    print("smollm2 noisy-self drafter AL:", out.counters.acceptance_length, tok.decode(ref))
    assert out.tokens == ref
    assert 1.0 < out.counters.acceptance_length < 4.0
