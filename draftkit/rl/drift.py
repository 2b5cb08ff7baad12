"""Drift: how well the current draft still fits the policy, without generating anything.

Teacher-forced AL estimate on rollouts: one policy forward (its logits p and the draft's input
features) plus the draft's unroll over the same tokens. A draft started at index t (the policy
just produced x_{t+1}) proposes x_{t+2+j} at step j; the policy's distribution for that token
is p_{t+1+j}. Per step the acceptance probability is
    T = 0:  alpha_j(t) = [vocab_ids[argmax q_j(t)] == argmax p_{t+1+j}]
    T > 0:  alpha_j(t) = sum_x min(p(x), q(x)), p = softmax(logits / T); q = the one-hot of the
            draft's argmax (vLLM's default greedy draft_sample_method) or softmax(draft / T)
            (`draft_sampling=probabilistic`)
A run of drafts stops at the first rejection, so position j is reached and accepted with
c_j(t) = prod_{i<=j} alpha_i(t); per-position acceptance = mean_t c_j(t) (vLLM's
accepted_at_pos_j / drafts) and AL = 1 + sum_j mean_t c_j(t). Start indices t count when the
policy produced x_{t+1} and x_{t+2} (both response tokens). Steps past the end count as
rejected. Every t is a start here; vLLM starts only where the last verification ended. At T=0
on a greedy rollout the teacher-forced tokens are exactly what vLLM accepts, so `walk` also
follows vLLM's path (next start = t + accepted + 1) and reproduces vLLM's own counters.

`EngineAL` reads the same numbers from a live engine's `vllm:spec_decode_*` counter deltas.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftkit.core import config
from draftkit.core.batching import collate, plan_batches, to_device
from draftkit.drafts import kind as kinds
from draftkit.rl.policy import Policy, check_lineage, load_policy
from draftkit.rl.publish import DraftStore
from draftkit.rl.rollouts import Rollout, read_rollouts, rollout_files
from draftkit.serving.counters import SpecCounters
from draftkit.targets.capture import logits_from_last

_CHUNK = 512  # policy logits are computed for this many positions at a time ([n, V] floats)


def pad_rows(rows: list[Rollout]) -> dict[str, torch.Tensor]:
    """Rollouts -> right-padded input_ids, loss_mask, attention_mask, [B, T] each."""
    return collate([{"input_ids": torch.tensor(r.input_ids),
                     "loss_mask": torch.tensor(r.loss_mask)} for r in rows], torch.float32)


def plan(rows: list[Rollout], batch_tokens: int) -> list[list[int]]:
    """Length-sorted groups of row indices with at most batch_tokens padded tokens each."""
    return plan_batches([len(r.input_ids) for r in rows], batch_tokens)


def policy_logits(policy_model, last: torch.Tensor) -> torch.Tensor:
    """last [N, H] (pre-norm) -> policy logits [N, V] in float32, on last's device."""
    dev = policy_model.lm_head.weight.device
    return torch.cat([logits_from_last(policy_model, c.to(dev)).float().to(last.device)
                      for c in last.split(_CHUNK)])


def step_alpha(q_logits: torch.Tensor, vocab_ids: torch.Tensor, p_logits: torch.Tensor,
               temperature: float, draft_sampling: str) -> torch.Tensor:
    """Acceptance probability of one draft step at N positions.

    q_logits [N, Vd] draft logits (draft vocab), vocab_ids [Vd] target id per draft id,
    p_logits [N, V] policy logits -> alpha [N] in [0, 1]."""
    draft_tok = vocab_ids[q_logits.argmax(-1)]  # [N] target ids
    if temperature <= 0:
        return (draft_tok == p_logits.argmax(-1)).float()
    p = F.softmax(p_logits / temperature, dim=-1)  # [N, V]
    if draft_sampling == "greedy":  # q = one-hot(draft_tok): sum_x min(p, q) = p(draft_tok)
        return p.gather(-1, draft_tok[:, None])[:, 0]
    q = torch.zeros_like(p)  # [N, V]
    q[:, vocab_ids] = F.softmax(q_logits.float() / temperature, dim=-1)
    return torch.minimum(p, q).sum(-1)


