"""Push a run's draft to several rollout servers, and record what each one serves.

    draftkit swap http://10.0.0.5:8000 http://10.0.0.6:8000 --draft runs/rl/drafts/current
    (the push reads `current` and failed.json under the push lock)
    draftkit watch runs/rl --checkpoints ckpts/ --rollouts rollouts/ --engines URL,URL

Engines are swapped one after another, each by one transaction on the server
(rollout_client.swap_engine: pause with requests kept, native update, hash check, resume, probe AL
read per request, and on any failure the previous draft back), which finishes whatever
happens to this process. One push per run at a time (the store's push lock, across
processes: the watch and an operator's `draftkit swap` take turns). `drafts/engines.json`
(atomic, synced) is rewritten after every engine:

    {"engines": {"http://10.0.0.5:8000": {"version": "v0007", "directory": ".../v0007",
                 "status": "serving", "al": 2.1, "swap_s": 0.4, "pause_s": 0.5, "time": ...},
                 "http://10.0.0.6:8000": {"version": "v0006", "status": "refused",
                 "refused": "v0007", "error": "...", "restored": true, ...}},
     "verdicts": {"v0007": {"http://10.0.0.5:8000": "passed",
                            "http://10.0.0.6:8000": "failed"}}}

A version that failed on any engine that served it is failed (issue 52's rule): engines
record their own verdicts (`verdicts`: measured ones only), and a `failed` on any of them marks
the version failed (publish.py), moves `current` back to the newest older version that failed
on no engine (else the export), and pushes that one into every engine that passed the failed
version (`swap_back`), so that no engine is left serving it; the engines that failed it have
their previous draft back already (restored and hash-checked). Passed on every engine that
measured it: `checked` (publish.py: `drafts/checked`, what servers start on). Each engine's
record and verdict are one atomic write, and every push and watch tick first judges the
current version again, so a crash between the records and the judgement, or before the swap
back, is finished by the next tick (the watch pushes the current version into every engine
that does not serve it). The rule trades speed for one answer: an engine whose check fails
every draft (it runs another policy, its files are broken) walks `current` back to the export;
engines.json and the `failed` events name it.

The store and the engines never disagree silently: engines.json names each engine's version
and status (`serving`; `refused`: its check failed there, not asked again for that version;
`behind`: it serves an older version after a swap that decided nothing, retried after a
backoff with jitter; `pending` while it still runs a transaction whose reply was lost;
`unknown` when a rollback did not restore (its verdict still counts); `unreachable`. `observe`
asks each engine what it serves (draft version, the hash of its weight files, boot id) before a
`draftkit swap` and every watch tick: an engine that restarted, or serves another version or
other weights under the recorded version's name than recorded, becomes `behind`. After a failure that decided nothing the version is what the
engine itself reports at /draftkit/state), every swap is
an event in the refresh log, and `push` raises EngineSwapError naming every engine that does
not serve the draft (the CLI exits 2). Only a measured failure (verdict `failed`: hashes that
differ, probe AL <= refresh.min_probe_al) judges the draft; transport failures, refusals and
errors decide nothing: nothing published changes, and the next push tries again.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import draft_info, rollout_client, swap_txn
from draftkit.serving.drafter_swap import version_name

ENGINES = "engines.json"


class EngineSwapError(DraftkitError):
    """Some engines do not serve the pushed draft; `results` has every engine's record."""

    def __init__(self, message: str, results: dict):
        super().__init__(message)
        self.results = results


def run_of(draft_dir: str | Path) -> Path:
    """The run a draft dir belongs to: <run>/drafts/<vNNNN|current> or <run>/export."""
    p = Path(draft_dir).absolute()
    if p.parent.name == "drafts":
        return p.parent.parent
    if p.name == "export":
        return p.parent
    raise DraftkitError(f"--draft {draft_dir} is not a draft dir of a run: pass "
                        "runs/NAME/drafts/current, runs/NAME/drafts/vNNNN or runs/NAME/export "
                        "(the run gives the kind, the probe prompts and the check's threshold)")


def read(store: DraftStore) -> dict:
    path = store.root / ENGINES
    record = artifacts.read_json(path) if path.is_file() else {}
    record.setdefault("engines", {})
    record.setdefault("verdicts", {})  # {version: {url: "passed" | "failed"}}: measured only
    return record


def _write(store: DraftStore, record: dict) -> None:
    store.write_record(ENGINES, record)


