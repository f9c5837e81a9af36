"""What the driver of a SparkPipeline operation does, and does not, ask of Spark.

* A small change that scans Parquet files is read by the driver itself; building a
  Spark projection of it (a py4j call per column and an analysis in the JVM, 0.1-0.4 s
  for q4's five sources) is left to the changes Spark must evaluate.  Both routes give
  the same answer, and a change with a wrong column type is refused before any job.
* Each stage's tasks carry only the part of the change that stage reads: a stage fed by
  exchanges alone ships none of the change's rows.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_io
from bench import q4
from joinstate import SchemaMismatchError
from joinstate.testing import compare
from planner.distribute import plan_distribution
from planner.stats import given
from spark_io.dag import ChangeRef, OperationSpec, stage_tasks
from spark_io.manifest import ShardStorage
from spark_io.stagerun import PlanRef, to_ipc

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

SQL = """
    SELECT c.region, count(*) AS n, sum(o.amount) AS total
    FROM orders o JOIN customers c ON o.customer_id = c.id
    GROUP BY c.region
"""

CUSTOMERS = pa.table({"id": pa.array(range(40), pa.int64()),
                      "region": pa.array([f"r{i % 5}" for i in range(40)])})


def _orders(start: int, n: int) -> pa.Table:
    return pa.table({"oid": pa.array(range(start, start + n), pa.int64()),
                     "customer_id": pa.array([i * 7 % 40 for i in range(start, start + n)],
                                             pa.int64()),
                     "amount": pa.array([i % 13 + 1 for i in range(start, start + n)],
                                        pa.int64())})


def _frame(spark: SparkSession, table: pa.Table, path: Path) -> DataFrame:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return spark.read.parquet(str(path))


def _view_now(orders: pa.Table) -> pa.Table:
    con = duckdb.connect()
    try:
        con.register("orders", orders)
        con.register("customers", CUSTOMERS)
        return con.execute(SQL).to_arrow_table()
    finally:
        con.close()


def test_parquet_change_needs_no_spark_projection(spark: SparkSession, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    orders = _orders(0, 200)
    sp = spark_io.SparkPipeline.from_sql(
        spark, SQL, {"orders": _frame(spark, orders, tmp_path / "in" / "orders.parquet"),
                     "customers": _frame(spark, CUSTOMERS, tmp_path / "in" / "c.parquet")},
        state_dir=tmp_path / "state", shards=2, name="per_region")
    sp.populate()
    new = _orders(200, 30)
    gone = orders.slice(0, 20)
    change = pa.concat_tables([q4.weighted(gone, -1), q4.weighted(new, 1)])
    frame = _frame(spark, change, tmp_path / "in" / "change.parquet")
    frame_class = type(frame)
    projections: list[int] = []
    real_select = frame_class.select

    def counted(self: DataFrame, *cols: Any) -> DataFrame:
        projections.append(len(cols))
        return real_select(self, *cols)

    monkeypatch.setattr(frame_class, "select", counted)
    sp.apply("orders", frame)
    assert projections == [], "a Parquet scan change was projected through Spark"
    orders = pa.concat_tables([orders.slice(20), new])

    # A change Spark must evaluate (not a plain Parquet scan) is projected, and agrees.
    more = _orders(230, 10)
    built = spark.createDataFrame(q4.weighted(more, 1).to_pandas())
    sp.apply("orders", built)
    assert projections, "a change Spark evaluates is projected to the source's columns"
    orders = pa.concat_tables([orders, more])
    monkeypatch.undo()

    want = _view_now(orders)
    got = sp.read("per_region").toArrow().rename_columns(want.column_names)
    assert compare(got, want)["ok"]

    # The column types are still checked before anything runs.
    bad = spark.createDataFrame([(1, "x", 5, 1)], "oid long, customer_id string, "
                                "amount long, _weight long")
    with pytest.raises(SchemaMismatchError, match="customer_id"):
        sp.apply("orders", bad)
    assert compare(sp.read("per_region").toArrow().rename_columns(want.column_names),
                   want)["ok"]


def test_each_stage_ships_only_the_change_it_reads(tmp_path: Path) -> None:
    graph = q4.define_q4(verified_keys=False)  # two stages
    rows = {"store_sales": 3_000_000, "catalog_sales": 1_500_000, "web_sales": 700_000,
            "customer": 100_000, "date_dim": 73_049}
    stats = {s: given(s, n, snapshot=True, unique_key=graph.sources[s].unique_key)
             for s, n in rows.items()}
    plan = plan_distribution(graph, stats, shards=2, name="q4")
    assert len(plan.stages) == 2
    assert not plan.stages[1].deliveries  # q4's second stage reads exchanges only
    sales = q4.weighted(pa.table({n: pa.nulls(2_000, f.type) for n, f in zip(
        graph.source_schema("store_sales").names, graph.source_schema("store_sales"),
        strict=True)}), 1)
    change = ChangeRef(tables={"store_sales": to_ipc(sales)}, rows={"store_sales": 2_000})
    spec = OperationSpec("q4", "op", "apply", str(tmp_path / "out"))
    tasks = stage_tasks(plan, PlanRef.of(plan), spec, ShardStorage(str(tmp_path / "s")),
                        None, change)
    assert [t.stage for t in tasks] == [0, 1]
    assert tasks[0].change.sources == ("store_sales",)
    assert tasks[1].change.sources == ()
    assert len(pickle.dumps(tasks[1].change)) < len(change.tables["store_sales"]) / 10
