"""Swap a draft into one running rollout server over HTTP, and prove it arrived.

    report = rollout.swap_engine("http://10.0.0.5:8000", "runs/rl/drafts/v0007", "eagle3",
                                 probes, min_al=1.2, max_tokens=64, timeout=60)

For the engine, in order (rollout_routes.py serves the first three on the server):
  1. pause with requests kept (no request is dropped; they wait),
  2. vLLM's native draft update from the dir (draftkit's weight-transfer engine),
  3. the workers' tensor hashes against the dir's published tensors: a difference rolls back
     before the resume, so no request is served by a draft that did not arrive; then resume,
  4. AL from the server's `/metrics` spec-decode counters over probe completions at T=0
     (`/v1/completions` with token-id prompts): AL <= min_al swaps the previous draft back
     (its own hash check included) and raises.
The counters are the server's: requests other clients send during the probes count too (they
run on the same new draft, so a draft that did not arrive reads AL ~1 either way).

Every failure raises `EngineError` naming the engine: `transport` (unreachable, timed out, an
answer that is not draftkit's: what the engine serves is unknown, nothing was decided),
`refused` (nothing loaded), `failed` (the check failed; `restored` says whether the previous
draft is back) or `error` (the swap raised; the server rolled back). Nothing here touches a
run's store: rl/rollout_servers.py decides what a failure means for it.

The secret comes from DRAFTKIT_SWAP_SECRET (never a command-line flag); `/v1` calls carry
`Authorization: Bearer $VLLM_API_KEY` when that is set (vLLM's `--api-key`).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from draftkit.core.errors import DraftkitError
from draftkit.serving.counters import SpecCounters
from draftkit.serving.drafter_swap import SECRET_ENV, require_check, version_name
from draftkit.serving.rollout_routes import HEADER, PREFIX

COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts",
            "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens_total": "accepted"}


class EngineError(DraftkitError):
    """A swap into one engine did not succeed; `verdict` says how far it got."""

    def __init__(self, url: str, message: str, verdict: str = "transport",
                 restored: bool | None = None, previous: str | None = None,
                 previous_version: str | None = None, status: int | None = None):
        super().__init__(f"engine {url}: {message}")
        self.url, self.verdict, self.restored, self.status = url, verdict, restored, status
        self.previous, self.previous_version = previous, previous_version


def secret() -> str:
    value = os.environ.get(SECRET_ENV, "")
    if not value:
        raise DraftkitError(f"set {SECRET_ENV} to the rollout servers' secret (the value they "
                            "were started with); draftkit sends it with every swap")
    return value


def call(url: str, method: str, path: str, body: dict | None = None, timeout: float = 60.0,
         headers: dict | None = None) -> tuple[int, dict | str]:
    """(status, JSON or text) of one HTTP call; a transport failure is EngineError(transport).
    A 4xx/5xx comes back as its status and body (the caller words it)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except TimeoutError as e:
        raise EngineError(url, f"{method} {path} timed out after {timeout:g}s ({e}); nothing "
                          "was decided: check the engine, then swap again") from e
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            raise EngineError(url, f"{method} {path} timed out after {timeout:g}s; nothing was "
                              "decided: check the engine, then swap again") from e
        raise EngineError(url, f"unreachable ({reason}); is the server up, and its host and "
                          "port right?") from e
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def _api_headers() -> dict:
    key = os.environ.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _draftkit(url: str, method: str, route: str, body: dict | None, timeout: float) -> dict:
    """A draftkit route; a non-JSON answer or 404 means the plugin is not loaded there."""
    status, out = call(url, method, PREFIX + route, body, timeout, {HEADER: secret()})
    if status == 200 and isinstance(out, dict):
        return out
    if status == 404 or not isinstance(out, dict):
        raise EngineError(url, f"{method} {PREFIX}{route} answered {status} {str(out)[:200]!r}: "
                          "draftkit's routes are not there. Start the server with "
                          "VLLM_PLUGINS=draftkit (docs/integration.md)", status=status)
    verdict = out.get("verdict") or ("refused" if status in (400, 401, 403) else "error")
    raise EngineError(url, f"{status}: {out.get('error', out)}", verdict, out.get("restored"),
                      out.get("previous"), status=status)


