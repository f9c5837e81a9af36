"""SparkPipeline.from_sql with an aggregate without GROUP BY: one row, never one per shard.

The aggregate's rows all route to one shard (its key is empty), so the answer has exactly
one row; after deletes empty the table it reads ``(0, NULL)``, as DuckDB does.  The row's
first change set comes with the first change that reaches the aggregate.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import spark_io
from planner.sql import Source
from spark_io.types import spark_schema

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
SALES = pa.schema([("k", pa.int64()), ("v", pa.int64())])
SQL = "SELECT count(*) AS n, sum(v) AS sv, max(k) AS top FROM sales WHERE v > 0"


def frame(spark: SparkSession, rows: list[tuple[Row, int]]) -> DataFrame:
    return spark.createDataFrame([(*r, w) for r, w in rows],
                                 spark_schema(SALES.append(pa.field("_weight", pa.int64()))))


def integrate(total: Counter[Row], out: DataFrame) -> Counter[Row]:
    cols = [c for c in out.columns if c != "_weight"]
    for r in out.collect():
        total[tuple(r[c] for c in cols)] += r["_weight"]
    return Counter({r: w for r, w in total.items() if w})


def duckdb_answer(rows: Counter[Row]) -> Counter[Row]:
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    try:
        data = list(rows.elements())
        cols = list(zip(*data, strict=True)) if data else [(), ()]
        con.register("sales", pa.table([pa.array(list(c), f.type)
                                        for c, f in zip(cols, SALES, strict=True)],
                                       schema=SALES))
        return Counter(tuple(r) for r in con.execute(SQL).fetchall())
    finally:
        con.close()


def test_global_aggregate_has_one_row_through_emptying(spark: SparkSession,
                                                       tmp_path: Path) -> None:
    sp = spark_io.SparkPipeline.from_sql(spark, SQL, {"sales": Source(SALES)},
                                         state_dir=tmp_path / "state", shards=3, name="g")
    table: Counter[Row] = Counter()
    total: Counter[Row] = Counter()
    rows = [((k, k % 4), 1) for k in range(12)]
    for r, w in rows:
        table[r] += w
    total = integrate(total, sp.populate({"sales": frame(spark, rows)})["g"])
    assert total == duckdb_answer(table) == Counter({(9, 18, 11): 1})
    gone = [(r, -w) for r, w in rows]
    for r, w in gone:
        table[r] += w
    total = integrate(total, sp.apply("sales", frame(spark, gone))["g"])
    assert total == duckdb_answer(+table) == Counter({(0, None, None): 1})
    back = [((5, 2), 2), ((6, -1), 1)]
    for r, w in back:
        table[r] += w
    total = integrate(total, sp.apply("sales", frame(spark, back))["g"])
    assert total == duckdb_answer(+table) == Counter({(2, 4, 5): 1})
