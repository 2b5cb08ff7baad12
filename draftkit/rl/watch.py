"""`draftkit watch RUN --checkpoints DIR --rollouts DIR`: a daemon beside any RL trainer that
talks to it only through files, and refreshes the draft when it pays.

    draftkit watch runs/rl --checkpoints ckpts/ --rollouts rollouts/ --every 10 --al-drop 0.15

- Checkpoints: each subdir of DIR is one policy step (the last integer in its name: step_200,
  global_step_200, checkpoint-200). Its HF model dir is itself or the first nested dir with a
  config.json (verl: global_step_N/actor/huggingface). It counts only when complete: a marker
  file (draftkit.ready, COMPLETE, .complete, DONE), or config.json plus every weight file of
  the index (or every *.safetensors), each as long as its own header says. Half-written
  checkpoints are skipped until they are complete.
- Rollouts: *.jsonl files in DIR that end with a newline; each is used by one refresh.
- Trigger: the newest complete checkpoint refreshes when `every` steps passed since the last
  refresh, or when the current draft's estimated AL on the new rollouts (drift.py) fell below
  (1 - al_drop) x the AL recorded when it was published.
- State (`drafts/watch-state.json`, atomic) is written after each decision; a restart goes on
  from it, and the refresh job key makes a repeated refresh publish nothing twice.
- SIGTERM/SIGINT stop it cleanly (an unfinished fine-tune is dropped, nothing published).
  Events go to `drafts/watch-log.jsonl` and to wandb (offline without a key).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import struct
import time
from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.rl import drift, kinds
from draftkit.rl.finetune import Stopped
from draftkit.rl.publish import DraftStore, RefreshLocked
from draftkit.rl.refresh import refresh

MARKERS = ("draftkit.ready", "COMPLETE", ".complete", "DONE")


def safetensors_complete(path: Path) -> bool:
    """The file is as long as its header says (8-byte length + JSON header + data)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size:
                return False
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError):
        return False
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return size == 8 + n + max(ends, default=0)


def model_dir(ckpt: Path) -> Path | None:
    if (ckpt / "config.json").is_file():
        return ckpt
    found = sorted(p.parent for p in ckpt.glob("*/*/config.json")) + \
        sorted(p.parent for p in ckpt.glob("*/config.json"))
    return min(found, key=lambda p: len(p.parts), default=None)


def checkpoint_complete(ckpt: Path) -> bool:
    if any((ckpt / m).exists() for m in MARKERS):
        return True
    hf = model_dir(ckpt)
    if hf is None or any(hf.glob("*.tmp")) or any(hf.glob("*.incomplete")):
        return False
    index = hf / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError):
            return False
        files = [hf / n for n in names]
    else:
        files = sorted(hf.glob("*.safetensors"))
    return bool(files) and all(safetensors_complete(f) for f in files)


def step_of(ckpt: Path) -> int | None:
    nums = re.findall(r"\d+", ckpt.name)
    return int(nums[-1]) if nums else None


def complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    out = [(step_of(p), p) for p in Path(directory).iterdir() if p.is_dir()]
    return sorted((s, p) for s, p in out if s is not None and checkpoint_complete(p))


def complete_rollouts(directory: Path) -> list[Path]:
    out = []
    for f in sorted(Path(directory).glob("*.jsonl")):
        with contextlib.suppress(OSError), open(f, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) == b"\n":
                    out.append(f)
    return out


