"""``python -m bench spark``: population driven from Spark ``mapInArrow`` workers.

The same synthetic data (``population/synthetic.py``: customers with a unique key vs
store_sales) is loaded twice in one run:

* **in-process**: ``population.populate`` into one StateStore in this process, output
  deltas written to one Parquet file;
* **Spark**: the data as Parquet-backed DataFrames, ``spark_io.SparkJoin.populate`` into
  2 and 8 shards on ``local[2]`` (two jobs: small side, then big side; the output
  written to Parquet by the workers).

Both run the same strategy name, and both include writing the output, so the ratio
``spark wall / in-process wall`` is the overhead of Spark (JVM round trips, Arrow
serialisation, the shuffle that routes rows to shards, per-task store opening) net of
whatever the second core wins back.  A small change set (new sales rows) is also
applied both ways, to show the fixed cost of a live ``apply`` job.  SparkSession start
is reported separately and excluded from the rates.

Results: ``bench-results/spark-<stamp>.json`` and ``.md``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

import joinstate
import population
from population import synthetic as syn

if TYPE_CHECKING:
    from collections.abc import Sequence


def _sides() -> tuple[joinstate.Side, joinstate.Side]:
    return (joinstate.Side(syn.CUSTOMER_SCHEMA, key=["c_customer_sk"],
                           unique_key=["c_customer_sk"]),
            joinstate.Side(syn.SALES_SCHEMA, key=["ss_customer_sk"]))


def write_data(data: Path, n_small: int, n_big: int, files: int, batch_rows: int
               ) -> dict[str, Path]:
    """Customers in one file, sales over ``files`` files (so Spark reads in parallel)."""
    shutil.rmtree(data, ignore_errors=True)
    (data / "customers").mkdir(parents=True)
    (data / "sales").mkdir(parents=True)
    (data / "changes").mkdir(parents=True)
    pq.write_table(syn.customers(n_small), data / "customers" / "part-0.parquet",
                   row_group_size=batch_rows)
    per_file = -(-n_big // files)
    writers = [pq.ParquetWriter(data / "sales" / f"part-{i}.parquet", syn.SALES_SCHEMA)
               for i in range(files)]
    done = 0
    for batch in syn.sales_batches(n_big, n_small, batch_rows):
        writers[min(done // per_file, files - 1)].write_batch(batch)
        done += batch.num_rows
    for w in writers:
        w.close()
    return {"customers": data / "customers", "sales": data / "sales",
            "changes": data / "changes"}


def change_set(n_changes: int, n_small: int, n_big: int) -> pa.Table:
    """``n_changes`` new sales rows (inserts) as a change set with ``_weight``."""
    t = syn.sales(n_changes, n_small, seed=99, first_ticket=n_big)
    return t.append_column("_weight", pa.array([1] * t.num_rows, pa.int64()))


def in_process(work: Path, paths: dict[str, Path], strategy: str, n_small: int, n_big: int,
               changes: pa.Table, batch_rows: int) -> dict[str, Any]:
    """Populate one store in this process; write the output to Parquet; apply changes."""
    path = work / "inproc"
    shutil.rmtree(path, ignore_errors=True)
    left = pq.read_table(paths["customers"])
    sales_files = sorted(paths["sales"].iterdir())

    def sales() -> Any:
        for f in sales_files:
            yield from pq.ParquetFile(f).iter_batches(batch_size=batch_rows)

    out_path = work / "inproc-output.parquet"
    with joinstate.StateStore(path / "store") as store:
        ls, rs = _sides()
        join = store.join("bench", left=ls, right=rs)
        writer = pq.ParquetWriter(out_path, join.output_schema)
        t = time.perf_counter()
        rep = population.populate(join, left, sales(), strategy=strategy,
                                  order="small-first", sink=writer.write_table,
                                  progress=False, sizes={"left": n_small, "right": n_big},
                                  batch_rows=batch_rows)
        report = {"driver": "population", "strategy": rep.strategy.get("name"),
                  "reason": rep.reason, "output_rows": rep.output_rows}
        writer.close()
        wall = time.perf_counter() - t
        t = time.perf_counter()
        delta = join.push("right", changes)
        apply_wall = time.perf_counter() - t
    return {"mode": "in-process", "shards": 1, "wall": wall, "rows": n_small + n_big,
            "rows_per_s": (n_small + n_big) / wall, "output_rows": report["output_rows"],
            "strategy": report["strategy"], "detail": report,
            "apply_rows": changes.num_rows, "apply_wall": apply_wall,
            "apply_output_rows": delta.num_rows}


def with_spark(spark: Any, work: Path, paths: dict[str, Path], strategy: str, shards: int,
               n_small: int, n_big: int, changes_path: Path) -> dict[str, Any]:
    """Populate ``shards`` shards from Spark; then apply the change set as one job."""
    import spark_io

    state = work / f"spark-{shards}"
    shutil.rmtree(state, ignore_errors=True)
    customers = spark.read.parquet(str(paths["customers"]))
    sales = spark.read.parquet(str(paths["sales"]))
    job = spark_io.SparkJoin(spark, "bench", left=customers, right=sales,
                             left_key=["c_customer_sk"], right_key=["ss_customer_sk"],
                             left_unique_key=["c_customer_sk"], state_dir=state,
                             shards=shards)
    t = time.perf_counter()
    out = job.populate(strategy=strategy)
    wall = time.perf_counter() - t
    rep = job.last_report
    assert rep is not None
    out_rows = out.count()
    strategies = sorted({
        str(s.detail.get("strategy", {}).get("name") if isinstance(s.detail.get("strategy"),
                                                                   dict)
            else s.detail.get("strategy"))
        for j in rep.jobs for s in j.shards
    })
    t = time.perf_counter()
    delta = job.apply("right", spark.read.parquet(str(changes_path)))
    apply_wall = time.perf_counter() - t
    apply_rows = delta.count()
    return {"mode": "spark", "shards": shards, "wall": wall, "rows": n_small + n_big,
            "rows_per_s": (n_small + n_big) / wall, "output_rows": out_rows,
            "strategy": ",".join(strategies),
            "jobs": {j.side: round(j.seconds, 3) for j in rep.jobs},
            # Seconds inside the workers' shard loops (store open, populate, output file):
            # the rest of a job's wall time is Spark (scan, routing, shuffle, scheduling).
            "worker_max_s": {j.side: round(max((s.seconds for s in j.shards), default=0), 3)
                             for j in rep.jobs},
            "worker_sum_s": {j.side: round(sum(s.seconds for s in j.shards), 3)
                             for j in rep.jobs},
            "control_and_driver": round(wall - sum(j.seconds for j in rep.jobs), 3),
            "apply_wall": apply_wall, "apply_output_rows": apply_rows}


def table(rows: list[dict[str, Any]], base: float, base_apply: float) -> str:
    """Markdown: one line per run, overhead relative to the in-process driver."""
    lines = ["| mode | shards | wall s | rows/s | Spark / in-process | small job s | "
             "big job s | output rows | strategy | apply s (x in-process) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        jobs = r.get("jobs", {})
        small = jobs.get("left", "")
        big = jobs.get("right", "")
        lines.append(
            f"| {r['mode']} | {r['shards']} | {r['wall']:.2f} | {r['rows_per_s']:,.0f} | "
            f"{r['wall'] / base:.2f}x | {small} | {big} | {r['output_rows']:,} | "
            f"{r['strategy']} | {r['apply_wall']:.2f} ({r['apply_wall'] / base_apply:.0f}x) |"
        )
    return "\n".join(lines)


def _warm_up(spark: Any, work: Path, strategy: str, batch_rows: int) -> None:
    """A throwaway run on tiny data: JVM code paths, Python workers and their imports.

    Without it the first measured run pays about 3 s of one-off start-up (measured).
    """
    tiny = write_data(work / "warm-data", 1_000, 10_000, 2, batch_rows)
    pq.write_table(change_set(100, 1_000, 10_000), tiny["changes"] / "part-0.parquet")
    with_spark(spark, work / "warm", tiny, strategy, 2, 1_000, 10_000, tiny["changes"])


def run_benchmark(*, small: int = 100_000, large: int = 1_000_000,
                  shards: Sequence[int] = (2, 8), cores: str = "2", strategy: str = "auto",
                  changes: int = 20_000, files: int = 4, batch_rows: int = 65_536,
                  out: Path = Path("bench-results"), keep: bool = False) -> int:
    """Run the in-process driver and the Spark driver on the same data; write results.

    What ``joinstate bench spark`` runs: ``small`` customers x ``large`` sales in
    ``files`` Parquet files, Spark at each of ``shards`` on ``local[cores]``, then a
    change set of ``changes`` new sales applied both ways.  Returns the exit status (0).
    """
    out.mkdir(parents=True, exist_ok=True)
    work = (out / "spark-work").resolve()
    work.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    print(f"data: {small:,} customers x {large:,} sales", flush=True)
    paths = write_data(work / "data", small, large, files, batch_rows)
    change_table = change_set(changes, small, large)
    pq.write_table(change_table, paths["changes"] / "part-0.parquet")

    rows = []
    print("in-process ...", flush=True)
    base = in_process(work, paths, strategy, small, large, change_table, batch_rows)
    rows.append(base)
    print(f"  {base['wall']:.2f} s, {base['rows_per_s']:,.0f} rows/s", flush=True)

    import spark_io

    t = time.perf_counter()
    spark = spark_io.local_session("joinstate-bench", cores=cores)
    session_start = time.perf_counter() - t
    try:
        (work / "warm").mkdir(exist_ok=True)
        _warm_up(spark, work, strategy, batch_rows)
        for n_shards in shards:
            print(f"spark, {n_shards} shards ...", flush=True)
            r = with_spark(spark, work, paths, strategy, n_shards, small, large,
                           paths["changes"])
            rows.append(r)
            print(f"  {r['wall']:.2f} s, {r['rows_per_s']:,.0f} rows/s, jobs {r['jobs']}, "
                  f"slowest worker {r['worker_max_s']}", flush=True)
            if r["output_rows"] != base["output_rows"]:
                raise SystemExit(f"output rows differ: spark {r['output_rows']} vs "
                                 f"in-process {base['output_rows']}")
    finally:
        spark.stop()

    md = [f"# Spark population benchmark {stamp}", "",
          f"{small:,} customers (unique key) x {large:,} sales, strategy "
          f"`{strategy}`, local[{cores}]; SparkSession start {session_start:.1f} s "
          "(not included). Apply: one change set of "
          f"{changes:,} new sales rows.", "",
          table(rows, base["wall"], base["apply_wall"]), ""]
    results = {"started": stamp, "small": small, "large": large,
               "cores": cores, "strategy": strategy,
               "session_start_s": session_start, "runs": rows}
    (out / f"spark-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
    (out / f"spark-{stamp}.md").write_text("\n".join(md))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(md))
    print(f"wrote {out / f'spark-{stamp}.json'} and .md")
    return 0
