"""The lifecycle on one device, one step at a time, with a JSON summary: what
scripts/gpu_check.sh runs on a lent GPU machine, and what tests/test_bench_scale.py runs on the
CPU so the driver itself stays working between GPU loans.

    python scripts/gpu_check.py --device cuda --out $OUT/gpu_check.json
    python scripts/gpu_check.py --device cpu --out /tmp/gpu_check.json      # ~1 min on 2 cores

Steps, on `tiny-llama` with tiny budgets: init (data.regenerate=false), prepare, harvest, train
an EAGLE-3 head offline, train one online (train.mode=online), train a draft LM (offline, its
own harvest), export (export.check=false: that check runs vLLM), reference eval (the torch spec
decoder of eval.engine=reference), drift and refresh (the target's own dir as the policy,
loaded on the device; rollouts = prepared conversations). Each step records ok | error |
skipped, its seconds and, on error, the exception and the traceback's tail; a step whose input
failed is skipped. If the offline EAGLE-3 train fails on the device, a head trained on the CPU
(train.device=cpu) stands in, marked `fallback`, so export, eval, drift and refresh still run
on the device. The summary is rewritten after every step: a run cut short keeps what it did.
vLLM is not started here: the summary says whether it is installed and which checks that
leaves out. With `--bench random:Qwen3-8B`, scripts/bench_scale.py then runs in its own process
(fresh device memory) if `--budget-s` leaves it at least `--bench-min-s`, writing
bench_scale_<device>.{json,md,png} beside the summary. Exit status 0 when every step is ok.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# torch, transformers, datasets and draftkit are imported inside the functions that use them
# (deferred on purpose): `--device cpu` hides the GPUs (CUDA_VISIBLE_DEVICES) in main(), before
# any of them loads.

TARGET = "tiny-llama"
OVERRIDES = [
    "data.source=local", "data.max_samples=32", "data.eval_samples=4", "data.regenerate=false",
    "draft.draft_vocab_size=256", "harvest.eval_sequences=4", "harvest.shard_tokens=2048",
    "train.max_steps=4", "train.eval_every=2", "train.save_every=2", "train.batch_tokens=1024",
    "train.num_workers=0", "tracking.backend=none", "export.check=false",
    "eval.engine=reference", "eval.k_values=[3]", "eval.temperatures=[0,1]",
    "eval.max_new_tokens=16", "eval.reference_prompts=2",
    "refresh.budget_steps=4", "refresh.batch_tokens=1024",
]
VLLM_CHECKS = ("export's vLLM parity check (export.check)", "eval.engine=vllm (AL, tok/s)",
               "drafter and policy swaps into a live engine")


class Check:
    """The summary: steps in order, written to `out` after each one."""

    def __init__(self, out: Path, device: str):
        self.out, self.device, self.t0 = out, device, time.perf_counter()
        self.data = {"device": device, "target": TARGET, "environment": environment(device),
                     "vllm": vllm_status(), "steps": []}
        self.outputs: dict[str, object] = {}
        self.write()

    def step(self, name: str, fn, needs: tuple[str, ...] = ()) -> object:
        missing = [n for n in needs if n not in self.outputs]
        entry: dict = {"name": name}
        if missing:
            entry.update(status="skipped", reason=f"needs {', '.join(missing)}")
        else:
            t0 = time.perf_counter()
            try:
                value = fn()
                entry["status"] = "ok"
                self.outputs[name] = value
                if isinstance(value, dict) and len(json.dumps(value, default=str)) < 2000:
                    entry["detail"] = value
            except Exception as e:  # noqa: BLE001 - every failure is a finding to record
                entry.update(status="error", error=f"{type(e).__name__}: {e}"[:2000],
                             traceback=traceback.format_exc()[-3000:])
            entry["seconds"] = round(time.perf_counter() - t0, 2)
        self.data["steps"].append(entry)
        print(f"[gpu_check] {name}: {entry['status']}"
              + (f" ({entry['seconds']} s)" if "seconds" in entry else "")
              + (f" {entry.get('error') or entry.get('reason')}" if entry["status"] != "ok"
                 else ""), flush=True)
        self.write()
        return self.outputs.get(name)

    def write(self) -> None:
        steps = self.data["steps"]
        self.data["ok"] = bool(steps) and all(s["status"] == "ok" for s in steps)
        self.data["total_s"] = round(time.perf_counter() - self.t0, 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.out)


def environment(device: str) -> dict:
    import torch
    import transformers

    from draftkit.core import artifacts, hardware, provenance

    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": sys.version.split()[0], "hardware": hardware.summary(),
           "git_sha": os.environ.get("DRAFTKIT_COMMIT") or provenance.git_sha(),
           "draftkit": str(Path(artifacts.__file__).parents[1]),
           "draftkit_wheel": os.environ.get("DRAFTKIT_WHEEL", "not installed from a wheel")}
    if device.startswith("cuda") and torch.cuda.is_available():
        env["cuda"] = {"name": torch.cuda.get_device_name(0), "torch_cuda": torch.version.cuda,
                       "memory_gib": round(torch.cuda.get_device_properties(0).total_memory
                                           / 2**30, 1)}
    return env


def vllm_status() -> dict:
    installed = importlib.util.find_spec("vllm") is not None
    why = "vLLM is installed, but this check does not start it" if installed else \
        "vLLM is not installed on this machine"
    return {"installed": installed, "status": "skipped", "reason": why,
            "not_checked": list(VLLM_CHECKS)}


def write_rollouts(run: Path, path: Path, n: int = 12) -> Path:
    """The first n prepared train conversations as rollouts (prompt ids + response ids)."""
    import datasets

    ds = datasets.load_from_disk(str(run / "data" / "train"))
    rows = [{"prompt_ids": r["prompt_ids"], "response_ids": r["input_ids"][len(r["prompt_ids"]):],
             "policy_step": 1} for r in ds.select(range(min(n, len(ds))))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def lifecycle(check: Check, root: Path, device: str) -> None:
    from draftkit import api
    from draftkit.rl.policy import load_policy
    from draftkit.targets.load import target_dir

    dev = [f"train.device={device}"]
    run = check.step("init", lambda: api.init(TARGET, "math", name="check", runs_dir=root,
                                              overrides=[*OVERRIDES, *dev], force=True))
    check.step("prepare", lambda: api.prepare(run), ("init",))
    check.step("harvest", lambda: api.harvest(run), ("prepare",))
    check.step("train_eagle3_offline", lambda: api.train(run), ("harvest",))
    if "train_eagle3_offline" not in check.outputs and "harvest" in check.outputs:
        check.step("train_eagle3_offline_cpu_fallback",
                   lambda: api.train(run, overrides=["train.device=cpu"]))
    head = ("train_eagle3_offline",) if "train_eagle3_offline" in check.outputs else \
        ("train_eagle3_offline_cpu_fallback",)
    check.step("train_eagle3_online", lambda: api.train(
        copy_data(run, root / "check-online"), overrides=["train.mode=online"]), ("prepare",))
    check.step("train_draft_lm", lambda: draft_lm(run, root, dev), ("prepare",))
    check.step("export", lambda: api.export(run), head)
    check.step("eval_reference", lambda: api.evaluate(
        run, [f"eval.results_dir={root / 'eval'}"]), ("export",))
    policy = check.step("policy_load", lambda: load_policy(target_dir(TARGET), device=device),
                        ("export",))
    rollouts = check.step("rollouts", lambda: write_rollouts(run, root / "rollouts.jsonl"),
                          ("prepare",))
    check.step("drift", lambda: api.drift(run, policy, [rollouts]), ("policy_load", "rollouts"))
    check.step("refresh", lambda: summary_of(api.refresh(run, policy, [rollouts])),
               ("policy_load", "rollouts"))


def copy_data(run: Path, other: Path) -> Path:
    """A sibling run with `run`'s config and prepared data (no harvest)."""
    other.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / "draftkit.yaml", other / "draftkit.yaml")
    shutil.copytree(run / "data", other / "data", dirs_exist_ok=True)
    return other


