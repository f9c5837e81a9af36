"""``python -m bench sparkjoin``: TPC-DS customer ⋈ store_sales three ways, side by side.

The one join a Spark user would otherwise write as a Spark Structured Streaming
stream-stream join, on the same Parquet, each run checked against DuckDB:

* **in-process**: ``population.populate`` into one StateStore, one writer, the output
  delta written to one Parquet file (the figure Spark must beat with two cores);
* **SparkJoin**: ``spark_io.SparkJoin.populate`` with ``shards`` shards on
  ``local[cores]`` (its output is Parquet written by the workers), once per ``--read``
  way (``files``: each task reads the Parquet files itself; ``shuffle``: Spark routes
  the rows; ``auto``: the library's rule); ``SparkJoin(...)`` itself (argument
  checks, the executor probe, which also starts one Python worker per core) is timed
  apart as "setup";
* **Spark Structured Streaming**: both tables as file-stream sources, an inner
  stream-stream join, the ``RocksDBStateStoreProvider``, ``trigger(availableNow=True)``,
  Parquet sink -- what a Spark user has without joinstate.

Then micro-batches, each the time of one ``availableNow`` run of a streaming query
over one checkpoint, for ``SparkJoin.foreach_batch_sink`` and for Spark's own join:
a run that finds no new file (no batch runs at all), an empty micro-batch (a new
Parquet file with no rows: the batch runs with nothing in it), and a small one
(``--micro-rows`` new sales).  Every output, micro-batches included, is compared with
DuckDB's join of the inputs as a multiset (a count and a row-hash sum per side of the
comparison).  SparkSession start is excluded from every figure; the load average is
recorded before each way.  Results: ``<out>/sparkjoin.json`` and ``.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

import joinstate
import population
from bench import tpcds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["run", "to_markdown"]

CUSTOMER_COLUMNS = ["c_customer_sk", "c_customer_id", "c_first_name", "c_last_name",
                    "c_birth_year", "c_email_address"]
SALES_COLUMNS = ["ss_customer_sk", "ss_item_sk", "ss_ticket_number", "ss_quantity",
                 "ss_net_paid"]
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _checksum(con: Any, relation: str, cols: list[str]) -> tuple[int, int]:
    """(rows, sum of a 64-bit hash of each row) of a DuckDB relation: a multiset digest."""
    row = con.execute(
        f"SELECT count(*), coalesce(sum(hash({', '.join(cols)}))::HUGEINT, 0) FROM {relation}"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def reference(customer: Path, sales: Path, extra: list[Path] | None = None) -> tuple[int, int]:
    """DuckDB's inner join of the inputs: (rows, row-hash sum)."""
    import duckdb

    con = duckdb.connect()
    try:
        files = [str(sales), *(str(p) for p in extra or [])]
        con.execute(f"CREATE VIEW s AS SELECT * FROM read_parquet({files!r})")
        con.execute(f"CREATE VIEW c AS SELECT * FROM read_parquet('{customer}')")
        con.execute("CREATE VIEW j AS SELECT * FROM c JOIN s ON c_customer_sk = ss_customer_sk")
        return _checksum(con, "j", CUSTOMER_COLUMNS + SALES_COLUMNS)
    finally:
        con.close()


def digest_parquet(paths: list[Path], weighted: bool) -> tuple[int, int]:
    """The same digest of Parquet output (``_weight`` rows expanded by their weight)."""
    import duckdb

    con = duckdb.connect()
    try:
        files = [str(p) for p in paths]
        con.execute(f"CREATE VIEW o AS SELECT * FROM read_parquet({files!r}, "
                    "union_by_name=true)")
        cols = CUSTOMER_COLUMNS + SALES_COLUMNS
        if weighted:
            row = con.execute(
                f"SELECT coalesce(sum(_weight), 0), coalesce(sum(hash({', '.join(cols)})::HUGEINT"
                " * _weight), 0) FROM o").fetchone()
            assert row is not None
            return int(row[0]), int(row[1])
        return _checksum(con, "o", cols)
    finally:
        con.close()


def _parquet_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if p.stat().st_size)


# ---- the three ways ------------------------------------------------------------------


