"""`draftkit watch RUN --checkpoints DIR --rollouts DIR`: a daemon beside any RL trainer that
talks to it only through files, and refreshes the draft when it pays.

    draftkit watch runs/rl --checkpoints ckpts/ --rollouts rollouts/ --every 10 --al-drop 0.15

The completeness rules below live in rl/watch_files.py; this module decides and acts.

- Checkpoints: each subdir of DIR is one policy step (the last integer in its name: step_200,
  global_step_200, checkpoint-200). Its HF model dir is itself or the first nested dir with a
  config.json (verl: global_step_N/actor/huggingface). It counts only when complete: a marker
  file (draftkit.ready, COMPLETE, .complete, DONE), or config.json plus every weight file of
  the index (or every *.safetensors; shards named model-0000i-of-0000N need the index), each
  as long as its own header says. Half-written checkpoints are skipped until they are complete.
  One that still fails to load is an event (`checkpoint_error`), retried at the next ticks and
  skipped after CHECKPOINT_TRIES (`checkpoint_skipped`); the watch goes on.
- Rollouts, the file contract: *.jsonl files in DIR (never hidden `.NAME.jsonl`, `NAME.jsonl.tmp`
  or `NAME.jsonl.partial`: write under such a name, then rename into place). A file counts
  once it is complete:
    * a marker `NAME.jsonl.done` beside it (a writer that appends: touch it last), or
    * it ends with a newline, has not changed for `refresh.rollout_settle_s` seconds (mtime),
      and did not change since the previous tick (a safety net for writers that append).
  Each complete file is used by one refresh. A used file that changes later is reported loudly
  (`rollout_changed`); its new rows are not read (write them to a new file). A file with a bad
  row is set aside (`rollouts_set_aside` naming file:line, `rejected_rollouts` in the state);
  the tick goes on with the other files, and a set-aside file that changes is looked at again.
  Files of a refresh that was `undecided` (too few held-out draft starts) or failed stay
  unused: the next checkpoint's refresh takes them with the newer ones.
- Trigger: the newest complete checkpoint refreshes when `every` steps passed since the last
  refresh, or when the current draft's estimated AL on the new rollouts (drift.py) fell below
  (1 - al_drop) x the AL recorded when it was published.
- State (`drafts/watch-state.json`, atomic) is written after each decision; a restart goes on
  from it, and the refresh job key makes a repeated refresh publish nothing twice. It is also
  written before each expensive step (reading one rollout file, a refresh): a watch killed
  there (out of memory) sets that file aside at restart, and skips a checkpoint whose refresh
  it died in CHECKPOINT_TRIES times. Rollout files are streamed, one line (at most
  rollouts.MAX_LINE_BYTES) at a time, when they are screened. A tick that raises anything is an
  event (`tick_failed`); TICK_FAILURES in a row end the watch.
- SIGTERM/SIGINT stop it cleanly (an unfinished fine-tune is dropped, nothing published).
  Events go to `drafts/watch-log.jsonl` and to wandb (offline without a key).
- Engines (`--engines URL,URL`: running `vllm serve` rollout servers, DRAFTKIT_SWAP_SECRET in
  the environment): at the start and after every tick, each engine that does not serve the
  current draft gets it (rl/rollout_servers.py: one transaction on the server, which finishes
  whatever happens to the watch: pause with requests kept, native update, hash check, resume,
  probe AL; a failed check puts that engine's previous draft back), and `drafts/engines.json`
  records what each serves. An engine whose check refused a version is not asked again until
  a newer one is published; one that is unreachable or `pending` is retried at every tick,
  one `behind` (a swap that decided nothing) after a backoff with jitter. Every tick asks each
  engine what it serves (GET /draftkit/state: draft version, boot id) and an engine that
  restarted or serves another draft than engines.json says is pushed again (so checked). Failures, and any exception of the push, are events
  (`engines_swap_failed`, naming each engine), never the end of the watch; so is any exception
  reading one rollout file (the file is set aside).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.rl import drift, rollout_servers
from draftkit.rl.finetune import Stopped
from draftkit.rl.job import refresh
from draftkit.rl.policy import CheckpointError, load_policy, load_tokenizer
from draftkit.rl.publish import DraftStore, RefreshLocked
from draftkit.rl.rollouts import iter_rollouts, read_rollouts
from draftkit.rl.watch_files import (  # noqa: F401 - the file contract, named here too
    DONE,
    MARKERS,
    _stat,
    checkpoint_complete,
    complete_checkpoints,
    complete_rollouts,
    model_dir,
    rollout_candidates,
    rollout_complete,
    safetensors_complete,
    step_of,
)
from draftkit.train.loop import Tracker

CHECKPOINT_TRIES = 3  # ticks a checkpoint that fails to load is retried before it is skipped
TICK_FAILURES = 5  # consecutive ticks that raise before the watch gives up (each is an event)


class Watcher:
    def __init__(self, run_dir, checkpoints, rollouts, overrides=None, every=None,
                 al_drop=None, engines=None):
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
        self.engines = list(engines or [])
        self.store = DraftStore(self.run)
        self.store.recover()  # a crash between failed.json and moving `current` back
        self.state_path = self.store.root / "watch-state.json"
        self.log_path = self.store.root / "watch-log.jsonl"
        self.state = artifacts.read_json(self.state_path) if self.state_path.is_file() else {}
        for key, empty in (("seen", []), ("used_rollouts", []), ("last_refresh_step", None),
                           ("rollout_stats", {}), ("rejected_rollouts", {}),
                           ("checkpoint_errors", {})):
            self.state.setdefault(key, empty)  # rollout_stats: path -> [size, mtime_ns] used
        self.last_stats: dict[str, list[int] | None] = {}  # rollout files at the last tick
        self.stop = False
        self.tracker = None
        self._died_in = self.state.pop("screening", None), self.state.pop("refreshing", None)

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

    def rollout_files(self) -> list[Path]:
        """Complete rollout files not used yet and not set aside (unless changed since)."""
        settle, prev = self.cfg.refresh.rollout_settle_s, self.last_stats
        self.last_stats = {str(f): _stat(f) for f in rollout_candidates(self.rollouts)}
        out = []
        for f in complete_rollouts(self.rollouts, settle):
            key, stat = str(f.resolve()), self.last_stats.get(str(f))
            marked = f.with_name(f.name + DONE).exists()
            if key in self.state["used_rollouts"] or (not marked and str(f) in prev
                                                      and prev[str(f)] != stat):
                continue  # used, or changed since the previous tick: still being written
            if (bad := self.state["rejected_rollouts"].get(key)) and bad["stat"] == stat:
                continue
            out.append(f)
        return out

    def check_used(self) -> None:
        """Loud when a rollout file a refresh used has changed since (its new rows are lost)."""
        for key, was in self.state["rollout_stats"].items():
            now = _stat(Path(key))
            if now is not None and now != was:
                self.event("rollout_changed", path=key, was=was, now=now,
                           detail="a refresh used this file already; rows added to it are not "
                                  "read. Write new rows to a new file (see draftkit/rl/watch.py)")
                self.state["rollout_stats"][key] = now

    def screen(self, hf: Path, files: list[Path]) -> list[Path]:
        """Files whose every row reads; a file with a bad row is set aside (file:line)."""
        tok, rc, good = load_tokenizer(hf), self.cfg.refresh, []
        for f in files:
            self.state["screening"] = str(f.resolve())  # a watch killed reading it (OOM)
            self.save()                                  # sets it aside at restart
            try:
                for _ in iter_rollouts([f], tok, self.cfg.target.vocab_size, rc.max_seq_len):
                    pass  # streamed: memory stays flat in the file's size
                good.append(f)
                self.state["rejected_rollouts"].pop(str(f.resolve()), None)  # fixed since
            except Exception as e:  # noqa: BLE001 - any file that cannot be read is set aside
                why = str(e) if isinstance(e, DraftkitError) else \
                    f"rollout {f}: reading it raised {type(e).__name__}: {str(e)[:300]}"
                key = str(f.resolve())
                self.state["rejected_rollouts"][key] = {"reason": why, "stat": _stat(f)}
                self.event("rollouts_set_aside", path=key, detail=why)
        self.state.pop("screening", None)
        return good

    def checkpoint_error(self, ckpt: Path, error: Exception, todo: list) -> None:
        tries = self.state["checkpoint_errors"].get(ckpt.name, 0) + 1
        self.state["checkpoint_errors"][ckpt.name] = tries
        self.event("checkpoint_error", checkpoint=str(ckpt), tries=tries, detail=str(error))
        if tries >= CHECKPOINT_TRIES:
            self.event("checkpoint_skipped", checkpoint=str(ckpt), tries=tries)
            self.state["seen"] += [p.name for _, p in todo]
        self.save()

    def tick(self) -> None:
        """One scan: act on the newest complete checkpoint not seen yet."""
        self.check_used()
        todo = [(s, p) for s, p in complete_checkpoints(self.ckpts)
                if p.name not in self.state["seen"]]
        files = self.rollout_files()
        if todo and files:
            self.decide(todo, files)
        self.save()

    def decide(self, todo: list[tuple[int, Path]], files: list[Path]) -> None:
        step, ckpt = todo[-1]
        hf = model_dir(ckpt)
        try:
            files = self.screen(hf, files)
            if not files:
                return  # every new file was set aside: wait for good ones
            why = self.trigger(step, hf, files)
            if why and not self.run_refresh(step, hf, files, why):
                return  # the lock is held: try again at the next tick
        except CheckpointError as e:
            return self.checkpoint_error(ckpt, e, todo)
        if not why:
            self.event("skipped", step=step)
        self.state["seen"] += [p.name for _, p in todo]  # older ones are superseded
        return None

    def run_refresh(self, step: int, hf: Path, files: list[Path], why: str) -> bool:
        """Run the refresh; False = another refresh holds the lock (nothing decided). Recorded
        before it starts: a watch killed during it (OOM) counts a try at restart."""
        self.event("refresh_started", step=step, checkpoint=str(hf), reason=why,
                   rollouts=[str(f) for f in files])
        died = self.state.get("refresh_deaths", {})
        self.state["refreshing"] = str(step)
        self.save()
        try:
            return self._refresh(step, hf, files, why)
        finally:
            self.state.pop("refreshing", None)
            self.state["refresh_deaths"] = {k: v for k, v in died.items() if k != str(step)}
            self.save()

    def recover_deaths(self) -> None:
        """At start: what a watch killed mid-step (out of memory) left. The rollout file it was
        reading is set aside; a checkpoint whose refresh it died in is retried, then skipped
        after CHECKPOINT_TRIES deaths, so a restart does not loop on the same step."""
        screening, refreshing = self._died_in
        if screening:
            why = ("the watch died while reading this file (killed: out of memory?); write "
                   "smaller rollout files")
            self.state["rejected_rollouts"][screening] = {"reason": why,
                                                          "stat": _stat(Path(screening))}
            self.event("rollouts_set_aside", path=screening, detail=why)
        if refreshing:
            deaths = self.state.setdefault("refresh_deaths", {})
            deaths[refreshing] = deaths.get(refreshing, 0) + 1
            self.event("refresh_died", step=int(refreshing), deaths=deaths[refreshing])
            if deaths[refreshing] >= CHECKPOINT_TRIES:
                self.state["seen"] += [p.name for s, p in complete_checkpoints(self.ckpts)
                                       if s <= int(refreshing)]
                self.event("checkpoint_skipped", step=int(refreshing), tries=deaths[refreshing],
                           detail="the watch died during its refresh each time")
        self._died_in = None, None
        self.save()

    def _refresh(self, step: int, hf: Path, files: list[Path], why: str) -> bool:
        rejected = self.state["rejected_rollouts"]  # set aside since the last refresh
        set_aside = [{"path": k, "reason": v["reason"][:300]}
                     for k, v in rejected.items() if not v.get("in_lineage")]
        try:
            res = refresh(self.run, hf, files, self.overrides, should_stop=lambda: self.stop,
                          policy_step=step, set_aside=set_aside)
        except RefreshLocked as e:  # a manual `draftkit refresh` runs: try again later
            self.event("refresh_waiting", step=step, detail=str(e))
            return False
        except CheckpointError:
            raise
        except DraftkitError as e:  # bad input the screen did not catch: log, go on
            res = {"status": "failed", "version": None, "reason": str(e)}
        res.setdefault("reason", "")
        self.event(f"refresh_{res['status']}", step=step, version=res["version"],
                   resumed=res.get("resumed", False), detail=res["reason"])
        if res["status"] in ("published", "rejected", "superseded"):  # else: kept for later
            self.state["last_refresh_step"] = step
            for f in files:
                key = str(f.resolve())
                self.state["used_rollouts"].append(key)
                self.state["rollout_stats"][key] = _stat(f)
            for v in rejected.values():
                v["in_lineage"] = True
        return True

    def sync_engines(self) -> None:
        """Push the current draft to every engine that does not serve it (module doc)."""
        if not self.engines:
            return
        try:  # the engines are the source of truth: ask them, judge what a crash left
            rollout_servers.observe(self.store, self.engines)
            with self.store.push_lock(self.cfg.refresh.engine_timeout_s):
                rollout_servers.settle(self.store, self.engines)
        except Exception as e:  # noqa: BLE001 - say, go on: the push below retries
            self.event("engines_observe_failed", detail=f"{type(e).__name__}: {str(e)[:500]}")
        record = rollout_servers.read(self.store)["engines"]
        current = self.store.current() or "export"
        todo = [u for u in self.engines if not _settled(record.get(u) or {}, current)]
        if not todo:
            return
        try:
            res = rollout_servers.push(self.run, todo, None, self.overrides)
            self.event("engines_swapped", version=current,
                       engines={u: round(r["al"], 3) for u, r in res.items()})
        except rollout_servers.EngineSwapError as e:
            self.event("engines_swap_failed", version=current, detail=str(e)[:2000],
                       engines={u: r["status"] for u, r in e.results.items()})
        except Exception as e:  # noqa: BLE001 - no probes, no secret, a bug: say, go on
            self.event("engines_swap_failed", version=current,
                       detail=f"{type(e).__name__}: {str(e)[:2000]}")

    def run_forever(self, once: bool = False) -> None:
        lock = _daemon_lock(self.store.root)
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self.tracker = Tracker(self.cfg.tracking, f"{self.cfg.name}-watch", self.store.root,
                               self.cfg.to_dict(), True)
        self.event("started", checkpoints=str(self.ckpts), rollouts=str(self.rollouts),
                   every=self.every, al_drop=self.al_drop, engines=self.engines)
        failures = 0
        try:
            self.recover_deaths()
            self.sync_engines()
            while not self.stop:
                try:
                    self.tick()
                    failures = 0
                except Stopped as e:
                    self.event("refresh_interrupted", detail=str(e))
                except Exception as e:  # noqa: BLE001 - one bad tick is an event, not the end
                    failures += 1
                    self.event("tick_failed", failures=failures,
                               detail=f"{type(e).__name__}: {str(e)[:2000]}")
                    if failures >= TICK_FAILURES:
                        raise DraftkitError(f"{failures} ticks in a row raised; the last: "
                                            f"{type(e).__name__}: {e}") from e
                self.sync_engines()
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


def _settled(rec: dict, current: str) -> bool:
    """The engine serves `current`, or refused it already (asked again for a newer one), or
    is `behind` on it and waits out its backoff (rollout_servers.backoff)."""
    waiting = rec.get("status") == "behind" and rec.get("refused") == current and \
        (rec.get("retry_at") or 0) > time.time()
    return (rec.get("status") == "serving" and rec.get("version") == current) or \
        (rec.get("status") == "refused" and rec.get("refused") == current) or waiting


def watch(run_dir, checkpoints, rollouts, overrides=None, every=None, al_drop=None,
          once: bool = False, engines: list[str] | None = None) -> None:
    Watcher(run_dir, checkpoints, rollouts, overrides, every, al_drop,
            engines).run_forever(once)
