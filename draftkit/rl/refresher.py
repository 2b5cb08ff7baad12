"""`DraftRefresher`: the in-process refresh API for RL loops (no checkpoint round-trip).

    from draftkit.api import DraftRefresher
    from draftkit.rl.drift import EngineAL

    refresher = DraftRefresher("runs/rl", every=10, al_drop=0.15)
    engine_al = EngineAL(llm)                     # llm: the rollout engine (vLLM LLM)
    for step in range(num_steps):
        rows = ...                                # this step's rollouts, JSONL-shaped dicts
        refresher.observe(rows, policy_step=step, al=engine_al.read()["acceptance_length"])
        if refresher.should_refresh():            # interval and/or AL drop
            if refresher.refresh(policy_model, tokenizer)["status"] == "published":
                refresher.swap_into(llm)          # in place, hash + probe-AL checked, rollback

Observed rows are written to `drafts/rollouts/` under names no other refresher (a restarted
one included) can reuse, never over an existing file (the lineage hashes them; later refreshes
replay them). The reference AL for `al_drop` is the first engine AL observed after a refresh
(the estimate in lineage.json until then); a refresh resets the interval.

`swap_into` always runs the probe check: with no probes given, `probes()` takes prompts of the
rollouts in the version's lineage (then its ancestors'), else the run's eval split, tokenized
with the target's tokenizer loaded on demand; with none at all it refuses. A version that
fails the check (probe AL at or below the minimum, or hashes that differ) is marked failed in
the store and `current` goes back to the version the engine still holds (publish.py); a check
that raised, or an engine whose acceptance cannot be read (`require_measurable`), decides
nothing about the draft. `current` is read once per swap: the version tried is the one judged.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.core.prepared_data import load_prompts
from draftkit.drafts import kind as kinds
from draftkit.rl import job as refresh_mod
from draftkit.rl.policy import from_model
from draftkit.rl.publish import DraftStore
from draftkit.rl.rollouts import read_rollouts
from draftkit.serving import drafter_swap
from draftkit.targets.load import run_target_dir, target_dir


class DraftRefresher:
    def __init__(self, run_dir: str | Path, overrides: list[str] | None = None,
                 every: int | None = None, al_drop: float | None = None):
        self.run = config.run_dir_of(run_dir)
        self.overrides = list(overrides or [])
        self.cfg = config.load(self.run, self.overrides)
        self.every = self.cfg.refresh.every if every is None else every
        self.al_drop = self.cfg.refresh.al_drop if al_drop is None else al_drop
        self.store = DraftStore(self.run)
        self.store.recover()  # a crash between failed.json and moving `current` back
        self.kind = kinds.get(self.cfg.draft.kind)
        self.pending: list[Path] = []  # rollout files observed since the last refresh
        self.policy_step: int | None = None
        self.al_now: float | None = None
        self.reason = ""
        current = self.store.current()
        lin = self.store.lineage(current) if current else {}
        self.last_refresh_step = (lin.get("policy") or {}).get("step")
        self.al_ref = _lineage_al(lin)
        self._fresh = True  # the next observed AL becomes the reference
        self.tokenizer = None

    def observe(self, rollouts: list[dict] | list[str | Path] | str | Path, policy_step: int,
                al: float | None = None) -> None:
        """Record a step's rollouts (JSONL-shaped dicts, or JSONL paths) and, if known, the
        engine AL they were generated with."""
        self.policy_step = policy_step
        if isinstance(rollouts, (str, Path)):
            rollouts = [rollouts]
        if rollouts and isinstance(rollouts[0], dict):
            rows = [{**r, "policy_step": r.get("policy_step", policy_step)} for r in rollouts]
            self.pending.append(_write_new(self.store.root / "rollouts", policy_step,
                                           "".join(json.dumps(r) + "\n" for r in rows)))
        else:
            self.pending += [Path(p) for p in rollouts]
        if al is not None and al == al:  # not NaN
            self.al_now = float(al)
            if self._fresh:
                self.al_ref, self._fresh = self.al_now, False

    def should_refresh(self) -> bool:
        """True when rollouts are pending and the interval passed or AL dropped; `reason` says."""
        self.reason = ""
        if not self.pending or self.policy_step is None:
            return False
        last = self.last_refresh_step or 0
        if self.every > 0 and self.policy_step - last >= self.every:
            self.reason = f"interval: step {self.policy_step} - {last} >= {self.every}"
        elif (self.al_drop > 0 and self.al_ref is not None and self.al_now is not None
              and self.al_now < (1 - self.al_drop) * self.al_ref):
            self.reason = (f"AL drop: {self.al_now:.3f} < (1 - {self.al_drop}) * "
                           f"{self.al_ref:.3f}")
        return bool(self.reason)

    def refresh(self, policy_model, tokenizer=None, should_stop=lambda: False,
                taps=None) -> dict:
        """Refresh from the pending rollouts with the policy in memory; publish if better.
        `taps` (rl/capture.Taps): the policy's features on rows a trainer's forward already
        computed, read instead of recomputed."""
        files, step = list(self.pending), self.policy_step
        result = self.job(policy_model, tokenizer, files, step, should_stop, taps)
        self.settle(result, files, step)
        return result

    def job(self, policy_model, tokenizer, files: list[Path], step: int | None,
            should_stop=lambda: False, taps=None) -> dict:
        """The refresh itself, on `files` with the policy of `step`; changes no state of this
        refresher but its tokenizer, so it may run in a worker thread while `observe` goes on
        (`settle` then books the result, in the caller's thread)."""
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(target_dir(self.cfg.target.name))
        self.tokenizer = tokenizer
        policy = from_model(policy_model, tokenizer, step=step)
        return refresh_mod.refresh(self.run, policy, files, self.overrides,
                                   should_stop=should_stop, taps=taps)

    def settle(self, result: dict, files: list[Path], step: int | None) -> None:
        """Book a refresh `job` ran on `files` at `step`: decided rows leave `pending` (an
        undecided refresh, too few held-out rows, keeps them), the interval restarts, and a
        published version's estimated AL becomes the reference for `al_drop`."""
        if result["status"] != "undecided":
            used = set(files)
            self.pending = [p for p in self.pending if p not in used]
            self.last_refresh_step = step
        if result["status"] == "published":
            self.al_ref, self._fresh = _lineage_al(result["lineage"]), True

    def probes(self, version: str | None = None) -> list[list[int]]:
        """`refresh.probe_prompts` distinct prompts (token ids) for the swap check: from the
        rollout files in the lineage of `version` (default current) and its ancestors, else
        the run's eval split. Never empty: raises DraftkitError naming the fix."""
        n, rc = self.cfg.refresh.probe_prompts, self.cfg.refresh
        out: dict[tuple, list[int]] = {}  # GRPO siblings share a prompt: keep one
        for f in self._lineage_files(version or self.store.current()):
            for r in read_rollouts([f], self._tokenizer(), self.cfg.target.vocab_size,
                                   rc.max_seq_len):
                out.setdefault(tuple(r.input_ids[: r.prompt_len]), r.input_ids[: r.prompt_len])
            if len(out) >= n:
                break
        if out:
            return list(out.values())[:n]
        data = artifacts.RunPaths(self.run).data
        try:
            return load_prompts(data, n)
        except DraftkitError as e:
            raise DraftkitError(
                f"no probe prompts for the swap check of {self.run}: the rollout files in the "
                f"drafts' lineage are gone and the run has no eval split ({e}). Pass "
                "probes=[token ids...] to swap_into, or run `draftkit prepare` on the run"
            ) from e

    def _lineage_files(self, version: str | None) -> list[str]:
        """Rollout files of `version`'s lineage, then of its parents' (those still on disk)."""
        files, seen = [], set()
        while version is not None and version not in seen and version in self.store.versions():
            seen.add(version)
            lin = self.store.lineage(version)
            files += [f["path"] for f in lin.get("rollouts", []) if Path(f["path"]).is_file()]
            version = lin.get("parent")
        return files

    def _tokenizer(self):
        """The policy's tokenizer: the one refresh() got, else the run target's (on demand)."""
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(run_target_dir(self.cfg.target))
        return self.tokenizer

    def swap_into(self, llm, probes: list[list[int]] | None = None) -> dict:
        """Load the current version into `llm`'s drafter in place; hash + probe-AL check
        (probes: `probes()` when None), rollback and DraftSwapError on failure; a version
        that failed is marked failed and `current` goes back. The engine needs
        `engine_kwargs()`."""
        version = self.store.current()  # read once: what is tried
        try:
            report = self.check_swap(llm, version, probes)
        except drafter_swap.DraftSwapError as e:
            self.record_failure(version, e)
            raise
        self.store.log("swapped", version=version, al=report["al"], swap_s=report["swap_s"],
                       previous=report["previous"])
        return report

    def check_swap(self, llm, version: str | None, probes: list[list[int]] | None = None
                   ) -> dict:
        """`version` (None: the run's export) into `llm`'s drafter, checked and rolled back on
        failure (DraftSwapError), as `swap_into`, but nothing is written to the store: a
        caller swapping into several engines (rl/engines.py) decides what the store says."""
        rc = self.cfg.refresh
        directory = self.store.root / version if version else self.store.current_dir()
        drafter_swap.require_measurable(llm)  # an engine the probe cannot read: not the draft's
        if version is not None and (failed := self.store.failure(version)) is not None:
            raise drafter_swap.DraftSwapError(
                f"{version} is marked failed ({failed.get('reason', '')[:200]}); nothing was "
                "loaded. Refresh again, or point `current` at a good version")
        if probes is None:
            try:
                probes = self.probes(version)
            except DraftkitError as e:  # an RL loop that catches DraftSwapError goes on
                raise drafter_swap.DraftSwapError(f"{e}; nothing was loaded") from e
        return drafter_swap.swap_into(llm, directory, self.kind, probes, rc.min_probe_al,
                                      rc.probe_max_tokens, candidates=self.candidates())

    def candidates(self) -> list[Path]:
        """Dirs an engine's drafter may have come from: every version, newest first, then the
        run's export (drafter_swap.begin finds the one that holds the engine's weights)."""
        dirs = [self.store.root / v for v in reversed(self.store.versions())]
        return [*dirs, artifacts.RunPaths(self.run).export]

    def record_failure(self, version: str | None, e) -> None:
        """Log a failed swap; a version whose check measured it bad (verdict "failed": probe
        AL at or below the minimum, or tensor hashes that differ) is marked failed and
        `current` goes back to what the engine still holds. A check that raised ("error")
        or was refused says nothing about the draft: nothing is marked."""
        self.store.log("swap_failed", version=version, verdict=e.verdict,
                       previous=e.previous, restored=e.restored, error=str(e)[:500])
        if version is not None and e.verdict == "failed":
            self.store.mark_failed(version, str(e), back_to=self.store.version_of(e.previous),
                                   verdict=e.verdict, restored=e.restored)


def _write_new(folder: Path, step: int, text: str) -> Path:
    """Write `text` to a new file `step-<step>-<time>-<pid>-<random>.jsonl` in `folder`,
    complete when it appears (a temp file hard-linked into place) and never over another."""
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        path = folder / (f"step-{step:08d}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-"
                         f"{uuid.uuid4().hex[:8]}.jsonl")
        tmp = folder / f".{path.name}.tmp"
        artifacts.write_text_atomic(tmp, text)
        try:
            os.link(tmp, path)  # fails if the name exists: nothing is overwritten
            return path
        except FileExistsError:
            continue
        finally:
            tmp.unlink()


def _lineage_al(lin: dict) -> float | None:
    if not lin:
        return None
    return lin["al_after"][lin["decided_on"]]["al"]
