"""Every commit and CPU a page of the README or docs/ cites beside a results/ file is the one
that file records (its `git_sha`, its `hardware`), and the pages' summaries of what ran on what
name every CPU kind results/ holds. The block rules (a paragraph, list item or table; a table
takes its caption's files) are tests/test_docs.py's figure check's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_docs import RESULT_FILE, ROOT, blocks, cited_blocks, each_page

# --- every commit and CPU kind cited beside a results/ file is the file's ------------------

RESULT_DIR = re.compile(r"results/(?:[\w-]+/)+(?![\w.-])")
COMMIT = re.compile(r"(?<![\w/.:-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
HISTORY_BEFORE = re.compile(r"(?:added in|git show)\s*`?\s*$", re.I)
HISTORY_AFTER = re.compile(r"^`?\s*\(git history")
CPU_KIND = re.compile(r"(AMD EPYC|Intel Xeon)((?:(?!AMD EPYC|Intel Xeon|[;:()]|\.(?!\d)).)*)")


def cited_results(content: str, root: Path) -> list[Path]:
    """The results/ files and folders a block names; those inside a `git show X:results/...`
    are the file as it was, not as it is, and are left out."""
    now = re.sub(r"git show [0-9a-f]+:\S+", " ", content)
    return [root / m for m in sorted(set(RESULT_FILE.findall(now) + RESULT_DIR.findall(now)))]


def recorded(path: Path, what: str) -> list:
    """What a result file (or every file under a results/ folder) records: `what="commit"` its
    git shas (any `git_sha`/`commit` value; a .md is read through its .json), `what="hardware"`
    its machine dicts (`hardware` at any depth; a bare `cpu` string counts as the model)."""
    if path.is_dir():
        return [r for p in sorted(path.rglob("*.json")) for r in recorded(p, what)]
    path = path.with_suffix(".json") if path.with_suffix(".json").exists() else path
    if path.suffix != ".json" or not path.exists():
        return []
    found: list = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if what == "commit" and key in ("git_sha", "commit") and isinstance(value, str):
                    found.append(value)
                elif what == "hardware" and key == "hardware" and isinstance(value, dict):
                    found.append(value)
                elif what == "hardware" and key == "cpu" and isinstance(value, str):
                    bf16 = {"bf16: True": True, "bf16: False": False}
                    found.append({"cpu_model": value, "cpu_native_bf16": next(
                        (v for k, v in bf16.items() if k in value), None)})
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(json.loads(path.read_text()))
    return found


def commit_problems(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """Every commit (7-40 hex digits, at least one letter and one digit) in a block that names
    results/ files (a table: its caption's) must be one a named file records, unless the page
    says it is history: "added in X", "git show X", or "X (git history...)" right after it."""
    problems = []
    for _, content, files in cited_blocks(text, lambda c: cited_results(c, root)):
        if not files:
            continue
        shas = [s for f in files for s in recorded(f, "commit")]
        for m in COMMIT.finditer(content):
            c = m.group(0)
            if HISTORY_BEFORE.search(content[:m.start()]) or HISTORY_AFTER.match(content[m.end():]):
                continue
            if not any(s.startswith(c) or c.startswith(s) for s in shas):
                where = ", ".join(str(f.relative_to(root)) for f in files)
                problems.append(f"{page.name}: commit {c} is not what {where} records "
                                f"({', '.join(sorted({s[:7] for s in shas})) or 'none'}): "
                                f"{content.splitlines()[0][:60]}")
    return problems


def cpu_claims(mention: str) -> dict:
    """What a CPU mention ("Intel Xeon @ 2.50GHz with AVX-512 but no bf16") says: vendor, and
    where it says so native bf16, AMX and the model's clock."""
    vendor, rest = CPU_KIND.match(mention).groups()
    claims = {"vendor": vendor}
    if re.search(r"\b(?:without|no) (?:native )?bf16|fp32 only", rest, re.I):
        claims["bf16"] = False
    elif re.search(r"AVX512-BF16|\bAMX\b|native bf16|with bf16", rest, re.I):
        claims["bf16"] = True
    if re.search(r"\bno AMX\b", rest, re.I):
        claims["amx"] = False
    elif re.search(r"\bAMX\b", rest):
        claims["amx"] = True
    if clock := re.search(r"@ ?[\d.]+GHz", rest):
        claims["clock"] = clock.group(0).replace(" ", "")
    return claims


def matches(claims: dict, hw: dict) -> bool:
    """Whether a machine `recorded` found is the one the claims describe."""
    model, flags = hw.get("cpu_model", ""), hw.get("cpu_flags", [])
    vendor = claims["vendor"].split()[1]  # EPYC, Xeon
    bf16 = hw.get("cpu_native_bf16")  # None: not recorded (a bare model name)
    return (vendor in model and (bf16 is None or claims.get("bf16", bf16) == bf16)
            and (not flags or claims.get("amx", "amx_bf16" in flags) == ("amx_bf16" in flags))
            and claims.get("clock", "").replace("@", "@ ") in model)


def cpu_problems(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """Every CPU a block names beside results/ files must be a machine one of them records
    (files that record none are not checked)."""
    problems = []
    for _, content, files in cited_blocks(text, lambda c: cited_results(c, root)):
        machines = [h for f in files for h in recorded(f, "hardware")]
        for m in CPU_KIND.finditer(re.sub(r"\s+", " ", content.replace("*", "")) if machines else ""):
            if not any(matches(cpu_claims(m.group(0)), h) for h in machines):
                where = ", ".join(str(f.relative_to(root)) for f in files)
                problems.append(f"{page.name}: '{m.group(0).strip()}' is not the CPU {where} "
                                f"records: {content.splitlines()[0][:60]}")
    return problems


@each_page
def test_every_commit_cited_beside_a_result_is_the_one_it_records(page):
    assert commit_problems(page, page.read_text()) == []


@each_page
def test_every_cpu_named_beside_a_result_is_the_one_it_records(page):
    assert cpu_problems(page, page.read_text()) == []


def cpu_kinds(root: Path = ROOT) -> list[dict]:
    """One recorded machine per CPU kind results/ holds (vendor, native bf16, AMX, model)."""
    kinds = {}
    for path in sorted((root / "results").rglob("*.json")):
        for hw in recorded(path, "hardware"):
            if hw.get("device", "cpu") == "cpu" and hw.get("cpu_flags"):
                key = (hw["cpu_model"], hw.get("cpu_native_bf16"), "amx_bf16" in hw["cpu_flags"])
                kinds.setdefault(key, hw)
    return list(kinds.values())


def summary_problems(name: str, content: str, kinds: list[dict]) -> list[str]:
    """A page's summary of what ran on what names every CPU kind results/ records, and only
    those."""
    mentions = [cpu_claims(m.group(0)) for m in CPU_KIND.finditer(
        re.sub(r"\s+", " ", content.replace("*", "")))]
    problems = [f"{name}: names no CPU like {hw['cpu_model']} (native bf16 "
                f"{hw.get('cpu_native_bf16')}, AMX {'amx_bf16' in hw['cpu_flags']})"
                for hw in kinds if not any(matches(c, hw) for c in mentions)]
    return problems + [f"{name}: {c} is no CPU results/ records" for c in mentions
                       if not any(matches(c, hw) for hw in kinds)]


@pytest.mark.parametrize("page, opening", [
    ("benchmarks.md", "**What was measured on what.**"),
    ("hardware.md", "The numbers in [benchmarks.md]")])
def test_the_pages_summaries_name_every_cpu_kind_results_records(page, opening):
    found = [c for _, c in blocks((ROOT / "docs" / page).read_text()) if c.startswith(opening)]
    assert len(found) == 1, f"{page}: no block opens with {opening!r}"
    assert summary_problems(page, found[0], cpu_kinds()) == []


def test_the_commit_and_cpu_checks_catch_a_wrong_one(tmp_path):
    (tmp_path / "results" / "gpu").mkdir(parents=True)
    xeon = {"device": "cpu", "cpu_model": "Intel(R) Xeon(R) Processor @ 2.50GHz",
            "cpu_flags": ["avx512f"], "cpu_native_bf16": False}
    (tmp_path / "results" / "bench_x.json").write_text(json.dumps(
        {"git_sha": "1fb0c2bc2cd7fcd20fa4054b04345a50b6b9365d", "hardware": xeon}))
    (tmp_path / "results" / "bench_x.md").write_text("| a |\n")
    (tmp_path / "results" / "gpu" / "run.json").write_text('{"meta": {"git_sha": "4bbb020aa"}}')
    page = tmp_path / "page.md"
    good = ("Code `1fb0c2b`, an Intel Xeon @ 2.50GHz without bf16 (`results/bench_x.md`); "
            "the run before, `81151f7` (git history), and one added in `d6557d3`.\n\n"
            "GPU runs at `4bbb020` ([results/gpu/](results/gpu/run.json)).\n\n"
            "Code 55f4a96 wrote the old report, `git show 7e957d4:results/bench_x.md`.\n")
    assert commit_problems(page, good, tmp_path) == cpu_problems(page, good, tmp_path) == []
    bad = ("At commit 19e9634 on an AMD EPYC, and on an Intel Xeon with AMX "
           "(results/bench_x.json).\n")
    assert [p.split(":")[1] for p in commit_problems(page, bad, tmp_path)] == [
        " commit 19e9634 is not what results/bench_x.json records (1fb0c2b)"]
    assert len(cpu_problems(page, bad, tmp_path)) == 2
    amd = {"device": "cpu", "cpu_model": "AMD EPYC", "cpu_flags": ["avx512_bf16"],
           "cpu_native_bf16": True}
    summary = "Two kinds: an AMD EPYC with AVX512-BF16, no AMX, and an Intel Xeon with AMX."
    assert len(summary_problems("p", summary, [amd, xeon])) == 2  # Xeon: AMX is none
    assert summary_problems("p", summary.replace("with AMX", "without bf16"), [amd, xeon]) == []


def test_no_result_file_records_an_absolute_path_of_this_machine():
    """Result files travel to other hosts: paths in them are relative to the run or export."""
    machine_path = re.compile(r"(?<![\w.])/(?:tmp|work|root|home)/")
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in sorted((ROOT / "results").rglob("*"))
             if p.suffix in (".json", ".md") for m in machine_path.finditer(p.read_text())]
    assert found == []