def state(url: str, timeout: float = 30.0) -> dict:
    """{"weight_version", "drafter_path", "transfer"} of the engine."""
    return _draftkit(url, "GET", "/state", None, timeout)


def metrics(url: str, timeout: float = 30.0) -> SpecCounters:
    """The server's cumulative spec-decode counters (Prometheus text at /metrics)."""
    status, text = call(url, "GET", "/metrics", None, timeout)
    if status != 200 or not isinstance(text, str):
        raise EngineError(url, f"GET /metrics answered {status}: cannot read its AL")
    c = SpecCounters()
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS:
            setattr(c, COUNTERS[name], getattr(c, COUNTERS[name]) + int(float(line.split()[-1])))
    return c


def served_model(url: str, timeout: float = 30.0) -> str:
    status, out = call(url, "GET", "/v1/models", None, timeout, _api_headers())
    if status != 200 or not isinstance(out, dict) or not out.get("data"):
        raise EngineError(url, f"GET /v1/models answered {status} {str(out)[:200]!r}")
    return out["data"][0]["id"]


def probe_al(url: str, probes: list[list[int]], max_tokens: int, timeout: float) -> dict:
    """AL over greedy completions of `probes` (token ids), from the /metrics counters."""
    body = {"model": served_model(url, timeout), "prompt": probes, "max_tokens": max_tokens,
            "temperature": 0.0}
    before = metrics(url, timeout)
    status, out = call(url, "POST", "/v1/completions", body, timeout, _api_headers())
    if status != 200:
        raise EngineError(url, f"probe completions answered {status}: {str(out)[:300]}",
                          "error", status=status)
    spec = metrics(url, timeout).delta(before)
    return {"al": spec.acceptance_length if spec.drafts else 1.0, "drafts": spec.drafts,
            "accepted": spec.accepted}


def swap_engine(url: str, directory: str | Path, kind: str, probes: list[list[int]],
                min_al: float, max_tokens: int, timeout: float, candidates=(),
                version: str | None = None, reload_held: bool = True) -> dict:
    """Swap `directory` into the engine at `url` and check it (module doc); the report, or
    EngineError. `reload_held=False`: an engine already holding these tensors is not reloaded
    (a check after a sleep/wake reloads only a draft that was lost)."""
    require_check(probes, min_al)
    directory = os.path.realpath(directory)
    version = version or version_name(directory)
    body = {"directory": directory, "kind": kind, "version": version,
            "candidates": [os.path.realpath(c) for c in candidates], "reload_held": reload_held}
    report = _draftkit(url, "POST", "/swap", body, timeout)
    t0 = time.perf_counter()
    try:
        probe = probe_al(url, probes, max_tokens, timeout)
    except EngineError as e:  # the draft is in, unjudged: put the previous one back
        raise _back(url, kind, report, f"the probe completions failed ({e})", timeout) from e
    report.update({"al": probe["al"], "probe": probe, "probe_s": time.perf_counter() - t0,
                   "min_al": min_al, "url": url})
    if probe["al"] > min_al:
        return report
    raise _back(url, kind, report, f"probe AL {probe['al']:.3f} <= minimum {min_al} (the draft "
                "is in but not accepted)", timeout)


def _back(url: str, kind: str, report: dict, why: str, timeout: float) -> EngineError:
    """Swap the engine's previous draft back (hash-checked on the server); the EngineError."""
    previous, was = report["previous"], report.get("previous_version")
    try:
        _draftkit(url, "POST", "/swap", {"directory": previous, "kind": kind,
                                         "version": was, "candidates": [report["directory"]]},
                  timeout)
        state_, restored = f"restored ({previous}, hash-checked)", True
    except EngineError as e:
        state_, restored = f"NOT restored ({e}): restart the engine", False
    return EngineError(url, f"swap to {report['directory']} failed its check: {why}; the "
                       f"previous draft is {state_}. Outputs were never wrong (verification is "
                       "lossless), only slower", "failed", restored, previous, was)
