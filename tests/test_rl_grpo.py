"""GRPO pieces on hand-computed numbers: group advantages, the clipped objective (value and
gradient), the k3 KL, aggregation across micro-batches, the response mask, the math reward,
and one policy update that raises the log-prob of the rewarded sample."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.rl import grpo, reward


def test_group_advantages_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5], [2.0, 0.0, 1.0, 1.0]])
    a = grpo.group_advantages(r, eps=0.0 + 1e-12)
    # row 0: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    assert torch.allclose(a[0], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    assert torch.equal(a[1], torch.zeros(4))  # equal rewards: no signal
    # row 2: mean 1, std sqrt(2 / 3)
    s = math.sqrt(2 / 3)
    assert torch.allclose(a[2], torch.tensor([1 / s, -1 / s, 0.0, 0.0]))
    assert torch.allclose(grpo.group_advantages(r, scale=False)[0],
                          torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_clipped_objective_values_and_gradient():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    mask = torch.ones(1, 2)
    # A = +1: token 0 ratio 1.5 -> clipped to 1.2; token 1 ratio 0.5 stays (min picks it)
    per, clipped = grpo.clipped_token_loss(logp, old, torch.tensor([1.0]), 0.2)
    assert torch.allclose(per, torch.tensor([[-1.2, -0.5]]))
    assert clipped.tolist() == [[True, False]]
    loss = grpo.aggregate(per, mask, "token", n_tokens=2, n_seqs=1)
    assert loss.item() == pytest.approx(-0.85)
    loss.backward()
    # d/dlogp of -ratio*A/2: clipped token has no gradient, the other -0.5 * 0.5
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.25]]))
    # A = -1: token 0 keeps -1.5 (pessimistic), token 1 is clipped at 0.8
    per, clipped = grpo.clipped_token_loss(logp.detach(), old, torch.tensor([-1.0]), 0.2)
    assert torch.allclose(per, torch.tensor([[1.5, 0.8]]))
    assert clipped.tolist() == [[False, True]]


def test_kl_k3_and_aggregation():
    assert grpo.kl_k3(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.0
    got = grpo.kl_k3(torch.tensor([0.0]), torch.tensor([math.log(0.5)])).item()
    assert got == pytest.approx(0.5 + math.log(2) - 1)
    per = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert grpo.aggregate(per, mask, "token", 3, 2).item() == pytest.approx(2.0)  # (1+2+3)/3
    assert grpo.aggregate(per, mask, "sequence", 3, 2).item() == pytest.approx(2.25)  # (1.5+3)/2
    halves = sum(grpo.aggregate(per[i:i + 1], mask[i:i + 1], "token", 3, 2) for i in range(2))
    assert halves.item() == pytest.approx(2.0)  # micro-batches add up to the batch mean
    with pytest.raises(ValueError, match="aggregation"):
        grpo.aggregate(per, mask, "mean", 3, 2)


def test_pad_batch_marks_predicted_response_tokens():
    ids, attn, mask, adv = grpo.pad_batch([grpo.Sample([5, 6], [7, 8, 9], 1.0),
                                           grpo.Sample([5], [7], -1.0)], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9], [5, 7, 0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # position t predicts ids[t+1]: row 0 predicts 7, 8, 9 from positions 1, 2, 3
    assert mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    assert adv.tolist() == [1.0, -1.0]


def test_math_reward():
    ref = reward.reference_answer("3 * 12 = $36\n36 + 4 = 40\n#### 40")
    assert ref == 40.0
    assert reward.math_reward("so 36 + 4 = 40\n#### 40", ref) == {
        "reward": pytest.approx(1.1), "correct": 1.0, "formatted": 1.0}
    assert reward.math_reward("The answer is $40.00.", ref)["reward"] == 1.0
    assert reward.math_reward("#### 1,200", 1200.0)["correct"] == 1.0
    assert reward.math_reward("I think 40, no wait 41", ref)["reward"] == 0.0
    assert reward.math_reward("#### 41", ref, format_weight=0.2)["reward"] == pytest.approx(0.2)
    assert reward.math_reward("no numbers here", ref)["reward"] == 0.0
    with pytest.raises(ValueError, match="####"):
        reward.reference_answer("no marker 12")


def test_policy_update_raises_the_rewarded_sample(one_thread):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2))
    ref = LlamaForCausalLM(model.config)
    ref.load_state_dict(model.state_dict())
    good, bad = grpo.Sample([1, 2], [3, 4, 5], 1.0), grpo.Sample([1, 2], [6, 7], -1.0)

    def logp_of(s):
        ids, attn, mask, _ = grpo.pad_batch([s], 0)
        with torch.no_grad():
            return float((grpo.token_logprobs(model, ids, attn) * mask).sum())

    g0, b0 = logp_of(good), logp_of(bad)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    m = grpo.policy_update(model, opt, [good, bad], 0, clip_eps=0.2, kl_coef=0.1, ref_model=ref,
                           epochs=2, micro_batch=1)
    assert logp_of(good) > g0 and logp_of(bad) < b0
    assert m["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # epoch 0 compared equal weights
    assert m["response_tokens"] == 5 and 0.0 <= m["clip_frac"] <= 1.0
    m2 = grpo.policy_update(model, opt, [good, bad], 0, clip_eps=0.2, ref_model=ref)
    assert m2["kl_ref"] > 0  # the policy moved away from the reference


def test_update_on_informative_samples_equals_whole_batch(one_thread):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    a = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=2))
    b = LlamaForCausalLM(a.config)
    b.load_state_dict(a.state_dict())
    batch = [grpo.Sample([1, 2], [3, 4, 5], 1.0), grpo.Sample([1, 2], [6, 7], -1.0),
             grpo.Sample([1, 9], [8], 0.0), grpo.Sample([1, 9], [8, 8, 8, 8], 0.0)]
    assert grpo.mean_kl(a, b, batch, 0) == pytest.approx(0.0, abs=1e-7)
    for agg in ("token", "sequence"):
        grpo.policy_update(a, torch.optim.SGD(a.parameters(), lr=0.5), batch, 0, 0.2,
                           micro_batch=3, agg=agg)
        few = grpo.informative(batch)
        assert len(few) == 2
        grpo.policy_update(b, torch.optim.SGD(b.parameters(), lr=0.5), few, 0, 0.2,
                           micro_batch=3, agg=agg, n_tokens=grpo.response_tokens(batch),
                           n_seqs=len(batch))
        for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
            assert torch.allclose(pa, pb, atol=1e-6), (agg, name)
    assert grpo.mean_kl(a, LlamaForCausalLM(a.config), batch, 0) > 0
