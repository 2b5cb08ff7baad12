"""Whether a refresh earns its cost while RL moves the policy.

    grpo_loop, grpo, reward   a small GRPO loop on the embedded target with the draft refreshed
                              and swapped in place (scripts/rl_loop.py)
    refresh                   the refresh benchmark: stale vs refreshed vs scratch vs the free
                              methods (scripts/bench_refresh.py)
    style_shift               a controlled policy drift for that benchmark (scripts/drift_policy.py)
    scratch                   the from-scratch draft baseline (scripts/scratch_draft.py)
"""
