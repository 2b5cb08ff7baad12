"""`draftkit status RUN`: where a run's draft stands, from its files and its rollout servers.

    draftkit status runs/rl                 # text
    draftkit status runs/rl --json          # the same as JSON (scripts, dashboards)
    draftkit status runs/rl --timeout 2     # seconds each engine may take to answer

It says: the current draft (drafts/current, else the run's export) with its lineage back to the
export: per version its parent, the policy and the rollouts it was refreshed on, and its
held-out AL estimate before and after (lineage.json, the gate's figure); the export's simulated
and vLLM-measured AL and whether eval's serving choice is in it; each engine in
drafts/engines.json, what the record says it serves and what it says itself, asked live at
GET /draftkit/state (rollout_client.state) with a timeout, so a dead engine costs the timeout
and no more; the last refresh and the last swap with their verdicts (drafts/refresh-log.jsonl);
and every version marked failed, with why. It reads and asks; it changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.rl.publish import DraftStore
from draftkit.serving import rollout_client
from draftkit.serving.speculative import SERVING_FILE

ENGINES = "engines.json"  # rl/rollout_servers.py's record of what each engine serves
REFRESHES = ("published", "rejected", "undecided", "superseded")  # refresh-log events
SWAPS = ("engine_swapped", "engine_swap_failed", "swapped", "swap_failed")


def status(run_dir: str | Path, overrides: list[str] | None = None) -> dict:
    """The run's state (module doc) as a dict; refresh.status_timeout_s bounds each engine."""
    cfg = config.load(run_dir, overrides)
    store = DraftStore(run_dir)
    events = store.events()
    try:
        current, problem = store.current(), None
    except DraftkitError as e:  # drafts/current names no complete version: said, not raised
        current, problem = None, str(e)
    return {"run": str(run_dir), "target": cfg.target.name, "draft_kind": cfg.draft.kind,
            "current": current or "export", "problem": problem,
            "lineage": lineage(store, current, events),
            "engines": engines(store, cfg.refresh.status_timeout_s),
            "last_refresh": _last(events, REFRESHES), "last_swap": _last(events, SWAPS),
            "failed": [{"version": v, **_pick(store.failure(v), ("reason", "time"))}
                       for v in store.versions() if store.failure(v) is not None]}


def lineage(store: DraftStore, version: str | None, events: list[dict]) -> list[dict]:
    """The chain from `version` back to the export: one entry per version, the export last."""
    published = {e.get("version"): e.get("time") for e in events if e["event"] == "published"}
    chain, seen = [], set()
    while version not in (None, "export") and version not in seen:
        seen.add(version)
        lin = store.lineage(version)
        key = lin.get("decided_on")
        est = {t: (lin.get(t) or {}).get(key, {}).get("al") for t in ("al_before", "al_after")}
        chain.append({"version": version, "parent": lin.get("parent") or "export",
                      "policy": _pick(lin.get("policy") or {}, ("source", "step")),
                      "rollouts": [r.get("path") if isinstance(r, dict) else r
                                   for r in lin.get("rollouts", [])],
                      "heldout_al": {"decided_on": key, "before": est["al_before"],
                                     "after": est["al_after"]},
                      "published": published.get(version)})
        version = lin.get("parent")
    chain.append(export_entry(artifacts.RunPaths(store.run).export))
    return chain


def export_entry(export: Path) -> dict:
    """The run's export: simulated AL (training), vLLM's AL (the parity check), serving.json."""
    if not (export / "config.json").is_file():
        return {"version": "export", "missing": f"no export at {export}: run `draftkit export`"}
    meta = artifacts.read_json(export / "meta.json") if (export / "meta.json").is_file() else {}
    return {"version": "export", "directory": str(export), "created": meta.get("created"),
            "sim_al": meta.get("sim_al"), "vllm_al": (meta.get("check") or {}).get("vllm_al"),
            "serving_choice": (export / SERVING_FILE).is_file()}


