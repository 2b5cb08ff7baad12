"""The lab imports: every module of benchmarks/ and every scripts/*.py loads (a script as a
module, by path, its `__main__` guard keeping main from running), each script's argument parser
builds and prints its --help, and no script or benchmark uses a private draftkit or benchmarks
name, or one that does not exist (deferred imports and module attributes included). A function moved or renamed in draftkit breaks this test, not a benchmark
run weeks later."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import benchmarks

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py"))
MODULES = sorted(m.name for m in pkgutil.walk_packages(benchmarks.__path__, "benchmarks."))
LAB = [*SCRIPTS, *(ROOT / "benchmarks").rglob("*.py")]


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"lab_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs the top level only: main sits behind __main__
    return module


def _guarded(tree: ast.Module) -> bool:
    """The module's top level calls nothing but behind `if __name__ == "__main__":`."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in tree.body)


def test_the_lab_has_its_modules_and_drivers():
    # one home per harness: the drivers stay in scripts/, the harnesses grouped in benchmarks/
    groups = {m.split(".")[1] for m in MODULES if m.count(".") >= 2}
    assert {"cost", "learning", "serving"} <= groups, groups
    assert len(SCRIPTS) >= 20 and not (ROOT / "scripts" / "_bench.py").exists()


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_module_imports(name):
    importlib.import_module(name)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_script_imports_and_builds_its_parser(path):
    tree = ast.parse(path.read_text())
    assert _guarded(tree), f"{path.name}: main must run only under `if __name__ == '__main__'`"
    module = _load_script(path)
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
    if hasattr(module, "parser"):  # the thin drivers: argparse + a call
        text = module.parser().format_help()
        assert text.startswith("usage:"), text


PACKAGES = ("draftkit", "benchmarks")


def _lab_names(path: Path):
    """(line, dotted name) of every draftkit or benchmarks name the file uses, deferred imports
    included: each `from draftkit... import name` / `import draftkit...`, and each attribute
    read off a module bound that way (`stage._open_harvest` after `from draftkit.train import
    stage`)."""
    tree = ast.parse(path.read_text())
    modules = {}  # local name -> draftkit module path
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGES):
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGES):
                    yield node.lineno, alias.name
                    if alias.asname:
                        modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            yield node.lineno, f"{modules[node.value.id]}.{node.attr}"


def _resolve(dotted: str):
    """The object a dotted name names; AttributeError / ImportError if none."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("path", LAB, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_lab_uses_only_public_names_that_exist(path):
    bad = []
    for line, dotted in sorted(set(_lab_names(path))):
        if any(p.startswith("_") and not p.endswith("__") for p in dotted.split(".")):
            bad.append(f"{path.name}:{line}: {dotted} is private")
            continue
        try:
            _resolve(dotted)
        except (AttributeError, ImportError):
            bad.append(f"{path.name}:{line}: {dotted} does not exist")
    assert not bad, "\n".join(bad)
