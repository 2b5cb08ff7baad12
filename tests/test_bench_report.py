"""benchmarks/report.py's writer: every results/ report names its command, machine and commit."""

from __future__ import annotations

import json


def test_every_report_names_its_command_machine_and_commit(tmp_path, monkeypatch):
    """benchmarks/report.write_report: a bench that gave no provenance gets a `meta` in its JSON
    and a closing Command line (command, commit, CPU) in its Markdown; one that wrote its own
    Command line keeps it as written."""
    from benchmarks import report

    monkeypatch.setattr("sys.argv", ["scripts/bench_x.py", "--seeds", "0"])
    data = {"rows": []}
    report.write_report(tmp_path, "bench_x", data, "# X\n\n| a |\n")
    md = (tmp_path / "bench_x.md").read_text()
    meta = json.loads((tmp_path / "bench_x.json").read_text())["meta"]
    assert md.startswith("# X\n\n| a |\n\nCommand: `python scripts/bench_x.py --seeds 0` at code ")
    assert meta["argv"] == ["scripts/bench_x.py", "--seeds", "0"]
    assert meta["hardware"]["cpu_model"] in md
    report.write_report(tmp_path, "bench_y", {}, "Command: `mine`\n")
    assert (tmp_path / "bench_y.md").read_text() == "Command: `mine`\n"
