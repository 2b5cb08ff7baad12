"""The client of a rollout server's draftkit routes (rollout_routes.py is the server side):
swap a draft into one running rollout server over HTTP, and read the server's verdict.

    report = rollout_client.swap_engine("http://10.0.0.5:8000", "runs/rl/drafts/v0007",
                                        "eagle3", probes, min_al=1.2, max_tokens=64, timeout=60)

The swap is one transaction on the server (serving/swap_txn.py, behind rollout_routes.py's
`POST /draftkit/swap`): pause with requests kept, load (vLLM's native draft update), the
workers' tensor hashes against the dir's published files, resume, then probe completions at
T=0 whose acceptance the server reads per request, and, on any failure, the previous draft
back (hash-checked). It finishes whatever happens to this client. The client names the
transaction (`txn`, a random id), sends it and waits for the verdict; a reply lost to a
timeout or a cut connection is asked for again at `GET /draftkit/state?txn=ID` until the
deadline. A transaction still running then is `transport` (nothing decided here: the server
finishes it, and the next push, queued behind it, reads the outcome).

Every failure raises `EngineError` naming the engine and its verdict: `transport` (unreachable,
timed out, cut, redirected, an answer that is not draftkit's: nothing was decided), `refused`
(nothing loaded: a wrong secret, a paused or asleep engine, an engine that cannot measure its
probe), `failed` (measured: hashes differ or probe AL <= min_al, the previous draft restored
or not, `restored`) or `error` (the swap or the probe raised, a probe that did not fit or did
not finish: rolled back, nothing decided about the draft). Only `failed` may condemn a draft;
rl/rollout_servers.py decides what a failure means for the store.

The secret comes from DRAFTKIT_SWAP_SECRET (never a command-line flag). Redirects are refused:
urllib would copy the secret header to whatever host a 30x names. No HTTP proxy is used for
engine URLs (DRAFTKIT_ENGINE_PROXY=1 opts in, with a warning), and a verdict counts only when
the server signed it for this request (an HMAC with the secret over the record and the
client's random `txn`). `/v1` calls (the measuring
helpers below) carry `Authorization: Bearer $VLLM_API_KEY` when that is set (`--api-key`).
"""

from __future__ import annotations

import hmac
import http.client
import json
import os
import time
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path

from draftkit.core.errors import DraftkitError
from draftkit.serving.counters import SpecCounters
from draftkit.serving.drafter_swap import (
    MIN_DRAFTS,
    SECRET_ENV,
    record_sig,
    require_check,
    version_name,
)
from draftkit.serving.rollout_routes import HEADER, PREFIX

COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts",
            "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
DONE = ("committed", "rolled_back", "refused", "error")
PAUSE_WAIT_S = 30.0  # how long the server waits for a pause it did not take to end


class EngineError(DraftkitError):
    """A swap into one engine did not succeed; `verdict` says how far it got."""

    def __init__(self, url: str, message: str, verdict: str = "transport",
                 restored: bool | None = None, previous: str | None = None,
                 previous_version: str | None = None, status: int | None = None,
                 txn: str | None = None):
        super().__init__(f"engine {url}: {message}")
        self.url, self.verdict, self.restored, self.status = url, verdict, restored, status
        self.previous, self.previous_version, self.txn = previous, previous_version, txn


def secret() -> str:
    value = os.environ.get(SECRET_ENV, "")
    if not value:
        raise DraftkitError(f"set {SECRET_ENV} to the rollout servers' secret (the value they "
                            "were started with); draftkit sends it with every swap")
    return value


class _Redirected(urllib.error.URLError):
    def __init__(self, code: int, newurl: str):
        super().__init__(f"redirected ({code}) to {newurl}: refused, the secret never leaves "
                         "the engine it was sent to. Use the engine's own address")
        self.code = code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise _Redirected(code, newurl)


PROXY_ENV = "DRAFTKIT_ENGINE_PROXY"  # =1: engine URLs may go through HTTP(S)_PROXY (warned)


