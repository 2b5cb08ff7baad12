"""Peak memory and tokens/s of offline training as the harvest grows 10x.

For each size, a run of the in-process `tiny-llama` target (hidden 128, aux [2, 4, 5]: 1 KiB of
bf16 hidden states per token) gets a harvest in the shard format (`harvest/shards.py`) of
random token sequences (lengths 64-512) whose hidden states are random too: training reads
them exactly as it reads the target's (cost/harvest.py measures the harvest itself). Then,
each in a fresh process:
- `materialise`: what offline training did before streaming, `list(open_harvest(..).sequences())`,
  then every value read once (as an epoch does);
- `stream`: the data path alone: one epoch of train batches (train/data.py) read through a
  DataLoader worker and dropped, no model;
- `train`: one epoch of `draftkit train` (EAGLE-3 head, streamed through a DataLoader worker).
Peak RSS is the process's VmHWM, and the peaks (sampled every 50 ms) of its anonymous and
file-backed parts; the DataLoader worker's peak PSS is split the same way; PSS total is the
largest sum of the proportional set sizes of the process and its workers (shared pages counted
once). Batch shapes = distinct [B, T] of the epoch's plan, with train.pad_multiple and without.
Train tokens/s = harvest tokens / the loop's time (loop.py's train_s_this_call: model and data
setup not counted).

Each measurement runs in a fresh process (cost/children.py).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks import report
from benchmarks.cost.children import STREAM_OVERRIDES as OVERRIDES
from draftkit.core import artifacts, batching, config, hardware
from draftkit.harvest import shards
from draftkit.harvest.shards import open_harvest
from draftkit.init.stage import init_run

ROOT = Path(__file__).resolve().parents[2]  # the repo root: where `-m benchmarks...` imports
TARGET = "tiny-llama"


def write_harvest(run: Path, tokens: int, seed: int) -> None:
    """A complete harvest (train ~`tokens` tokens, eval 4k) of random sequences and states,
    plus prepare's token counts (the draft vocab is built from them)."""
    cfg = config.load(run)
    t, aux = cfg.target, cfg.draft.aux_layer_ids
    g, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    counts = torch.zeros(t.vocab_size, dtype=torch.long)
    for split, budget in (("train", tokens), ("eval", 4096)):
        directory = artifacts.RunPaths(run).harvest / ("" if split == "train" else split)
        lengths = []
        while sum(lengths) < budget:
            lengths.append(rng.randint(64, 512))
        entries = []
        for index, rows in enumerate(shards.plan_shards(lengths, cfg.harvest.shard_tokens)):
            n = sum(lengths[r] for r in rows)
            ids = torch.randint(3, t.vocab_size, (n,), generator=g)  # [T]
            mask = torch.ones(n, dtype=torch.long)  # [T]
            entries.append(shards.write_shard(directory, index, {
                "aux": torch.randn(n, len(aux) * t.hidden_size, generator=g).bfloat16(),
                "last": torch.randn(n, t.hidden_size, generator=g).bfloat16(),
                "input_ids": ids, "loss_mask": mask,
                "seq_lens": torch.tensor([lengths[r] for r in rows]),
                "sample_idx": torch.tensor(rows)}, "bench-stream"))
            if split == "train":
                counts += torch.bincount(ids, minlength=t.vocab_size)
        shards.write_manifest(directory, {
            "split": split, "target": {"name": t.name, "hidden_size": t.hidden_size},
            "aux_layer_ids": aux, "dtype": "bfloat16", "data_fingerprint": "bench-stream",
            "bytes_per_token": shards.bytes_per_token(len(aux), t.hidden_size, "bfloat16")},
            entries)
    artifacts.RunPaths(run).data.mkdir(parents=True, exist_ok=True)
    save_file({"counts": counts}, str(artifacts.RunPaths(run).data / "token_freqs.safetensors"))


def measure(run: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.cost.children", "stream", mode,
                          str(run)], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def batch_shapes(run: Path) -> dict:
    """Distinct [B, T] micro-batch shapes of a training epoch: with the run's
    train.pad_multiple, and with 1 (T = the longest sequence, as before buckets)."""
    cfg = config.load(run, OVERRIDES)
    lengths = open_harvest(artifacts.RunPaths(run).harvest).lengths()
    out = {}
    for m in (cfg.train.pad_multiple, 1):
        plan = batching.plan_batches(lengths, cfg.train.batch_tokens, pad_multiple=m)
        out[f"pad_{m}"] = len({(len(b), batching.padded_length(max(lengths[i] for i in b), m))
                               for b in plan})
    return out


def one_size(root: Path, tokens: int, seed: int) -> dict:
    run = init_run(TARGET, "math", name=f"stream-{tokens}", runs_dir=root, overrides=OVERRIDES)
    write_harvest(run, tokens, seed)
    man = artifacts.read_json(artifacts.RunPaths(run).harvest / "manifest.json")
    files = sum(f.stat().st_size for f in artifacts.RunPaths(run).harvest.glob("shard-*"))
    return {"tokens": man["total_tokens"], "sequences": man["total_sequences"],
            "shards": len(man["shards"]), "harvest_mib": files / 2**20,
            "batch_shapes": batch_shapes(run),
            **{mode: measure(run, mode) for mode in ("materialise", "stream", "train")}}


