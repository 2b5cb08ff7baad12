"""The README and docs/ stay true to the tree and the CLI: every relative link (and #anchor, as
GitHub slugs headings) resolves, and every `draftkit ...` line in a shell code block names a verb
and flags the argparse parser of draftkit/cli.py knows, and parses where it has no `...`
placeholder. The README stays a short guide with its one headline table copied from
docs/benchmarks.md."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from draftkit.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w-]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(prose lines, [(info string, block lines)]) of a Markdown text."""
    prose, blocks, block = [], [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if block is None and m:
            block = (m.group(2).lower(), [])
        elif block is not None and m and not m.group(2):
            blocks.append(block)
            block = None
        elif block is not None:
            block[1].append(line)
        else:
            prose.append(line)
    return prose, blocks


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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert link_problems(page, page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_draftkit_command_lines_parse(page):
    parser = build_parser()
    lines = command_lines(page.read_text())
    assert [p for line in lines for p in command_problems(line, parser)] == []


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


def test_readme_is_a_short_guide_with_the_benchmarks_headline_table():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400, "the README is the short guide: move detail to docs/"
    lines = readme.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| head | its whole cost"))
    end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or
               not lines[i].startswith("|"))
    rows = lines[start:end]  # header, separator, one row per head
    assert len(rows) >= 4
    bench = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    assert all(row in bench for row in rows), "README's headline rows differ from benchmarks.md"
