"""One draft version into every rank's engine, checked: all or none.

An RL job run by `accelerate launch` / torchrun with colocated generation holds one vLLM engine
per rank (TRL's colocate mode: vLLM's external launcher in each trainer process). A version is
swapped into every engine at the same step boundary:

  1. rank 0 names the version and the probe prompts (`DraftRefresher.probes`), and shares them;
  2. every rank loads the version into its own engine and checks it (drafter_swap.swap_into:
     its worker's tensor hashes against the published tensors, then the probe AL at T=0); a
     rank whose check fails or raises has already rolled its engine back (hash-checked);
  3. the verdicts are gathered. **All or none**: if any rank did not pass, the ranks that passed
     load back the version they held before (a hash-checked load), so every engine serves the
     same version again. A version measured bad on any engine (verdict "failed": probe AL at or
     below the minimum, or hashes that differ) is marked failed in the store and `current` goes
     back to what the engines hold (publish.mark_failed), so `current` never names a version
     that failed on an engine. A swap that raised or was refused ("error", "refused") says
     nothing about the draft: every rank rolls back, nothing is marked, and the caller does not
     try that version again.

The record (`drafts/engines-inloop.json`, written by rank 0 after every swap, and
`InLoop.engines`): one row per rank with the engine it belongs to (rank // tensor parallel
size), the version it serves and whether its last check passed.

Tensor parallelism: the ranks of one TP group hold one engine (vLLM's external launcher), a
worker each; every rank loads its own worker, and the check compares each worker's shards with
the same slices of the published tensors (serving/drafter_hashes.py). Every rank of the group
gathers the whole group's hashes and load errors, so the ranks of one engine reach one verdict
and roll back together; its row in the record is one per rank, with the engine's index.
"""

from __future__ import annotations

import torch.distributed as dist

from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap
from draftkit.serving.drafter_swap import DraftSwapError

RECORD = "engines-inloop.json"  # drafts/<this>: which rank's engine serves which version


class Ranks:
    """The processes of the job (torch.distributed's default group once initialized, else this
    process alone) and the two collectives the swap needs."""

    def __init__(self, tp_size: int = 1):
        self.on = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.on else 0
        self.world = dist.get_world_size() if self.on else 1
        self.tp_size = tp_size

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def engine(self) -> int:
        """The engine this rank's worker belongs to (ranks of one TP group share one)."""
        return self.rank // self.tp_size

    def gather(self, obj) -> list:
        """`obj` of every rank, in rank order, on every rank."""
        if not self.on:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def share(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.on:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def swap_all(refresher: DraftRefresher, llm, ranks: Ranks, version: str | None) -> dict:
    """`version` (rank 0's; None = the run's export) into every rank's engine, all or none (the
    module doc). Every rank calls it at the same point. Returns the same report on every rank:
    {"ok", "version", "verdict", "restored", "engines": [per rank: rank, engine, ok, verdict, al, restored,
    error]}."""
    version = ranks.share(version)
    probes = None
    if ranks.main:
        try:
            probes = refresher.probes(version)
        except Exception as e:  # noqa: BLE001 - no probes: every rank refuses alike
            probes = f"{type(e).__name__}: {e}"
    probes = ranks.share(probes)
    mine = _check_here(refresher, llm, ranks, version, probes)
    engines = ranks.gather(mine)
    ok = all(e["ok"] for e in engines)
    if not ok:  # all or none: an engine that passed loads back what it held
        if mine["ok"]:
            mine = {**mine, **_load_back(refresher, llm, mine["previous"])}
        engines = ranks.gather(mine)
    verdicts = [e["verdict"] for e in engines if not e["ok"] and e["verdict"] != "rolled back"]
    verdict = "ok" if ok else ("failed" if "failed" in verdicts else verdicts[0])
    report = {"ok": ok, "version": version, "verdict": verdict,
              "restored": None if ok else all(e["restored"] is not False for e in engines),
              "engines": [{k: v for k, v in e.items() if k != "previous"} for e in engines]}
    if ranks.main:
        _book(refresher, report, engines)
    return report


def _check_here(refresher, llm, ranks: Ranks, version: str | None, probes) -> dict:
    """This rank's checked swap, as a row of the record."""
    row = {"rank": ranks.rank, "engine": ranks.engine, "version": version, "ok": False,
           "verdict": None, "al": None, "restored": None, "error": None, "previous": None}
    try:
        if isinstance(probes, str):
            raise DraftSwapError(f"no probe prompts for the swap check ({probes}); nothing was "
                                 "loaded")
        rep = refresher.check_swap(llm, version, probes)
        row.update(ok=True, verdict="ok", al=rep["al"], swap_s=rep["swap_s"],
                   previous=rep["previous"], path=rep.get("path"))
    except DraftSwapError as e:
        row.update(verdict=e.verdict, restored=e.restored, error=str(e)[:500],
                   previous=e.previous, version=_held_version(llm))
    except Exception as e:  # noqa: BLE001 - anything else: this engine did not take it
        row.update(verdict="error", error=f"{type(e).__name__}: {str(e)[:500]}",
                   version=_held_version(llm))
    return row


def _load_back(refresher: DraftRefresher, llm, previous: str) -> dict:
    """The version this engine held before a swap that another engine refused, loaded back and
    hash-checked; the row's fields after it."""
    try:
        drafter_swap.load_checked(llm, refresher.kind, previous, refresher.candidates())
        return {"ok": False, "verdict": "rolled back", "restored": True,
                "version": drafter_swap.version_name(previous)}
    except Exception as e:  # noqa: BLE001 - the row says the engine may hold something else
        return {"ok": False, "verdict": "rolled back", "restored": False,
                "error": f"load back raised {type(e).__name__}: {str(e)[:300]}",
                "version": _held_version(llm)}


def _held_version(llm) -> str | None:
    try:
        return drafter_swap.version_name(drafter_swap.drafter_path(llm))
    except Exception:  # noqa: BLE001 - an engine that cannot say: the record says so
        return None


def _book(refresher: DraftRefresher, report: dict, engines: list[dict]) -> None:
    """Rank 0: the store's log and `current`, and the record of which engine serves what."""
    store, version = refresher.store, report["version"]
    if report["ok"]:
        store.log("swapped", version=version, engines=report["engines"])
    else:
        bad = next(e for e in engines if not e["ok"] and e["verdict"] != "rolled back")
        err = DraftSwapError(bad["error"] or "", bad["verdict"], previous=bad["previous"],
                             restored=all(e["restored"] is not False for e in engines))
        refresher.record_failure(version, err)
    store.write_record(RECORD, {"current": store.current(), "engines": report["engines"]})