def in_process(work: Path, customer: Path, sales: Path, strategy: str) -> dict[str, Any]:
    """One writer in this process; the output delta to one Parquet file."""
    path = work / "inproc"
    shutil.rmtree(path, ignore_errors=True)
    out_file = work / "inproc-out.parquet"
    writer: pq.ParquetWriter | None = None

    def sink(t: pa.Table) -> None:
        nonlocal writer
        if writer is None:
            writer = pq.ParquetWriter(out_file, t.schema)
        writer.write_table(t)

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with joinstate.StateStore(path) as store:
        join = store.join("cs", left=joinstate.Side(pq.read_schema(customer),
                                                    ["c_customer_sk"], ["c_customer_sk"]),
                          right=joinstate.Side(pq.read_schema(sales), ["ss_customer_sk"]))
        rep = population.populate(join, left=str(customer), right=str(sales),
                                  strategy=strategy, progress=False, sink=sink)
    if writer is not None:
        writer.close()
    wall = time.perf_counter() - t0
    shutil.rmtree(path, ignore_errors=True)
    return {"s": wall, "load_average": load, "strategy": rep.strategy.get("name"),
            "output_rows": rep.output_rows,
            "digest": digest_parquet([out_file], weighted=True)}


def spark_join(spark: SparkSession, work: Path, customer: Path, sales: Path, strategy: str,
               shards: int, micro_rows: int, read: str, micro: bool) -> dict[str, Any]:
    """SparkJoin.populate with ``read``; then, if ``micro``, foreachBatch micro-batches."""
    import spark_io

    state = work / f"sparkjoin-{read}"
    shutil.rmtree(state, ignore_errors=True)
    left = spark.read.parquet(str(customer))
    right = spark.read.parquet(str(sales))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    job = spark_io.SparkJoin(spark, "cs", left=left, right=right,
                             left_key=["c_customer_sk"], right_key=["ss_customer_sk"],
                             left_unique_key=["c_customer_sk"], state_dir=state,
                             shards=shards)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = job.populate(strategy, read=read)
    wall = time.perf_counter() - t0
    rep = job.last_report
    assert rep is not None
    files = [Path(p.replace("file://", "")) for p in out.inputFiles()]
    res: dict[str, Any] = {
        "s": wall, "setup_s": setup, "shards": shards, "read": read, "load_average": load,
        "strategy": rep.strategy,
        "jobs": [{"side": j.side, "s": round(j.seconds, 3),
                  "task_s": [round(t.seconds, 3) for t in sorted(j.shards,
                                                                key=lambda t: t.shard)],
                  "task_rows": [t.rows_in for t in sorted(j.shards, key=lambda t: t.shard)],
                  "task_cpu_s": [t.detail.get("process_cpu_s")
                                 for t in sorted(j.shards, key=lambda t: t.shard)],
                  "task_minor_faults": [t.detail.get("minor_faults")
                                        for t in sorted(j.shards, key=lambda t: t.shard)]}
                 for j in rep.jobs],
        "digest": digest_parquet(files, weighted=True)}
    if micro:
        sink = job.foreach_batch_sink("right", work / "sj-out")
        inside: list[float] = []

        def timed(batch: Any, batch_id: int) -> None:
            t = time.perf_counter()
            sink(batch, batch_id)
            inside.append(time.perf_counter() - t)

        res["micro"] = _micro_batches(
            spark, work / "sj-stream", customer, sales, micro_rows, files,
            lambda stream, ckpt: stream.writeStream.foreachBatch(timed).option(
                "checkpointLocation", str(ckpt)),
            work / "sj-out", inside)
    shutil.rmtree(state, ignore_errors=True)
    return res


def structured_streaming(spark: SparkSession, work: Path, customer: Path, sales: Path,
                         micro_rows: int) -> dict[str, Any]:
    """Spark's own stream-stream join with the RocksDB state store, availableNow."""
    root = work / "sss"
    shutil.rmtree(root, ignore_errors=True)
    cdir, sdir = root / "in-customer", root / "in-sales"
    cdir.mkdir(parents=True)
    sdir.mkdir(parents=True)
    os.symlink(customer, cdir / "part-0.parquet")
    os.symlink(sales, sdir / "part-0.parquet")
    c = spark.readStream.schema(spark.read.parquet(str(customer)).schema).parquet(str(cdir))
    s = spark.readStream.schema(spark.read.parquet(str(sales)).schema).parquet(str(sdir))
    joined = c.join(s, c["c_customer_sk"] == s["ss_customer_sk"])
    out, ckpt = root / "out", root / "checkpoint"

    def run_once() -> float:
        t0 = time.perf_counter()
        q = (joined.writeStream.format("parquet").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start(str(out)))
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"the streaming join failed: {q.exception()}")
        return time.perf_counter() - t0

    res: dict[str, Any] = {"load_average": os.getloadavg()[0], "s": run_once()}
    res["digest"] = digest_parquet(_parquet_files(out), weighted=False)
    micro: dict[str, Any] = {"idle_s": run_once()}
    extra = root / "extra.parquet"
    new = _new_sales(sales, micro_rows)
    pq.write_table(new.slice(0, 0), sdir / "part-1.parquet")
    micro["empty_s"] = run_once()
    pq.write_table(new, extra)
    shutil.copy(extra, sdir / "part-2.parquet")
    micro["small_s"] = run_once()
    micro["rows"] = micro_rows
    micro["digest"] = digest_parquet(_parquet_files(out), weighted=False)
    micro["want"] = reference(customer, sales, [extra])
    micro["ok"] = micro["digest"] == micro["want"]
    res["micro"] = micro
    shutil.rmtree(root, ignore_errors=True)
    return res


