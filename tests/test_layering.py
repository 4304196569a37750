"""The README's "Where things live" map, checked: which package may import which. A library that imported
Dagster or the code location would no longer be usable on its own (a notebook, a serving host), and an
asset module that imported the definitions, jobs or sensors would close a cycle through the code location."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GENRANK = ("contracts", "assets", "pipelines", "transforms", "models", "quality", "deploy")   # the installed packages
TESTKIT = "testkit"   # shared by tests and benchmarks, never installed nor imported by a genrank package


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions count too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _violations(folder: str, allowed) -> list[str]:
    return [f"{path.relative_to(REPO)} imports {name}"
            for path in sorted((REPO / folder).rglob("*.py")) for name in sorted(_imports(path))
            if not allowed(path.relative_to(REPO).as_posix(), name)]


def _within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _genrank(name: str) -> bool:
    return _within(name, *GENRANK, TESTKIT)


# pipelines (the code location) -> assets (the Dagster glue) -> the libraries -> contracts; nothing imports upwards.
RULES = {
    "contracts": lambda f, n: n.split(".")[0] in sys.stdlib_module_names,   # the layer below all: no dependency
    "pipelines": lambda f, n: not _within(n, TESTKIT),                       # the top: the code location, the CLI
    "assets": lambda f, n: not _within(n, "pipelines", TESTKIT),
    "transforms": lambda f, n: not _within(n, "dagster", "dagster_dbt", "pipelines", "assets", "deploy", "quality", TESTKIT),
    "models": lambda f, n: not _within(n, "dagster") and (not _genrank(n) or _within(n, "contracts", "models", "transforms.atomic")),
    "deploy": lambda f, n: not _within(n, "dagster") and (not _genrank(n) or _within(n, "contracts", "deploy", "models", "transforms.atomic")
                                                          or (f in ("deploy/replay.py", "deploy/stack.py") and _within(n, "transforms.landing"))),
    "quality": lambda f, n: not _genrank(n) or _within(n, "contracts", "quality", "transforms.landing"),
    "benchmarks": lambda f, n: not _within(n, "tests"),   # a benchmark shares no code with a test module
    TESTKIT: lambda f, n: not _genrank(n) or _within(n, "contracts", "transforms.atomic", TESTKIT),
}


@pytest.mark.parametrize("folder", list(RULES))
def test_each_package_imports_only_what_the_map_allows(folder):
    assert _violations(folder, RULES[folder]) == []


def test_the_readme_map_and_the_installed_packages_are_the_checked_ones():
    """The README's "Where things live" table has a row for each folder ruled here (and tests/), and the
    packages pyproject installs are exactly the genrank ones."""
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("`")[1].rstrip("/") for line in table.splitlines() if line.startswith("| `")}
    assert rows == set(RULES) | {"tests"}
    pyproject = (REPO / "pyproject.toml").read_text()
    include = pyproject.split("[tool.setuptools.packages.find]", 1)[1].split("include = [", 1)[1].split("]", 1)[0]
    assert {name.strip().strip('"').rstrip("*") for name in include.split(",")} == set(GENRANK)


def _environment_reads(path: Path) -> list[int]:
    """Lines of ``path`` that read the environment: os.getenv, os.environ.get, os.environ[...] read (not written)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if call and ast.unparse(node.func) in ("os.getenv", "os.environ.get"):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ" and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
    return lines


def test_contracts_settings_is_the_one_reader_of_the_environment():
    """Every variable is read through contracts.settings (one idiom: empty is unset), so that the README's table
    and tests/test_settings.py see them all; setting one for the processes a command starts is not a read."""
    reads = [f"{path.relative_to(REPO)}:{line}" for package in GENRANK for path in sorted((REPO / package).rglob("*.py"))
             if path != REPO / "contracts" / "settings.py" for line in _environment_reads(path)]
    assert reads == []
