"""The package layering, checked on the source: lower layers never import
higher ones, and pyspark is imported only by ``spark_io`` and ``bench``.

Import-time checks (tests/spark/test_spark_layering.py) catch what runs; this catches
every import statement, including ones inside functions that a test may never reach.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["joinstate", "compaction", "planner", "population", "spark_io", "bench"]
PYSPARK_ALLOWED = {"spark_io", "bench"}
LAZY_ALLOWED = {"joinstate/cli.py": {"population", "planner", "bench"}}
"""Thin command-line layers inside a lower package that may import a higher one, but
only inside a function (never at module level, so importing the package stays clean)."""


def imported_top_levels(path: Path, module_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    nodes = _module_level(tree) if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """Every node outside function bodies (class bodies and ``if`` blocks included)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _offending(path: Path, higher: set[str]) -> set[str]:
    lazy = LAZY_ALLOWED.get(str(path.relative_to(ROOT)), set())
    return (imported_top_levels(path) - lazy | imported_top_levels(path, True)) & higher


@pytest.mark.parametrize("package", ORDER)
def test_package_imports_only_lower_layers(package: str) -> None:
    higher = set(ORDER[ORDER.index(package) + 1:])
    offenders = {
        str(p.relative_to(ROOT)): sorted(_offending(p, higher))
        for p in sorted((ROOT / package).rglob("*.py"))
        if _offending(p, higher)
    }
    assert offenders == {}


def test_lazy_exemptions_are_used_lazily() -> None:
    """Each exempted file really imports its higher layer, and only inside functions."""
    for rel, allowed in LAZY_ALLOWED.items():
        path = ROOT / rel
        assert allowed <= imported_top_levels(path), f"{rel} no longer needs its exemption"
        assert not allowed & imported_top_levels(path, module_level_only=True), rel


@pytest.mark.parametrize("package", [p for p in ORDER if p not in PYSPARK_ALLOWED])
def test_pyspark_only_in_spark_io_and_bench(package: str) -> None:
    offenders = [
        str(p.relative_to(ROOT)) for p in sorted((ROOT / package).rglob("*.py"))
        if "pyspark" in imported_top_levels(p)
    ]
    assert offenders == []