def _new_sales(sales: Path, n: int) -> pa.Table:
    """``n`` sales rows with fresh ticket numbers (new rows of existing customers)."""
    t = pq.read_table(sales).slice(0, n)
    i = t.schema.get_field_index("ss_ticket_number")
    return t.set_column(i, t.schema.field(i),
                        pa.array(range(10**9, 10**9 + t.num_rows), t.schema.field(i).type))


def _micro_batches(spark: SparkSession, root: Path, customer: Path, sales: Path, n: int,
                   populated: list[Path], writer: Any, out: Path, inside: list[float]
                   ) -> dict[str, Any]:
    """Through a foreachBatch sink: no new file, an empty file, then ``n`` new sales.

    The populate output (``populated``) plus every micro-batch output must equal
    DuckDB's join of the customers with all the sales.  ``inside`` collects the
    seconds spent in the sink per batch (the rest of a run is Spark's streaming).
    """
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    sdir = root / "in"
    sdir.mkdir(parents=True)
    new = _new_sales(sales, n + 1)
    first, more = root / "first.parquet", root / "more.parquet"
    pq.write_table(new.slice(0, 1), first)
    pq.write_table(new.slice(1), more)
    shutil.copy(first, sdir / "part-0.parquet")
    stream = spark.readStream.schema(spark.read.parquet(str(sdir)).schema).parquet(str(sdir))
    ckpt = root / "checkpoint"

    def run_once() -> float:
        t0 = time.perf_counter()
        q = writer(stream, ckpt).trigger(availableNow=True).start()
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"the foreachBatch stream failed: {q.exception()}")
        return time.perf_counter() - t0

    def in_sink(calls: int) -> float | None:
        """Seconds in the sink during the last run (None: Spark did not call it)."""
        return inside[-1] if len(inside) == calls + 1 else None

    res: dict[str, Any] = {"first_s": run_once()}  # one row: sets the stream up
    res["idle_s"] = run_once()
    pq.write_table(new.slice(0, 0), sdir / "part-1.parquet")
    calls = len(inside)
    res["empty_s"] = run_once()
    res["empty_sink_s"] = in_sink(calls)
    shutil.copy(more, sdir / "part-2.parquet")
    calls = len(inside)
    res["small_s"] = run_once()
    res["small_sink_s"] = in_sink(calls)
    res["sink_calls"] = len(inside)
    res["rows"] = n
    res["batches"] = sorted(p.name for p in out.iterdir())
    res["digest"] = digest_parquet(populated + _parquet_files(out), weighted=True)
    res["want"] = reference(customer, sales, [first, more])
    res["ok"] = res["digest"] == res["want"]
    return res


# ---- driver --------------------------------------------------------------------------


def run(sf: float = 1.0, *, shards: int = 2, cores: int = 2, strategy: str = "auto",
        micro_rows: int = 600, out: Path | None = None, workdir: Path | None = None,
        skip: tuple[str, ...] = (), reads: tuple[str, ...] = ("auto",)) -> dict[str, Any]:
    """Run every way that is not in ``skip`` (SparkJoin once per ``reads``); as a dict."""
    import spark_io

    paths = tpcds.tables(sf, ["customer", "store_sales"],
                         {"customer": CUSTOMER_COLUMNS, "store_sales": SALES_COLUMNS})
    customer, sales = paths["customer"], paths["store_sales"]
    want = reference(customer, sales)
    res: dict[str, Any] = {"suite": "sparkjoin", "sf": sf, "shards": shards, "cores": cores,
                           "strategy": strategy, "want": want,
                           "rows_in": pq.read_metadata(customer).num_rows
                           + pq.read_metadata(sales).num_rows,
                           "load_average_start": list(os.getloadavg())}
    work = Path(workdir or tempfile.mkdtemp(prefix="joinstate-sparkjoin-"))
    try:
        if "inproc" not in skip:
            r = in_process(work, customer, sales, strategy)
            r["ok"] = r["digest"] == want
            res["in_process"] = r
        t0 = time.perf_counter()
        spark = spark_io.local_session("joinstate-sparkjoin", cores, conf={
            "spark.sql.shuffle.partitions": str(shards),
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER})
        res["spark_start_s"] = time.perf_counter() - t0
        if "sparkjoin" not in skip:
            runs = []
            for i, read in enumerate(reads):
                r = spark_join(spark, work, customer, sales, strategy, shards, micro_rows,
                               read, micro=i == 0)
                r["ok"] = r["digest"] == want and r.get("micro", {}).get("ok", True)
                runs.append(r)
            res["spark_join"] = runs
        if "sss" not in skip:
            r = structured_streaming(spark, work, customer, sales, micro_rows)
            r["ok"] = r["digest"] == want and r["micro"]["ok"]
            res["structured_streaming"] = r
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    res["load_average_end"] = list(os.getloadavg())
    res["ok"] = (all(res[k]["ok"] for k in ("in_process", "structured_streaming") if k in res)
                 and all(r["ok"] for r in res.get("spark_join", [])))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sparkjoin.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "sparkjoin.md").write_text(to_markdown(res) + "\n")
    return res