def push(run_dir, urls: list[str], draft: str | Path | None = None,
         overrides: list[str] | None = None, reload_held: bool = False) -> dict:
    """Swap `draft` (default: the store's current draft) into every engine in `urls`, in
    order, and record each (module doc). Returns {url: record}; raises EngineSwapError when
    any engine does not serve it. `reload_held=False`: an engine already holding the draft's
    tensors is checked, not reloaded (so a push after a sleep/wake reloads only lost drafts).
    `current` and failed.json are read under the push lock (a push queued behind another
    never pushes a version that was marked failed meanwhile)."""
    if not urls:
        raise DraftkitError("no engines to swap into: pass URL... (e.g. http://10.0.0.5:8000)")
    rollout_client.secret()  # a missing secret fails before anything is read
    refresher = DraftRefresher(run_dir, overrides)
    store, cfg = refresher.store, refresher.cfg
    with store.push_lock(timeout=cfg.refresh.engine_timeout_s * 2 * (len(urls) + 1)):
        settle(store, urls)  # a verdict a crash left unjudged is judged first
        directory = Path(os.path.realpath(draft or store.current_dir()))
        version = store.version_of(directory) or version_name(directory)
        if (failed := store.failure(version) if store.version_of(directory) else None):
            raise DraftkitError(f"{version} is marked failed ({failed.get('reason', '')[:200]}); "
                                "nothing was pushed. Refresh again, or push a good version")
        results = _push_all(refresher, urls, directory, reload_held)
        if judge(store, version, urls) == "failed":  # the engines that passed it go back too
            results.update(swap_back(refresher, version))
    _raise_unless_serving(version, results)
    return results


def _push_all(refresher: DraftRefresher, urls: list[str], directory: Path,
              reload_held: bool) -> dict:
    """Swap `directory` into each engine in turn, each recorded (`_one`); {url: record}."""
    store, cfg = refresher.store, refresher.cfg
    version = store.version_of(directory) or version_name(directory)
    probes = refresher.probes(store.version_of(directory))
    weights = store.lineage(version).get("weights") if store.version_of(directory) else None
    candidates = [store.root / v for v in reversed(store.versions())]
    candidates.append(artifacts.RunPaths(store.run).export)
    return {url: _one(store, url, directory, version, cfg, (probes, weights), candidates,
                      reload_held) for url in urls}


def swap_back(refresher: DraftRefresher, failed: str) -> dict:
    """After `failed` was marked failed: push the new current (the export when none) into
    every engine engines.json records serving `failed` (those that passed it), so that none
    is left on a failed version; a swap back that does not pass is that engine's record, and
    the next push or watch tick tries again. Returns {url: record}."""
    store = refresher.store
    serving = sorted(u for u, r in read(store)["engines"].items()
                     if r.get("status") == "serving" and r.get("version") == failed)
    if not serving:
        return {}
    directory = Path(os.path.realpath(store.current_dir()))
    back = store.version_of(directory) or version_name(directory)
    store.log("swap_back", version=failed, to=back, engines=serving)
    results = _push_all(refresher, serving, directory, False)
    judge(store, back, serving)
    return results


def _one(store, url, directory, version, cfg, check, candidates, reload_held) -> dict:
    """Swap into one engine (`check`: the probes and the published digests) and record it."""
    (probes, weights), rc = check, cfg.refresh
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        rep = rollout_client.swap_engine(url, directory, cfg.draft.kind, probes, rc.min_probe_al,
                                         rc.probe_max_tokens, rc.engine_timeout_s, candidates,
                                         version, reload_held, rc.min_probe_drafts, weights)
        rec = {"version": version, "directory": str(directory), "status": "serving",
               "verdict": "passed", "al": rep["al"], "swap_s": rep["swap_s"],
               "pause_s": rep["pause_s"], "probe_s": rep["probe_s"],
               "paused_at": rep.get("paused_at"), "loaded": rep["loaded"],
               "transfer": rep["path"], "boot_id": rep.get("boot_id"),
               "hash": rep.get("draft_hash"), "scheduling": rep.get("scheduling"), "time": now}
        store.log("engine_swapped", url=url, version=version, al=rep["al"],
                  swap_s=rep["swap_s"], pause_s=rep["pause_s"], transfer=rep["path"])
    except rollout_client.EngineError as e:
        rec = _failed_record(store, url, version, e, now, rc.poll_s)
    except Exception as e:  # noqa: BLE001 - any fault of one engine is that engine's record
        err = rollout_client.EngineError(
            url, f"the push raised {type(e).__name__}: {str(e)[:300]}")
        rec = _failed_record(store, url, version, err, now, rc.poll_s)
    record = read(store)  # the engine's record and its verdict in one atomic write
    policy = rec.get("scheduling")
    if policy not in (None, "priority") and \
            record["engines"].get(url, {}).get("scheduling") != policy:  # once per engine
        store.log("engine_probe_queues", url=url, scheduling=policy, detail=swap_txn.FCFS_FIX)
    record["engines"][url] = rec
    if rec.get("verdict") in ("passed", "failed"):
        record["verdicts"].setdefault(version, {})[url] = rec["verdict"]
    _write(store, record)
    return rec


