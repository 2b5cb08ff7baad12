"""`draftkit refresh RUN --policy CKPT --rollouts PATH...`: one job an RL scheduler can call.
New policy + its recent rollouts -> warm-started draft, published as `drafts/vNNNN` only if it
is better than the current draft on the current policy.

    draftkit refresh runs/rl --policy ckpts/step_200 --rollouts rollouts/step_200.jsonl
    draftkit refresh runs/rl --policy ckpts/step_200 --rollouts rollouts/ --replay 512 --budget-s 120
    python -c "from draftkit import api; api.refresh('runs/tiny', 'ckpt', ['r.jsonl'])"

Steps, under the run's refresh lock: read and check the rollouts (policy tokenizer; a file met
twice, a symlink or a copy, counts once; identical rows once; rows past `refresh.max_seq_len`
are cut and counted); hold out a deterministic `refresh.heldout_fraction` of the *prompts*
(all samples of a prompt, a GRPO group, stay on one side); refuse to decide ("undecided") when
the held-out rows give fewer than `refresh.min_heldout_starts` draft starts; add up to
`refresh.replay` rows of the rollouts earlier refreshes trained on (their features recaptured
with the new policy; rows of held-out prompts left out; a replay file that is gone or changed
is skipped with a warning, named in the lineage's `replay.skipped`); load the current draft
with the policy's frozen parts; estimate its AL on the
held-out rows (drift.py); capture the policy's features on the train + replay rows
(`refresh.capture`: online in RAM, or harvest shards under drafts/.capture/<job>/ that a rerun
reuses; capture.py); fine-tune within the budget; estimate again; publish if AL rose by more
than `refresh.min_gain` (`refresh.gate=false`: publish unjudged), else log the reason. Every
outcome goes to `drafts/refresh-log.jsonl`; the lineage records rows read, cut and dropped.
Reruns (reruns.py): a job is keyed by its inputs and its parent version; a rerun after a crash
finishes it, a rerun after success does nothing, and a rerun after newer versions were
published is "superseded": `current` never moves backwards.

`taps` (capture.Taps, from the in-process API only): the policy's features on rollout rows a
trainer's own forward already computed; the capture reads the rows they cover instead of running
the policy over them (capture.py), the rest are computed as without them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from draftkit.core import artifacts, config, provenance
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.divergence import Divergence
from draftkit.rl import capture, drift, finetune, reruns, rollouts
from draftkit.rl.policy import Policy, check_lineage, load_policy
from draftkit.rl.publish import DraftStore


def heldout_split(rows: list[rollouts.Rollout], fraction: float) -> tuple[list, list]:
    """(train, heldout) by prompt: rows grouped by a hash of their prompt token ids (GRPO
    siblings share one), groups ranked by that hash, the first ceil(fraction * groups) held
    out (at least one, and at least one left to train on). Deterministic, wherever the files
    live and in whatever order they come."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(rollouts.prompt_key(r), []).append(i)
    if len(groups) < 2:
        raise DraftkitError(f"a refresh needs rollouts of at least 2 distinct prompts (one "
                            f"trains, one is held out to compare drafts), got {len(rows)} "
                            f"rows of {len(groups)} prompt(s)")
    ranked = sorted(groups)
    n = min(len(groups) - 1, max(1, int(-(-fraction * len(groups) // 1))))
    held = {i for key in ranked[:n] for i in groups[key]}
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


def draft_starts(rows: list[rollouts.Rollout]) -> int:
    """Draft starts drift.estimate scores on `rows` (its "starts"): indices t where x_{t+1} and
    x_{t+2} are both response tokens, e.g. a 24-token response gives 23."""
    return sum(sum(1 for i in range(1, len(r.loss_mask) - 1)
                   if r.loss_mask[i] and r.loss_mask[i + 1]) for r in rows)


def replay_rows(store: DraftStore, exclude: set[str], n: int, tok, vocab: int, max_len: int,
                stats: rollouts.ReadStats | None = None) -> tuple[list, list[str], list[dict]]:
    """(rows, files read, files skipped): up to n rows of rollout files earlier versions trained
    on (newest version first). A file a lineage names that is gone (retention) or changed (a
    writer appended) is skipped with a warning, [{"path", "version", "why"}], and replay goes
    on with what is there."""
    rows, files, skipped = [], [], []
    for version in reversed(store.versions()):
        for f in store.lineage(version).get("rollouts", []):
            path = f["path"]
            seen = path in files or any(s["path"] == path for s in skipped)
            if len(rows) >= n or {path, f["sha256"]} & exclude or seen:
                continue
            if (why := _replay_problem(version, f)) is not None:
                print(f"refresh: replay skips {path}: {why}")
                skipped.append({"path": path, "version": version, "why": why})
                continue
            files.append(path)
            exclude.add(f["sha256"])
            rows += rollouts.read_rollouts([path], tok, vocab, max_len, stats=stats)
    return rows[:n], files, skipped


def _replay_problem(version: str, f: dict) -> str | None:
    if not Path(f["path"]).is_file():
        return (f"gone: {version}'s lineage names it (by path and sha256); restore it to "
                "replay its rows")
    if artifacts.sha256_file(f["path"]) != f["sha256"]:
        return (f"changed: its sha256 differs from the one {version} trained on (rows were "
                "added or edited); write new rows to new files")
    return None


@dataclass
class Job:
    cfg: config.RunConfig
    kind: object
    store: DraftStore
    policy: Policy
    digests: list[dict]  # the rollout files read, each once
    parent: str  # the version current when the job started ("export" before the first)
    inputs: str  # reruns.inputs_key
    job: str  # reruns.job_key(inputs, parent)
    dropped: dict = field(default_factory=dict)  # duplicate_files, set_aside_files
    taps: capture.Taps | None = None  # features already computed for some rows (capture.py)


def refresh(run_dir: str | Path, policy: str | Path | Policy, rollout_paths: list,
            overrides: list[str] | None = None, should_stop=lambda: False,
            policy_step: int | None = None, set_aside: list[dict] | None = None,
            taps: capture.Taps | None = None) -> dict:
    """Run one refresh job; returns {"status": published|rejected|undecided|superseded,
    "version", "job", ...}. `policy_step` defaults to the checkpoint's own, else the newest the
    rollouts name; `set_aside` ([{"path", "reason"}], from watch) goes into the lineage; `taps`
    are features already computed for some rows (the capture reads them, module doc)."""
    run_dir = config.run_dir_of(run_dir)
    cfg = config.load(run_dir, overrides)
    capture.check_mode(cfg.refresh.capture)
    kind = kinds.get(cfg.draft.kind)
    store = DraftStore(run_dir)
    with store.lock():
        store.clean_partial()
        if not isinstance(policy, Policy):
            policy = load_policy(policy, step=policy_step, dtype=cfg.target.dtype,
                                 device=cfg.train.device if cfg.train.device != "auto" else None)
        check_lineage(policy, cfg)
        digests, duplicates = rollouts.unique_files(rollouts.rollout_files(rollout_paths))
        parent = store.parent() or "export"  # current, never a version marked failed
        inputs = reruns.inputs_key(policy.digest, digests, cfg)
        job = reruns.job_key(inputs, parent)
        if (done := reruns.earlier(store, inputs, job, parent)) is not None:
            return done
        dropped = {"duplicate_files": duplicates, "set_aside_files": list(set_aside or [])}
        return _run_job(Job(cfg, kind, store, policy, digests, parent, inputs, job, dropped,
                            taps), should_stop)


@dataclass
class Rows:
    train: list
    held: list
    replay: list
    info: dict  # lineage "rows"
    replay_info: dict  # lineage "replay"


def _read_rows(j: Job) -> Rows:
    """The job's rows: read (cut counted), deduplicated, split by prompt, plus replay."""
    rc, vocab, tok = j.cfg.refresh, j.cfg.target.vocab_size, j.policy.tokenizer
    stats = rollouts.ReadStats()
    rows = rollouts.read_rollouts([d["path"] for d in j.digests], tok, vocab, rc.max_seq_len,
                                  stats=stats)
    rows, n_dup = rollouts.dedupe_rows(rows)
    if j.policy.step is None:  # the newest policy_step the rollouts name
        j.policy.step = max((r.policy_step for r in rows if r.policy_step is not None),
                            default=None)
    train, held = heldout_split(rows, rc.heldout_fraction)
    exclude = {d["path"] for d in j.digests} | {d["sha256"] for d in j.digests}
    rstats = rollouts.ReadStats()
    replay, files, skipped = replay_rows(j.store, exclude, rc.replay, tok, vocab,
                                         rc.max_seq_len, rstats)
    held_prompts = {rollouts.prompt_key(r) for r in held}
    kept = [r for r in replay if rollouts.prompt_key(r) not in held_prompts]
    if stats.cut:
        print(f"refresh: {stats.cut} of {stats.rows} rollout rows cut to refresh.max_seq_len="
              f"{rc.max_seq_len} ({stats.cut_tokens} tokens dropped; e.g. "
              f"{stats.cut_sources[0]})")
    info = {"read": stats.rows, "train": len(train), "heldout": len(held),
            "heldout_prompts": len(held_prompts), "heldout_starts": draft_starts(held),
            "cut": stats.cut, "cut_tokens": stats.cut_tokens,
            "dropped": {"duplicate_rows": n_dup, **j.dropped}}
    replay_info = {"rows": len(kept), "files": files, "skipped": skipped, "cut": rstats.cut,
                   "dropped_heldout_prompts": len(replay) - len(kept)}
    return Rows(train, held, kept, info, replay_info)


def _undecided(j: Job, rows: Rows) -> dict:
    rc, n = j.cfg.refresh, rows.info["heldout_starts"]
    reason = (f"only {n} held-out draft starts ({rows.info['heldout']} rows of "
              f"{rows.info['heldout_prompts']} prompts held out of {rows.info['read']}), "
              f"fewer than refresh.min_heldout_starts={rc.min_heldout_starts}: too few to tell "
              "a better draft from noise. Pass more rollouts, raise refresh.heldout_fraction "
              f"(now {rc.heldout_fraction}), or lower refresh.min_heldout_starts")
    j.store.log("undecided", job=j.job, inputs=j.inputs, parent=j.parent, reason=reason,
                rows=rows.info)
    print(f"refresh undecided: {reason}")
    return {"status": "undecided", "version": None, "job": j.job, "resumed": False,
            "reason": reason}


def _run_job(j: Job, should_stop) -> dict:
    cfg, kind, store, policy = j.cfg, j.kind, j.store, j.policy
    rc, k, t0 = cfg.refresh, cfg.draft.num_speculative_tokens, time.perf_counter()
    rows = _read_rows(j)
    if rc.gate and rows.info["heldout_starts"] < rc.min_heldout_starts:
        return _undecided(j, rows)
    reruns.mark_started(store, j.inputs, j.job, j.parent)
    model = kind.load(_parent_dir(store, j.parent), policy.model, k)
    model.divergence = Divergence.from_config(cfg.train)  # the run's train.loss, as in training
    temps = sorted({0.0, rc.temperature})

    def measure() -> dict:
        return drift.estimate(kind, model, policy.model, rows.held, k, temps,
                              rc.draft_sampling, rc.batch_tokens)

    before = measure()
    cap = capture.capture(kind, model, policy, rows.train + rows.replay, cfg, store, j.job,
                          should_stop, taps=j.taps)
    fit = finetune.finetune(model, cap.batches, rc.budget_steps, rc.budget_s, rc.lr, rc.seed,
                            should_stop=should_stop)
    after = measure()
    key = drift.label(rc.temperature)
    gain = after[key]["al"] - before[key]["al"]
    lineage = {
        "job": j.job, "inputs": j.inputs, "parent": j.parent,
        "policy": {"source": policy.source, "sha256": policy.digest, "step": policy.step},
        "rollouts": j.digests, "replay": rows.replay_info, "rows": rows.info,
        "al_before": before, "al_after": after, "decided_on": key, "gain": gain,
        "gate": rc.gate, "steps": fit.steps, "tokens_trained": fit.tokens,
        "train_s": fit.seconds, "loss": {"first": fit.first_loss, "last": fit.last_loss},
        "wall_s": time.perf_counter() - t0, "draft_kind": kind.name, "k": k,
        "max_seq_len": rc.max_seq_len, "capture": cap.info,
    }
    if rc.gate and not gain > rc.min_gain:
        reason = (f"AL {key} after {after[key]['al']:.3f} is not above before "
                  f"{before[key]['al']:.3f} + refresh.min_gain={rc.min_gain}")
        store.log("rejected", job=j.job, inputs=j.inputs, parent=j.parent, reason=reason,
                  **_brief(lineage))
        capture.remove(store, j.job)
        print(f"refresh rejected: {reason}")
        return {"status": "rejected", "version": None, "job": j.job, "reason": reason,
                "lineage": lineage}
    return _publish(j, model, lineage, t0)


def _parent_dir(store: DraftStore, parent: str) -> Path:
    if parent != "export":
        return store.root / parent
    if store.current() is None:
        return store.current_dir()  # the export, or an error saying how to make one
    return artifacts.RunPaths(store.run).export  # `current` is a failed version


def _publish(j: Job, model, lineage: dict, t0: float) -> dict:
    store, key = j.store, lineage["decided_on"]
    version = store.next_version()
    lineage["version"] = version
    lineage["wall_s"] = time.perf_counter() - t0

    def write(tmp: Path, final: Path) -> None:
        j.kind.export(model, tmp, final, j.cfg)
        provenance.write_meta(tmp, "refresh", j.cfg.to_dict(), {"wall_s": lineage["wall_s"]},
                             version=version, parent=j.parent, job=j.job)

    store.publish(version, write, lineage)
    store.set_current(version)
    store.log("published", job=j.job, inputs=j.inputs, version=version, **_brief(lineage))
    capture.remove(store, j.job)
    unjudged = "" if lineage["gate"] else " unjudged (refresh.gate=false)"
    print(f"refresh published{unjudged} {store.root / version}: AL {key} "
          f"{lineage['al_before'][key]['al']:.3f} -> {lineage['al_after'][key]['al']:.3f} "
          f"({lineage['steps']} steps, {lineage['train_s']:.1f} s)")
    return {"status": "published", "version": version, "job": j.job, "resumed": False,
            "lineage": lineage}


def _brief(lineage: dict) -> dict:
    key = lineage["decided_on"]
    return {"policy_step": lineage["policy"]["step"], "al_before": lineage["al_before"][key]["al"],
            "al_after": lineage["al_after"][key]["al"], "steps": lineage["steps"],
            "wall_s": lineage["wall_s"], "gate": lineage["gate"]}
