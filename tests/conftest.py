"""Test-suite wide: the ``cover`` marker, which keeps the default run short.

A test marked ``@pytest.mark.cover`` is a grid of cases, each of which starts and kills
child processes (a few seconds apiece).  In the default run only enough of its cases run
that every value of every parameter appears in at least one of them (a greedy cover, in
collection order); every other case is marked ``slow`` and runs with ``-m slow``.  So
each kill point, strategy and join type is still exercised by default, and the whole
grid stays one command away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Hashable

    from _pytest.nodes import Item


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cover: run by default only the cases needed to cover every parameter "
        "value once; the rest are marked slow")


def _values(item: Item) -> set[tuple[str, Hashable]]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return {(name, repr(value)) for name, value in params.items()}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[Item]) -> None:
    """Mark the cases a ``cover`` grid does not need by default as ``slow``.

    Runs before ``-m`` deselects, so ``-m slow`` selects exactly the cases left out.
    """
    seen: dict[str, set[tuple[str, Hashable]]] = {}
    for item in items:
        if item.get_closest_marker("cover") is None or item.get_closest_marker("slow"):
            continue
        function = item.nodeid.split("[", 1)[0]
        covered = seen.setdefault(function, set())
        values = _values(item)
        if values <= covered:
            item.add_marker(pytest.mark.slow)
        covered |= values
