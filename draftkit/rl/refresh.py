"""`draftkit refresh RUN --policy CKPT --rollouts PATH...`: one job an RL scheduler can call.
New policy + its recent rollouts -> warm-started draft, published as `drafts/vNNNN` only if it
is better than the current draft on the current policy.

    draftkit refresh runs/rl --policy ckpts/step_200 --rollouts rollouts/step_200.jsonl
    draftkit refresh runs/rl --policy ckpts/step_200 --rollouts rollouts/ --replay 512 --budget-s 120
    python -c "from draftkit import api; api.refresh('runs/tiny', 'ckpt', ['r.jsonl'])"

Steps, under the run's refresh lock: read and check the rollouts (policy tokenizer); hold out
a deterministic `refresh.heldout_fraction` of them; add up to `refresh.replay` rows of the
rollouts earlier refreshes trained on (their features recaptured with the new policy); load
the current draft with the policy's frozen parts; estimate its AL on the held-out rows
(drift.py); capture the policy's features on the train + replay rows (`refresh.capture`:
online in RAM, or harvest shards under drafts/.capture/<job>/ that a rerun reuses; capture.py);
fine-tune within the budget; estimate again; publish if AL rose by more than
`refresh.min_gain`, else log the reason. Every outcome goes to `drafts/refresh-log.jsonl`.
A job is keyed by (policy hash, rollout sha256s, settings); a rerun after a crash finishes it,
and a rerun after success does nothing: nothing is published twice.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.rl import capture, drift, finetune, kinds, rollouts
from draftkit.rl.policy import Policy, check_lineage, load_policy
from draftkit.rl.publish import DraftStore


def heldout_split(rows: list[rollouts.Rollout], fraction: float) -> tuple[list, list]:
    """(train, heldout): rows ranked by a hash of file:line, the first ceil(fraction * n) held
    out (at least one, and at least one left to train on)."""
    if len(rows) < 2:
        raise DraftkitError(f"a refresh needs at least 2 rollouts (one to train, one held out "
                            f"to compare drafts), got {len(rows)}")
    def rank(i: int) -> str:  # file name + line: the same rows wherever the files live
        return hashlib.sha256(Path(rows[i].source).name.encode()).hexdigest()

    ranked = sorted(range(len(rows)), key=rank)
    n = min(len(rows) - 1, max(1, int(-(-fraction * len(rows) // 1))))
    held = set(ranked[:n])
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


def replay_rows(store: DraftStore, exclude: set[str], n: int, tok, vocab: int,
                max_len: int) -> tuple[list, list[str]]:
    """Up to n rows of rollout files earlier versions trained on (newest version first)."""
    rows, files = [], []
    for version in reversed(store.versions()):
        for f in store.lineage(version).get("rollouts", []):
            path = f["path"]
            if len(rows) >= n or path in exclude or path in files or not Path(path).is_file():
                continue
            files.append(path)
            rows += rollouts.read_rollouts([path], tok, vocab, max_len)
    return rows[:n], files


def job_key(policy: Policy, digests: list[dict], rcfg) -> str:
    """Same policy, same rollout files, same settings = same job (whatever is current now)."""
    settings = {k: getattr(rcfg, k) for k in ("replay", "budget_steps", "budget_s", "lr",
                                              "batch_tokens", "heldout_fraction", "min_gain",
                                              "temperature", "draft_sampling", "seed")}
    blob = json.dumps([policy.digest, [d["sha256"] for d in digests], settings],
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _finish_existing(store: DraftStore, version: str, job: str) -> dict:
    """The job already produced `version`: make it current if the crash came before that."""
    if store.current() != version:
        store.set_current(version)
        store.log("resumed", job=job, version=version, detail="moved current after a crash")
    return {"status": "published", "version": version, "job": job, "resumed": True,
            "lineage": store.lineage(version)}


def refresh(run_dir: str | Path, policy: str | Path | Policy, rollout_paths: list,
            overrides: list[str] | None = None, should_stop=lambda: False,
            policy_step: int | None = None) -> dict:
    """Run one refresh job; returns {"status": published|rejected, "version", "job", ...}.
    `policy_step` defaults to the checkpoint's own, else the newest the rollouts name."""
    run_dir = config.run_dir_of(run_dir)
    cfg = config.load(run_dir, overrides)
    rc = cfg.refresh
    capture.check_mode(rc.capture)
    kind = kinds.get(cfg.draft.kind)
    store = DraftStore(run_dir)
    with store.lock():
        store.clean_partial()
        if not isinstance(policy, Policy):
            policy = load_policy(policy, step=policy_step, dtype=cfg.target.dtype,
                                 device=cfg.train.device if cfg.train.device != "auto" else "cpu")
        check_lineage(policy, cfg)
        files = rollouts.rollout_files(rollout_paths)
        digests = rollouts.file_digests(files)
        parent = store.current() or "export"
        job = job_key(policy, digests, rc)
        if (done := store.find_job(job)) is not None:
            capture.remove(store, job)  # a crash may have come before its removal
            return _finish_existing(store, done, job)
        rejected = [e for e in store.events() if e.get("job") == job and e["event"] == "rejected"]
        if rejected:
            capture.remove(store, job)
            return {"status": "rejected", "version": None, "job": job, "resumed": True,
                    "reason": rejected[-1]["reason"]}
        return _run_job(cfg, kind, store, policy, files, digests, parent, job, should_stop)


