"""TPC-DS queries compiled from their official text and maintained on Spark, against DuckDB.

The harness of ``tests/test_planner_tpcds.py`` (its SF0.01 tables, seeds and change
batches, its DuckDB check), with :meth:`spark_io.SparkPipeline.from_sql` in place of the
in-process pipeline: the distributed planner cuts each query into stages, one Spark job
per operation runs them on two shards.  Each query is populated from the tables'
Parquet files, seeded where its answer would be empty, then changed (deleted and
duplicated fact rows, dimension rows rewritten under their key; every source of the
batch in one ``apply``); after each, the integrated output equals DuckDB's answer and
``read()`` DuckDB's ordered, limited one.

By default three queries whose plans need what q4's does not: q12 (a window function
partitioned by a column), q6 (scalar subqueries: global aggregates on shard 0, a check)
and q38 (``INTERSECT`` of three channels, then a global count); more under ``slow``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

pytest.importorskip("duckdb")
pytest.importorskip("duckdb_extension_tpcds")

import numpy as np
from test_planner_tpcds import (
    FACTS,
    NONEMPTY,
    SEEDS,
    SF,
    Check,
    all_tables,  # noqa: F401 - the module's fixture
    change_batch,
    official,
    sources_of,
)

import spark_io
from bench import q4, tpcds
from planner.sql import plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

DEFAULT = [12, 6, 38]
"""A window (q12), scalar subqueries (q6), INTERSECT (q38): run by default."""
MORE = [51, 67, 87, 45, 81, 97, 98, 3, 7, 42]
"""Windows over full outer joins (q51), rank over ROLLUP (q67), EXCEPT (q87), IN and
correlated subqueries (q45, q81), a full outer join (q97), more windows and stars."""


class SparkView:
    """What :class:`test_planner_tpcds.Check` reads of a pipeline, from a SparkPipeline."""

    def __init__(self, sp: spark_io.SparkPipeline) -> None:
        self.sp = sp

    @property
    def sources(self) -> tuple[str, ...]:
        return self.sp.sources

    def read(self, name: str) -> pa.Table:
        return self.sp.read(name).toArrow()


def frame(spark: SparkSession, table: pa.Table, folder: Path, name: str) -> DataFrame:
    """``table`` as a DataFrame over a Parquet file (exact types; read by the driver)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.parquet"
    pq.write_table(table, path)
    return spark.read.parquet(str(path))


def outputs(outs: dict[str, DataFrame]) -> dict[str, pa.Table]:
    return {o: df.toArrow() for o, df in outs.items()}


def run_on_spark(spark: SparkSession, n: int, tables: dict[str, pa.Table], root: Path
                 ) -> None:
    sql = official(n)
    srcs = sources_of(tables)
    name = f"q{n}"
    sp = spark_io.SparkPipeline.from_sql(spark, sql, srcs, state_dir=root / "state",
                                         shards=2, name=name)
    order = [o.column for o in plan(sql, srcs, name=name).order_by]
    check = Check(SparkView(sp), name, sql, order)  # type: ignore[arg-type]
    paths = tpcds.tables(SF, sp.sources)
    try:
        current = {s: tables[s] for s in sp.sources}
        check.integrated.add(outputs(sp.populate({s: str(paths[s]) for s in sp.sources})))
        for i, (s, rows) in enumerate(SEEDS[n](current, np.random.default_rng(1000 + n))
                                      if n in SEEDS else []):
            delta = frame(spark, q4.weighted(rows, 1), root / "seed", f"{i}-{s}")
            check.integrated.add(outputs(sp.apply(s, delta)))
            current[s] = pa.concat_tables([current[s], rows])
        check.nonempty = n in NONEMPTY
        check.check(current, "population")
        rng = np.random.default_rng(n)
        batch: dict[str, Any] = {}
        for s, delta, after in change_batch(current, list(sp.sources), rng):
            batch[s] = frame(spark, delta, root / "batch", s)
            current[s] = after
        assert any(s in FACTS for s in batch)
        check.integrated.add(outputs(sp.apply(batch)))  # every source in one operation
        check.check(current, "a change batch")
    finally:
        check.close()


@pytest.mark.parametrize("n", DEFAULT)
def test_tpcds_query_on_spark_equals_duckdb(spark: SparkSession, tmp_path: Path, n: int,
                                            all_tables: dict[str, pa.Table]) -> None:  # noqa: F811
    run_on_spark(spark, n, all_tables, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("n", MORE)
def test_tpcds_query_on_spark_equals_duckdb_slow(spark: SparkSession, tmp_path: Path, n: int,
                                                 all_tables: dict[str, pa.Table]  # noqa: F811
                                                 ) -> None:
    run_on_spark(spark, n, all_tables, tmp_path)
