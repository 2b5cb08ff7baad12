"""Speculative rollouts inside an RL training loop, framework-free: the engine's speculative
config, each generate call's record, the policy sync on vLLM's CPU platform, and at each step
end the follow / refresh / checked swap into every rank's engine. A trainer adapter
(integrations/trl.py) only wires these to its hooks; nothing here imports a trainer.

    loop = SpeculativeRollouts(DraftkitConfig(run="runs/rl", every=10))
    llm = loop.start_engine(model=policy_dir, max_num_seqs=16)   # or the trainer builds it
    loop.bind(llm, Ranks(tp_size=1))
    generate = loop.observing(generate, step=lambda: state.step)  # returns (prompt, completion ids, ...)
    ... each step: loop.step_end(state.step, policy_model, tokenizer)

Refreshes never stop training: a refresh or a swap that raises becomes an event (`events`,
"status": "error", the error's text), the engines keep the draft they hold and the loop goes
on; a raising refresh waits `every` steps before the next try (its rollouts stay pending).
Where the refresh runs (`DraftkitConfig.refresh_in`):
  sync        at the step end, in the trainer's process; every rank waits for it.
  background  a worker thread in rank 0's process, on a copy of the policy taken at the step
              end (host or device memory for one more policy) and the taps so far; training goes
              on, and the step end after it finished swaps in what it published. Not with vLLM
              TP > 1: the thread would draw from the generator the TP engines sample with.
  watch       none here: `draftkit watch` in another process (or on another device) refreshes
              from the rollouts this loop writes to `drafts/rollouts/` and publishes; the step
              end follows `current` (`follow=True`).
Every rank: rollouts are gathered to rank 0, which alone refreshes (from the rollouts of every
rank; the taps of its own rows, the policy runs over the others') and publishes; the version
goes into every rank's engine, all or none (rl/engines.py).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftkit.core.errors import DraftkitError
from draftkit.rl import engines
from draftkit.rl.capture import Taps
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import conditions, drafter_swap, policy_sync, speculative, vllm_engine
from draftkit.serving.counters import SpecCounters

log = logging.getLogger(__name__)
METHODS = ("draft", "auto", "ngram", "suffix", "none")
DRAFTS = ("draft", "auto")  # methods that read the run's draft
REFRESH_IN = ("sync", "background", "watch")


@dataclass
class DraftkitConfig:
    run: str | None = None  # the draft's run dir: drafts/current (else export) is served
    # draft (the run's) | auto (what the export's serving.json picks for the loop's generation
    # batch and temperature: the draft, a free method or none) | ngram | suffix | none
    method: str = "draft"
    k: int | None = None  # speculative tokens (None: the draft's config; 3 for ngram/suffix)
    every: int | None = None  # refresh every N policy steps (None: the run's refresh.every; 0 never)
    al_drop: float | None = None  # refresh when the engine AL falls by this fraction (None: run's)
    overrides: list[str] = field(default_factory=list)  # run-config key=value for refreshes
    refresh: bool = True  # False: serve the draft frozen (observe nothing, refresh nothing)
    refresh_in: str = "sync"  # sync | background | watch (module doc)
    follow: bool = True  # swap in a draft another process (draftkit watch) publishes in the run
    dtype: str = "auto"  # vLLM dtype; auto = what the hardware does natively
    # None = the engine settings' (core/engine_settings.py): CUDA graphs on CUDA; on a CPU eager
    # (no torch.compile: seconds, not minutes, to start) unless measured faster compiled
    enforce_eager: bool | None = None
    # the refresh's features from the trainer's own loss forward (rl/taps.py), not a second
    # policy pass over the rollouts; held in host memory until a refresh: (aux ids + 1) hidden
    # states per pending token, in the policy's dtype
    taps_from_trainer: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise DraftkitError(f"DraftkitConfig.method={self.method!r}; one of {METHODS}")
        if self.refresh_in not in REFRESH_IN:
            raise DraftkitError(f"DraftkitConfig.refresh_in={self.refresh_in!r}; one of "
                                f"{REFRESH_IN}")
        if self.method in DRAFTS and not self.run:
            raise DraftkitError(f"DraftkitConfig(method={self.method!r}) needs run= (a draftkit "
                                "run dir with an export: `draftkit export RUN`)")


def serving_advice(pick: speculative.Served, own: str, batch: int) -> str | None:
    """What serving.json measured at the loop's generation batch when its pick there is not the
    draft's own method `own` (no speculation or a free method), else None."""
    r = pick.pick
    if pick.source != "range" or r is None or r["method"] == own:
        return None
    ups = ", ".join(f"T={t}: {x['speedup']:.2f}x" for t, x in r["by_temperature"].items())
    return (f"serving.json measured {r['method']} fastest at batch {r['batch_from']}-"
            f"{r['batch_to'] or ''} ({ups} over no speculation), which holds the loop's "
            f"generation batch {batch}: the draft measured slower there. "
            "DraftkitConfig(method='auto') serves that pick; re-run `draftkit eval` on this "
            "machine to measure again")


