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
ORDER = ["joinstate", "compaction", "population", "planner", "spark_io", "bench"]
PYSPARK_ALLOWED = {"spark_io", "bench"}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", ORDER)
def test_package_imports_only_lower_layers(package: str) -> None:
    higher = set(ORDER[ORDER.index(package) + 1:])
    offenders = {
        str(p.relative_to(ROOT)): sorted(imported_top_levels(p) & higher)
        for p in sorted((ROOT / package).rglob("*.py"))
        if imported_top_levels(p) & higher
    }
    assert offenders == {}


@pytest.mark.parametrize("package", [p for p in ORDER if p not in PYSPARK_ALLOWED])
def test_pyspark_only_in_spark_io_and_bench(package: str) -> None:
    offenders = [
        str(p.relative_to(ROOT)) for p in sorted((ROOT / package).rglob("*.py"))
        if "pyspark" in imported_top_levels(p)
    ]
    assert offenders == []
