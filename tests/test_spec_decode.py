"""Reference speculative decoder on toy distributions: the acceptance rule, its counters, and
that samples follow the target's distribution (chi-square), with a broken residual as the
negative control the same test must catch; the bonus token after k accepted drafts follows the
target's next-token distribution (directly, and inside whole sampled sequences at k=1)."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from draftkit.core.errors import DraftkitError
from draftkit.eval import spec_decode
from draftkit.eval.spec_decode import probs_from_logits, residual, speculative_decode, verify

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread

V = 6  # toy vocabulary




class ToyLM:
    """Context-dependent toy LM: logits of the token after ids[i] = W[ids[i-1], ids[i]]."""

    def __init__(self, seed: int, scale: float = 1.5):
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(V, V, V, generator=g) * scale  # [prev, cur, V]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:  # target: [L] -> [L, V]
        prev = torch.cat([ids[:1], ids[:-1]])  # position 0 sees itself as "prev"
        return self.w[prev, ids]

    # drafter protocol
    def begin(self, ids: torch.Tensor) -> torch.Tensor:
        self.ids = ids.clone()
        return self(self.ids)[-1]

    def extend(self, token: int) -> torch.Tensor:
        self.ids = torch.cat([self.ids, torch.tensor([token])])
        return self(self.ids)[-1]


def exact_joint(target: ToyLM, prompt: list[int], n: int, temperature: float) -> dict:
    """P(x_1..x_n | prompt) under plain sampling from the target, by enumeration."""
    out = {}
    for seq in itertools.product(range(V), repeat=n):
        ids, prob = list(prompt), 1.0
        for tok in seq:
            prob *= float(probs_from_logits(target(torch.tensor(ids))[-1], temperature)[tok])
            ids.append(tok)
        out[seq] = prob
    return out


def sample_counts(target, drafter, prompt, n, k, temperature, samples, seed) -> dict:
    g = torch.Generator().manual_seed(seed)
    counts: dict = {}
    for _ in range(samples):
        toks = tuple(speculative_decode(target, drafter, prompt, k=k, max_new_tokens=n,
                                        temperature=temperature, generator=g).tokens)
        counts[toks] = counts.get(toks, 0) + 1
    return counts


def chi2_pvalue(counts: dict, joint: dict, samples: int) -> float:
    """Chi-square p-value; outcomes with expected count < 5 are pooled into one cell."""
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for seq, prob in joint.items():
        if prob * samples < 5:
            pool_o, pool_e = pool_o + counts.get(seq, 0), pool_e + prob * samples
        else:
            obs.append(counts.get(seq, 0))
            exp.append(prob * samples)
    obs.append(pool_o)
    exp.append(pool_e)
    assert sum(obs) == samples
    total = sum(exp)  # enumeration in fp32: renormalise so both sums agree exactly
    return float(chisquare(obs, [e * samples / total for e in exp]).pvalue)


def broken_residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The classic bug: resample from q after a rejection instead of norm(max(0, q - p))."""
    return q


# n=3 tokens: 1 prefill + one step of k drafts + bonus. At k >= 2 the bonus is token 4 and cut,
# so (1.0, 1) is the case whose output holds bonus tokens (token 3 after an accepted draft).
@pytest.mark.parametrize("temperature, k", [(1.0, 1), (1.0, 2), (0.7, 3)])
def test_samples_follow_the_target_distribution_and_a_broken_residual_is_caught(
        monkeypatch, temperature, k):
    target, drafter = ToyLM(seed=1), ToyLM(seed=2)
    prompt, n, samples = [0, 1], 3, 4000
    joint = exact_joint(target, prompt, n, temperature)
    counts = sample_counts(target, drafter, prompt, n, k, temperature, samples, seed=0)
    p_ok = chi2_pvalue(counts, joint, samples)
    monkeypatch.setattr(spec_decode, "residual", broken_residual)
    p_bad = chi2_pvalue(sample_counts(target, drafter, prompt, n, k, temperature, samples, 0),
                        joint, samples)
    print(f"T={temperature} k={k}: p(correct)={p_ok:.3g} p(broken residual)={p_bad:.3g}")
    assert p_ok > 0.01, p_ok
    assert p_bad < 1e-6, p_bad