def _failed_record(store: DraftStore, url: str, version: str, e: rollout_client.EngineError,
                   now: str, poll_s: float) -> dict:
    """What the engine serves after a failed swap, as far as it is known."""
    old = read(store)["engines"].get(url, {})
    if e.verdict in ("transport", "refused"):  # nothing decided: record what the engine says
        rec = {**old, **_engine_now(url), "refused": version, "verdict": e.verdict,
               "error": str(e), "time": now}
        rec.setdefault("status", "unreachable")
    elif e.restored is False:  # the engine may hold the new draft: pushed again, judged
        rec = {"version": None, "directory": None, "status": "unknown", "refused": version,
               "verdict": e.verdict, "error": str(e), "restored": False, "time": now}
    else:  # failed (measured) or error (decided nothing), the previous draft back
        prev = e.previous or old.get("directory")
        rec = {"version": e.previous_version or (version_name(prev) if prev else None),
               "directory": prev, "status": "refused" if e.verdict == "failed" else "behind",
               "refused": version, "verdict": e.verdict,
               "error": str(e), "restored": e.restored, "time": now}
    if rec["status"] == "behind":
        rec["tries"] = old.get("tries", 0) + 1 if old.get("refused") == version else 1
        rec["retry_at"] = time.time() + backoff(rec["tries"], poll_s)
    store.log("engine_swap_failed", url=url, version=version, verdict=e.verdict,
              restored=e.restored, error=str(e)[:500])
    return rec


def backoff(tries: int, base: float, cap: float = 600.0) -> float:
    """Seconds before an engine that is `behind` after `tries` undecided swaps is asked again
    (`base`: refresh.poll_s): exponential with jitter (0.5x-1x), at most `cap`, so an engine
    that refuses or times out every time is not paused and reloaded every tick."""
    return min(cap, base * 2 ** max(tries - 1, 0)) * random.uniform(0.5, 1.0)


def _engine_now(url: str) -> dict:
    """What the engine reports serving ({} when it cannot be read): version, directory, and
    status `pending` while its latest transaction still runs, else `behind` (it serves its
    own version, not the pushed one)."""
    try:
        st = rollout_client.state(url, 10.0)
    except Exception:  # noqa: BLE001 - unreachable: nothing more is known
        return {"status": "unreachable"}
    path, txn = st.get("drafter_path"), st.get("txn") or {}
    version = st.get("draft_version") or (version_name(path) if path else None)
    running = txn.get("state") not in (None, *rollout_client.DONE)
    return {"version": version, "directory": path, "boot_id": st.get("boot_id"),
            "hash": st.get("draft_hash"), "status": "pending" if running else "behind"}


def _raise_unless_serving(version: str, results: dict) -> None:
    """EngineSwapError naming the engines of this push that do not serve `version`."""
    bad = {u: r for u, r in results.items()
           if r["status"] != "serving" or r.get("version") != version}
    if not bad:
        return
    lines = "; ".join(f"{u}: {r['status']} {r.get('version') or ''} "
                      f"({_brief(r.get('error') or 'swapped back: ' + version + ' failed')})"
                      for u, r in bad.items())
    raise EngineSwapError(f"{len(bad)} of {len(results)} engines do not serve {version}: "
                          f"{lines}. drafts/engines.json records what each one serves", results)


def judge(store: DraftStore, version: str, urls: list[str]) -> str | None:
    """The store's verdict on `version` from every engine's measured verdict (engines.json
    `verdicts`: this push's and earlier ones'). Failed on any engine that served it -> marked
    failed, `current` back to the newest older version that failed on no engine (`fallback`;
    none: the export); `push` then swaps the engines that passed it back (`swap_back`), and the
    watch's next tick any it missed. Passed on every engine that measured it -> checked.
    Idempotent: a crash between the records and the mark is finished by the next call."""
    record = read(store)
    verdicts = record["verdicts"].get(version, {})
    if not store.version_of(store.root / version) or not verdicts:
        return None
    if "failed" not in verdicts.values():
        store.mark_checked(version, engines=sorted(verdicts))
        return "passed"
    if store.failure(version):
        return "failed"
    bad = sorted(u for u, v in verdicts.items() if v == "failed")
    why = next((record["engines"].get(u, {}).get("error", "") for u in bad), "")
    store.mark_failed(version, f"failed the check on {len(bad)} of {len(verdicts)} engines "
                      f"that measured it ({', '.join(bad)}): {_brief(why)}",
                      back_to=fallback(store, version, record), engines=bad)
    if (now := store.current()) and now != version and "failed" in \
            record["verdicts"].get(now, {}).values():
        judge(store, now, urls)  # the export, when no older version passed everywhere
    return "failed"