@torch.no_grad()
def batch_counts(kind, model, policy_model, batch: dict, k: int, temperatures: list[float],
                 draft_sampling: str) -> dict[float, torch.Tensor]:
    """Sums of c_j(t) over start indices, per temperature: {T: [k + 1]} (last entry = count),
    on the CPU; the work runs where the kind put the features (the policy's device)."""
    feats = kind.features(model, policy_model, batch["input_ids"], batch["attention_mask"])
    device = feats["last"].device
    batch = to_device({**batch, **feats}, device)
    steps, vocab_ids = kind.step_logits(model, batch)  # k x [B, T, Vd], [Vd]
    valid = batch["attention_mask"].bool()  # [B, T]
    resp = batch["loss_mask"].bool() & valid  # [B, T]
    t = resp.shape[1]
    start = torch.zeros_like(resp)
    start[:, : t - 2] = resp[:, 1: t - 1] & resp[:, 2:]  # x_{t+1}, x_{t+2} are response tokens
    out = {}
    chains = {temp: torch.ones(int(start.sum()), device=device) for temp in temperatures}
    sums = {temp: [] for temp in temperatures}
    rows, cols = start.nonzero(as_tuple=True)  # [N] start indices
    leading = torch.zeros(len(rows), device=device)  # [N] drafts accepted in a row at T=0
    for j in range(k):
        at = cols + 1 + j  # policy position whose distribution judges step j
        inside = at + 1 < t  # the drafted token x_{at+1} exists in the padded batch ...
        inside[inside.clone()] = valid[rows[inside], at[inside] + 1]  # ... and in the row
        idx = inside.nonzero(as_tuple=True)[0]
        p_logits = policy_logits(policy_model, batch["last"][rows[idx], at[idx]])  # [n, V]
        q_logits = steps[j][rows[idx], cols[idx]].float()  # [n, Vd]
        for temp in temperatures:
            alpha = torch.zeros(len(rows), device=device)
            alpha[idx] = step_alpha(q_logits, vocab_ids, p_logits, temp, draft_sampling)
            chains[temp] = chains[temp] * alpha
            sums[temp].append(chains[temp].sum())
        leading = leading + chains[0.0] if 0.0 in chains else leading  # accepted run at T=0
    for temp in temperatures:
        out[temp] = torch.stack([*sums[temp], torch.tensor(float(len(rows)), device=device)]).cpu()
    if 0.0 in chains:
        accepted = torch.full(start.shape, -1, dtype=torch.long, device=device)  # [B, T]
        accepted[rows, cols] = leading.round().long()  # -1 = no start
        out["walk"] = walk(accepted.cpu(), k)
    return out


def walk(accepted: torch.Tensor, k: int) -> torch.Tensor:
    """vLLM's own path at T=0: the first draft starts after the first response token; after
    `a` accepted drafts the next starts a + 1 tokens later (the bonus token). accepted [B, T]
    (-1 where no draft can start) -> [k + 1]: accepted per position, then drafts."""
    out = torch.zeros(k + 1)
    for row in accepted.tolist():
        t = next((i for i, a in enumerate(row) if a >= 0), len(row))
        while t < len(row) and row[t] >= 0:
            a = row[t]
            out[:a] += 1
            out[k] += 1
            t += a + 1
    return out


def estimate(kind, model, policy_model, rows: list[Rollout], k: int,
             temperatures: list[float] = (0.0,), draft_sampling: str = "greedy",
             batch_tokens: int = 4096) -> dict:
    """Teacher-forced AL of `model` against `policy_model` on `rows`, per temperature:
    {"T=0": {"al", "per_position": [k], "starts", "walk": {...}}, ...}; "walk" (T=0 only)
    scores the same acceptances along the path vLLM itself takes on a greedy rollout."""
    model.eval()
    totals = {temp: torch.zeros(k + 1) for temp in [*temperatures, "walk"]}
    for group in plan(rows, batch_tokens):
        counts = batch_counts(kind, model, policy_model, pad_rows([rows[i] for i in group]), k,
                              list(temperatures), draft_sampling)
        for key, value in counts.items():
            totals[key] += value
    out = {label(temp): summarize(totals[temp]) for temp in temperatures}
    if 0.0 in temperatures:  # the same T=0 acceptances along vLLM's path (see walk)
        out[label(0.0)]["walk"] = summarize(totals["walk"])
    return out


def summarize(total: torch.Tensor) -> dict:
    n = float(total[-1])
    per_pos = [float(x) / n if n else 0.0 for x in total[:-1]]
    return {"al": 1.0 + sum(per_pos), "per_position": per_pos, "starts": int(n)}


def label(temperature: float) -> str:
    return f"T={temperature:g}"


class EngineAL:
    """The AL a live vLLM engine's rollouts got since the last `read`: counter deltas."""

    def __init__(self, llm):
        self.llm = llm
        self.last = SpecCounters.read(llm)

    def read(self) -> dict | None:
        now = SpecCounters.read(self.llm)
        delta, self.last = now.delta(self.last), now
        return delta.as_dict() if delta.drafts else None


def drift(run_dir, policy, rollout_paths: list, overrides: list[str] | None = None) -> dict:
    """`draftkit drift RUN --policy CKPT --rollouts PATH...`: the current draft's estimated AL
    against `policy` (a checkpoint dir or a policy.Policy) on the rollouts, at T=0 and at
    refresh.temperature; logged to the run's refresh log as a `drift` event."""
    run_dir = config.run_dir_of(run_dir)
    cfg = config.load(run_dir, overrides)
    rc, k = cfg.refresh, cfg.draft.num_speculative_tokens
    if not isinstance(policy, Policy):
        policy = load_policy(policy, dtype=cfg.target.dtype)
    check_lineage(policy, cfg)
    store, kind = DraftStore(run_dir), kinds.get(cfg.draft.kind)
    files = rollout_files(rollout_paths)
    rows = read_rollouts(files, policy.tokenizer, cfg.target.vocab_size, rc.max_seq_len)
    model = kind.load(store.current_dir(), policy.model, k)
    est = estimate(kind, model, policy.model, rows, k, sorted({0.0, rc.temperature}),
                   rc.draft_sampling, rc.batch_tokens)
    result = {"draft": store.current() or "export", "policy": policy.source,
              "policy_sha256": policy.digest, "rows": len(rows), "k": k, "estimate": est}
    store.log("drift", **result)
    for key, e in est.items():
        per = " / ".join(f"{a:.2f}" for a in e["per_position"])
        print(f"drift {result['draft']} {key}: AL {e['al']:.3f} (per position {per}; "
              f"{e['starts']} draft starts on {len(rows)} rollouts)")
    return result