def write_results(res: dict, out: Path) -> None:
    h = res["hardware"]
    pad = res["pad_multiple"]
    md = [f"Streaming benchmark: target `{res['target']}` (1 KiB of bf16 hidden states per token),"
          f" random sequences of 64-512 tokens and states, one epoch, train.dtype "
          f"{res['train_dtype']}, train.pad_multiple {pad}, one torch thread, {h['cpu_model']} "
          f"({', '.join(h['cpu_flags'])}; {h['cpu_count']} shared cores). Each measurement in a fresh process: peak RSS = its "
          "VmHWM, split into the peaks of its anonymous (heap) and file-backed pages; worker PSS "
          "= the peak PSS of the DataLoader worker (anon / file); PSS total = process plus worker,"
          " shared pages counted once.",
          "", "| harvest | shard files | materialised (old: list(sequences()), read once): "
          "peak RSS | data stream: peak RSS / PSS total | data stream: worker PSS (anon / file) "
          "| data tokens/s | train: batch shapes (T rounded to "
          f"{pad} / not) | train: peak RSS (anon + file) | train: PSS total | train: worker PSS "
          "(anon / file) | train tokens/s |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]

    def worker(m: dict) -> str:
        return (f"{m['worker_peak_pss_mib']:.0f} ({m['worker_peak_pss_anon_mib']:.0f} / "
                f"{m['worker_peak_pss_file_mib']:.0f}) MiB")

    for s in res["sizes"]:
        m, d, t = s["materialise"], s["stream"], s["train"]
        md.append(f"| {s['tokens']:,} tokens, {s['shards']} shards | {s['harvest_mib']:.0f} MiB | "
                  f"{m['peak_rss_mib']:.0f} MiB | {d['peak_rss_mib']:.0f} / "
                  f"{d['peak_pss_mib']:.0f} MiB | {worker(d)} | {d['tokens_per_s']:,.0f} | "
                  f"{s['batch_shapes'][f'pad_{pad}']} / {s['batch_shapes']['pad_1']} | "
                  f"{t['peak_rss_mib']:.0f} ({t['peak_rss_anon_mib']:.0f} + "
                  f"{t['peak_rss_file_mib']:.0f}) MiB | {t['peak_pss_mib']:.0f} MiB | {worker(t)} | "
                  f"{t['tokens_per_s']:,.0f} |")
    a, b = res["sizes"][0], res["sizes"][-1]

    def grew(mode: str, key: str) -> str:
        return f"{b[mode][key] - a[mode][key]:+.0f} MiB"

    md += ["", f"Harvest x{b['tokens'] / a['tokens']:.1f}: materialised peak RSS "
           f"{grew('materialise', 'peak_rss_mib')}; data stream peak RSS "
           f"{grew('stream', 'peak_rss_mib')} (worker PSS {grew('stream', 'worker_peak_pss_mib')},"
           f" of it file-backed {grew('stream', 'worker_peak_pss_file_mib')}); training peak RSS "
           f"{grew('train', 'peak_rss_mib')} (anon {grew('train', 'peak_rss_anon_mib')}, file "
           f"{grew('train', 'peak_rss_file_mib')}; worker PSS "
           f"{grew('train', 'worker_peak_pss_mib')}; PSS total {grew('train', 'peak_pss_mib')}).",
           ""]
    report.write_report(out, "bench_stream", res, "\n".join(md), lambda path: _plot(res, path))


def _plot(res: dict, path: Path) -> None:
    plt = report.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [f"{s['tokens'] / 1000:.0f}k tok" for s in res["sizes"]]
    x = range(len(labels))
    ax1.plot(x, [s["materialise"]["peak_rss_mib"] for s in res["sizes"]], "o-",
             label="materialised (old)")
    ax1.plot(x, [s["train"]["peak_rss_mib"] for s in res["sizes"]], "o-",
             label="streamed training")
    ax1.plot(x, [s["train"]["peak_rss_anon_mib"] for s in res["sizes"]], "o--",
             label="streamed training, anon")
    ax1.plot(x, [s["stream"]["peak_pss_mib"] for s in res["sizes"]], "o-",
             label="data stream, PSS incl. worker")
    ax1.set_xticks(list(x), labels)
    ax1.set_ylim(bottom=0)
    ax1.set_ylabel("peak RSS / PSS (MiB)")
    ax1.legend()
    ax2.bar(labels, [s["train"]["tokens_per_s"] for s in res["sizes"]], color="#55a868")
    ax2.set_ylabel("train tokens / s (1 epoch)")
    fig.suptitle(f"{res['target']} harvest, {res['hardware']['cpu_model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> None:
    """The bench as scripts/bench_stream.py's flags ask: every size measured in every mode,
    <out>/bench_stream.{json,md,png} written."""
    with tempfile.TemporaryDirectory() as tmp:
        counts = [args.tokens, *([int(args.tokens * args.scale / 2.5)] if args.mid else []),
                  args.tokens * args.scale]
        sizes = [one_size(Path(tmp), n, seed) for seed, n in enumerate(counts)]
    res = {"target": TARGET, "hardware": hardware.summary(), "overrides": OVERRIDES,
           "train_dtype": hardware.resolve("auto"), "pad_multiple": config.TrainConfig().pad_multiple,
           "sizes": sizes}
    write_results(res, args.out)
    print((args.out / "bench_stream.md").read_text())

