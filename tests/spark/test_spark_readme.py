"""README example 2 (a SQL view on Spark) runs as printed, and its answers are DuckDB's.

The code blocks of examples 1 (for ``sql``) and 2 are taken from README.md itself and
run in a directory holding ``orders/`` and ``customers/`` Parquet, with ``/data/`` put
under the test's directory, ``changes_df`` a change of two orders and
``order_changes_stream`` a file stream of one more change.  After the stream's
micro-batch, ``view.read("revenue")`` must equal DuckDB's answer on the changed tables,
and so must the population's output plus every change set returned or written.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks(section: str) -> list[str]:
    """The python code blocks of README section ``section`` (a heading's start)."""
    text = README.read_text()
    start = text.index(section)
    end = text.find("\n### ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def test_readme_spark_example_runs_and_answers_as_duckdb(spark: SparkSession,
                                                         tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    (ex1,) = blocks("### 1. A SQL view in your Python process")
    (ex2,) = blocks("### 2. The same view on Spark")
    sql = re.search(r'sql = """(.*?)"""', ex1, re.S)
    assert sql is not None
    customers = pa.table({"id": pa.array([10, 11, 12], pa.int64()),
                          "region": ["north", "south", "north"]})
    orders = pa.table({"order_id": pa.array([1, 2, 3], pa.int64()),
                       "customer_id": pa.array([10, 11, 12], pa.int64()),
                       "amount": [5.0, 7.5, 1.25]})
    (tmp_path / "orders").mkdir()
    (tmp_path / "customers").mkdir()
    pq.write_table(orders, tmp_path / "orders" / "part-0.parquet")
    pq.write_table(customers, tmp_path / "customers" / "part-0.parquet")
    change = pa.table({"order_id": pa.array([4, 1], pa.int64()),
                       "customer_id": pa.array([11, 10], pa.int64()),
                       "amount": [2.0, 5.0], "_weight": pa.array([1, -1], pa.int64())})
    streamed = pa.table({"order_id": pa.array([5], pa.int64()),
                         "customer_id": pa.array([12], pa.int64()), "amount": [3.0],
                         "_weight": pa.array([1], pa.int64())})
    (tmp_path / "stream").mkdir()
    pq.write_table(streamed, tmp_path / "stream" / "part-0.parquet")
    code = (ex2.replace("/data/", f"{tmp_path}/data/")
            .replace('"orders/"', f'"{tmp_path}/orders/"')
            .replace('"customers/"', f'"{tmp_path}/customers/"')
            .replace("spark = spark_io.local_session()", "spark = spark_session"))
    assert code.count(str(tmp_path)) >= 5  # the example's paths all moved
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        pq.write_table(change, tmp_path / "change.parquet")
        env: dict[str, Any] = {
            "sql": sql.group(1), "spark_session": spark,
            "changes_df": spark.read.parquet(str(tmp_path / "change.parquet")),
            "order_changes_stream": spark.readStream.schema(
                spark.read.parquet(str(tmp_path / "change.parquet")).schema).parquet(
                    str(tmp_path / "stream"))}
        exec(compile(code, "README.md example 2", "exec"), env)
        query = env["query"]
        query.processAllAvailable()
        query.stop()
    finally:
        os.chdir(cwd)
    view = env["view"]
    con = duckdb.connect()
    try:
        final = pa.table({"order_id": pa.array([2, 3, 4, 5], pa.int64()),
                          "customer_id": pa.array([11, 12, 11, 12], pa.int64()),
                          "amount": [7.5, 1.25, 2.0, 3.0]})
        con.register("orders", final)
        con.register("customers", customers)
        want = Counter(tuple(r) for r in con.execute(sql.group(1)).fetchall())
    finally:
        con.close()
    assert Counter(tuple(r) for r in view.read("revenue").collect()) == want
    total: Counter[tuple[Any, ...]] = Counter()
    outs = [view.populate(resume=True)["revenue"], env["changed"]["revenue"],
            spark.read.parquet(str(tmp_path / "data" / "out" / "revenue"))]
    for df in outs:
        cols = [c for c in df.columns if c not in ("_weight", "batch_id")]
        for r in df.collect():
            total[tuple(r[c] for c in cols)] += r["_weight"]
    assert +total == want
