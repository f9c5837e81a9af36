"""``python -m bench SUITE ...``: the same as ``joinstate bench SUITE ...``.

``python -m bench --help`` lists the suites; each suite's module is imported only when
it runs, so one suite's optional dependencies (pyspark, duckdb) never burden another.
"""

from __future__ import annotations

from bench.cli import bench_main

__all__ = ["bench_main"]

if __name__ == "__main__":
    raise SystemExit(bench_main())
