"""bench_scale's report: projections from its measured tokens/s (the `TIER=full` demo recipe, a
SpecBundle-size run), the Markdown tables and the PNG. Pure functions of the result dict that
cost/scale.py measures.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import report

# make demo TIER=full (scripts/demo.py FULL_OVERRIDES): the harvest of its data, 5 epochs
# (results/bench_learning_1120_sub2e5.json, setting sub-2-e5: harvest_tokens, train.epochs)
FULL_TIER_TOKENS, FULL_TIER_EPOCHS = 589_171, 5
SPECBUNDLE_SAMPLES = 1_400_000  # SpecBundle-size training set (samples)


def project(res: dict, spec_tokens: int) -> dict:
    """Hours on this device from the measured tokens/s: offline (harvest once, then epochs over
    the shards; the shards' disk) and online (the target in the loop every epoch)."""
    harvest = res["harvest"]["tokens_per_s"]
    forward, train = res["bare_forward"]["tokens_per_s"], res["train"]["tokens_per_s"]

    def cost(tokens: float, epochs: int) -> dict:
        return {"tokens": tokens, "epochs": epochs, "harvest_h": tokens / harvest / 3600,
                "train_h": epochs * tokens / train / 3600,
                "offline_h": (tokens / harvest + epochs * tokens / train) / 3600,
                "harvest_disk_gb": tokens * res["harvest"]["bytes_per_token"] / 1e9,
                "online_h": epochs * tokens * (1 / forward + 1 / train) / 3600}

    spec = cost(SPECBUNDLE_SAMPLES * spec_tokens, 1)
    spec.update(samples=SPECBUNDLE_SAMPLES, tokens_per_sample_assumed=spec_tokens)
    return {"full_tier": cost(FULL_TIER_TOKENS, FULL_TIER_EPOCHS), "specbundle": spec,
            "excluded": "data preparation and regeneration (vLLM), evals, checkpoints"}


def device_name(res: dict) -> str:
    hw = res["hardware"]
    return hw.get("cuda_name", "GPU") if res["device"].startswith("cuda") else \
        f"{hw['cpu_model']} ({hw['cpu_count']} cores)"


def count(n: float) -> str:
    """1.2e9 -> '1.20B', 3.4e6 -> '3.40M', 5e4 -> '50.0k'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def markdown(res: dict) -> str:
    h, b, t, r = res["harvest"], res["bare_forward"], res["train"], res["refresh"]
    d, p = res["data"], res["projections"]
    rows = [("bare target forward incl. lm_head", b["tokens_per_s"], "1.00x", b["peak_gib"]),
            (f"harvest: capture + write shards ({res['dtypes']['harvest_storage']})",
             h["tokens_per_s"], f"{res['harvest_vs_bare']:.2f}x", h["peak_gib"]),
            *([("bare decoder forward, no lm_head (what harvest computes); harvest vs it",
                res["bare_decoder"]["tokens_per_s"], f"harvest {res['harvest_vs_decoder']:.2f}x",
                res["bare_decoder"]["peak_gib"])] if "bare_decoder" in res else []),
            *([(f"harvest into a null sink (forward, capture, encode, copies, "
                f"{res['null_sink']['writers']} writers storing nothing; "
                f"{res['null_sink']['packing']})", res["null_sink"]["tokens_per_s"],
                f"{res['null_sink_vs_decoder']:.2f}x the decoder", float("nan"))]
              if "null_sink" in res else []),
            (f"EAGLE-3 head training, batch {t['batch_tokens']} tokens",
             t["tokens_per_s"], "", t["peak_gib"]),
            (f"refresh fine-tune, batch {r['batch_tokens']} tokens (target resident)",
             r["finetune_tokens_per_s"], "", r["peak_gib"])]
    md = [f"# What a draft costs at `{res['target']}` scale on {device_name(res)}", "",
          f"Target `{res['target']}`: {count(res['target_params_b'] * 1e9)} parameters, "
          f"{res['shapes']['num_hidden_layers']} layers, hidden {res['shapes']['hidden_size']}, "
          f"vocab {res['shapes']['vocab_size']}; random weights (AL not reported: it means "
          f"nothing on them), built on the device in {res['target_build_s']:.1f} s. Device "
          f"`{res['device']}`; target dtype {res['dtypes']['target']}, training autocast "
          f"{res['dtypes']['train_autocast']} (fp32 master weights), torch threads "
          f"{res['torch_threads']}; commit "
          f"{res['git_sha'][:10]}. Data: {d['sequences']} random-token sequences x "
          f"{d['seq_len']} tokens; EAGLE-3 head: aux ids {res['aux_layer_ids']}, draft vocab "
          f"{res['draft_vocab_size']}, TTT {res['ttt_steps']}, "
          f"{count(res['head_trainable_params_m'] * 1e6)} trainable parameters. Peak memory: "
          + ("CUDA max_memory_allocated per phase." if res["device"].startswith("cuda") else
             "the process's peak RSS per phase (Python and torch included)."), "",
          "| what | tokens/s | vs bare forward | peak memory GiB |", "|---|---|---|---|"]
    md += [f"| {n} | {tps:,.0f} | {ratio} | {'' if gib != gib else f'{gib:.2f}'} |"
           for n, tps, ratio, gib in rows]
    md += hardware_lines(res)
    md += ["", f"Harvest stores {h['bytes_per_token']:,} bytes per token; its target load took "
           f"{h['load_s']:.1f} s. Head training: {t['steps']} timed steps of "
           f"{t['step_s']:.3f} s, batch shapes {t['batch_shapes']}"
           + (f"; out of memory at {t['oom_at']} batch tokens" if t["oom_at"] else "") + ".",
           "", "| refresh part | seconds |", "|---|---|",
           f"| AL estimate, {r['heldout_rows']} held-out rows (twice per refresh) | "
           f"{r['estimate_s']:.2f} |",
           f"| capture, {r['train_rows']} rows (online, in RAM) | {r['capture_s']:.2f} |",
           f"| one fine-tune step | {r['finetune_step_s']:.3f} |",
           f"| **a refresh of refresh.budget_steps={r['budget_steps']}** | "
           f"**{r['projected_s']:.1f}** |", "",
           f"Projected on this device from these tokens/s ({p['excluded']} excluded):", "",
           "| run | tokens | epochs | harvest h | train h | offline total h | harvest disk GB "
           "| online h (target in the loop) |", "|---|---|---|---|---|---|---|---|"]
    spec = p["specbundle"]
    for name, c in ((f"`TIER=full` recipe ({FULL_TIER_TOKENS:,} harvested tokens)",
                     p["full_tier"]),
                    (f"SpecBundle-size: {spec['samples']:,} samples x "
                     f"{spec['tokens_per_sample_assumed']} tokens (assumed mean)", spec)):
        md.append(f"| {name} | {c['tokens']:,.0f} | {c['epochs']} | {c['harvest_h']:.2f} | "
                  f"{c['train_h']:.2f} | {c['offline_h']:.2f} | {c['harvest_disk_gb']:,.0f} | "
                  f"{c['online_h']:.2f} |")
    md += ["", "Each further SpecBundle epoch adds its train hours (offline) or its online "
           "hours again.", ""]
    return "\n".join(md)


def hardware_lines(res: dict) -> list[str]:
    """The disk's own rate, MFU with its FLOP count, the verify-cost curve and the projection."""
    out = []
    if "disk" in res:
        d = res["disk"]
        out += ["", f"Disk: {d['bytes_per_s'] / 1e9:.2f} GB/s sequential write of "
                f"{d['bytes'] >> 20} MiB through the shard writer (sha256 as written, then "
                f"fsync {d['fsync_s']:.2f} s), in this run; harvest at the bare decoder's rate "
                f"needs {d['needed_bytes_per_s'] / 1e9:.2f} GB/s."]
    if "mfu" in res:
        f, m, p = res["train_flops"], res["mfu"], res["matmul_peak"]
        t = f["terms"]
        out += ["", f"Head training MFU: {f['total'] / 1e9:.2f} GFLOP per token = {f['formula']}"
                f" (fc {t['fc'] / 1e9:.3f}, layer {t['layer_per_ttt_step'] / 1e9:.3f} and "
                f"lm_head {t['lm_head_per_ttt_step'] / 1e9:.3f} per TTT step, verifier logits "
                f"{t['verifier_logits'] / 1e9:.3f} GFLOP); achieved "
                f"{m['achieved_flops'] / 1e12:.1f} TFLOP/s = {m['vs_measured_matmul']:.1%} of "
                f"this device's measured {p['dtype']} matmul "
                f"({p['measured_flops'] / 1e12:.1f} TFLOP/s)"
                + (f", {m['vs_spec']:.1%} of the spec sheet's dense bf16 "
                   f"{p['spec_flops'] / 1e12:.0f}" if "vs_spec" in m else "") + "."]
    if "verify" in res:
        v, pr = res["verify"], res["projection"]
        qs = list(range(1, v["k"] + 2))
        out += ["", f"Verify cost of the target (forward of q new tokens per sequence against "
                f"a {v['context']}-token KV cache, relative to q = 1 at the same batch), and "
                f"the **{pr['label']}**: speedup = {pr['tokens_per_step']} tokens per target "
                f"step / (verify of k+1 + k x {pr['draft_step_rel']:.3f} draft steps):", "",
                "| batch | 1-token step ms | " + " | ".join(f"q={q}" for q in qs[1:])
                + " | projected speedup |", "|---" * (len(qs) + 2) + "|"]
        proj = {r["batch"]: r["projected_speedup"] for r in pr["rows"]}
        for r in v["rows"]:
            if r.get("oom"):
                out.append(f"| {r['batch']} | out of memory |" + " |" * (len(qs) + 0))
                continue
            rel = r["relative"]
            out.append(f"| {r['batch']} | {r['seconds'][1] * 1e3:.2f} | "
                       + " | ".join(f"{rel[q]:.2f}" for q in qs[1:])
                       + f" | {proj[r['batch']]:.2f}x |")
    return out


def plot(res: dict, path: Path) -> None:
    """Tokens/s per phase and the projected hours, side by side."""
    plt = report.pyplot()
    fig, (a, c) = plt.subplots(1, 2, figsize=(11, 3.6))
    names = ["bare forward", "harvest", "head training", "refresh fine-tune"]
    tps = [res["bare_forward"]["tokens_per_s"], res["harvest"]["tokens_per_s"],
           res["train"]["tokens_per_s"], res["refresh"]["finetune_tokens_per_s"]]
    bars = a.barh(names[::-1], tps[::-1], color=["#dd8452", "#55a868", "#4c72b0", "#8c8c8c"])
    a.bar_label(bars, fmt="%.0f", padding=3)
    a.margins(x=0.2)
    a.set(xlabel="tokens / s", title=f"{res['target']} on {device_name(res)[:40]}")
    p = res["projections"]
    labels = ["TIER=full offline", "TIER=full online", "SpecBundle offline",
              "SpecBundle online"]
    hours = [p["full_tier"]["offline_h"], p["full_tier"]["online_h"],
             p["specbundle"]["offline_h"], p["specbundle"]["online_h"]]
    bars = c.barh(labels[::-1], hours[::-1], color="#4c72b0")
    c.bar_label(bars, fmt="%.2f h", padding=3)
    c.set_xscale("log")
    c.margins(x=0.3)
    c.set(xlabel="projected hours on this device (log)",
          title="projected cost (SpecBundle: 1 epoch)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
