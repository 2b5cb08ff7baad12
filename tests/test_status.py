"""`draftkit status RUN` (rl/status.py): the current version and its lineage back to the
export, each engine of engines.json as recorded and as it answers live (a silent engine costs
the timeout, no more), the last refresh and swap, failed versions; text and --json. And the
CLI's `--version` and help text on every flag."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import io
import json
import threading
import time

import pytest
from _runs import make_run

from draftkit import __version__, cli
from draftkit.core import artifacts
from draftkit.rl.publish import DraftStore
from draftkit.serving.drafter_swap import SECRET_ENV


class _State(http.server.BaseHTTPRequestHandler):
    """A rollout server's GET /draftkit/state; `delay` seconds before answering."""

    delay = 0.0

    def do_GET(self):  # noqa: N802 - http.server's name
        time.sleep(self.delay)
        body = json.dumps({"weight_version": "v0002", "drafter_path": "/d/v0002",
                           "transfer": "native", "txn": {"id": "t1", "state": "committed"}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def server(delay: float = 0.0):
    handler = type("H", (_State,), {"delay": delay})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def lineage(parent: str, step: int, before: float, after: float) -> dict:
    return {"parent": parent, "policy": {"source": f"ckpt/step{step}", "step": step},
            "rollouts": [{"path": f"r/{step}.jsonl", "sha256": "x"}], "decided_on": "T=0",
            "al_before": {"T=0": {"al": before}}, "al_after": {"T=0": {"al": after}}}


@pytest.fixture()
def run(tmp_path):
    """A run with an export, v0001 <- v0002 published (v0002 current), v0003 marked failed."""
    run = make_run(tmp_path, name="st")
    export = artifacts.RunPaths(run).export
    export.mkdir()
    (export / "config.json").write_text("{}")
    artifacts.write_json_atomic(export / "meta.json", {"sim_al": 1.9, "check": {"vllm_al": 1.8}})
    store = DraftStore(run)
    for v, lin in (("v0001", lineage("export", 10, 1.5, 1.7)),
                   ("v0002", lineage("v0001", 20, 1.6, 1.8)),
                   ("v0003", lineage("v0002", 30, 1.7, 1.9))):
        store.publish(v, lambda tmp, final: (tmp / "config.json").write_text("{}"), lin)
        store.set_current(v)
        store.log("published", version=v, al_before=lin["al_before"]["T=0"]["al"])
    store.log("engine_swap_failed", url="http://a", version="v0003", verdict="failed")
    store.mark_failed("v0003", "probe AL 1.0 <= refresh.min_probe_al", back_to="v0002")
    store.log("rejected", job="j4", reason="AL after 1.80 is not above before 1.80")
    return run


def record(run, urls: list[str]) -> None:
    DraftStore(run).write_record("engines.json", {"engines": {
        u: {"version": "v0002", "status": "serving", "al": 2.1, "refused": "v0003",
            "time": "t"} for u in urls}})


def test_status_reads_lineage_engines_refreshes_and_failures(run, monkeypatch):
    from draftkit.rl.status import render, status

    monkeypatch.setenv(SECRET_ENV, "s")
    with server() as live, server(delay=30) as silent:
        record(run, [live, silent, "http://127.0.0.1:9"])  # 9: discard, nothing listens
        t0 = time.monotonic()
        s = status(run, ["refresh.status_timeout_s=1"])
        took = time.monotonic() - t0
    assert took < 10, took  # the silent engine costs its timeout, not its 30 s
    assert s["current"] == "v0002"
    assert [e["version"] for e in s["lineage"]] == ["v0002", "v0001", "export"]
    v2 = s["lineage"][0]
    assert v2["parent"] == "v0001" and v2["policy"] == {"source": "ckpt/step20", "step": 20}
    assert v2["rollouts"] == ["r/20.jsonl"] and v2["published"]
    assert v2["heldout_al"] == {"decided_on": "T=0", "before": 1.6, "after": 1.8}
    assert s["lineage"][-1]["sim_al"] == 1.9 and s["lineage"][-1]["vllm_al"] == 1.8
    assert s["lineage"][-1]["serving_choice"] is False
    assert s["engines"][live]["live"]["version"] == "v0002"
    assert s["engines"][live]["recorded"]["al"] == 2.1
    assert "timed out" in s["engines"][silent]["live"]["error"]
    assert "error" in s["engines"]["http://127.0.0.1:9"]["live"]
    assert s["last_refresh"]["event"] == "rejected" and "not above" in s["last_refresh"]["reason"]
    assert s["last_swap"]["event"] == "engine_swap_failed"
    assert [f["version"] for f in s["failed"]] == ["v0003"] and "probe AL" in s["failed"][0]["reason"]
    text = render(s)
    assert "lineage: v0002 <- v0001 <- export" in text
    assert "held-out AL T=0 1.60 -> 1.80" in text and "simulated AL 1.90, vLLM AL 1.80" in text
    assert f"{live}: recorded v0002 serving, AL 2.10, refused v0003 at t; says v0002" in text
    assert "last refresh: rejected" in text and "failed versions: v0003 (probe AL" in text


def test_status_without_a_secret_or_engines_or_versions_still_answers(tmp_path, monkeypatch):
    from draftkit.rl.status import render, status

    monkeypatch.delenv(SECRET_ENV, raising=False)
    run = make_run(tmp_path, name="bare")
    s = status(run)
    assert s["current"] == "export" and s["engines"] == {} and s["failed"] == []
    assert "run `draftkit export`" in s["lineage"][0]["missing"]
    assert "engines: none recorded" in render(s)
    record(run, ["http://127.0.0.1:9", "not-a-url"])
    s = status(run)
    assert SECRET_ENV in s["engines"]["http://127.0.0.1:9"]["live"]["error"]
    monkeypatch.setenv(SECRET_ENV, "s")  # a recorded address urllib cannot use: its own line
    assert "unknown url type" in status(run)["engines"]["not-a-url"]["live"]["error"]


def test_cli_status_prints_text_and_json(run, capsys, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "s")
    assert cli.run(["status", str(run)]) == 0
    assert "current: v0002" in capsys.readouterr().out
    assert cli.run(["status", str(run), "--json", "--timeout", "0.5"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["current"] == "v0002" and s["failed"][0]["version"] == "v0003"


def test_version_and_every_flag_has_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"draftkit {__version__}"
    p = cli.build_parser()
    verbs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices
    bare = [f"{verb} {a.option_strings or a.dest}" for verb, q in verbs.items()
            for a in q._actions if not isinstance(a, argparse._HelpAction) and not a.help]
    assert bare == []
    for verb in verbs:  # and each verb's help prints
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
            p.parse_args([verb, "--help"])


def test_a_broken_current_link_is_reported_not_raised(run):
    from draftkit.rl.status import render, status

    link = DraftStore(run).current_link
    link.unlink()
    link.symlink_to("v0009")  # no such version
    s = status(run)
    assert s["current"] == "export" and "v0009" in s["problem"]
    assert "PROBLEM:" in render(s)

