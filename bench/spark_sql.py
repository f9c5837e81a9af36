"""Spark SQL computing TPC-DS q4 from scratch: the batch recompute a Spark user would run.

Incremental maintenance is worth something only against what a user would otherwise do
after each change: rerun the query.  DuckDB is the fast single-machine way
(:func:`bench.q4.duckdb_recompute`); this is the Spark way: the current tables as
Parquet files (what a Spark job reads), temporary views over them, and the official
query text run by ``spark.sql`` on ``local[cores]``.  Each run re-reads the files and
plans the query again, as a scheduled recompute would; the session is started before
the first timed run (its start is not the query's cost).

Spark's answer is also checked against DuckDB's on the same tables (the customer columns
q4 returns, as multisets; ``year_total`` by its row count), so a wrong recompute cannot
pass for a fast one.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from bench.q4ref import Reference, reference_sql
from joinstate.testing import zset

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = ["recompute"]


def _median_summary(ms: list[float]) -> dict[str, Any]:
    return {"ms": [round(x, 3) for x in ms], "first_ms": ms[0],
            "median_ms": statistics.median(ms), "max_ms": max(ms)}


def recompute(tables: Mapping[str, pa.Table], runs: int = 3, *,
              spark: SparkSession | None = None, cores: int | str = "*",
              workdir: Path | None = None) -> dict[str, Any]:
    """Time Spark SQL computing ``year_total`` and q4's answer from ``tables``.

    ``tables``: q4's five inputs (the columns it reads) as they are now.  Returns the
    per-run milliseconds of both queries, their row counts, and whether Spark's answer
    equals DuckDB's on the same tables (``matches_duckdb``).  With ``spark=None`` a local
    session is started (and stopped) here.
    """
    import spark_io

    if runs < 1:
        raise ValueError(f"runs={runs} must be >= 1")
    sql_year_total, sql_answer, _ = reference_sql()
    own = spark is None
    session = spark if spark is not None else spark_io.local_session("joinstate-q4-sql", cores)
    tmp = Path(workdir or tempfile.mkdtemp(prefix="joinstate-sparksql-"))
    try:
        for name, table in tables.items():
            path = tmp / f"{name}.parquet"
            pq.write_table(table, path)
        yt_ms: list[float] = []
        ans_ms: list[float] = []
        answer_rows: list[Any] = []
        yt_rows = 0
        for _ in range(runs):
            for name in tables:  # views re-created each run: the files are read again
                session.read.parquet(str(tmp / f"{name}.parquet")).createOrReplaceTempView(
                    name)
            t0 = time.perf_counter()
            yt_rows = session.sql(sql_year_total).count()
            yt_ms.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            answer_rows = session.sql(sql_answer).collect()
            ans_ms.append((time.perf_counter() - t0) * 1e3)
        cores_used = session.sparkContext.defaultParallelism
    finally:
        if own:
            session.stop()
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    ref = Reference()
    try:
        want, _ = ref.answer(tables)
        want_yt, _ = ref.year_total(tables)
    finally:
        ref.close()
    columns = list(want.column_names)
    got = Counter(tuple(r[c] for c in columns) for r in answer_rows)
    matches = got == zset(want, columns) and yt_rows == want_yt.num_rows
    return {"year_total": _median_summary(yt_ms), "answer": _median_summary(ans_ms),
            "rows": {"year_total": yt_rows, "q4": len(answer_rows)},
            "want_rows": {"year_total": want_yt.num_rows, "q4": want.num_rows},
            "matches_duckdb": matches, "parallelism": cores_used, "runs": runs}
