"""Refresh capture benchmark: peak memory and time of one `draftkit refresh` with
`refresh.capture=online` (features in RAM) and `harvest` (shards on disk, streamed back) as the
rollout set grows.

For each size, a run of the in-process `tiny-llama` target (hidden 128, aux [1, 3, 5]: EAGLE-3
keeps 4 x 128 features a token, 2 KiB in fp32 online, 1 KiB in bf16 shards) with a random-init
EAGLE-3 head, and N random token-id rollouts (32 prompt + 224 response tokens). Each refresh
runs in a fresh process (peak RSS = its VmHWM): capture the train rows, fine-tune 20 steps,
publish. Times come from the job's lineage (capture seconds, fine-tune seconds, wall).
Writes results/bench_capture.{json,md,png}.

    python scripts/bench_capture.py                        # 500 and 3000 rollouts, ~10 min
    python scripts/bench_capture.py --rows 100 --scale 2   # smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"
TARGET = "tiny-llama"
RUN = ["draft.draft_vocab_size=256", "draft.aux_layer_ids=[1, 3, 5]", "tracking.backend=none"]
REFRESH = ["refresh.budget_steps=20", "refresh.gate=false", "refresh.batch_tokens=4096"]
MODES = ("online", "harvest")


def make_run(root: Path, name: str, target) -> Path:
    """A refreshable run: a random-init EAGLE-3 head, exported."""
    import torch

    from draftkit.core import artifacts, config
    from draftkit.drafts.eagle3.model import Eagle3Draft
    from draftkit.drafts.eagle3.vocab import DraftVocab
    from draftkit.export.stage import export
    from draftkit.init.stage import init_run

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


def child(run: str, policy: str, rollouts: str, mode: str) -> dict:
    """One refresh in this (fresh) process."""
    import torch

    from draftkit.rl.job import refresh

    torch.set_num_threads(1)
    res = refresh(run, policy, [rollouts], [*REFRESH, f"refresh.capture={mode}"])
    lin = res["lineage"]
    hwm = next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines()
               if x.startswith("VmHWM:"))
    return {"mode": mode, "peak_rss_mib": hwm / 1024, "wall_s": lin["wall_s"],
            "train_s": lin["train_s"], "steps": lin["steps"],
            "capture": {k: v for k, v in lin["capture"].items() if k != "dir"}}


def one_size(root: Path, rows: int, target, policy: Path) -> dict:
    rollouts = write_rollouts(root / f"rollouts-{rows}.jsonl", rows, 512, rows)
    out = {"rows": rows}
    for mode in MODES:
        run = make_run(root / "runs", f"{mode}-{rows}", target)
        proc = subprocess.run([sys.executable, __file__, "--child", str(run), str(policy),
                               str(rollouts), mode], check=True, capture_output=True, text=True)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["tokens"] = out["online"]["capture"]["tokens"]
    return out


def write_results(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from draftkit.core import artifacts

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500, help="rollouts of the small set")
    ap.add_argument("--scale", type=int, default=6, help="the large set has this many times more")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--child", nargs=4, metavar=("RUN", "POLICY", "ROLLOUTS", "MODE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    from draftkit.core import hardware
    from draftkit.target.load import load_target

    target = load_target(TARGET, device="cpu", dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy"
        target.model.save_pretrained(policy)
        target.tokenizer.save_pretrained(policy)
        sizes = [one_size(Path(tmp), n, target, policy)
                 for n in (args.rows, args.rows * args.scale)]
    res = {"target": TARGET, "hardware": hardware.summary(), "run": RUN, "refresh": REFRESH,
           "sizes": sizes}
    write_results(res, args.out)
    print((args.out / "bench_capture.md").read_text())


if __name__ == "__main__":
    main()
