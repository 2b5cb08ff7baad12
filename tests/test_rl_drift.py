"""The teacher-forced AL estimate on hand-made drafts whose answer is known: a draft that is
the policy itself (every step accepted), a draft that always proposes a token the policy never
picks (AL 1), and the T>0 rules (greedy drafts accept with p(draft), probabilistic with
sum min(p, q))."""

from __future__ import annotations

import pytest
import torch

from draftkit.rl import drift
from draftkit.rl.rollouts import Rollout

K = 3
NOMODEL = torch.nn.Module()  # the fake kinds below need no draft module


class PolicyAsDraft:
    """step j at index t returns the policy's own logits for x_{t+2+j} (position t+1+j)."""

    def __init__(self, scale: float = 1.0, wrong: bool = False):
        self.scale, self.wrong = scale, wrong

    def features(self, model, policy_model, ids, attn):
        out = policy_model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
        return {"logits": out.logits.float(), "last": _pre_norm_last(policy_model, ids, attn)}

    def step_logits(self, model, batch):
        logits = batch["logits"] * self.scale  # [B, T, V]
        if self.wrong:  # the policy's least likely token
            logits = -logits
        steps = [torch.cat([logits[:, 1 + j:], logits[:, :1 + j]], dim=1) for j in range(K)]
        return steps, torch.arange(logits.shape[-1])


def _pre_norm_last(policy_model, ids, attn):
    from draftkit.targets.capture import capture

    n = policy_model.config.num_hidden_layers
    _, last = capture(policy_model, ids, [n], attention_mask=attn)
    return last.float()


def _rows(target, n=4, gen=12):
    tok, rows = target.tokenizer, []
    for i in range(n):
        p = tok(f"<|im_start|>user\n{i} plus {i * 3}?<|im_end|>\n<|im_start|>assistant\n",
                add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = target.model.generate(torch.tensor([p]), max_new_tokens=gen, do_sample=False,
                                        eos_token_id=None)[0].tolist()
        rows.append(Rollout(out, [0] * len(p) + [1] * (len(out) - len(p)), len(p), f"x:{i}"))
    return rows


def test_self_draft_accepts_everything_and_wrong_draft_nothing(tiny_target, one_thread):
    rows = _rows(tiny_target)
    est = drift.estimate(PolicyAsDraft(), NOMODEL, tiny_target.model, rows, K, [0.0, 1.0],
                         "probabilistic")
    starts = sum(sum(r.loss_mask) - 1 for r in rows)  # t with x_{t+1}, x_{t+2} in the response
    assert est["T=0"]["starts"] == starts
    # at start t, step j exists while t+2+j < len: the tail loses j steps per row
    expect = [(starts - j * len(rows)) / starts for j in range(K)]
    assert est["T=0"]["per_position"] == pytest.approx(expect)
    assert est["T=1"]["per_position"] == pytest.approx(expect, abs=1e-5)  # q = p: alpha = 1
    wrong = drift.estimate(PolicyAsDraft(wrong=True), NOMODEL, tiny_target.model, rows, K, [0.0])
    assert wrong["T=0"]["al"] == 1.0


def test_greedy_draft_at_temperature_accepts_with_p_of_its_token(tiny_target, one_thread):
    rows = _rows(tiny_target, n=2)
    batch = drift.pad_rows(rows)
    kind = PolicyAsDraft()
    feats = kind.features(None, tiny_target.model, batch["input_ids"], batch["attention_mask"])
    p = torch.softmax(feats["logits"] / 0.7, -1)  # [B, T, V]
    est = drift.estimate(kind, NOMODEL, tiny_target.model, rows, K, [0.7], "greedy")
    # step 0 at start t: alpha = max_x p_{t+1}(x) (the draft proposes the policy argmax)
    top = p.max(-1).values  # [B, T]
    alphas = [top[i, r.prompt_len:len(r.input_ids) - 1] for i, r in enumerate(rows)]
    want0 = torch.cat(alphas).mean().item()
    assert est["T=0.7"]["per_position"][0] == pytest.approx(want0, rel=1e-4)
    assert est["T=0.7"]["per_position"][1] < est["T=0.7"]["per_position"][0]


def test_step_alpha_rules():
    p_logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    q_logits = torch.log(torch.tensor([[0.2, 0.6]]))  # draft vocab -> target ids [0, 1]
    ids = torch.tensor([0, 1])
    assert drift.step_alpha(q_logits, ids, p_logits, 0.0, "greedy").item() == 0.0  # 1 vs 0
    assert drift.step_alpha(q_logits, ids, p_logits, 1.0, "greedy").item() == pytest.approx(0.3)
    # min(.5,.25)+min(.3,.75)+0 with q renormalised over the draft vocab (0.25, 0.75)
    assert drift.step_alpha(q_logits, ids, p_logits, 1.0, "probabilistic").item() == \
        pytest.approx(0.55)


def test_walk_follows_vllms_path():
    # row 1: start 2, 3 accepted -> next start 2+3+1 = 6: 0 accepted -> 7: no start, stop
    # row 2: start 1, 1 accepted -> 3: 2 accepted -> 6: no start
    accepted = torch.tensor([[-1, -1, 3, 0, 1, 2, 0, -1], [-1, 1, 0, 2, -1, -1, -1, -1]])
    assert drift.walk(accepted, K).tolist() == [3, 2, 1, 4]


def test_walk_of_the_self_draft(tiny_target, one_thread):
    rows = _rows(tiny_target, n=3)
    est = drift.estimate(PolicyAsDraft(), NOMODEL, tiny_target.model, rows, K, [0.0])["T=0"]
    # every draft of K accepted: starts every K+1 tokens; the tail start accepts what is left
    assert est["walk"]["al"] > 1 + K - 0.5 and est["walk"]["per_position"][0] == 1.0