def fallback(store: DraftStore, version: str, record: dict | None = None) -> str | None:
    """The newest version older than `version` that is not marked failed and failed on no
    engine (engines.json `verdicts`); None: the export."""
    verdicts = (record or read(store))["verdicts"]
    ok = [v for v in store.good_versions() if int(v[1:]) < int(version[1:])
          and "failed" not in verdicts.get(v, {}).values()]
    return ok[-1] if ok else None


def observe(store: DraftStore, urls: list[str]) -> list[str]:
    """Ask every engine what it serves (GET /draftkit/state: draft version, boot id) and make
    engines.json agree: an engine that serves another version than recorded, or booted again
    (a restart, or two backends behind one URL), becomes `behind` (pushed, so checked, at the
    next push). Returns the URLs whose record changed; an engine that does not answer keeps its
    record (the push finds out)."""
    changed, now = [], time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for url in urls:
        try:
            st = rollout_client.state(url, 10.0)
        except Exception:  # noqa: BLE001 - unreachable now: nothing learnt
            continue
        path, digest = st.get("drafter_path"), st.get("draft_hash")
        version, boot = st.get("draft_version") or (version_name(path) if path else None), \
            st.get("boot_id")
        with store.push_lock():
            record = read(store)
            old = record["engines"].get(url, {})
            rebooted = bool(old.get("boot_id") and boot and old["boot_id"] != boot)
            want = _expected_hash(store, old) if old.get("version") == version else None
            other = bool(digest and want and digest != want)  # same name, other weights
            if old.get("version") == version and not rebooted and not other and old:
                continue
            record["engines"][url] = {**old, "version": version, "directory": path,
                                      "boot_id": boot, "hash": digest, "status": "behind",
                                      "retry_at": None, "observed": now}
            _write(store, record)
        store.log("engine_observed", url=url, version=version, recorded=old.get("version"),
                  rebooted=rebooted, hash=digest, recorded_hash=want)
        changed.append(url)
    return changed


def _expected_hash(store: DraftStore, rec: dict) -> str | None:
    """The hash of what engines.json says the engine serves: the one it reported at its last
    swap, else its version's published digests (lineage.json `weights`); None if unknown."""
    if rec.get("hash"):
        return rec["hash"]
    version = rec.get("version")
    if version and store.version_of(store.root / version):
        return draft_info.weights_hash(store.lineage(version).get("weights"))
    return None


def settle(store: DraftStore, urls: list[str]) -> None:
    """At the start of a push and every watch tick: finish what a crash left (a `current`
    on a version marked failed; a current version whose measured verdicts were recorded but
    not judged)."""
    store.recover()
    if (current := store.current()) is not None:
        judge(store, current, urls)


def _brief(error: str, limit: int = 1000) -> str:
    """An engine's error for a one-line summary: whole up to `limit` characters (a check's
    verdict and its "is restored" tail both fit with long run paths), else head ... tail."""
    return error if len(error) <= limit else f"{error[:limit // 2]} ... {error[-limit // 2:]}"


def swap(urls: list[str], draft: str | Path, overrides: list[str] | None = None) -> dict:
    """`draftkit swap URL... --draft DIR`: ask each engine what it serves (`observe`), then
    push and print one line per engine."""
    run = run_of(draft)
    rollout_client.secret()
    observe(DraftStore(run), urls)
    try:
        results = push(run, urls, draft, overrides)
    except EngineSwapError as e:
        _print(e.results)
        raise
    _print(results)
    return results


def _print(results: dict) -> None:
    for url, r in results.items():
        if r["status"] == "serving":
            print(f"{url}: serving {r['version']} (AL {r['al']:.2f}, swap {r['swap_s']:.2f} s, "
                  f"paused {r['pause_s']:.2f} s, {r['transfer']})", flush=True)
        else:
            print(f"{url}: {r['status']} {r.get('refused', '')}, serves "
                  f"{r.get('version') or 'unknown'}: {r.get('error', '')}", flush=True)
