"""Imports point one way (STYLE.md 13), read from the source with ast: no cycle between
draftkit's subpackages, no draft kind importing another kind, export or eval, and few internal
imports deferred into functions, each with its reason on the same or the previous line."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "draftkit"
KINDS = sorted(p.name for p in (PACKAGE / "drafts").iterdir()
               if p.is_dir() and (p / "kind.py").is_file())

# Kind -> kind imports still there: none. What a family of kinds shares lives in a family
# package that is not itself a kind (no kind.py): drafts/eagle_family/ (EAGLE-3, P-EAGLE,
# DFlash), drafts/lm_family/ (draft LM, PARD). Nothing may be added here.
KIND_DEBTS: set[tuple[str, str]] = set()
# A kind importing a stage, and files left out of the cycle check: none may be added.
STAGE_DEBTS: set[tuple[str, str]] = set()
DEBT_FILES: set[str] = set()
# Longer cycles (three or more subpackages) still there: none may be added.
CYCLE_DEBTS: set[frozenset[str]] = set()
# Deferred internal imports: under 2% today (8 of 486: cli.py keeps torch out of `--help`,
# vllm_plugin's subclasses vLLM at import); it may only fall, and each one says why.
DEFERRED_CEILING = 0.02
SILENT_CEILING = 0  # deferred imports with no comment giving the reason


def imports(path: Path) -> list[tuple[str, ast.stmt, bool]]:
    """(absolute module, node, inside a function) of every draftkit import in `path`."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("").parts  # ("draftkit", ..., name)
    out = []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom):
                base = list(rel[:-1][: len(rel) - child.level]) if child.level else []
                module = ".".join([*base, *([child.module] if child.module else [])])
                out.append((module, child, in_function))
            elif isinstance(child, ast.Import):
                out.extend((a.name, child, in_function) for a in child.names)
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return [(m, n, f) for m, n, f in out if m == "draftkit" or m.startswith("draftkit.")]


def modules() -> dict[Path, list[tuple[str, ast.stmt, bool]]]:
    return {p: imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def subpackage(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def subpackage_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path, found in modules().items():
        src = subpackage(path)
        if str(path.relative_to(PACKAGE)) in DEBT_FILES:
            continue
        for module, _, _ in found:
            dst = module.split(".")[1] if module.count(".") else None
            if src and dst and dst != src and (PACKAGE / dst).is_dir():
                edges.setdefault(src, set()).add(dst)
    return edges


def cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The subpackages on each cycle (strongly connected groups of more than one)."""
    def reach(a: str) -> set[str]:
        seen, todo = set(), [a]
        while todo:
            for n in edges.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    out = set()
    for a in edges:
        group = frozenset({a} | {b for b in reach(a) if a in reach(b)})
        if len(group) > 1:
            out.add(group)
    return out


def test_subpackages_import_each_other_one_way_only():
    edges = subpackage_edges()
    pairs = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a in edges.get(b, ()))
    assert not pairs, pairs
    assert cycles(edges) <= CYCLE_DEBTS, sorted(map(sorted, cycles(edges) - CYCLE_DEBTS))


def node_edges() -> dict[str, set[str]]:
    """Import edges between subpackages and top-level modules (cli, api, ...) alike, deferred
    imports included: `harvest -> cli` under a `__main__` closed a cycle the subpackage edges
    did not see (issue #50)."""
    def node(parts: tuple[str, ...]) -> str:
        return parts[0].removesuffix(".py")

    edges: dict[str, set[str]] = {}
    for path, found in modules().items():
        src = node(path.relative_to(PACKAGE).parts)
        for module, _, _ in found:
            m = module.split(".")
            if len(m) < 2 or m[1] == "__init__":
                continue
            dst = m[1]
            if dst != src and ((PACKAGE / dst).is_dir() or (PACKAGE / f"{dst}.py").is_file()):
                edges.setdefault(src, set()).add(dst)
    return edges


def test_no_cycle_through_the_top_level_modules_either():
    assert cycles(node_edges()) == set(), sorted(map(sorted, cycles(node_edges())))


def test_eval_imports_nothing_from_export():
    """eval measures and decides (eval/choice.py); export copies the decision in, not back."""
    found = [f"{p.relative_to(PACKAGE)}: {m}" for p, mods in modules().items()
             if p.relative_to(PACKAGE).parts[0] == "eval"
             for m, _, _ in mods if m.startswith("draftkit.export")]
    assert not found, found


def test_a_kind_imports_no_other_kind_and_no_stage():
    found = set()
    for path, mods in modules().items():
        parts = path.relative_to(PACKAGE).parts
        if parts[0] != "drafts" or len(parts) < 3 or parts[1] not in KINDS:
            continue
        kind = parts[1]
        for module, _, _ in mods:
            m = module.split(".")
            if len(m) > 2 and m[1] == "drafts" and m[2] in KINDS and m[2] != kind:
                found.add((kind, m[2]))
            elif len(m) > 1 and m[1] in ("export", "eval"):
                found.add((kind, m[1]))
    assert found <= KIND_DEBTS | STAGE_DEBTS, sorted(found - KIND_DEBTS - STAGE_DEBTS)


def test_a_family_package_imports_no_kind():
    """drafts/<family>/ (a folder with no kind.py) holds what kinds share: it imports no kind."""
    found = set()
    for path, mods in modules().items():
        parts = path.relative_to(PACKAGE).parts
        if parts[0] != "drafts" or len(parts) < 3 or parts[1] in KINDS:
            continue
        for module, _, _ in mods:
            m = module.split(".")
            if len(m) > 2 and m[1] == "drafts" and m[2] in KINDS:
                found.add((parts[1], m[2]))
    assert not found, sorted(found)


def test_few_imports_are_deferred_and_each_says_why():
    total, deferred, silent = 0, 0, []
    for path, mods in modules().items():
        lines = path.read_text().splitlines()
        for _, node, in_function in mods:
            total += 1
            if not in_function:
                continue
            deferred += 1
            here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
            if "#" not in here and not above.startswith("#"):
                silent.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert deferred / total < DEFERRED_CEILING, (deferred, total)
    assert len(silent) <= SILENT_CEILING, silent



def test_what_drafts_name_of_serving_as_text_is_serving_s():
    """drafts/ never imports serving/: the export README names the swap extension as text."""
    from draftkit.drafts.eagle3.export import SWAP_EXTENSION
    from draftkit.serving.drafter_swap import EXTENSION

    assert SWAP_EXTENSION == EXTENSION
