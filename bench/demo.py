"""The demo: populate customer ⋈ sales, apply live changes, check the result with DuckDB.

What it shows, end to end on one machine:

1. population: ``population.populate`` loads customers (the small side, unique key)
   then sales (the big side) with the strategy it picks, steering RocksDB compaction;
   the output deltas are the initial join result;
2. live phase: a batch of customer updates (-old, +new) and a batch of sales deletes;
3. correctness: the sum of every output delta equals DuckDB's join of the final inputs
   (compared as multisets), and the store reopens with the same state.
"""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import joinstate
import population
from population.synthetic import CUSTOMER_SCHEMA, SALES_SCHEMA, customers, sales_batches

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["run_demo", "run_spark_demo"]


def _weighted(table: pa.Table, w: int) -> pa.Table:
    return table.append_column("_weight", pa.array(np.full(table.num_rows, w, np.int64)))


def _duckdb_mismatches(outputs: pa.Table, cust: pa.Table, sales: pa.Table) -> int:
    """Rows in the symmetric difference of (integrated outputs) and (DuckDB's join)."""
    import duckdb  # bench extra: the reference implementation

    con = duckdb.connect()
    con.register("outputs", outputs)
    con.register("customer", cust)
    con.register("store_sales", sales)
    cols = ", ".join(f'"{c}"' for c in outputs.column_names if c != "_weight")
    sql = f"""
        WITH got AS (
            SELECT {cols}, sum(_weight) AS w FROM outputs GROUP BY ALL HAVING sum(_weight) <> 0
        ), want AS (
            SELECT {cols}, count(*) AS w
            FROM customer JOIN store_sales ON c_customer_sk = ss_customer_sk GROUP BY ALL
        )
        SELECT count(*) FROM ((SELECT * FROM got EXCEPT SELECT * FROM want)
                              UNION ALL (SELECT * FROM want EXCEPT SELECT * FROM got))
    """
    row = con.execute(sql).fetchone()
    con.close()
    return int(row[0]) if row else -1


def _join(store: joinstate.StateStore) -> joinstate.Join:
    """Create (or re-attach to) the demo's join: customers unique on their key."""
    return store.join(
        "customer_sales",
        left=joinstate.Side(CUSTOMER_SCHEMA, key=["c_customer_sk"], unique_key=["c_customer_sk"]),
        right=joinstate.Side(SALES_SCHEMA, key=["ss_customer_sk"]),
    )