class SpeculativeRollouts:
    """The state kept beside one RL loop: its engine, refresher, records and events."""

    def __init__(self, cfg: DraftkitConfig):
        self.cfg = cfg
        self.llm = self.refresher = self.taps = None
        self.ranks = engines.Ranks()
        self.generations: list[dict] = []  # one per generate call: step, tokens, spec counters
        self.events: list[dict] = []  # refreshes, swaps and errors, in order
        self.syncs: list[dict] = []  # policy syncs draftkit ran (vLLM's CPU platform)
        self.engines: list[dict] = []  # per rank: the version its engine serves (rl/engines.py)
        self.on_event = lambda event: None  # an adapter's sink (its trainer's logs)
        self._rows: list[dict] = []  # this rank's rollouts since the last step end
        self._al: list[int] = [0, 0]  # drafts, accepted since the last step end
        self._sync_dir: str | None = None
        self._refused: str | None = None  # a version whose swap was refused (not retried)
        self._worker: _Worker | None = None
        self._warned = False
        self.temperature = 1.0  # the loop's sampling T (an adapter sets it: method="auto")
        self.draft_dir = DraftStore(cfg.run).current_dir() if cfg.method in DRAFTS else None
        self.serves_draft = self.draft_dir is not None  # False once "auto" picks another method
        if self.draft_dir is not None:
            self.speculative = speculative.served(self.draft_dir, k=cfg.k).config
        else:
            self.speculative = speculative.method_config(
                cfg.method, cfg.k if cfg.k is not None else 3, None)

    # ---------------------------------------------------------------- the engine

    def engine_kwargs(self) -> dict:
        out = {**vllm_engine.suffix_engine_kwargs(self.speculative)}
        if self.serves_draft:
            out.update(drafter_swap.engine_kwargs())
        out.update(policy_sync.engine_kwargs())  # its worker class has the drafter-swap methods
        if self.speculative is None:  # vLLM refuses spec-decode metrics without speculation
            out.pop("per_request_spec_decode_metrics", None)
        return out

    def start_engine(self, model: str, max_model_len: int | None = None,
                     max_num_seqs: int | None = None, seed: int = 0, **loop_kwargs):
        """A vLLM `LLM` with the loop's own keywords (a trainer's: TP, external launcher, ...),
        plus the draft's speculative config and what draftkit's checks need."""
        if self.draft_dir is not None and max_num_seqs:
            self.choose(max_num_seqs, loop_kwargs)
        spec = vllm_engine.EngineSpec(
            model=model, speculative_config=self.speculative, dtype=self.cfg.dtype, seed=seed,
            max_model_len=max_model_len or vllm_engine.EngineSpec.max_model_len,
            max_num_seqs=max_num_seqs or vllm_engine.EngineSpec.max_num_seqs,
            enforce_eager=self.cfg.enforce_eager, extra={**loop_kwargs, **self.engine_kwargs()})
        set_threads = torch.set_num_threads
        try:
            return vllm_engine.start(spec)
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads process-wide (it pins the threads
            # of its own worker process); with an external launcher that is this process
            torch.set_num_threads = set_threads

    def choose(self, batch: int, engine_kwargs: dict | None = None) -> None:
        """The speculative config for the loop's generation `batch` and `temperature`, from the
        export's serving.json (speculative.served). method="draft": the draft as asked, with
        advice when serving.json picked another method there; "auto": serving.json's pick (not
        the draft: the draft is not served, nothing refreshes in the loop), at DraftkitConfig's
        k where it gives one, where serving.json measured under this engine's conditions
        (`engine_kwargs`: the loop's LLM keywords; serving/conditions.py), else no speculation.
        Chosen once: vLLM fixes the engine's speculative method at start, so a later, faster
        refreshed draft is picked by the next engine, not this one (docs/integration.md)."""
        pick = speculative.served(self.draft_dir, batch=batch, temperature=self.temperature)
        own = speculative.served(self.draft_dir).method
        event = {"event": "served", "batch": batch, "temperature": self.temperature,
                 "method": self.cfg.method, "source": pick.source, "note": pick.note}
        if self.cfg.method == "auto" and pick.source == "range":
            # an explicit k holds for whichever method serving.json picked (no per-batch k)
            self.speculative = speculative.with_k(pick.config, self.cfg.k)
            if self.speculative is not None and (why := conditions.unvouched(
                    self.draft_dir, engine_kwargs or {}, self.cfg.dtype)):
                log.warning("draftkit: %s", why)
                event["why"], self.speculative = why, None
            self.serves_draft = self.speculative is not None and pick.method == own
            event["served"] = pick.method if self.speculative is not None else "none"
        elif advice := serving_advice(pick, own, batch):
            log.warning("draftkit: %s", advice)
            event["advice"] = advice
        if pick.note:
            log.warning("draftkit: %s", pick.note)
        if self.cfg.method == "auto" or "advice" in event or pick.note:
            self._event(event)

    def bind(self, llm, ranks: engines.Ranks, sync_policy: bool = False) -> None:
        """The loop's engine and its ranks; `sync_policy`: this loop syncs the policy into the
        engine with `sync_policy` (vLLM's CPU platform). Rank 0 builds the refresher first (it
        may move a `current` a crash left on a failed version), then the others."""
        self.llm, self.ranks = llm, ranks
        if sync_policy:
            self._sync_dir = tempfile.mkdtemp(prefix="draftkit-policy-")
        if not (self.cfg.refresh and self.serves_draft):
            return
        if ranks.tp_size > 1 and self.cfg.refresh_in == "background":
            raise DraftkitError(
                f"DraftkitConfig(refresh_in='background') with a vLLM engine of tensor parallel "
                f"size {ranks.tp_size}: the refresh thread would draw from the torch generator "
                "the engine samples with while it runs, and the TP workers' engines must draw "
                "alike. Use refresh_in='sync' or 'watch' (another process)")
        for turn in (True, False):
            if ranks.main == turn:
                self.refresher = DraftRefresher(self.cfg.run, self.cfg.overrides,
                                                self.cfg.every, self.cfg.al_drop)
            ranks.share(None)  # rank 0's first
        self.engines = [{"rank": r, "engine": r // ranks.tp_size,
                         "version": drafter_swap.version_name(self.draft_dir)}
                        for r in range(ranks.world)]

    @property
    def wants_taps(self) -> bool:
        """Taps pay only where this rank refreshes (rank 0) and a refresh can happen here."""
        r = self.refresher
        return (self.cfg.taps_from_trainer and self.ranks.main and r is not None
                and self.cfg.refresh_in != "watch" and (r.every > 0 or r.al_drop > 0))

    # ---------------------------------------------------------------- each generate call

    def observing(self, generate, step):
        """`generate` recorded: it returns (prompt ids, completion ids, ...) as TRL's does;
        `step()` is the policy step. What it returns is untouched."""

        def observed(*args, **kwargs):
            before, t0 = SpecCounters.read(self.llm), time.perf_counter()
            out = generate(*args, **kwargs)
            seconds = time.perf_counter() - t0
            self.record(step(), out[0], out[1], SpecCounters.read(self.llm).delta(before),
                        seconds)
            return out

        return observed

    def record(self, step: int, prompt_ids, completion_ids, spec, seconds: float) -> dict:
        tokens = sum(len(c) for c in completion_ids)
        rec = {"step": step, "completions": len(completion_ids), "tokens": tokens,
               "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9), **spec.as_dict()}
        self.generations.append(rec)
        if not spec.drafts and self.speculative is not None and tokens > len(completion_ids) \
                and not self._warned:
            self._warned = True
            log.warning("speculation drafted nothing in the generate call at step %d "
                        "(speculative_config %s)", step, self.speculative)
        if self.refresher is not None:
            self._rows += [{"prompt_ids": list(p), "response_ids": list(c), "policy_step": step}
                           for p, c in zip(prompt_ids, completion_ids, strict=True)]
            self._al[0] += spec.drafts
            self._al[1] += spec.accepted
        return rec

    def sync_policy(self, model, step: int) -> None:
        """The policy's weights into the live engine by vLLM's in-place reload
        (serving/policy_sync.py), then the prefix cache dropped."""
        report = policy_sync.sync_policy(self.llm, model, self._sync_dir)
        self.syncs.append({"step": step, **report})

    # ---------------------------------------------------------------- each step end

    def step_end(self, step: int, model, tokenizer) -> None:
        """Every rank, at the same step boundary, after `step` policy updates: rollouts to rank
        0's refresher; a finished background refresh or a version another process published
        swapped in; then, when due, a refresh (sync or background). The torch generator is
        given back as found: an engine under vLLM's external launcher samples from this
        process's generator, and the engines of one TP group must draw alike (a refresh on
        rank 0 alone would desynchronise them, and their next generate call would hang)."""
        if self.refresher is None:
            return
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            self._step_end(step, model, tokenizer)

    def _step_end(self, step: int, model, tokenizer) -> None:
        self._gather(step)
        done = self.ranks.share(self._worker.poll() if self._worker and self.ranks.main
                                else None)
        if done is not None:
            self._finish(done, self._worker.taps if self._worker else None)
            self._worker = None
        if self.cfg.follow:
            self.follow(step)
        due = self.ranks.share(self._due() if self.ranks.main else None)
        if due is None:
            return
        if self.cfg.refresh_in == "background":
            if self.ranks.main:
                self._worker = _Worker(self, model, tokenizer, step, due)
            return
        taps = self.taps.taps if self.taps is not None else None
        result = self._refresh(model, tokenizer, step, due, taps) if self.ranks.main else None
        self._finish(self.ranks.share(result))

    def _gather(self, step: int) -> None:
        rows, al = self.ranks.gather(self._rows), self.ranks.gather(self._al)
        self._rows, self._al = [], [0, 0]
        if not self.ranks.main:
            return
        drafts, accepted = sum(a[0] for a in al), sum(a[1] for a in al)
        r = self.refresher
        r.observe([row for part in rows for row in part], policy_step=step,
                  al=1 + accepted / drafts if drafts else None)

    def _due(self) -> str | None:
        """Rank 0: why a refresh runs now (None: not due, or one is still running)."""
        r = self.refresher
        if self.cfg.refresh_in == "watch" or self._worker is not None:
            return None
        return r.reason if r.should_refresh() else None

    def _refresh(self, model, tokenizer, step: int, reason: str, taps: Taps | None) -> dict:
        """Rank 0: one refresh on the pending rollouts; an exception becomes the event."""
        r, t0 = self.refresher, time.perf_counter()
        files = list(r.pending)
        event = {"event": "refresh", "step": step, "reason": reason, "mode": self.cfg.refresh_in}
        training = model.training
        try:
            result = r.job(model, tokenizer, files, step, taps=taps)
        except Exception as e:  # noqa: BLE001 - a refresh never stops training
            log.warning("draftkit: the refresh at step %d raised; the engines keep their draft "
                        "and training goes on: %s: %s", step, type(e).__name__, e)
            return {**event, "status": "error", "error": f"{type(e).__name__}: {str(e)[:500]}",
                    "refresh_s": time.perf_counter() - t0, "files": [str(f) for f in files]}
        finally:
            model.train(training)
        return {**event, "status": result["status"], "version": result.get("version"),
                "refresh_s": time.perf_counter() - t0, "result": result,
                "files": [str(f) for f in files],
                "capture": (result.get("lineage") or {}).get("capture")}

    def _finish(self, event: dict, held: Taps | None = None) -> None:
        """Every rank: book a refresh's result (rank 0's refresher) and swap in what it
        published. `held`: a background refresh's taps, back in the store if undecided."""
        result = event.pop("result", None)
        files = [Path(f) for f in event.pop("files", [])]
        if self.ranks.main:
            r = self.refresher
            if event["status"] == "error":
                r.last_refresh_step = event["step"]  # try again `every` steps later
            else:
                r.settle(result, files, event["step"])
                if self.taps is not None and event["status"] != "undecided" and held is None:
                    self.taps.clear()  # a sync refresh read them
            if self.taps is not None and held is not None and event["status"] == "undecided":
                self.taps.taps.rows.update(held.rows)  # kept pending with their rows
        if event["status"] == "published":
            event["swap"] = self.swap(event["version"])
        self._event(event)

    def follow(self, step: int) -> None:
        """Swap in the run's current draft when an engine holds another one (a version that a
        `draftkit watch` in another process published)."""
        want = self.ranks.share(os.path.realpath(self.refresher.store.current_dir())
                                if self.ranks.main else None)
        held = drafter_swap.drafter_path(self.llm)
        if not any(self.ranks.gather(want != held)) or want == self._refused:
            return
        version = DraftStore(self.cfg.run).version_of(want)
        self._event({"event": "follow", "step": step,
                     "version": drafter_swap.version_name(want), "swap": self.swap(version)})

    def swap(self, version: str | None) -> dict:
        """`version` into every rank's engine, checked, all or none (rl/engines.py); on a
        refusal the engines keep the draft they hold and training goes on."""
        try:
            rep = engines.swap_all(self.refresher, self.llm, self.ranks, version)
        except Exception as e:  # noqa: BLE001 - a swap never stops training
            rep = {"ok": False, "version": version, "verdict": "error", "restored": None,
                   "error": f"{type(e).__name__}: {str(e)[:500]}", "engines": []}
        target = self.refresher.store.root / version if version else self.draft_dir
        self._refused = None if rep["ok"] else os.path.realpath(target)
        if rep["engines"]:
            self.engines = [{k: e.get(k) for k in ("rank", "engine", "version", "ok")}
                            for e in rep["engines"]]
        if rep["ok"]:
            mine = rep["engines"][self.ranks.rank]
            rep.update(al=mine["al"], swap_s=mine.get("swap_s"), path=mine.get("path"))
        else:
            bad = next((e for e in rep["engines"] if e.get("error")), rep)
            rep["error"] = bad.get("error")
            log.warning("draftkit: draft swap refused, the engines keep their draft: %s",
                        str(rep["error"])[:300])
        return rep

    def _event(self, event: dict) -> None:
        self.events.append(event)
        self.on_event(event)

    def close(self) -> None:
        """Wait for a background refresh and book it (its version is not swapped: the engines
        are going away; the next run starts on `current`), drop temp files."""
        if self._worker is not None and self.ranks.main:
            self._worker.thread.join()
            event = self._worker.poll()
            self._worker = None
            if event is not None:
                result, files = event.pop("result", None), event.pop("files", [])
                if event["status"] != "error":
                    self.refresher.settle(result, [Path(f) for f in files], event["step"])
                self._event({**event, "swap": None})
        if self._sync_dir:
            shutil.rmtree(self._sync_dir, ignore_errors=True)


class _Worker:
    """A refresh in a thread of rank 0's process, on a copy of the policy of `step` and the taps
    so far (the trainer's hooks fill a fresh store meanwhile): `poll()` is its event once done."""

    def __init__(self, loop: SpeculativeRollouts, model, tokenizer, step: int, reason: str):
        self.event: dict | None = None
        policy = copy.deepcopy(model)  # training moves `model` on while the refresh reads this
        self.taps = None
        if loop.taps is not None:
            self.taps, loop.taps.taps = loop.taps.taps, Taps()

        def run():
            self.event = loop._refresh(policy, tokenizer, step, reason, self.taps)

        self.thread = threading.Thread(target=run, name="draftkit-refresh", daemon=True)
        self.thread.start()

    def poll(self) -> dict | None:
        return None if self.thread.is_alive() else self.event
