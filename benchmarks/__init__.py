"""The lab beside the product: benchmark harnesses that import draftkit and that draftkit never
imports, grouped by the question they answer. scripts/ holds their thin drivers (argparse and
one call), each writing results/<bench>.{json,md,png}.

    cost/       what each stage costs in time and memory: harvest, streaming, refresh capture,
                a training step, a real target's scale
    learning/   what acceptance a training recipe buys: EAGLE-3 and draft-LM runs, the
                training and data levers, the AL-vs-compute frontier, vocab coverage, misses,
                near-duplicates
    serving/    how fast vLLM serves a draft: the goals table against the free methods, where a
                step's time goes (and the step timers), greedy vs probabilistic drafting, swaps
                into a running server
    rl/         whether refresh earns its cost during RL: the GRPO loop with the draft swapped
                in place, the refresh benchmark, a controlled drift, the from-scratch baseline
    report      what the benchmarks share: bench runs over a finished run's data, the vLLM
                table and plots, writing results/
    headline    the README's headline table, derived from a bench_goals result
"""