def run_demo(
    state_dir: Path, n_customers: int, n_sales: int, batch_rows: int, progress: bool = True
) -> int:
    """Run the demo; returns 0 if the result matches DuckDB, 1 otherwise."""
    shutil.rmtree(state_dir, ignore_errors=True)
    cust = customers(n_customers)
    sales = pa.Table.from_batches(list(sales_batches(n_sales, n_customers, batch_rows)))
    outputs: list[pa.Table] = []
    with joinstate.StateStore(state_dir) as store:
        join = _join(store)
        report = population.populate(
            join, left=cust, right=sales, strategy="auto", order="small-first",
            sink=outputs.append, progress=progress, batch_rows=batch_rows,
        )
        print(report.summary())

        # Live phase: 1% of customers change their last name; 1% of sales are deleted.
        rng = np.random.default_rng(42)
        upd_idx = rng.choice(n_customers, max(1, n_customers // 100), replace=False)
        old = cust.take(pa.array(upd_idx))
        new = old.set_column(3, "c_last_name",
                             pc.binary_join_element_wise(old["c_last_name"], "-renamed", ""))
        t3 = time.perf_counter()
        outputs.append(join.push("left", pa.concat_tables([_weighted(old, -1),
                                                           _weighted(new, 1)])))
        del_idx = rng.choice(n_sales, max(1, n_sales // 100), replace=False)
        outputs.append(join.push("right", _weighted(sales.take(pa.array(del_idx)), -1)))
        t4 = time.perf_counter()
        keep = np.ones(n_customers, bool)
        keep[upd_idx] = False
        cust_final = pa.concat_tables([cust.filter(pa.array(keep)), new])
        keep_s = np.ones(n_sales, bool)
        keep_s[del_idx] = False
        sales_final = sales.filter(pa.array(keep_s))
        print(f"live: {len(upd_idx):,} customer updates and {len(del_idx):,} sales deletes "
              f"in {t4 - t3:.2f}s")
        stats = join.stats()
        for side in ("left", "right"):
            st = stats[side]
            print(f"  {side:<5} layout={st['layout']:<4} rows={st['rows']:,} "
                  f"distinct_keys={st['distinct_keys']:,} bytes={st['bytes']:,}")
    with joinstate.StateStore(state_dir) as store:
        join = _join(store)
        reopened_rows = join.state("right").num_rows
    out = pa.concat_tables(outputs)
    bad = _duckdb_mismatches(out, cust_final, sales_final)
    ok = bad == 0 and reopened_rows == sales_final.num_rows
    print(f"check: integrated output vs DuckDB join -> {bad} mismatching rows; "
          f"state after reopen: {reopened_rows:,} sales rows -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def run_spark_demo(
    state_dir: Path, n_customers: int, n_sales: int, batch_rows: int, shards: int = 4,
    spark: Any = None,
) -> int:
    """The same demo driven from a local Spark session (``spark_io.SparkJoin``).

    Population runs as two Spark jobs (customers, then sales) over ``shards`` RocksDB
    shards; the live changes are two ``apply`` calls; the integrated output is checked
    against DuckDB like the in-process demo.
    """
    import pyarrow.parquet as pq

    import spark_io  # the spark extra; imported only in this mode

    shutil.rmtree(state_dir, ignore_errors=True)
    data = state_dir.parent / (state_dir.name + "-input")
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    cust = customers(n_customers)
    sales = pa.Table.from_batches(list(sales_batches(n_sales, n_customers, batch_rows)))
    pq.write_table(cust, data / "customer.parquet")
    pq.write_table(sales, data / "store_sales.parquet")
    rng = np.random.default_rng(42)
    upd_idx = rng.choice(n_customers, max(1, n_customers // 100), replace=False)
    old = cust.take(pa.array(upd_idx))
    new = old.set_column(3, "c_last_name",
                         pc.binary_join_element_wise(old["c_last_name"], "-renamed", ""))
    pq.write_table(pa.concat_tables([_weighted(old, -1), _weighted(new, 1)]),
                   data / "customer_changes.parquet")
    del_idx = rng.choice(n_sales, max(1, n_sales // 100), replace=False)
    pq.write_table(_weighted(sales.take(pa.array(del_idx)), -1), data / "sales_changes.parquet")

    own_session = spark is None
    if own_session:
        spark = spark_io.local_session("joinstate-demo")
    try:
        t0 = time.perf_counter()
        job = spark_io.SparkJoin(
            spark, "customer_sales",
            left=spark.read.parquet(str(data / "customer.parquet")),
            right=spark.read.parquet(str(data / "store_sales.parquet")),
            left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how="inner",
            state_dir=str(state_dir), shards=shards, left_unique_key=["c_customer_sk"],
        )
        frames = [job.populate(strategy="auto")]
        t1 = time.perf_counter()
        frames.append(job.apply("left", spark.read.parquet(str(data / "customer_changes.parquet"))))
        frames.append(job.apply("right", spark.read.parquet(str(data / "sales_changes.parquet"))))
        t2 = time.perf_counter()
        print(f"spark population: {n_customers:,} customers + {n_sales:,} sales into {shards} "
              f"shards in {t1 - t0:.2f}s; live: {len(upd_idx):,} customer updates and "
              f"{len(del_idx):,} sales deletes in {t2 - t1:.2f}s")
        out = pa.concat_tables([f.toArrow() for f in frames], promote_options="permissive")
    finally:
        if own_session:
            spark.stop()
    keep = np.ones(n_customers, bool)
    keep[upd_idx] = False
    keep_s = np.ones(n_sales, bool)
    keep_s[del_idx] = False
    bad = _duckdb_mismatches(out, pa.concat_tables([cust.filter(pa.array(keep)), new]),
                             sales.filter(pa.array(keep_s)))
    print(f"check: integrated Spark output vs DuckDB join -> {bad} mismatching rows -> "
          f"{'OK' if bad == 0 else 'FAILED'}")
    shutil.rmtree(data, ignore_errors=True)
    return 0 if bad == 0 else 1