def test_the_bonus_token_follows_the_target_after_the_last_draft():
    """All k drafts accepted (p = q on the drafted rows) -> the bonus is drawn from q[k], the
    target's distribution after the last draft: not q[k-1], not p, not argmax."""
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(3, V, generator=g) * 1.5, -1)  # [k+1, V], k=2
    p = q[:2].clone()  # [k, V]
    drafts, samples = [int(q[0].argmax()), int(q[1].argmax())], 20000
    counts = torch.zeros(V)
    for _ in range(samples):
        m, bonus = verify(drafts, p, q, g)
        assert m == 2
        counts[bonus] += 1
    print("bonus counts", counts.tolist(), "expected", (q[2] * samples).round().tolist())
    assert chisquare(counts.numpy(), (q[2] * samples / q[2].sum()).numpy()).pvalue > 0.01
    assert (counts / samples - q[2]).abs().max() < 0.015  # 3 sigma at 20000 samples: 0.011


def test_greedy_toy_matches_argmax_decoding_and_counts_positions():
    target, drafter = ToyLM(seed=3), ToyLM(seed=4)
    for k in range(1, 6):
        out = speculative_decode(target, drafter, [2, 5], k=k, max_new_tokens=20)
        assert out.tokens == spec_decode.greedy_decode(target, [2, 5], 20)
        c = out.counters
        assert c.draft_tokens == k * c.drafts and len(c.accepted_per_pos) == k
        assert c.accepted == sum(c.accepted_per_pos)
        assert all(a >= b for a, b in itertools.pairwise(c.accepted_per_pos))
        assert c.acceptance_length == 1 + c.accepted / c.drafts


def test_a_drafter_equal_to_the_target_is_always_accepted():
    target = ToyLM(seed=5)
    for temperature in (0.0, 1.0):
        out = speculative_decode(target, ToyLM(seed=5), [1, 2], k=3, max_new_tokens=17,
                                 temperature=temperature, generator=torch.Generator().manual_seed(0))
        # 1 prefill token + 4 steps x (3 accepted + bonus) = 17 tokens
        assert out.counters.drafts == 4 and out.counters.accepted_per_pos == [4, 4, 4]
        assert out.counters.acceptance_length == 4.0 and len(out.tokens) == 17


def test_verify_rule_cases():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    # draft 1 at pos 0: q=1 >= p=0.5 -> accepted; draft 1 at pos 1: q=0 -> rejected,
    # residual max(0, q - p) = [0, 0, 1] -> token 2.
    assert verify([1, 1], p, q, g) == (1, 2)
    # both accepted (q >= p) -> bonus from q[2] = token 0
    q2 = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert verify([1, 1], p, q2, g) == (2, 0)
    torch.testing.assert_close(residual(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.1, 0.6, 0.3])),
                               torch.tensor([1.0, 0.0, 0.0]))
    # q/p acceptance frequency: q=0.25, p=1 -> accepted 25% of the time
    pp, qq = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    acc = sum(verify([0], pp, qq, g)[0] for _ in range(4000)) / 4000
    assert abs(acc - 0.25) < 0.03


def test_bad_k_and_vocab_mismatch_raise():
    with pytest.raises(DraftkitError, match="k >= 1"):
        speculative_decode(ToyLM(0), ToyLM(1), [0, 1], k=0, max_new_tokens=4)

    class Wide(ToyLM):
        def begin(self, ids):
            return torch.zeros(V + 1)

    with pytest.raises(DraftkitError, match="target vocab"):
        speculative_decode(ToyLM(0), Wide(1), [0, 1], k=1, max_new_tokens=4)


def test_eos_and_max_new_tokens_cut_the_output():
    target = ToyLM(seed=6)
    ref = spec_decode.greedy_decode(target, [0, 1], 30)
    eos = ref[4]
    out = speculative_decode(target, ToyLM(seed=6), [0, 1], k=4, max_new_tokens=30, eos_id=eos)
    assert out.tokens == ref[:ref.index(eos) + 1]
    assert len(speculative_decode(target, ToyLM(7), [0, 1], k=4, max_new_tokens=7).tokens) == 7
