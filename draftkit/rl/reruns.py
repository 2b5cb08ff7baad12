"""Reruns of a refresh job (rl/job.py): its keys, and what running the same inputs again
does; a rerun never moves `drafts/current` backwards.

A job's *inputs* key hashes everything that decides its result: the policy weights, the rollout
files (content sha256s, each file once), the draft kind, k (draft.num_speculative_tokens), the
policy dtype, and the refresh settings (SETTINGS; harvest.dtype when refresh.capture=harvest).
Its *job* key adds the parent: the version current when it starts ("export" before the first).

What a rerun of the same inputs does, under the refresh lock (`earlier`):
    a version has this job key (same parent)   a crash came before `current` moved: move it
    a version has these inputs and is current  done already: nothing to do ("published")
    a version has these inputs, other parent   superseded: newer drafts were published since;
                                               nothing runs and `current` stays where it is
    rejected / undecided with this job key     the same decision again, nothing recomputed
    rejected / undecided / started under       superseded
      another parent
    started under this parent (a crash)        run again; a harvest capture is reused
A job writes `drafts/.jobs/<inputs>.json` (its parent) when it starts training, so a job that
crashed half-way is recognised after newer versions are published. A version the swap check
marked failed is never made current again by a rerun.
"""

from __future__ import annotations

import hashlib
import json

from draftkit.core import artifacts
from draftkit.rl import capture
from draftkit.rl.publish import DraftStore

# refresh.* settings that change what a job produces (or whether it publishes)
SETTINGS = ("replay", "budget_steps", "budget_s", "lr", "batch_tokens", "heldout_fraction",
            "min_gain", "temperature", "draft_sampling", "seed", "max_seq_len", "capture",
            "min_heldout_starts", "gate")
JOBS = ".jobs"  # drafts/.jobs/<inputs>.json: {"inputs", "job", "parent", "time"}


def inputs_key(policy_digest: str, digests: list[dict], cfg) -> str:
    """Same policy, same rollout files, same settings = same inputs (whatever is current)."""
    rc = cfg.refresh
    settings = {k: getattr(rc, k) for k in SETTINGS}
    draft = {"kind": cfg.draft.kind, "k": cfg.draft.num_speculative_tokens,
             "policy_dtype": cfg.target.dtype,
             "harvest_dtype": cfg.harvest.dtype if rc.capture == "harvest" else None}
    blob = json.dumps([policy_digest, [d["sha256"] for d in digests], settings, draft],
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def job_key(inputs: str, parent: str) -> str:
    """The inputs on top of one parent version."""
    return hashlib.sha256(f"{inputs}:{parent}".encode()).hexdigest()[:16]


def mark_started(store: DraftStore, inputs: str, job: str, parent: str) -> None:
    import time

    artifacts.write_json_atomic(store.root / JOBS / f"{inputs}.json", {
        "inputs": inputs, "job": job, "parent": parent,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def _started(store: DraftStore, inputs: str) -> dict | None:
    path = store.root / JOBS / f"{inputs}.json"
    try:
        return artifacts.read_json(path)
    except (OSError, ValueError):
        return None


def earlier(store: DraftStore, inputs: str, job: str, parent: str) -> dict | None:
    """What an earlier run of these inputs leaves to do (see the table above); None = run."""
    for version in store.versions():
        lin = store.lineage(version)
        if lin.get("job") == job:  # built on the current parent: only `current` is left
            if store.failure(version) is not None:
                return superseded(store, inputs, job, parent, f"it published {version}, "
                                  "which the swap check marked failed")
            capture.remove(store, job)  # a crash may have come before its removal
            return finish_existing(store, version, job)
        if lin.get("inputs") == inputs:
            if version == parent:
                return {"status": "published", "version": version, "job": job,
                        "resumed": True, "lineage": lin}
            return superseded(store, inputs, job, parent, f"it published {version} on top of "
                              f"{lin.get('parent')}")
    for e in reversed(store.events()):
        if e.get("event") not in ("rejected", "undecided"):
            continue
        if e.get("job") == job:
            capture.remove(store, job)
            return {"status": e["event"], "version": None, "job": job, "resumed": True,
                    "reason": e.get("reason", "")}
        if e.get("inputs") == inputs:
            return superseded(store, inputs, job, parent, f"it was {e['event']} on top of "
                              f"{e.get('parent')}")
    started = _started(store, inputs)
    if started is not None and started["parent"] != parent:
        capture.remove(store, started["job"])
        return superseded(store, inputs, job, parent, f"it started on {started['parent']} "
                          "and did not finish")
    return None


def superseded(store: DraftStore, inputs: str, job: str, parent: str, what: str) -> dict:
    """A rerun of an old job after newer drafts: do nothing, and say so."""
    reason = (f"this job ran before ({what}); {parent} is current now, so it is superseded "
              "and `current` stays. Refresh with newer rollouts or policy to go on")
    store.log("superseded", job=job, inputs=inputs, parent=parent, reason=reason)
    print(f"refresh superseded: {reason}")
    return {"status": "superseded", "version": None, "job": job, "resumed": True,
            "reason": reason}


def finish_existing(store: DraftStore, version: str, job: str) -> dict:
    """The job already produced `version` from today's parent: make it current (a crash came
    before that)."""
    if store.current() != version:
        store.set_current(version)
        store.log("resumed", job=job, version=version, detail="moved current after a crash")
    return {"status": "published", "version": version, "job": job, "resumed": True,
            "lineage": store.lineage(version)}
