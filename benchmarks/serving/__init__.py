"""How fast vLLM serves a draft, against no speculation and the free methods.

    goals           the demo's drafts against n-gram, suffix and no speculation at every
                    (split, T, batch), and the exported serving choice (scripts/bench_goals.py)
    step, step_timers   where a speculative step's time goes, per method and batch
                    (scripts/bench_step.py; step_timers is the vLLM plugin that times it)
    draft_sampling  greedy vs probabilistic drafting at T > 0 (scripts/bench_draft_sampling.py)
    swap_server     draft swaps into a running `vllm serve` under client load
                    (scripts/bench_swap_server.py)
    cpu_bind        vLLM's CPU thread binding and compile setting for draftkit's engines
                    (scripts/bench_cpu_bind.py)
"""
