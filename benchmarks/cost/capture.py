"""Peak memory and time of one `draftkit refresh` with
`refresh.capture=online` (features in RAM) and `harvest` (shards on disk, streamed back) as the
rollout set grows.

For each size, a run of the in-process `tiny-llama` target (hidden 128, aux [1, 3, 5]: EAGLE-3
keeps 4 x 128 features a token, 2 KiB in fp32 online, 1 KiB in bf16 shards) with a random-init
EAGLE-3 head, and N random token-id rollouts (32 prompt + 224 response tokens). Each refresh
runs in a fresh process (peak RSS = its VmHWM): capture the train rows, fine-tune 20 steps,
publish. Times come from the job's lineage (capture seconds, fine-tune seconds, wall).
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

from benchmarks import report
from benchmarks.cost.children import REFRESH_OVERRIDES
from draftkit.core import artifacts, config, hardware
from draftkit.drafts.eagle_family.model import Eagle3Draft
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.export.stage import export
from draftkit.init.stage import init_run
from draftkit.targets.load import load_target

ROOT = Path(__file__).resolve().parents[2]  # the repo root: where `-m benchmarks...` imports
TARGET = "tiny-llama"
RUN = ["draft.draft_vocab_size=256", "draft.aux_layer_ids=[1, 3, 5]", "tracking.backend=none"]
MODES = ("online", "harvest")


def make_run(root: Path, name: str, target) -> Path:
    """A refreshable run: a random-init EAGLE-3 head, exported."""
    run = init_run(TARGET, "math", name=name, runs_dir=root, overrides=RUN)
    cfg = config.load(run)
    vocab = DraftVocab.build(torch.ones(cfg.target.vocab_size, dtype=torch.long), 256)
    torch.manual_seed(0)
    best = artifacts.RunPaths(run).train / "best"
    Eagle3Draft.from_run_config(cfg, vocab, target_model=target.model).save_pretrained(best)
    artifacts.write_json_atomic(best / "meta.json", {"step": 0, "eval": {}})
    export(run, ["export.check=false"])
    return run


def write_rollouts(path: Path, rows: int, vocab: int, seed: int) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(vocab) for _ in range(32)],
                                        "response_ids": [rng.randrange(vocab) for _ in range(224)]})
                            + "\n" for _ in range(rows)))
    return path


def one_size(root: Path, rows: int, target, policy: Path) -> dict:
    rollouts = write_rollouts(root / f"rollouts-{rows}.jsonl", rows, 512, rows)
    out = {"rows": rows}
    for mode in MODES:
        run = make_run(root / "runs", f"{mode}-{rows}", target)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.cost.children", "capture",
                               str(run), str(policy), str(rollouts), mode], check=True,
                              capture_output=True, text=True, cwd=ROOT)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["tokens"] = out["online"]["capture"]["tokens"]
    return out


def write_results(res: dict, out: Path) -> None:
    plt = report.pyplot()
    out.mkdir(parents=True, exist_ok=True)
    artifacts.write_json_atomic(out / "bench_capture.json", res)
    h = res["hardware"]
    md = [f"Refresh capture benchmark: target `{res['target']}` (EAGLE-3, 4 x 128 features a "
          f"token), random token-id rollouts of 256 tokens (80% train rows), one refresh of "
          f"20 fine-tune steps per mode, one torch thread, {h['cpu_model']} ({h['cpu_count']} "
          "shared cores). Each refresh in a fresh process: peak RSS = its VmHWM.", "",
          "| rollouts | train tokens | mode | features held | peak RSS | capture s | "
          "fine-tune s | wall s |", "|---|---|---|---|---|---|---|---|"]
    for s in res["sizes"]:
        for mode in MODES:
            m = s[mode]
            where = "in RAM" if mode == "online" else f"on disk, {m['capture']['shards']} shards"
            md.append(f"| {s['rows']:,} | {s['tokens']:,} | {mode} | "
                      f"{m['capture']['bytes'] / 2**20:.0f} MiB {where} | "
                      f"{m['peak_rss_mib']:.0f} MiB | {m['capture']['seconds']:.1f} | "
                      f"{m['train_s']:.1f} | {m['wall_s']:.1f} |")
    a, b = res["sizes"][0], res["sizes"][-1]
    md += ["", f"Rollouts x{b['rows'] / a['rows']:.0f}: peak RSS " + "; ".join(
        f"{mode} {b[mode]['peak_rss_mib'] - a[mode]['peak_rss_mib']:+.0f} MiB" for mode in MODES)
        + ".", ""]
    artifacts.write_text_atomic(out / "bench_capture.md", "\n".join(md))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for mode in MODES:
        ax.plot([s["tokens"] / 1000 for s in res["sizes"]],
                [s[mode]["peak_rss_mib"] for s in res["sizes"]], "o-",
                label=f"refresh.capture={mode}")
    ax.set_xlabel("train tokens captured (thousands)")
    ax.set_ylabel("peak RSS of the refresh (MiB)")
    ax.legend()
    ax.set_title(f"{res['target']} refresh, {h['cpu_model']}")
    fig.tight_layout()
    fig.savefig(out / "bench_capture.png", dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> None:
    """The bench as scripts/bench_capture.py's flags ask: both sizes, both modes, each refresh
    in a fresh process (cost/children.py); <out>/bench_capture.{json,md,png} written."""
    target = load_target(TARGET, device="cpu", dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy"
        target.model.save_pretrained(policy)
        target.tokenizer.save_pretrained(policy)
        sizes = [one_size(Path(tmp), n, target, policy)
                 for n in (args.rows, args.rows * args.scale)]
    res = {"target": TARGET, "hardware": hardware.summary(), "run": RUN, "refresh": REFRESH_OVERRIDES,
           "sizes": sizes}
    write_results(res, args.out)
    print((args.out / "bench_capture.md").read_text())
