"""The main job (``./dev demo``) at a small size: it must keep running and agree with DuckDB.

``run_demo`` returns non-zero when the integrated output differs from DuckDB's join of
the final inputs or the state does not survive a reopen, so this is a differential test
of population + live changes end to end, not a smoke test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.demo import run_demo

if TYPE_CHECKING:
    from pathlib import Path


def test_demo_matches_duckdb(tmp_path: Path) -> None:
    assert run_demo(tmp_path / "state", 2_000, 30_000, 4_096, progress=False) == 0
