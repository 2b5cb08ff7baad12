"""Step costs for eval's projected speedup, timed in torch on this machine.

    projected speedup = (1 + sum_i a_i) * c_target / (c_verify(k) + k * c_draft)

c_target: one target forward of 1 new token per sequence with a KV cache at the mean eval
context (prompt + half the generation budget), batch b; c_verify(k): the same with k+1 new
tokens (the verification pass); c_draft: one draft step for 1 new token per sequence, the
kind's `draft_step_call` (drafts/kind.py), else a cached forward. For an
EAGLE-3 head that is `Eagle3Draft.step` on one row (fc input projection excluded, no attention
over the context: the head has no KV cache here, so this slightly underestimates vLLM's
cached draft step); for a draft LM it is the same cached forward as c_target. n-gram drafting
costs 0. Each cost is the minimum over interleaved timed calls after a warm-up. vLLM's
own scheduling, sampling and proposer overheads are not in the model: the gap between the
projected and the measured speedup is that overhead.
"""

from __future__ import annotations

import time

import torch

from draftkit.drafts import kind as kinds

REPEATS = 7  # timed rounds at least
MIN_SECONDS = 1.0  # keep adding rounds (up to MAX_ROUNDS) until this much time was measured
MAX_ROUNDS = 100


def _min_times(fns: dict) -> dict:
    """Seconds per call of each fn: two warm-up rounds, then rounds calling every fn in turn
    (interleaved, so drifting background load hits all alike) until REPEATS rounds and
    MIN_SECONDS have passed; the minimum of each is kept (noise only ever adds time)."""
    for _ in range(2):
        for fn in fns.values():
            fn()
    best = dict.fromkeys(fns, float("inf"))
    start, rounds = time.perf_counter(), 0
    while rounds < REPEATS or (time.perf_counter() - start < MIN_SECONDS and rounds < MAX_ROUNDS):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
        rounds += 1
    return best


def _cached_forward(model, batch: int, context: int, new: int):
    """A call running `new` tokens per sequence on top of a `context`-token KV cache."""
    vocab = model.config.vocab_size
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(new)
    ids = torch.randint(0, vocab, (batch, context), generator=g).to(device)  # [b, context]
    cache = model(input_ids=ids, use_cache=True).past_key_values
    x = torch.randint(0, vocab, (batch, new), generator=g).to(device)  # [b, new]

    def call():
        model(input_ids=x, past_key_values=cache, use_cache=True)
        cache.crop(context)  # back to the context for the next call

    return call


@torch.no_grad()
def step_costs(target_model, draft, cfg, prompts: list[list[int]]) -> dict:
    """c_target, c_verify(k) and c_draft per eval batch size (seconds)."""
    e = cfg.eval
    context = int(sum(map(len, prompts)) / len(prompts) + e.max_new_tokens / 2)
    rows = []
    kind = kinds.of(cfg)
    for b in e.batch_sizes:  # a draft LM's step is a cached forward, as the target's
        fns = {"target": _cached_forward(target_model, b, context, 1),
               "draft": (kind.draft_step_call(draft, b, context)
                         or _cached_forward(draft, b, context, 1))}
        fns.update({str(k): _cached_forward(target_model, b, context, k + 1)
                    for k in e.k_values})
        t = _min_times(fns)
        rows.append({"batch_size": b, "target_s": t["target"], "draft_s": t["draft"],
                     "verify_s": {str(k): t[str(k)] for k in e.k_values}})
    return {"context_tokens": context, "statistic": "min over >= 7 interleaved rounds",
            "device": "torch fp32 (the reference decoder's models)", "rows": rows}


def project(per_position: list[float], k: int, target_s: float, verify_s: float,
            draft_s: float) -> float:
    """(1 + sum_i a_i) * c_target / (c_verify(k) + k * c_draft)."""
    return (1.0 + sum(per_position)) * target_s / (verify_s + k * draft_s)


def add_projections(rows: list[dict], costs: dict) -> None:
    """Put `projected_speedup` on every speculative vLLM row (in place)."""
    by_batch = {c["batch_size"]: c for c in costs["rows"]}
    for r in rows:
        if r["method"] == "none":
            r["projected_speedup"] = None
            continue
        c = by_batch[r["batch_size"]]
        draft_s = 0.0 if r["method"] in ("ngram", "suffix") else c["draft_s"]  # no draft model
        r["projected_speedup"] = project(r["per_position"], r["k"], c["target_s"],
                                         c["verify_s"][str(r["k"])], draft_s)