def to_markdown(res: dict[str, Any]) -> str:
    """The side-by-side table."""
    rows_in = res["rows_in"]
    base = res.get("in_process", {}).get("s")
    lines = [f"# customer ⋈ store_sales at SF{res['sf']:g}: in-process, SparkJoin, "
             "Spark Structured Streaming", "",
             f"{rows_in:,} rows in, {res['want'][0]:,} out; local[{res['cores']}], "
             f"{res['shards']} shards; load average {res['load_average_start'][0]:.1f} at "
             f"the start, {res['load_average_end'][0]:.1f} at the end.", "",
             "| how | wall s | rows/s | vs in-process | load avg before | "
             "checked against DuckDB |",
             "|---|---|---|---|---|---|"]
    ways: list[tuple[str, dict[str, Any]]] = []
    if "in_process" in res:
        ways.append(("in-process, one writer", res["in_process"]))
    for r in res.get("spark_join", []):
        jobs = " + ".join(f"{j['side']} {j['s']:.1f} s{_tasks_note(j)}" for j in r["jobs"])
        ways.append((f"SparkJoin.populate, {r['shards']} shards, read={r['read']} "
                     f"(jobs: {jobs}; setup {r['setup_s']:.1f} s apart)", r))
    if "structured_streaming" in res:
        ways.append(("Spark Structured Streaming join (RocksDB)", res["structured_streaming"]))
    for label, r in ways:
        rel = f"{r['s'] / base:.2f}x" if base else "-"
        load = r.get("load_average")
        lines.append(f"| {label} | {r['s']:.1f} | {rows_in / r['s']:,.0f} | {rel} | "
                     f"{'-' if load is None else f'{load:.1f}'} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    sjs, ss = res.get("spark_join", []), res.get("structured_streaming")
    if sjs and ss:
        best = min(r["s"] for r in sjs)
        lines += ["", f"SparkJoin is {ss['s'] / best:.1f}x faster than Spark's own join."]
    micro = next((r["micro"] for r in sjs if "micro" in r), None)
    if micro and ss:
        lines += ["", "| micro-batch run | SparkJoin foreachBatch s | Structured Streaming s |",
                  "|---|---|---|",
                  f"| no new file (no batch) | {micro['idle_s']:.2f} | "
                  f"{ss['micro']['idle_s']:.2f} |",
                  f"| empty micro-batch (a file of 0 rows) | {micro['empty_s']:.2f} "
                  f"({_sink_note(micro['empty_sink_s'])}) | {ss['micro']['empty_s']:.2f} |",
                  f"| {micro['rows']} new sales | {micro['small_s']:.2f} "
                  f"({_sink_note(micro['small_sink_s'])}) | {ss['micro']['small_s']:.2f} |",
                  f"| checked against DuckDB | {'yes' if micro['ok'] else 'NO'} | "
                  f"{'yes' if ss['micro']['ok'] else 'NO'} |"]
    return "\n".join(lines)


def _tasks_note(job: dict[str, Any]) -> str:
    """`` (tasks 3.1/3.3 s, CPU 2.9/3.1 s)``: the slower task sets the job's time."""
    secs, cpus = job.get("task_s") or [], job.get("task_cpu_s") or []
    if not secs:
        return ""
    note = f" (tasks {'/'.join(f'{x:.1f}' for x in secs)} s"
    if cpus and all(c is not None for c in cpus):
        note += f", CPU {'/'.join(f'{c:.1f}' for c in cpus)} s"
    return note + ")"


def _sink_note(seconds: float | None) -> str:
    return "sink not called" if seconds is None else f"in the sink {seconds:.3f}"