def engines(store: DraftStore, timeout: float) -> dict:
    """{url: {"recorded": engines.json's record, "live": what the engine says, or "error"}}."""
    path = store.root / ENGINES
    recorded = artifacts.read_json(path)["engines"] if path.is_file() else {}
    return {url: {"recorded": rec, "live": ask(url, timeout)} for url, rec in recorded.items()}


def ask(url: str, timeout: float) -> dict:
    """What the engine says it serves (GET /draftkit/state), or {"error": why not}."""
    try:
        st = rollout_client.state(url, timeout)
    except DraftkitError as e:  # unreachable, timed out, no secret, no draftkit routes
        return {"error": str(e).splitlines()[0]}
    except Exception as e:  # noqa: BLE001 - any other fault of one engine is its own line
        return {"error": f"{type(e).__name__}: {e}"}
    txn = st.get("txn") or {}
    return {"version": st.get("weight_version"), "directory": st.get("drafter_path"),
            "transfer": st.get("transfer"), "txn": _pick(txn, ("id", "state", "verdict"))}


def _last(events: list[dict], names: tuple[str, ...]) -> dict | None:
    return next((e for e in reversed(events) if e["event"] in names), None)


def _pick(d: dict, keys: tuple[str, ...]) -> dict:
    return {k: d[k] for k in keys if k in d}


# ----------------------------------------------------------------------------- text


def render(s: dict) -> str:
    lines = [f"run {s['run']} (target {s['target']}, draft {s['draft_kind']})",
             f"current: {s['current']}" + (f" (PROBLEM: {s['problem']})" if s["problem"] else ""),
             "lineage: " + " <- ".join(e["version"] for e in s["lineage"])]
    lines += [f"  {_version_line(e)}" for e in s["lineage"]]
    lines.append(f"engines ({len(s['engines'])} in drafts/{ENGINES}):" if s["engines"] else
                 f"engines: none recorded (drafts/{ENGINES}: `draftkit swap` or `watch "
                 "--engines` writes it)")
    for url, e in s["engines"].items():
        rec, live = e["recorded"], e["live"]
        said = f"unreachable ({live['error']})" if "error" in live else \
            f"says {live.get('version')} ({live.get('directory')})"
        al = f", AL {rec['al']:.2f}" if isinstance(rec.get("al"), (int, float)) else ""
        refused = f", refused {rec['refused']}" if rec.get("refused") else ""
        lines.append(f"  {url}: recorded {rec.get('version')} {rec.get('status')}{al}{refused} "
                     f"at {rec.get('time')}; {said}")
    lines.append("last refresh: " + _event_line(s["last_refresh"]))
    lines.append("last swap: " + _event_line(s["last_swap"]))
    lines.append("failed versions: " + ("none" if not s["failed"] else "; ".join(
        f"{f['version']} ({f.get('reason', '')[:120]}, {f.get('time')})" for f in s["failed"])))
    return "\n".join(lines)


def _version_line(e: dict) -> str:
    if e["version"] == "export":
        if "missing" in e:
            return f"export: {e['missing']}"
        return (f"export: simulated AL {_f(e['sim_al'])}, vLLM AL {_f(e['vllm_al'])} (parity "
                f"check), serving choice {'in it' if e['serving_choice'] else 'not measured'}")
    al, pol = e["heldout_al"], e["policy"]
    return (f"{e['version']}: parent {e['parent']}, policy step {pol.get('step')} "
            f"({pol.get('source')}), {len(e['rollouts'])} rollout files, held-out AL "
            f"{al['decided_on']} {_f(al['before'])} -> {_f(al['after'])}, published "
            f"{e['published']}")


def _event_line(e: dict | None) -> str:
    if e is None:
        return "none"
    rest = {k: v for k, v in e.items() if k not in ("time", "event", "inputs")}
    return f"{e['event']} at {e['time']}: {json.dumps(rest, default=str)[:300]}"


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"
