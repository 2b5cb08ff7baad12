"""Harvest cost on the embedded target (smollm2-135m), in one run:

1. regeneration tokens/s through vLLM (batch 64, T=0, math prompts from `draftkit.mathgen`);
2. those prompts + answers become a prepared train split; `draftkit harvest` runs over it;
3. a bare forward (`model(input_ids)` incl. lm_head) runs over the *same* batches;
4. bytes per harvested token (hidden states, and whole shard files).

Harvest and bare forward run over the first `harvest_seqs` regenerated conversations,
alternating `repeats` times; the best time of each is kept. The machine is shared, and two
OpenMP threads under contention run 2-10x slower and far noisier than one, so torch runs with
one thread unless told otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import datasets
import torch
from transformers import AutoTokenizer

from benchmarks import report
from draftkit.core import artifacts, config, hardware
from draftkit.harvest import stage as hv
from draftkit.init.stage import init_run
from draftkit.prepare import mathgen
from draftkit.serving import vllm_engine
from draftkit.targets.load import load_target, target_dir

TARGET = "smollm2-135m"


def prompts(tok, n: int) -> list[list[int]]:
    """Chat-templated math questions (generation prompt included)."""
    out = []
    for p in mathgen.generate("train", n, seed=0):
        msgs = [{"role": "user", "content": p.question}]
        out.append(list(tok.apply_chat_template(msgs, tokenize=True,
                                                add_generation_prompt=True)["input_ids"]))
    return out


def regenerate(path: Path, prompt_ids: list[list[int]], max_tokens: int, batch: int) -> dict:
    dtype = hardware.resolve("auto")  # bf16 where native, else fp32 (core/hardware.py)
    spec = vllm_engine.EngineSpec(model=str(path), dtype=dtype, max_num_seqs=batch)
    t0 = time.perf_counter()
    with vllm_engine.engine(spec) as llm:
        start_s = time.perf_counter() - t0
        vllm_engine.generate(llm, prompt_ids[:4], vllm_engine.sampling(0.0, 8))  # warm-up
        gen = vllm_engine.generate(llm, prompt_ids, vllm_engine.sampling(0.0, max_tokens),
                                   batch_size=batch)
    return {"engine_start_s": start_s, "prompts": len(prompt_ids), "batch_size": batch,
            "max_tokens": max_tokens, "temperature": 0.0, "dtype": dtype,
            "output_tokens": gen.num_tokens, "seconds": gen.seconds,
            "tokens_per_s": gen.num_tokens / gen.seconds, "outputs": gen.token_ids}


def write_prepared(run: Path, prompt_ids: list[list[int]], outputs: list[list[int]]) -> int:
    ids = [p + o for p, o in zip(prompt_ids, outputs, strict=True)]
    datasets.Dataset.from_dict({
        "id": [f"bench-{i}" for i in range(len(ids))],
        "messages": ["[]"] * len(ids),
        "prompt_ids": prompt_ids,
        "input_ids": ids,
        "loss_mask": [[0] * len(p) + [1] * len(o) for p, o in zip(prompt_ids, outputs,
                                                                   strict=True)],
        "length": [len(x) for x in ids],
    }).save_to_disk(str(artifacts.RunPaths(run).data / "train"))
    return sum(len(x) for x in ids)


def run_harvest(run: Path) -> dict:
    shutil.rmtree(artifacts.RunPaths(run).harvest, ignore_errors=True)
    t0 = time.perf_counter()
    hdir = hv.harvest(run)
    wall = time.perf_counter() - t0
    meta = artifacts.read_json(hdir / "meta.json")["timings"]
    man = artifacts.read_json(hdir / "manifest.json")
    files = sum((hdir / s["file"]).stat().st_size for s in man["shards"])
    return {"tokens": man["total_tokens"], "compute_s": meta["compute_s"], "wall_s": wall,
            "bytes_per_token": man["bytes_per_token"], "file_bytes_per_token":
            files / man["total_tokens"], "shards": len(man["shards"])}


@torch.no_grad()
def bare_forward(model, run: Path) -> dict:
    """model(input_ids) incl. lm_head over exactly the batches harvest runs."""
    opened = config.open_run(run)
    cfg = opened.cfg
    batches = []
    for job in hv.plan(opened):
        for rows in job.shards:
            data = job.ds[rows]
            seqs = [torch.tensor(x) for x in data["input_ids"]]
            for b in hv.plan_batches([len(s) for s in seqs], cfg.harvest.batch_tokens,
                                     hv.resolve_packing(cfg.harvest.packing, "cpu")):
                batches.append(hv.pad_right([seqs[j] for j in b]))
    t0 = time.perf_counter()
    for x, mask in batches:
        model(input_ids=x, attention_mask=mask, use_cache=False)
    return {"tokens": sum(int(x.numel() if m is None else m.sum()) for x, m in batches),
            "seconds": time.perf_counter() - t0, "forwards": len(batches)}


def write_results(res: dict, out: Path) -> None:
    h, b, g = res["harvest"], res["bare_forward"], res["regeneration"]
    rows = [
        (f"vLLM regeneration (batch {g['batch_size']}, T=0, {g['dtype']})", g["tokens_per_s"], ""),
        (f"bare forward incl. lm_head ({res['target_dtype']}, same batches)", b["tokens_per_s"],
         "1.00x"),
        (f"harvest, capture + write shards ({res['target_dtype']} -> bf16)", h["tokens_per_s"],
         f"{res['harvest_vs_bare']:.2f}x"),
        ("harvest end to end (load, plan, verify, manifest)", h["end_to_end_tokens_per_s"],
         f"{h['end_to_end_tokens_per_s'] / b['tokens_per_s']:.2f}x"),
    ]
    md = [f"Harvest benchmark: target `{res['target']}`; regeneration: {g['prompts']} math "
          f"prompts, {g['output_tokens']} output tokens (max {g['max_tokens']}/prompt); harvest "
          f"and bare forward: {h['tokens']} tokens in {res['sequences']} of those conversations "
          f"({b['forwards']} forwards: only equal lengths share one), torch threads "
          f"{res['torch_threads']}, "
          "best of alternating runs on 2 shared CPU cores.", "",
          "| what | tokens/s | vs bare forward |", "|---|---|---|"]
    md += [f"| {name} | {tps:,.0f} | {ratio} |" for name, tps, ratio in rows]
    md += ["", f"Bytes per harvested token: {h['bytes_per_token']:,} (hidden states, "
           f"{len(res['aux_layer_ids'])} aux + last, bf16); {h['file_bytes_per_token']:,.0f} "
           "in shard files (+ input_ids, loss_mask, header).", ""]
    report.write_report(out, "bench_harvest", res, "\n".join(md),
                        lambda path: _plot(res, rows, path))


def _plot(res: dict, rows: list[tuple], path: Path) -> None:
    """The tokens/s table as horizontal bars."""
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.4))
    bars = ax.barh([r[0] for r in rows][::-1], [r[1] for r in rows][::-1],
                   color=["#8c8c8c", "#4c72b0", "#55a868", "#dd8452"][::-1])
    ax.bar_label(bars, fmt="%.0f", padding=3)
    ax.margins(x=0.12)
    ax.set_xlabel("tokens / s")
    ax.set_title(f"{res['target']}, 2 shared CPU cores; harvest stores "
                 f"{res['harvest']['bytes_per_token']} B/token")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> None:
    """The bench as scripts/bench_harvest.py's flags ask: regenerate, harvest and forward,
    write <out>/bench_harvest.{json,md,png}."""
    if args.threads:
        torch.set_num_threads(args.threads)

    path = target_dir(TARGET)
    tok = AutoTokenizer.from_pretrained(path)
    prompt_ids = prompts(tok, args.prompts)
    regen = regenerate(path, prompt_ids, args.max_tokens, args.batch)
    print(f"regeneration: {regen['tokens_per_s']:.0f} tok/s")

    with tempfile.TemporaryDirectory() as tmp:
        bench_run = init_run(TARGET, "math", name="bench", runs_dir=tmp)
        n = args.harvest_seqs
        write_prepared(bench_run, prompt_ids[:n], regen.pop("outputs")[:n])
        model = load_target(TARGET, device="cpu", dtype=config.load(bench_run).target.dtype).model
        harvests, bares = [], []
        for _ in range(args.repeats):
            bares.append(bare_forward(model, bench_run))
            harvests.append(run_harvest(bench_run))
        aux_ids = config.load(bench_run).draft.aux_layer_ids
        target_dtype = hardware.resolve(config.load(bench_run).target.dtype)
    bare = dict(min(bares, key=lambda r: r["seconds"]))
    bare["tokens_per_s"] = bare["tokens"] / bare["seconds"]
    h = dict(min(harvests, key=lambda r: r["compute_s"]))
    h["tokens_per_s"] = h["tokens"] / h["compute_s"]
    h["end_to_end_tokens_per_s"] = h["tokens"] / min(r["wall_s"] for r in harvests)
    assert h["tokens"] == bare["tokens"], (h["tokens"], bare["tokens"])
    res = {"target": TARGET, "hardware": hardware.summary(),
           "target_dtype": target_dtype, "aux_layer_ids": aux_ids, "sequences": min(n, args.prompts),
           "torch_threads": torch.get_num_threads(), "regeneration": regen,
           "bare_forward": bare, "harvest": h, "harvest_vs_bare": h["tokens_per_s"] /
           bare["tokens_per_s"], "all_runs": {"harvest": harvests, "bare_forward": bares}}
    write_results(res, args.out)
    print((args.out / "bench_harvest.md").read_text())