class Watcher:
    def __init__(self, run_dir, checkpoints, rollouts, overrides=None, every=None,
                 al_drop=None):
        self.run = config.run_dir_of(run_dir)
        self.overrides = list(overrides or [])
        self.cfg = config.load(self.run, self.overrides)
        rc = self.cfg.refresh
        self.every = rc.every if every is None else every
        self.al_drop = rc.al_drop if al_drop is None else al_drop
        if self.every <= 0 and self.al_drop <= 0:
            raise DraftkitError("watch needs a trigger: --every N (policy steps) and/or "
                                "--al-drop X (fraction of AL lost)")
        self.ckpts, self.rollouts = Path(checkpoints), Path(rollouts)
        self.store = DraftStore(self.run)
        self.state_path = self.store.root / "watch-state.json"
        self.log_path = self.store.root / "watch-log.jsonl"
        self.state = artifacts.read_json(self.state_path) if self.state_path.is_file() else \
            {"seen": [], "used_rollouts": [], "last_refresh_step": None}
        self.stop = False
        self.tracker = None

    def event(self, name: str, **fields) -> None:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": name, **fields}
        self.store.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
        if self.tracker is not None:
            nums = {f"watch/{k}": v for k, v in fields.items() if isinstance(v, (int, float))}
            self.tracker.log({**nums, f"watch/{name}": 1}, step=len(self.state["seen"]))
        print(f"watch: {name} {json.dumps(fields, default=str)}", flush=True)

    def save(self) -> None:
        artifacts.write_json_atomic(self.state_path, self.state)

    def trigger(self, step: int, hf: Path, files: list[Path]) -> str:
        """Why this checkpoint refreshes ('' = it does not)."""
        last = self.state["last_refresh_step"] or 0
        if self.every > 0 and step - last >= self.every:
            return f"interval: step {step} - {last} >= {self.every}"
        if self.al_drop <= 0:
            return ""
        from draftkit.rl.policy import load_policy
        from draftkit.rl.rollouts import read_rollouts

        current = self.store.current()
        ref = self.store.lineage(current) if current else None
        if ref is None:
            return "AL drop: no refreshed draft yet"
        policy = load_policy(hf, step=step, dtype=self.cfg.target.dtype)
        kind, rc = kinds.get(self.cfg.draft.kind), self.cfg.refresh
        rows = read_rollouts(files, policy.tokenizer, self.cfg.target.vocab_size,
                             rc.max_seq_len)
        k = self.cfg.draft.num_speculative_tokens
        model = kind.load(self.store.current_dir(), policy.model, k)
        key = ref["decided_on"]
        now = drift.estimate(kind, model, policy.model, rows, k, [rc.temperature],
                             rc.draft_sampling, rc.batch_tokens)[key]["al"]
        was = ref["al_after"][key]["al"]
        self.event("drift", step=step, al=now, al_published=was)
        return f"AL drop: {now:.3f} < (1 - {self.al_drop}) * {was:.3f}" \
            if now < (1 - self.al_drop) * was else ""

    def tick(self) -> None:
        """One scan: act on the newest complete checkpoint not seen yet."""
        todo = [(s, p) for s, p in complete_checkpoints(self.ckpts)
                if p.name not in self.state["seen"]]
        files = [f for f in complete_rollouts(self.rollouts)
                 if str(f.resolve()) not in self.state["used_rollouts"]]
        if not todo or not files:
            return
        step, ckpt = todo[-1]
        hf = model_dir(ckpt)
        why = self.trigger(step, hf, files)
        if why:
            self.event("refresh_started", step=step, checkpoint=str(hf), reason=why,
                       rollouts=[str(f) for f in files])
            try:
                res = refresh(self.run, hf, files, self.overrides,
                              should_stop=lambda: self.stop, policy_step=step)
            except RefreshLocked as e:  # a manual `draftkit refresh` runs: try again later
                self.event("refresh_waiting", step=step, detail=str(e))
                return
            except DraftkitError as e:  # bad rollouts or checkpoint: log, skip, go on
                res = {"status": "failed", "version": None, "reason": str(e)}
            res.setdefault("reason", "")
            self.event(f"refresh_{res['status']}", step=step, version=res["version"],
                       resumed=res.get("resumed", False), detail=res["reason"])
            if res["status"] != "failed":
                self.state["last_refresh_step"] = step
            self.state["used_rollouts"] += [str(f.resolve()) for f in files]
        else:
            self.event("skipped", step=step)
        self.state["seen"] += [p.name for _, p in todo]  # older ones are superseded
        self.save()

    def run_forever(self, once: bool = False) -> None:
        from draftkit.train.loop import Tracker

        lock = _daemon_lock(self.store.root)
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self.tracker = Tracker(self.cfg.tracking, f"{self.cfg.name}-watch", self.store.root,
                               self.cfg.to_dict(), True)
        self.event("started", checkpoints=str(self.ckpts), rollouts=str(self.rollouts),
                   every=self.every, al_drop=self.al_drop)
        try:
            while not self.stop:
                try:
                    self.tick()
                except Stopped as e:
                    self.event("refresh_interrupted", detail=str(e))
                if once:
                    break
                deadline = time.monotonic() + self.cfg.refresh.poll_s
                while not self.stop and time.monotonic() < deadline:
                    time.sleep(0.2)
        finally:
            self.event("stopped", signal=self.stop)
            self.tracker.finish()
            for s, h in handlers.items():
                signal.signal(s, h)
            os.close(lock)

    def _on_signal(self, signum, _frame) -> None:
        self.stop = True


def _daemon_lock(root: Path) -> int:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".watch.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DraftkitError(f"another `draftkit watch` runs on {root.parent}; stop it first") \
            from None
    return fd


def watch(run_dir, checkpoints, rollouts, overrides=None, every=None, al_drop=None,
          once: bool = False) -> None:
    Watcher(run_dir, checkpoints, rollouts, overrides, every, al_drop).run_forever(once)
