"""What acceptance a training recipe buys, and why a head misses.

    eagle3          a longer EAGLE-3 training on the embedded target, measured in vLLM beside
                    n-gram and no speculation (scripts/bench_eagle3.py)
    draft_lm        a draft LM distilled on the same data and harvest (scripts/bench_draft_lm.py)
    levers          which training and data settings buy AL per CPU-second
                    (scripts/bench_learning.py)
    frontier        AL against the whole CPU cost of a head, over those runs
                    (scripts/bench_frontier.py)
    vocab           the share of answers a draft vocabulary can propose (scripts/bench_vocab.py)
    misses          where the head's first draft token misses (scripts/bench_misses.py)
    dedup           near-duplicates in the prepared data (scripts/bench_dedup.py)
"""
