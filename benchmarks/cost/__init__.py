"""What each stage costs in time and memory, on the CPU and at a target's real scale.

    harvest         regeneration tokens/s, harvest against a bare target forward, bytes per
                    harvested token (scripts/bench_harvest.py)
    stream          offline training's peak memory as the harvest grows (scripts/bench_stream.py)
    capture         a refresh's capture online vs through harvest shards (scripts/bench_capture.py)
    train_step      where an EAGLE-3 training step's time goes (scripts/bench_train_step.py)
    scale, scale_report   harvest, training and refresh at a real target's shapes, and the
                    projections from them (scripts/bench_scale.py)
"""
