"""Core push benchmark under pytest-benchmark (deselected by default; see README).

One round on the benchmark's data set (100k customers unique on their key x 3M sales):
(a)-(d) measured side by side in one process; the figures go into ``extra_info`` so
``--benchmark-json`` keeps them.  The assertion is the target, (b) >= 50% of (d).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from bench.core import CoreResult, run_core, to_markdown

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.benchmark


def test_core_push_rates(benchmark: Any, tmp_path: Path) -> None:
    right_rows = int(os.environ.get("JOINSTATE_BENCH_RIGHT_ROWS", "3000000"))
    result: CoreResult = benchmark.pedantic(
        run_core, kwargs={"right_rows": right_rows, "workdir": tmp_path}, rounds=1, iterations=1
    )
    benchmark.extra_info.update(vars(result))
    print("\n" + to_markdown(result))
    assert result.ratio_b_over_d >= 0.5
