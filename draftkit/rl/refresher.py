"""`DraftRefresher`: the in-process refresh API for RL loops (no checkpoint round-trip).

    from draftkit import DraftRefresher
    from draftkit.rl.drift import EngineAL

    refresher = DraftRefresher("runs/rl", every=10, al_drop=0.15)
    engine_al = EngineAL(llm)                     # llm: the rollout engine (vLLM LLM)
    for step in range(num_steps):
        rows = ...                                # this step's rollouts, JSONL-shaped dicts
        refresher.observe(rows, policy_step=step, al=engine_al.read()["acceptance_length"])
        if refresher.should_refresh():            # interval and/or AL drop
            if refresher.refresh(policy_model, tokenizer)["status"] == "published":
                refresher.swap_into(llm)          # in place, hash + probe-AL checked, rollback

Observed rows are written to `drafts/rollouts/` (the lineage hashes them; later refreshes
replay them). The reference AL for `al_drop` is the first engine AL observed after a refresh
(the estimate in lineage.json until then); a refresh resets the interval.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.rl import kinds
from draftkit.rl import refresh as refresh_mod
from draftkit.rl.policy import from_model
from draftkit.rl.publish import DraftStore


class DraftRefresher:
    def __init__(self, run_dir: str | Path, overrides: list[str] | None = None,
                 every: int | None = None, al_drop: float | None = None):
        self.run = config.run_dir_of(run_dir)
        self.overrides = list(overrides or [])
        self.cfg = config.load(self.run, self.overrides)
        self.every = self.cfg.refresh.every if every is None else every
        self.al_drop = self.cfg.refresh.al_drop if al_drop is None else al_drop
        self.store = DraftStore(self.run)
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
            path = self.store.root / "rollouts" / f"step-{policy_step:08d}-{len(self.pending)}.jsonl"
            rows = [{**r, "policy_step": r.get("policy_step", policy_step)} for r in rollouts]
            artifacts.write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
            self.pending.append(path)
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

    def refresh(self, policy_model, tokenizer=None, should_stop=lambda: False) -> dict:
        """Refresh from the pending rollouts with the policy in memory; publish if better."""
        from draftkit.target.load import target_dir

        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(target_dir(self.cfg.target.name))
        self.tokenizer = tokenizer
        policy = from_model(policy_model, tokenizer, step=self.policy_step)
        result = refresh_mod.refresh(self.run, policy, self.pending, self.overrides,
                                     should_stop=should_stop)
        self.pending, self.last_refresh_step = [], self.policy_step
        if result["status"] == "published":
            self.al_ref, self._fresh = _lineage_al(result["lineage"]), True
        return result

    def probes(self) -> list[list[int]]:
        """Prompt ids of the current version's first held-out-sized set of rollouts."""
        from draftkit.rl.rollouts import read_rollouts

        current = self.store.current()
        if current is None or self.tokenizer is None:
            return []
        files = [f["path"] for f in self.store.lineage(current)["rollouts"]]
        rows = read_rollouts([f for f in files if Path(f).is_file()], self.tokenizer,
                             self.cfg.target.vocab_size, self.cfg.refresh.max_seq_len)
        return [r.input_ids[: r.prompt_len] for r in rows[: self.cfg.refresh.probe_prompts]]

    def swap_into(self, llm, probes: list[list[int]] | None = None) -> dict:
        """Load the current version into `llm`'s drafter in place; hash + probe-AL check,
        rollback and DraftSwapError on failure. The engine needs `engine_kwargs()`."""
        from draftkit.serving import drafter_swap

        rc = self.cfg.refresh
        report = drafter_swap.swap_into(llm, self.store.current_dir(), self.kind,
                                        self.probes() if probes is None else probes,
                                        rc.min_probe_al, rc.probe_max_tokens)
        self.store.log("swapped", version=self.store.current(), al=report["al"],
                       swap_s=report["swap_s"])
        return report


def _lineage_al(lin: dict) -> float | None:
    if not lin:
        return None
    return lin["al_after"][lin["decided_on"]]["al"]
