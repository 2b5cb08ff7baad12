"""The README and docs/ stay true to the tree and the CLI: every relative link (and #anchor, as
GitHub slugs headings) resolves, and every `draftkit ...` line in a shell code block names a verb
and flags the argparse parser of draftkit/cli.py knows, and parses where it has no `...`
placeholder. The README and docs/benchmarks.md stay short (<= 400 lines each), their headline table is
the one benchmarks/headline.py derives from results/bench_goals.json, and every figure a page
cites from a results/ file is in that file (commits and CPUs: test_docs_results.py). Every module
a page names exists; the README's first screen shows the CPU and GPU installs and its Python
example inits offline, apart from `make demo`'s run. Every python block is labelled in its fence:
`python test=NAME` (a test execs `example(page, NAME)` as written), `python fragment` or
`python not-run-here=WHY`."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from benchmarks import headline
from draftkit.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w-]*)(.*)$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
each_page = pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))


def split_fences(text: str, full_info: bool = False) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(prose lines, [(info string, block lines)]) of a Markdown text; the info string is its
    first word, lowercased (the language), or with `full_info` the whole of it as written."""
    prose, blocks, block = [], [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if block is None and m:
            block = ((m.group(2) + m.group(3)).strip() if full_info else m.group(2).lower(), [])
        elif block is not None and m and not m.group(2):
            blocks.append(block)
            block = None
        elif block is not None:
            block[1].append(line)
        else:
            prose.append(line)
    return prose, blocks


def python_examples(text: str) -> list[tuple[str, str]]:
    """(label, code) of each python block of a page: its label is the info string after
    `python` (`test=NAME`, `fragment` or `not-run-here=WHY`; '' when it has none)."""
    return [(info[len("python"):].strip(), "\n".join(lines))
            for info, lines in split_fences(text, full_info=True)[1]
            if info.split()[:1] == ["python"]]


def example(page: str, name: str) -> str:
    """The code of the python block of `page` (README.md, docs/x.md) labelled `test=NAME`: what
    a test execs as written."""
    found = [code for label, code in python_examples((ROOT / page).read_text())
             if label == f"test={name}"]
    assert len(found) == 1, f"{page} has {len(found)} python blocks labelled test={name}"
    return found[0]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup and punctuation dropped."""
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    found, count = set(), {}
    for line in split_fences(text)[0]:
        if m := re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line):
            s = slug(m.group(1))
            n = count[s] = count.get(s, -1) + 1
            found.add(f"{s}-{n}" if n else s)
    return found


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for line in split_fences(text)[0]:
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            if not path:
                if anchor not in anchors(text):
                    problems.append(f"{page.name}: link to {target}: no such heading")
                continue
            dest = (page.parent / path).resolve()
            if not dest.exists():
                problems.append(f"{page.name}: link to {target}: {dest} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                problems.append(f"{page.name}: link to {target}: no heading #{anchor} in {dest.name}")
    return problems


def command_lines(text: str) -> list[str]:
    """`draftkit ...` lines of the shell blocks, continuation lines joined."""
    lines = []
    for info, block in split_fences(text)[1]:
        if info not in SHELL:
            continue
        joined = "\n".join(block).replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("draftkit ") or " -m draftkit.cli " in line:
                lines.append(line)
    return lines


def command_problems(line: str, parser: argparse.ArgumentParser) -> list[str]:
    words = shlex.split(line, comments=True)
    argv = words[words.index("draftkit.cli") + 1:] if "draftkit.cli" in words else words[1:]
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if not argv or argv[0] not in verbs:
        return [f"`{line}`: no verb {argv[:1]} (verbs: {', '.join(verbs)})"]
    known = verbs[argv[0]]._option_string_actions
    problems = [f"`{line}`: {argv[0]} has no flag {w.split('=')[0]}"
                for w in argv[1:] if w.startswith("--") and w.split("=")[0] not in known]
    if not problems and "..." not in argv:
        err = io.StringIO()
        try:  # as cli.run parses: key=value overrides may also follow a verb's options
            with contextlib.redirect_stderr(err):
                args, extra = parser.parse_known_args(argv)
        except SystemExit:
            problems.append(f"`{line}` does not parse: {err.getvalue().strip().splitlines()[-1]}")
        else:
            stray = [w for w in extra if w.startswith("-") or "=" not in w]
            if stray or (extra and not hasattr(args, "overrides")):
                problems.append(f"`{line}` does not parse: stray {stray or extra}")
    return problems


@each_page
def test_relative_links_resolve(page):
    assert link_problems(page, page.read_text()) == []


@each_page
def test_draftkit_command_lines_parse(page):
    parser = build_parser()
    lines = command_lines(page.read_text())
    assert [p for line in lines for p in command_problems(line, parser)] == []


def example_problems(page: str, text: str, tests: str) -> list[str]:
    """Every python block of a page is run as written by a test (labelled `python test=NAME`,
    and `tests` holds `example("<page>", "NAME")`) or says why not: `python fragment` (a
    signature, placeholders) or `python not-run-here=<why>` (it needs a GPU or the network)."""
    problems = []
    for label, code in python_examples(text):
        first = code.strip().splitlines()[0][:50] if code.strip() else ""
        if label.startswith("test="):
            if f'example("{page}", "{label[5:]}")' not in tests:
                problems.append(f"{page}: no test runs the block labelled {label}: `{first}`")
        elif not (label == "fragment" or re.fullmatch(r"not-run-here=\S+", label)):
            problems.append(f"{page}: python block `{first}` is labelled '{label}': label it "
                            "test=NAME (and exec it in a test), fragment or not-run-here=WHY")
    return problems


@each_page
def test_every_python_example_runs_in_a_test_or_says_why_not(page):
    tests = "\n".join(p.read_text() for p in sorted((ROOT / "tests").rglob("*.py")))
    assert example_problems(str(page.relative_to(ROOT)), page.read_text(), tests) == []


def test_the_example_check_catches_an_unlabelled_or_unrun_block():
    text = ("```python\nx = 1\n```\n```python test=twice\ny = 2\n```\n```python fragment\nf(...)\n"
            "```\n```python not-run-here=gpu\nLLM(model='big')\n```\n```py\nnot python\n```\n")
    assert python_examples(text)[0] == ("", "x = 1")
    problems = example_problems("docs/x.md", text, 'example("docs/x.md", "once")')
    assert len(problems) == 2 and "`x = 1`" in problems[0] and "test=twice" in problems[1]
    assert example_problems("docs/x.md", text.replace("```python\nx", "```python test=twice\nx"),
                            'example("docs/x.md", "twice")') == []


def test_every_verb_has_help_and_the_docs_use_the_lifecycle_verbs():
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for verb in verbs:
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
            parser.parse_args([verb, "--help"])
        assert e.value.code == 0, verb
    used = {shlex.split(line, comments=True)[1] for page in PAGES
            for line in command_lines(page.read_text()) if line.startswith("draftkit ")}
    lifecycle = {"init", "prepare", "harvest", "train", "export", "eval", "drift", "refresh",
                 "watch"}
    assert lifecycle <= used, f"verbs no doc shows: {sorted(lifecycle - used)}"


def test_the_checks_catch_a_broken_link_and_an_unknown_flag(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    good = "[ok](there.md#a-heading-with-code) [2nd](there.md#twice-1) [self](#top)\n# Top\n"
    assert link_problems(page, good) == []
    bad = "[x](missing.md) [y](there.md#no-such) `[code](not-a-link.md)`\n"
    assert len(link_problems(page, bad)) == 2
    parser = build_parser()
    assert command_problems("draftkit eval runs/x --k 1,3 eval.num_prompts=4", parser) == []
    assert command_problems("draftkit init ... --draft draft-lm draft.init=scratch", parser) == []
    assert "no flag --bogus" in command_problems("draftkit eval runs/x --bogus 3", parser)[0]
    assert "no verb" in command_problems("draftkit evaluate runs/x", parser)[0]
    assert "does not parse" in command_problems("draftkit eval runs/x --k one", parser)[0]
    text = "```bash\ndraftkit refresh r --policy p \\\n    --rollouts x --budget-s 1  # c\n```\n"
    assert command_lines(text) == ["draftkit refresh r --policy p      --rollouts x --budget-s 1  # c"]


def headline_rows(text: str, section: str = "## Results at a glance") -> list[str]:
    """The table under `section` whose header starts with `| method |`: header, separator, rows."""
    lines = text.splitlines()
    at = lines.index(section)
    start = next(i for i in range(at, len(lines)) if lines[i].startswith("| method |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_readme_and_benchmarks_are_short_and_show_the_derived_headline_table():
    readme = (ROOT / "README.md").read_text()
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(readme.splitlines()) <= 400, "the README is the short guide: move detail to docs/"
    assert len(bench.splitlines()) <= 400, "benchmarks.md holds current results only"
    expected = headline.table(headline.load(ROOT / "results" / "bench_goals.json"))
    assert headline_rows(readme) == expected, \
        "README's headline table is not `python scripts/headline.py results/bench_goals.json`"
    assert "\n".join(expected) in bench, "benchmarks.md lacks the README's headline table"


# --- every figure cited from results/ is in the named file ---------------------------------

RESULT_FILE = re.compile(r"results/(?:[\w-]+/)*[\w-]+\.(?:md|json)(?![\w*{])")
VERSION = re.compile(r"\d+\.\d+\.\d+[\w.]*")  # 0.32.0, 2.13.0+cpu: versions, not figures
FIGURE = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(x?)(?![\d,]\d)")
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def blocks(text: str) -> list[tuple[str, str]]:
    """A page's prose as ("table" | "text", content) blocks: a paragraph, one list item, one
    heading or one table each; fenced code is left out."""
    out: list[tuple[str, list[str]]] = []
    for line in split_fences(text)[0]:
        kind = "table" if line.lstrip().startswith("|") else "text"
        new = (not out or not line.strip() or kind != out[-1][0] or line.startswith("#")
               or out[-1][1][-1].startswith("#")
               or re.match(r"^\s{0,3}(?:[-*+]|\d+\.)\s", line) is not None)
        if not line.strip():
            out.append(("gap", []))
        elif new:
            out.append((kind, [line]))
        else:
            out[-1][1].append(line)
    return [(kind, "\n".join(lines)) for kind, lines in out if kind != "gap"]


def cited_blocks(text: str, named) -> list[tuple[str, str, list]]:
    """(kind, content, files) of each block of a page: `files` is what `named(content)` finds in
    it, and for a table that names none, what its caption (the text block just above) names."""
    out, caption = [], []
    for kind, content in blocks(text):
        found = named(content)
        out.append((kind, content, found if found or kind != "table" else caption))
        caption = found if kind == "text" else []
    return out


def figures(text: str) -> list[str]:
    """The figures of a block: numbers with a decimal point, or with an `x` suffix (2.01x, 10x),
    outside inline code and link targets; version numbers (0.32.0) are not figures."""
    prose = re.sub(r"`[^`]*`", " ", text)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)
    prose = VERSION.sub(" ", prose)
    return [whole + frac + x for whole, frac, x in FIGURE.findall(prose) if frac or x]


def in_file(figure: str, numbers: list[str]) -> bool:
    """Whether a figure (1.33, 1.33x, 0.3) is one of the file's numbers as printed, or one of
    them rounded half-up, or as Python's format rounds it, to the figure's decimals."""
    want = Decimal(figure.rstrip("x").replace(",", ""))
    places = Decimal(1).scaleb(want.as_tuple().exponent)
    for n in numbers:
        have = Decimal(n.replace(",", ""))
        if have == want or have.quantize(places, ROUND_HALF_UP) == want:
            return True
        if format(float(have), f".{max(0, -want.as_tuple().exponent)}f") == str(want):
            return True
    return False


def derived_tables(root: Path) -> set[str]:
    """Rows benchmarks/headline.py derives from results/bench_goals.json, one table per split:
    test_readme_and_benchmarks_are_short_and_show_the_derived_headline_table checks those."""
    result = headline.load(root / "results" / "bench_goals.json")
    return {row for split in {r["split"] for r in result["rows"]}
            for row in headline.table(result, split)}


def figure_problems(page: Path, text: str, root: Path = ROOT, skip: set[str] = frozenset()) -> list[str]:
    """Every figure in a block that names exactly one results/ file (a table names none: the
    paragraph just above it, its caption, names it) must be a number of that file.

    The rule: a figure is a number written with a decimal point or an `x` suffix outside
    inline code; it is found when the file holds that number (thousands commas ignored), or a
    number with more decimals that rounds to it (half-up, or as Python formats the float, so
    JSON's 1.3250 matches 1.33 and 0.263 matches 0.3). Derived figures (a difference, a mean)
    are not in the file: a page writes them in a block that names no file, or not at all."""
    problems = []
    for kind, content, files in cited_blocks(text, lambda c: sorted(set(RESULT_FILE.findall(c)))):
        if len(files) != 1 or (kind == "table" and set(content.splitlines()) <= skip):
            continue
        path = root / files[0]
        if not path.exists():
            problems.append(f"{page.name}: cites {files[0]}, which does not exist")
            continue
        numbers = NUMBER.findall(path.read_text())
        problems += [f"{page.name}: {f} is not in {files[0]}: {content.splitlines()[0][:80]}"
                     for f in figures(content) if not in_file(f, numbers)]
    return problems


@each_page
def test_every_figure_cited_from_results_is_in_the_named_file(page):
    assert figure_problems(page, page.read_text(), skip=derived_tables(ROOT)) == []


def test_the_figure_check_catches_a_made_up_number(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench_x.md").write_text("| a | 1.325 | 2.01x | 30,061 |\n")
    (tmp_path / "results" / "bench_y.json").write_text('{"al": 1.3250, "s": 0.263}')
    page = tmp_path / "page.md"
    good = ("From `results/bench_x.md`: 1.33, 2.01x and 30,061 tok/s, version 0.32.0.\n\n"
            "Caption naming results/bench_y.json:\n\n| AL | s |\n|---|---|\n| 1.33 | 0.3 |\n\n"
            "Two files, results/bench_x.md and results/bench_y.json: 9.99 is not checked.\n")
    assert figure_problems(page, good, tmp_path) == []
    bad = "From results/bench_x.md: AL 1.34 and 1.90x (`1.77` in code is no figure).\n"
    assert [p.split(":")[1] for p in figure_problems(page, bad, tmp_path)] == [" 1.34 is not in results/bench_x.md", " 1.90x is not in results/bench_x.md"]
    table = "Caption: results/bench_y.json\n\n| AL |\n|---|\n| 1.3 |\n| 2.7 |\n"
    assert len(figure_problems(page, table, tmp_path)) == 1
    gone = "Measured in results/bench_gone.md: 1.50.\n"
    assert "does not exist" in figure_problems(page, gone, tmp_path)[0]


# --- the README's first screen and its Python example --------------------------------------


def test_readme_first_screen_shows_both_installs_and_the_gpu_guide_second():
    readme = (ROOT / "README.md").read_text()
    first = "\n".join(readme.splitlines()[:40])
    assert "**On a GPU**" in first and "**On a CPU**" in first, "where speculation pays"
    assert re.search(r"^make setup +#", first, re.M) and re.search(r"^make setup GPU=1 ", first, re.M)
    links = [t for line in split_fences(readme)[0] for t in LINK.findall(re.sub(r"`[^`]*`", "", line))]
    assert links[1] == "docs/qwen3-8b.md", f"the second link is {links[1]}"


def test_readme_python_example_runs_offline_beside_make_demos_run(monkeypatch):
    """Its init uses the recipe's shipped sample (the hub source downloads datasets and
    regenerates 20k answers) and a run name `make demo` does not write (the stages stubbed here:
    tests/test_docs_examples.py runs them)."""
    from draftkit import api
    from draftkit.init.stage import resolve
    calls = []
    monkeypatch.setattr(api, "init", lambda *a, **kw: calls.append((a, kw)) or "runs/x")
    for verb in ("prepare", "harvest", "train", "export", "evaluate"):
        monkeypatch.setattr(api, verb, lambda run, *a, **kw: None)
    exec(example("README.md", "readme-python"), {})  # noqa: S102 - the README's own code
    (target, data), kw = calls[0]
    cfg = resolve(target, data, name=kw.get("name"), overrides=kw.get("overrides"))
    assert cfg.data.source != "hub"
    demo_run = re.search(r"^RUN\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert cfg.name not in (demo_run, f"{demo_run}-dflash")


# --- every module a page names exists ------------------------------------------------------

MODULE_PATH = re.compile(r"(?<![\w/.])draftkit/[\w/]+\.py\b")
DOTTED = re.compile(r"(?<![\w/.])draftkit(?:\.\w+)+")
FILE_SUFFIXES = {"yaml", "ready", "done", "json", "jsonl", "md"}  # draftkit.yaml is a file


def module_problems(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """Every `draftkit/x/y.py` path and every dotted `draftkit.x.y[.name]` a page names exists:
    the module as a file (or package) under draftkit/, then at most the first name after it
    defined (def, class or assignment) or imported in that module's source."""
    problems = [f"{page.name}: {p} does not exist" for p in MODULE_PATH.findall(text)
                if not (root / p).is_file()]
    for name in DOTTED.findall(text):
        parts = name.split(".")
        if parts[-1] in FILE_SUFFIXES:
            continue
        here, i = root / "draftkit", 1
        while i < len(parts) and ((here / parts[i]).is_dir() or (here / f"{parts[i]}.py").is_file()):
            here, i = here / parts[i], i + 1
        if i == len(parts):
            continue
        source = here / "__init__.py" if here.is_dir() else here.with_suffix(".py")
        defined = rf"^\s*(?:def|class)\s+{parts[i]}\b|^{parts[i]}\s*[:=]|\bimport\b.*\b{parts[i]}\b"
        if not source.is_file() or not re.search(defined, source.read_text(), re.M):
            problems.append(f"{page.name}: {name}: no {'.'.join(parts[:i + 1])} in draftkit/")
    return problems


@each_page
def test_every_module_a_page_names_exists(page):
    assert module_problems(page, page.read_text()) == []


def test_the_module_check_catches_an_old_path():
    page = ROOT / "docs" / "x.md"
    good = "`draftkit.rl.rollout_servers.push`, `draftkit/serving/rollout_client.py`, draftkit.yaml"
    assert module_problems(page, good) == []
    bad = "`draftkit.rollout.swap_engine`, `draftkit.rl.rollout_servers.pull`, `draftkit/rl/rollout_client.py`"
    assert len(module_problems(page, bad)) == 3
