"""The package layering, checked on the source, every import statement included.

* Lower layers never import higher ones: not at module level, not inside a function,
  not under ``if TYPE_CHECKING``.  There is no exemption: the ``joinstate`` command
  lives in the top package (``bench.cli``) for that reason.
* No import circle between modules (imports under ``if TYPE_CHECKING`` excluded: they
  never run).
* No module imports another top-level package's underscore module (``joinstate._index``
  is the core's own business; other packages use its public names).
* pyspark is imported only by ``spark_io`` and ``bench``.

Import-time checks (tests/spark/test_spark_layering.py) catch what runs; this catches
every import statement, including ones inside functions that a test may never reach.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["joinstate", "compaction", "planner", "population", "spark_io", "bench"]
"""Bottom to top: each package may import only the packages before it."""
PYSPARK_ALLOWED = {"spark_io", "bench"}

@dataclass(frozen=True)
class Import:
    """One imported module: the importing file, the line, the module, how it runs."""

    path: Path
    line: int
    module: str
    type_only: bool
    """Under ``if TYPE_CHECKING``: never executed."""

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_module_name(p): p for package in ORDER for p in sorted((ROOT / package).rglob("*.py"))}
"""Every module of the six packages, by dotted name."""


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                for stmt in node.body:
                    out.update(id(n) for n in ast.walk(stmt))
    return out


def imports(path: Path) -> list[Import]:
    """Every module ``path`` imports, with ``from m import name`` resolved to ``m.name``
    when that is a module of the packages, and relative imports made absolute."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = _type_checking_nodes(tree)
    found: list[Import] = []
    for node in ast.walk(tree):
        tc = id(node) in type_only
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, a.name, tc) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.append(Import(path, node.lineno, sub if sub in FILES else module, tc))
    return found


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("package", ORDER)
def test_package_imports_only_lower_layers(package: str) -> None:
    higher = set(ORDER[ORDER.index(package) + 1:])
    offenders = sorted(
        f"{_rel(p)}:{i.line} imports {i.module}"
        for p in sorted((ROOT / package).rglob("*.py"))
        for i in imports(p) if i.top in higher
    )
    assert offenders == []


def test_no_import_circle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in FILES}
    for m, path in FILES.items():
        graph[m] = {i.module for i in imports(path)
                    if not i.type_only and i.module in FILES and i.module != m}
    circles = _strongly_connected(graph)
    assert circles == [], "import circles (each a set of modules importing each other)"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _strongly_connected(graph) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def _underscore(module: str) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__"))
               for p in module.split(".")[1:])


def test_no_underscore_module_of_another_package() -> None:
    found = {
        (_rel(p), i.module)
        for package in ORDER for p in sorted((ROOT / package).rglob("*.py"))
        for i in imports(p) if i.top != package and i.top in ORDER and _underscore(i.module)
    }
    assert sorted(found) == [], "import the package's public names instead"


@pytest.mark.parametrize("package", [p for p in ORDER if p not in PYSPARK_ALLOWED])
def test_pyspark_only_in_spark_io_and_bench(package: str) -> None:
    offenders = [
        f"{_rel(p)}:{i.line}" for p in sorted((ROOT / package).rglob("*.py"))
        for i in imports(p) if i.top == "pyspark"
    ]
    assert offenders == []