def _run_job(cfg, kind, store, policy, files, digests, parent, job, should_stop) -> dict:
    rc, k, t0 = cfg.refresh, cfg.draft.num_speculative_tokens, time.perf_counter()
    vocab = cfg.target.vocab_size
    rows = rollouts.read_rollouts(files, policy.tokenizer, vocab, rc.max_seq_len)
    if policy.step is None:  # the newest policy_step the rollouts name
        policy.step = max((r.policy_step for r in rows if r.policy_step is not None), default=None)
    train_rows, held = heldout_split(rows, rc.heldout_fraction)
    replay, replay_files = replay_rows(store, {d["path"] for d in digests}, rc.replay,
                                       policy.tokenizer, vocab, rc.max_seq_len)
    model = kind.load(store.current_dir(), policy.model, k)
    temps = sorted({0.0, rc.temperature})

    def measure() -> dict:
        return drift.estimate(kind, model, policy.model, held, k, temps, rc.draft_sampling,
                              rc.batch_tokens)

    before = measure()
    cap = capture.capture(kind, model, policy, train_rows + replay, cfg, store, job, should_stop)
    fit = finetune.finetune(model, cap.batches, rc.budget_steps, rc.budget_s, rc.lr, rc.seed,
                            should_stop=should_stop)
    after = measure()
    key = drift.label(rc.temperature)
    gain = after[key]["al"] - before[key]["al"]
    lineage = {
        "job": job, "parent": parent, "policy": {"source": policy.source,
                                                 "sha256": policy.digest, "step": policy.step},
        "rollouts": digests, "replay": {"rows": len(replay), "files": replay_files},
        "rows": {"train": len(train_rows), "heldout": len(held)},
        "al_before": before, "al_after": after, "decided_on": key, "gain": gain,
        "steps": fit.steps, "tokens_trained": fit.tokens, "train_s": fit.seconds,
        "loss": {"first": fit.first_loss, "last": fit.last_loss},
        "wall_s": time.perf_counter() - t0, "draft_kind": kind.name, "k": k,
        "capture": cap.info,
    }
    if not gain > rc.min_gain:
        reason = (f"AL {key} after {after[key]['al']:.3f} is not above before "
                  f"{before[key]['al']:.3f} + refresh.min_gain={rc.min_gain}")
        store.log("rejected", job=job, parent=parent, reason=reason, **_brief(lineage))
        capture.remove(store, job)
        print(f"refresh rejected: {reason}")
        return {"status": "rejected", "version": None, "job": job, "reason": reason,
                "lineage": lineage}
    version = store.next_version()
    lineage["version"] = version
    lineage["wall_s"] = time.perf_counter() - t0

    def write(tmp: Path, final: Path) -> None:
        kind.export(model, tmp, final, cfg)
        artifacts.write_meta(tmp, "refresh", cfg.to_dict(), {"wall_s": lineage["wall_s"]},
                             version=version, parent=parent, job=job)

    store.publish(version, write, lineage)
    store.set_current(version)
    store.log("published", job=job, version=version, **_brief(lineage))
    capture.remove(store, job)
    print(f"refresh published {store.root / version}: AL {key} {before[key]['al']:.3f} -> "
          f"{after[key]['al']:.3f} ({fit.steps} steps, {fit.seconds:.1f} s)")
    return {"status": "published", "version": version, "job": job, "resumed": False,
            "lineage": lineage}


def _brief(lineage: dict) -> dict:
    key = lineage["decided_on"]
    return {"policy_step": lineage["policy"]["step"], "al_before": lineage["al_before"][key]["al"],
            "al_after": lineage["al_after"][key]["al"], "steps": lineage["steps"],
            "wall_s": lineage["wall_s"]}
