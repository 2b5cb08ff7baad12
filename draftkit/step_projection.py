"""`draftkit project`: what a measured rollout speedup buys an RL step (Amdahl, sync or async).

    draftkit project --generation-s 100 --step-s 151.2 --rollout-speedup 1.767 --mode sync
    draftkit project --generation-s 100 --step-s 151.2 --rollout-speedup 1.767 --mode async

Synchronous RL (generate, then logprob + train, in turn): only the generation share shrinks,
    step' = generation / rollout_speedup + (step - generation) + other_delta.
Asynchronous RL (rollouts for step i+1 overlap training on step i): in steady state a step
takes as long as the slower of the two overlapped parts,
    step_async  = max(generation, step - generation)
    step_async' = max(generation / rollout_speedup, step - generation + other_delta),
and `speedup_vs_sync` compares it with the synchronous step without speculation (the
combination the NeMo-RL study projects at 235B). Weight-sync and staleness limits are not
modelled: the projection is an upper bound for async.

`other_delta` is an explicit, usually zero input: the change of the non-generation time when
speculation is switched on (draft weight refit, online draft training, or plain run-to-run
variation of the logprob/train stages). The published NeMo-RL 8B synchronous case (Iso et al.,
"Accelerating RL Post-Training Rollouts via System-Integrated Speculative Decoding",
arXiv:2604.26779; NeMo-RL v0.6, EAGLE-3, vLLM, Qwen3-8B RL-Think) reports generation
100.0 s -> 56.6 s (1.77x, the in-domain draft) and step 151.2 s -> 107.5 s (1.41x). Pure
Amdahl gives 151.2 - 100.0 + 56.6 = 107.8 s; the reported step is 0.3 s shorter, so the
non-generation stages (prepare + logprob + train) took 51.2 s without and 50.9 s with
speculation. The per-stage table behind that was not reachable here (only summaries of the
paper, which give the stage list and a 65-72% rollout share), so the 0.3 s is modelled as
`other_delta_s=-0.3` rather than attributed to a stage. tests/test_project.py checks the
projection against hand-computed Amdahl and takes the published step as an out-of-sample
prediction (107.8 s predicted from the generation times alone, 107.5 s reported).
"""

from __future__ import annotations

from draftkit.core.errors import DraftkitError

MODES = ("sync", "async")


def project_step(generation_s: float, step_s: float, rollout_speedup: float, mode: str = "sync",
                 other_delta_s: float = 0.0) -> dict:
    """Projected RL step time and speedup from a rollout (generation) speedup."""
    if mode not in MODES:
        raise DraftkitError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if generation_s <= 0 or rollout_speedup <= 0:
        raise DraftkitError("generation time and rollout speedup must be > 0 (e.g. "
                            "--generation-s 100 --rollout-speedup 1.8)")
    if step_s < generation_s:
        raise DraftkitError(f"step time {step_s} s is shorter than its generation time "
                            f"{generation_s} s; pass the whole RL step time as --step-s")
    other = step_s - generation_s  # prepare + logprob + train (+ anything not generation)
    other_new = other + other_delta_s
    if other_new < 0:
        raise DraftkitError(f"other_delta_s={other_delta_s} makes the non-generation time "
                            "negative")
    gen_new = generation_s / rollout_speedup
    out = {"mode": mode, "rollout_speedup": rollout_speedup, "generation_s": generation_s,
           "generation_new_s": gen_new, "other_s": other, "other_new_s": other_new,
           "other_delta_s": other_delta_s, "rollout_share": generation_s / step_s}
    if mode == "sync":
        before, after = step_s, gen_new + other_new
    else:
        before, after = max(generation_s, other), max(gen_new, other_new)
        out["speedup_vs_sync"] = step_s / after
        out["bound_by"] = "generation" if gen_new >= other_new else "training"
    out.update(step_s=before, step_new_s=after, step_speedup=before / after)
    return out


def render(p: dict) -> str:
    """The projection as a few aligned lines for the terminal."""
    lines = [
        f"mode: {p['mode']}  (rollout share of the step: {p['rollout_share']:.0%})",
        f"generation: {p['generation_s']:8.1f} s -> {p['generation_new_s']:8.1f} s "
        f"({p['rollout_speedup']:.2f}x)",
        f"other:      {p['other_s']:8.1f} s -> {p['other_new_s']:8.1f} s "
        f"(other_delta {p['other_delta_s']:+.1f} s)",
        f"RL step:    {p['step_s']:8.1f} s -> {p['step_new_s']:8.1f} s "
        f"({p['step_speedup']:.2f}x)",
    ]
    if p["mode"] == "async":
        lines.append(f"async step is bound by {p['bound_by']}; vs the synchronous step without "
                     f"speculation: {p['speedup_vs_sync']:.2f}x (upper bound: no staleness "
                     "limit or weight-sync cost modelled)")
    return "\n".join(lines)
