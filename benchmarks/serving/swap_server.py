"""Swap drafts into a running `vllm serve` rollout server (issue 37): how long a swap takes with
its health check, whether any client request fails while clients stream, and how long clients
stall.

One server on the run's target with its export as the draft (versions v0001 and v0002 are two
copies of it, so every swap loads and passes). Phase 1, idle: `swaps` pushes (engines.push:
pause with requests kept, native update, hash check, resume, probe AL at T=0). Phase 2:
`clients` streaming greedy completions run all the time while `swaps` more pushes happen;
every chunk's arrival time is kept. "Stall seen" is the longest gap between two chunks of one
request that overlaps a swap's pause, against the longest gap outside the swaps.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks import report
from draftkit.core import artifacts, config, hardware, provenance
from draftkit.rl import rollout_servers as engines
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import rollout_client, serve
from draftkit.serving.drafter_swap import SECRET_ENV
from draftkit.targets.load import run_target_dir


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_run(src: Path, root: Path) -> Path:
    """A run beside nothing: src's config, data linked, v0001 and v0002 = copies of src's
    export (current -> v0001)."""
    run = root / "swap-bench"
    shutil.rmtree(run, ignore_errors=True)
    report.link_run(src, run, lambda cfg: setattr(cfg.tracking, "backend", "none"))
    export = artifacts.RunPaths(src).export
    store = DraftStore(run)
    for v in ("v0001", "v0002"):
        store.publish(v, lambda tmp, final: [shutil.copy(f, tmp / f.name) for f in
                                             export.iterdir() if f.is_file()],
                      {"parent": None, "rollouts": [], "decided_on": "T=0",
                       "al_after": {"T=0": {"al": 0.0}}})
    store.set_current("v0001")
    return run


class Streams:
    """`n` clients streaming greedy completions in a loop; every chunk's time is kept."""

    def __init__(self, url, model, prompts, n, max_tokens):
        self.url, self.model, self.prompts, self.max_tokens = url, model, prompts, max_tokens
        self.stop, self.requests, self.failures = threading.Event(), [], []
        self.threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(n)]

    def _loop(self, i):
        n = 0
        while not self.stop.is_set():
            body = {"model": self.model, "prompt": self.prompts[(i + n) % len(self.prompts)],
                    "max_tokens": self.max_tokens, "temperature": 0.0, "stream": True}
            n += 1
            req = urllib.request.Request(self.url + "/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            times = [time.time()]
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    for line in r:
                        if line.startswith(b"data:") and b"[DONE]" not in line:
                            times.append(time.time())
                self.requests.append(times)
            except Exception as e:  # noqa: BLE001 - every failure is the result
                self.failures.append(f"{type(e).__name__}: {e}")

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def push_timed(run, url, version, probe_tokens: int | None = None) -> dict:
    """One push (engines.push: the CLI's code path), timed from the caller's side."""
    over = [f"refresh.probe_max_tokens={probe_tokens}"] if probe_tokens else []
    t0 = time.time()
    rec = engines.push(run, [url], DraftStore(run).root / version, over, reload_held=True)[url]
    return {"version": version, "t0": t0, "total_s": time.time() - t0, "swap_s": rec["swap_s"],
            "pause_s": rec["pause_s"], "probe_s": rec["probe_s"], "paused_at": rec["paused_at"],
            "al": rec["al"], "transfer": rec["transfer"], "probe_tokens": probe_tokens}


def stalls(requests: list[list[float]], windows: list[tuple[float, float]]) -> dict:
    """Longest chunk gap overlapping a pause (server clock = client clock: one machine), and
    the longest gap elsewhere."""
    inside, outside = [0.0], [0.0]
    for times in requests:
        for a, b in zip(times, times[1:]):  # noqa: B905 - consecutive pairs
            hit = any(a < w1 and b > w0 for w0, w1 in windows)
            (inside if hit else outside).append(b - a)
    return {"max_gap_in_swap_s": max(inside), "max_gap_outside_s": max(outside),
            "gaps_outside_p99_s": statistics.quantiles(outside, n=100)[-1]
            if len(outside) > 100 else max(outside)}


def measure(args) -> dict:
    root = Path(args.work)
    run = bench_run(Path(args.run), root)
    cfg = config.load(run)
    os.environ[SECRET_ENV] = secrets.token_hex(16)
    dtype = hardware.resolve("auto", key="vLLM dtype")
    argv = serve.command(run_target_dir(cfg.target), run / "drafts" / "v0001",
                         cfg.draft.num_speculative_tokens, port=_port(), dtype=dtype,
                         max_model_len=1024, extra=["--max-num-seqs", str(args.clients + 8)])
    prompts = DraftRefresher(run).probes()
    t_start = time.time()
    with serve.Server(argv, serve.environment(os.environ[SECRET_ENV]), root / "server.log") as srv:
        start_s = time.time() - t_start
        model = rollout_client.served_model(srv.url)
        versions = ["v0002", "v0001"] * args.swaps
        idle = [push_timed(run, srv.url, v) for v in versions[:args.swaps]]
        short = [push_timed(run, srv.url, v, args.short_probe_tokens)
                 for v in versions[:args.swaps]]
        with Streams(srv.url, model, prompts, args.clients, args.max_tokens) as load:
            time.sleep(args.load_s)
            loaded = []
            for v in versions[args.swaps:2 * args.swaps]:
                loaded.append(push_timed(run, srv.url, v))
                time.sleep(args.load_s)
        windows = [(s["paused_at"], s["paused_at"] + s["pause_s"]) for s in loaded]
        result = {"target": cfg.target.name, "server_start_s": start_s, "dtype": dtype, "clients": args.clients,
                  "max_tokens": args.max_tokens, "probe_prompts": len(prompts),
                  "probe_max_tokens": cfg.refresh.probe_max_tokens, "idle": idle,
                  "idle_short_probes": short,
                  "loaded": loaded, "requests": len(load.requests),
                  "failures": load.failures, **stalls(load.requests, windows),
                  "timeline": _timeline(load.requests, t_start), "t_start": t_start}
    return result


def _timeline(requests, t0, width=0.5) -> list[list[float]]:
    """[bin start s, chunks/s] over the loaded phase."""
    bins: dict[int, int] = {}
    for times in requests:
        for t in times[1:]:
            bins[int((t - t0) / width)] = bins.get(int((t - t0) / width), 0) + 1
    return [[k * width, v / width] for k, v in sorted(bins.items())]


def markdown(r: dict) -> str:
    def row(name, s):
        return (f"| {name} | {s['version']} | {s['total_s']:.2f} | {s['pause_s']:.3f} | "
                f"{s['swap_s']:.3f} | {s['probe_s']:.2f} | {s['al']:.2f} | {s['transfer']} |")
    cpu = r["meta"]["hardware"]["cpu_model"]
    lines = [f"Swaps into a running `vllm serve` ({r['target']}, {r['dtype']}, "
             f"{cpu}, {r['meta']['hardware']['cpu_count']} cores); health check = hash check + AL over {r['probe_prompts']} probe "
             f"completions of {r['probe_max_tokens']} tokens at T=0.", "",
             "| phase | to | push s (all of it) | clients paused s (load + hash check) | "
             "load s | probe AL s | probe AL | path |", "|---|---|---|---|---|---|---|---|"]
    lines += [row(f"idle, probes of {r['probe_max_tokens']} tokens", s) for s in r["idle"]]
    lines += [row(f"idle, probes of {s['probe_tokens']} tokens", s)
              for s in r["idle_short_probes"]]
    lines += [row(f"{r['clients']} streaming clients", s) for s in r["loaded"]]
    lines += ["", f"- {r['requests']} client requests completed during the loaded phase, "
                  f"**{len(r['failures'])} failed**.",
              f"- Longest stall a client saw (gap between two chunks overlapping a swap): "
              f"{r['max_gap_in_swap_s']:.2f} s; longest gap outside swaps: "
              f"{r['max_gap_outside_s']:.2f} s (p99 {r['gaps_outside_p99_s']:.2f} s).",
              f"- Server start: {r['server_start_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    tl = r["timeline"]
    axes[0].plot([t for t, _ in tl], [v for _, v in tl], lw=1)
    for s in r["loaded"]:
        a, p = s["t0"] - r["t_start"], s["paused_at"] - r["t_start"]
        axes[0].axvspan(a, a + s["total_s"], color="orange", alpha=0.2)
        axes[0].axvspan(p, p + s["pause_s"], color="red", alpha=0.4)
    axes[0].set(xlabel="s since server start", ylabel="chunks/s (all clients)",
                title=f"{r['clients']} streaming clients; red: paused, orange: one push")
    rows = r["idle"] + r["idle_short_probes"] + r["loaded"]
    names = [f"idle {i}" for i in range(len(r["idle"]))] + \
        [f"short {i}" for i in range(len(r["idle_short_probes"]))] + \
        [f"load {i}" for i in range(len(r["loaded"]))]
    paused = [s["pause_s"] for s in rows]
    probe = [s["probe_s"] for s in rows]
    axes[1].bar(names, paused, label="clients paused (load + hash check)")
    axes[1].bar(names, probe, bottom=paused, label="probe AL")
    axes[1].bar(names, [s["total_s"] - a - b for s, a, b in zip(rows, paused, probe, strict=True)],
                bottom=[a + b for a, b in zip(paused, probe, strict=True)], label="client setup, HTTP")
    axes[1].tick_params(axis="x", labelsize=7, rotation=45)
    axes[1].axhline(2.0, color="gray", lw=0.8, ls="--")
    axes[1].set(ylabel="seconds", title="one push (swap + health check)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> None:
    """The bench as scripts/bench_swap_server.py's flags ask: serve, push, stream, write
    results/bench_swap_server.{json,md,png}; exits 2 without a prepared run."""
    if report.prepared_run(args.run) is None:
        sys.exit(2)
    result = measure(args)
    result["meta"] = provenance.make_meta("bench_swap_server", None, run=args.run)
    md = markdown(result)
    report.write_report(Path(args.out), "bench_swap_server", result, md,
                        lambda p: plot(result, p))
    print(md)