def _opener() -> urllib.request.OpenerDirector:
    """No proxy for engine URLs (a proxy would see the secret header and could answer for the
    engine), unless DRAFTKIT_ENGINE_PROXY=1 opts in; redirects refused either way."""
    if os.environ.get(PROXY_ENV) == "1":
        warnings.warn(f"{PROXY_ENV}=1: engine calls go through the environment's HTTP proxy, "
                      "which sees the swap secret", stacklevel=3)
        return urllib.request.build_opener(_NoRedirect)
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def call(url: str, method: str, path: str, body: dict | None = None, timeout: float = 60.0,
         headers: dict | None = None) -> tuple[int, dict | str]:
    """(status, JSON or text) of one HTTP call; any failure to get a whole answer (refused,
    timed out, cut mid-body, redirected) is EngineError(transport). A 4xx/5xx comes back as
    its status and body (the caller words it)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with _opener().open(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except _Redirected as e:
        raise EngineError(url, f"{method} {path}: {e.reason}", status=e.code) from e
    except urllib.error.HTTPError as e:
        status, raw = e.code, _read(e)
    except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or isinstance(e, TimeoutError):
            raise EngineError(url, f"{method} {path} timed out after {timeout:g}s; nothing was "
                              "decided here: check the engine, then swap again") from e
        what = f"{type(reason).__name__}: {reason}" if isinstance(reason, Exception) else reason
        raise EngineError(url, f"{method} {path}: no whole answer ({what}); is the server "
                          "up, and its host and port right?") from e
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def _read(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read()
    except (OSError, http.client.HTTPException):
        return b""


def _api_headers() -> dict:
    key = os.environ.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _draftkit(url: str, method: str, route: str, body: dict | None, timeout: float) -> dict:
    """A draftkit route's JSON (any status); a non-JSON answer or 404: the plugin is not
    there (transport); 401/403: the secret (refused)."""
    status, out = call(url, method, PREFIX + route, body, timeout, {HEADER: secret()})
    if status == 404 or not isinstance(out, dict):
        raise EngineError(url, f"{method} {PREFIX}{route} answered {status} {str(out)[:200]!r}: "
                          "draftkit's routes are not there. Start the server with "
                          "VLLM_PLUGINS=draftkit (docs/integration.md)", status=status)
    if status in (401, 403):
        raise EngineError(url, f"{status}: {out.get('error', out)}. Set {SECRET_ENV} to the "
                          "value the server was started with", "refused", status=status)
    if status >= 400 and "txn" not in out:  # 400: nothing started; 5xx: the route raised
        verdict = out.get("verdict") or ("refused" if status < 500 else "error")
        raise EngineError(url, f"{status}: {out.get('error', out)}", verdict,
                          out.get("restored"), out.get("previous"), status=status)
    return out


def state(url: str, timeout: float = 30.0, txn: str | None = None) -> dict:
    """{"weight_version", "drafter_path", "transfer", "txn": the latest transaction's record}
    of the engine; with `txn` (an id, or "last") only {"txn": that record}."""
    return _draftkit(url, "GET", "/state" + (f"?txn={txn}" if txn else ""), None, timeout)


def swap_engine(url: str, directory: str | Path, kind: str, probes: list[list[int]],
                min_al: float, max_tokens: int, timeout: float, candidates=(),
                version: str | None = None, reload_held: bool = True,
                min_drafts: int = MIN_DRAFTS, weights: dict | None = None) -> dict:
    """Start the swap transaction of `directory` on the engine at `url` and return its
    report once committed, or raise EngineError with the server's verdict (module doc).
    `reload_held=False`: an engine already holding these tensors is not reloaded (a check
    after a sleep/wake reloads only a draft that was lost); it is probed all the same.
    `weights`: the version's published digests (lineage.json), checked before the load."""
    require_check(probes, min_al)
    directory = os.path.realpath(directory)
    txn, pause_wait = uuid.uuid4().hex, min(PAUSE_WAIT_S, timeout)
    body = {"directory": directory, "kind": kind, "version": version or version_name(directory),
            "candidates": [os.path.realpath(c) for c in candidates], "reload_held": reload_held,
            "probes": probes, "min_al": min_al, "max_tokens": max_tokens, "txn": txn,
            "min_drafts": min_drafts, "weights": weights or {},
            "probe_timeout_s": timeout, "pause_wait_s": pause_wait, "wait_s": timeout}
    deadline = time.monotonic() + 2 * timeout + pause_wait  # the server's longest transaction
    try:
        rec = _draftkit(url, "POST", "/swap", body, timeout + pause_wait + 10)
    except EngineError as e:
        if e.verdict != "transport" or e.status is not None:
            raise
        rec = {}  # the reply was lost: the transaction may be running; ask for it
    if rec.get("state") not in DONE:
        rec = _await(url, txn, deadline, timeout)
    return _verdict(url, _bound(url, rec, txn))


def _bound(url: str, rec: dict, txn: str) -> dict:
    """`rec` if it is the server's record of this request (its txn, signed with the secret:
    drafter_swap.record_sig), else EngineError(transport): an answer anyone else wrote (a
    proxy, a stale listener) decides nothing."""
    sig = rec.get("sig")
    if rec.get("txn") != txn or not isinstance(sig, str) or not hmac.compare_digest(
            sig, record_sig(rec, secret())):
        raise EngineError(url, f"an answer not bound to swap transaction {txn} (wrong txn or "
                          "signature: a proxy, another listener, or a draftkit version older "
                          "than the client's answered). Nothing was decided", txn=txn)
    return rec


def _await(url: str, txn: str, deadline: float, timeout: float) -> dict:
    """The transaction's record once it is done, polling /draftkit/state?txn= until
    `deadline`; EngineError(transport) if it is still running (or unknown) then."""
    last: Exception | str = "no answer"
    while True:
        try:
            rec = state(url, min(timeout, 30.0), txn).get("txn") or {}
            if rec.get("state") in DONE:
                return rec
            last = f"state {rec.get('state') or 'unknown to the server'}"
        except EngineError as e:
            if e.verdict != "transport":
                raise
            last = e
        if time.monotonic() >= deadline:
            raise EngineError(url, f"swap transaction {txn} not finished by the deadline "
                              f"({last}); the server finishes it (committed or rolled back) "
                              "and the next push reads what it serves. Nothing was decided "
                              "here", txn=txn)
        time.sleep(0.5)


def _verdict(url: str, rec: dict) -> dict:
    """The committed transaction's report, or its EngineError."""
    if rec.get("state") == "committed" and rec.get("verdict") == "passed":
        return {**rec, "url": url}
    if rec.get("state") not in DONE or rec.get("verdict") not in (
            "failed", "error", "refused"):
        raise EngineError(url, f"an answer that is not a swap transaction's: {str(rec)[:300]}. "
                          "Is draftkit on the server the same version as here?")
    return_ = rec.get("restored")
    raise EngineError(url, rec.get("error") or rec["verdict"], rec["verdict"], return_,
                      rec.get("previous"), rec.get("previous_version"), txn=rec.get("txn"))


# ------------------------------------------------- measuring helpers (tests, benchmarks)


def metrics(url: str, timeout: float = 30.0) -> SpecCounters:
    """The server's cumulative spec-decode counters (Prometheus text at /metrics); every
    client's requests count (the swap's own probe reads per-request metrics instead)."""
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
        fix = " (set VLLM_API_KEY to the server's --api-key)" if status == 401 else ""
        raise EngineError(url, f"GET /v1/models answered {status} {str(out)[:200]!r}{fix}")
    return out["data"][0]["id"]


def probe_al(url: str, probes: list[list[int]], max_tokens: int, timeout: float) -> dict:
    """AL over greedy completions of `probes` (token ids), from the /metrics counters (a
    measurement on a quiet server: other clients' requests count too)."""
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
