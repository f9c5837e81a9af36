"""``python -m bench <suite>``: run a benchmark suite and write JSON + markdown results.

Suites are modules with a ``main(argv)`` function, imported only when chosen, so one
suite's optional dependencies (pyspark, duckdb) never burden another.
"""

from __future__ import annotations

import importlib
import sys

SUITES = {
    "demo": ("bench.demo", "populate customer x sales, apply live changes, check with DuckDB"),
    "core": ("bench.core", "push rates of the join operator vs the raw WriteBatch ceiling"),
    "population": ("bench.population", "population strategies x orders; small-side memtables"),
    "spark": ("bench.spark_population", "population driven from Spark mapInArrow workers"),
    "q4spark": ("bench.q4spark", "TPC-DS q4 on local Spark (SparkPipeline), checked by DuckDB"),
    "live": ("bench.live", "live-phase batches on TPC-DS customer x store_sales vs DuckDB"),
    "q4": ("bench.q4", "TPC-DS query 4 as a live pipeline: timed change batches vs DuckDB"),
    "sparkjoin": ("bench.spark_tpcds", "TPC-DS customer x store_sales: in-process vs SparkJoin "
                  "vs Spark Structured Streaming's own join"),
    "recompute": ("bench.recompute", "incremental apply vs recompute per change batch, the rule"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a suite; ``--help`` lists them."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in SUITES:
        print("usage: python -m bench {" + ",".join(SUITES) + "} [--help | suite options]")
        for name, (_, text) in SUITES.items():
            print(f"  {name:<11} {text}")
        return 0 if not args or args[0] in ("-h", "--help") else 2
    module = importlib.import_module(SUITES[args[0]][0])
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