def draft_lm(run: Path, root: Path, dev: list[str]) -> Path:
    """A draft LM run on the same prepared data: its own harvest (the last state), trained."""
    from draftkit import api

    dlm = api.init(TARGET, "math", kind="draft-lm", name="check-dlm", runs_dir=root,
                   overrides=[*OVERRIDES, *dev], force=True)
    shutil.copytree(run / "data", dlm / "data", dirs_exist_ok=True)
    api.harvest(dlm)
    return api.train(dlm)


def summary_of(result: dict) -> dict:
    return {k: result.get(k) for k in ("status", "version", "reason")}


def bench(check: Check, args) -> None:
    """scripts/bench_scale.py in its own process, within what is left of --budget-s."""
    left = args.budget_s - (time.perf_counter() - check.t0)
    if left < args.bench_min_s:
        check.data["steps"].append({"name": "bench_scale", "status": "skipped", "reason":
                                    f"{left:.0f} s left of --budget-s, < --bench-min-s"})
        check.write()
        return
    name = f"bench_scale_{args.device.split(':')[0]}"
    cmd = [sys.executable, str(Path(__file__).with_name("bench_scale.py")), "--target",
           args.bench, "--device", args.device, "--out", str(args.out.parent), "--name", name]

    def run() -> dict:
        log = args.out.parent / f"{name}.log"
        try:
            proc = subprocess.run(cmd, timeout=left - 5, capture_output=True, text=True)
        except subprocess.TimeoutExpired as e:
            log.write_text("".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                                   for x in (e.stdout or "", e.stderr or "")))
            raise RuntimeError(f"bench_scale ran past the {left - 5:.0f} s left; see {log}") from e
        log.write_text(proc.stdout + proc.stderr)
        if proc.returncode:
            raise RuntimeError(f"bench_scale exited {proc.returncode}: {proc.stderr[-1500:]}")
        return json.loads((args.out.parent / f"{name}.json").read_text())["projections"]

    check.step("bench_scale", run)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda | cpu")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) /
                   "gpu_check.json")
    p.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    p.add_argument("--bench", default="", help="then scripts/bench_scale.py at this target")
    p.add_argument("--budget-s", type=float, default=290, help="the whole check's seconds")
    p.add_argument("--bench-min-s", type=float, default=120)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cpu":  # harvest picks its device through accelerate: keep it off GPUs
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    check = Check(args.out, args.device)
    with tempfile.TemporaryDirectory() as tmp:
        lifecycle(check, args.dir or Path(tmp), args.device)
    if args.bench:
        bench(check, args)
    check.write()
    bad = [s["name"] for s in check.data["steps"] if s["status"] != "ok"]
    print(f"[gpu_check] {len(check.data['steps']) - len(bad)}/{len(check.data['steps'])} steps "
          f"ok in {check.data['total_s']} s on {args.device}; not ok: {bad or 'none'}; vLLM: "
          f"{check.data['vllm']['reason']}. Summary: {args.out}", flush=True)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
