"""SparkJoin's fast paths hold the same contract as the shuffle (test_spark_join.py).

* ``populate(read="files")``: each task reads the snapshots' Parquet files itself; the
  output equals Spark's own join (NULL keys, duplicate rows, an IntegerType key against
  a LongType key, every column type of ``sparkdata``), pyarrow reads the files as Spark
  does (INT96 and millisecond timestamps included), a population killed midway resumes
  exactly, and the ``"auto"`` rule falls back to the shuffle where it must.
* Small changes collected and cut by shard on the driver, and large ones routed by
  the shuffle: the output equals Spark's join, an ``op_id`` applies once, a change
  whose tasks died after committing is completed exactly once by the same ``op_id``.
* Empty changes run no job (a provably empty plan) or only the probe.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparkdata import (
    CUSTOMER,
    CUSTOMER_COLS,
    OUT_COLS,
    SALES,
    SALES_COLS,
    add,
    apply_to,
    changes_df,
    customer,
    customers,
    df,
    mutate,
    new_sale,
    sales,
    spark_join,
    via_spark,
    zset,
)

import population
import spark_io
import spark_io.job
import spark_io.routing
from joinstate import Side
from spark_io._direct import DirectPopulateTask, shard_tables
from spark_io._worker import ApplyTask
from spark_io.frames import parquet_files
from spark_io.manifest import Manifest
from spark_io.routing import ShardRouter
from spark_io.types import arrow_schema

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

    from joinstate import SideName

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]



def parquet_of(spark: SparkSession, rows: Counter[Row], schema: str, path: Path,
               files: int = 3) -> DataFrame:
    """``rows`` written by Spark as ``files`` Parquet files, read back as a plain scan."""
    df(spark, rows, schema).repartition(files).write.parquet(str(path))
    return spark.read.parquet(str(path))


def make_job(spark: SparkSession, root: Path, left: DataFrame, right: DataFrame, *,
             how: str = "inner", shards: int = 2) -> spark_io.SparkJoin:
    return spark_io.SparkJoin(
        spark, "cs", left=left, right=right, left_key=["c_customer_sk"],
        right_key=["ss_customer_sk"], how=how, state_dir=root / "state", shards=shards)


def jobs_run(spark: SparkSession, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def check_state(spark: SparkSession, job: spark_io.SparkJoin, left: Counter[Row],
                right: Counter[Row]) -> None:
    assert zset(job.state("left"), CUSTOMER_COLS) == via_spark(spark, left, CUSTOMER,
                                                                CUSTOMER_COLS)
    assert zset(job.state("right"), SALES_COLS) == via_spark(spark, right, SALES, SALES_COLS)


# ---- populate(read="files") ------------------------------------------------------------------


def test_files_are_read_as_spark_reads_them(spark: SparkSession, tmp_path: Path) -> None:
    """Every column type of the customer rows, as Spark writes them (INT96 timestamps)
    and as pyarrow writes them (millisecond timestamps, large strings): the rows a
    task reads equal the rows Spark delivers."""
    rng = random.Random(41)
    rows = Counter(customers(rng, 80))
    written = parquet_of(spark, rows, CUSTOMER, tmp_path / "spark-written")
    from_spark = written.toArrow()
    by_arrow = tmp_path / "arrow-written"
    by_arrow.mkdir()
    table = from_spark.cast(from_spark.schema.set(
        from_spark.schema.get_field_index("c_name"), pa.field("c_name", pa.large_string())))
    pq.write_table(table, by_arrow / "part-0.parquet", coerce_timestamps="ms",
                   allow_truncated_timestamps=False)
    manifest = Manifest("m", 1, Side(arrow_schema(written.schema), key=["c_customer_sk"]),
                        Side(arrow_schema(df(spark, Counter(), SALES).schema),
                             key=["ss_customer_sk"]))
    for frame in (written, spark.read.parquet(str(by_arrow))):
        files, why = parquet_files(frame, CUSTOMER_COLS, "left")
        assert files is not None, why
        assert files.rows == rows.total()
        got = pa.concat_tables(shard_tables(files, ShardRouter(manifest, "left"), 0))
        want = frame.select(*CUSTOMER_COLS).toArrow().cast(got.schema)
        assert sorted(map(repr, got.to_pylist())) == sorted(map(repr, want.to_pylist()))

    # What pyarrow would read differently, or what is no plain scan, is refused by name.
    refused = [
        (written.filter("c_customer_sk > 3"), "its plan is a Filter"),
        (written.withColumn("c_score", written.c_score * 2), "computes a column"),
        (df(spark, rows, CUSTOMER), "not a file scan"),
    ]
    for frame, reason in refused:
        files, why = parquet_files(frame, CUSTOMER_COLS, "left")
        assert files is None and why.startswith("left: ") and reason in why, why
    parted = tmp_path / "partitioned"
    df(spark, rows, CUSTOMER).write.partitionBy("c_flag").parquet(str(parted))
    files, why = parquet_files(spark.read.parquet(str(parted)), CUSTOMER_COLS, "left")
    assert files is None and "partition columns" in why


@pytest.mark.parametrize("how", ["inner", pytest.param("left", marks=pytest.mark.slow)])
def test_files_populate_then_apply_matches_spark_join(spark: SparkSession, tmp_path: Path,
                                                      how: str) -> None:
    rng = random.Random(42 if how == "inner" else 43)
    left, right = Counter(customers(rng, 120)), Counter(sales(rng, 900, 140))
    job = make_job(spark, tmp_path, parquet_of(spark, left, CUSTOMER, tmp_path / "c"),
                   parquet_of(spark, right, SALES, tmp_path / "s"), how=how, shards=3)
    group = f"populate-{how}"
    spark.sparkContext.setJobGroup(group, "files populate")
    out = job.populate()
    assert jobs_run(spark, group) == 1  # no counting job, no routing: one task per shard
    total = zset(out, OUT_COLS)
    assert total == spark_join(spark, left, right, how)
    report = job.last_report
    assert report is not None and [j.side for j in report.jobs] == ["both"]
    assert sorted(s.shard for s in report.jobs[0].shards) == [0, 1, 2]
    assert {s.detail["read"] for s in report.jobs[0].shards} == {"files"}
    # what each task cost its worker, to tell a straggler from a skewed shard
    assert all(s.detail["process_cpu_s"] > 0 and s.detail["minor_faults"] > 0
               for s in report.jobs[0].shards)
    assert report.rows_in == left.total() + right.total()
    assert {r["phase"] for r in job.shard_summary()} == {"live"}
    assert job.manifest.populating is None and job.manifest.populated == report.operation

    rounds: list[tuple[SideName, Any]] = [("left", customer), ("right", new_sale),
                                          ("left", customer)]
    for side, make in rounds:
        current = left if side == "left" else right
        changes = mutate(rng, current, make, 160)
        delta = job.apply(side, changes_df(spark, changes, CUSTOMER if side == "left"
                                           else SALES))
        total = add(total, zset(delta, OUT_COLS))
        if side == "left":
            left = apply_to(left, changes)
        else:
            right = apply_to(right, changes)
        assert total == spark_join(spark, left, right, how), f"after {side} changes"
    check_state(spark, job, left, right)


def test_files_population_killed_midway_resumes_exactly(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard's Python worker dies (os._exit) at its third output file; a plain
    populate() refuses, populate(resume=True) finishes: output and state exactly Spark's,
    and the shards did resume from their markers."""
    rng = random.Random(44)
    left, right = Counter(customers(rng, 60)), Counter(sales(rng, 1200, 70))
    job = make_job(spark, tmp_path, parquet_of(spark, left, CUSTOMER, tmp_path / "c"),
                   parquet_of(spark, right, SALES, tmp_path / "s"), how="left")
    run_job = spark_io.SparkJoin._run_job  # noqa: SLF001 (the test wraps the job runner)

    def small_batches(die: bool) -> Any:
        def runner(self: spark_io.SparkJoin, frame: Any, task: Any, side: str) -> Any:
            if not isinstance(task, DirectPopulateTask):
                return run_job(self, frame, task, side)
            task = dataclasses.replace(task, batch_rows=40)  # many batches per shard
            if not die:
                return run_job(self, frame, task, side)

            def dies_midway(shards: Iterator[Any]) -> Iterator[pa.RecordBatch]:
                import spark_io._worker as worker

                real, written = worker._BatchFiles.write, []  # noqa: SLF001

                def write(files: Any, table: pa.Table, batch: Any) -> None:
                    written.append(batch)
                    if len(written) == 3:
                        os._exit(1)  # the worker dies: nothing is cleaned up
                    real(files, table, batch)

                worker._BatchFiles.write = write  # type: ignore[assignment]  # noqa: SLF001
                try:
                    yield from task(shards)
                finally:
                    worker._BatchFiles.write = real  # type: ignore[method-assign]  # noqa: SLF001

            return run_job(self, frame, dies_midway, side)

        return runner

    monkeypatch.setattr(spark_io.SparkJoin, "_run_job", small_batches(die=True))
    with pytest.raises(Exception, match=r"(?i)crash|exit|worker|fail"):
        job.populate()
    assert job.manifest.populating is not None
    assert job.manifest.populating["read"] == "files"
    monkeypatch.setattr(spark_io.SparkJoin, "_run_job", small_batches(die=False))
    with pytest.raises(spark_io.PopulationStateError, match=r"resume=True"):
        job.populate()
    out = job.populate(resume=True)
    assert zset(out, OUT_COLS) == spark_join(spark, left, right, "left")
    report = job.last_report
    assert report is not None
    resumed = [s.detail["resumed"] for s in report.jobs[0].shards]
    assert all(r.get("right", {}).get("batches", 0) >= 1 for r in resumed), resumed
    monkeypatch.undo()
    check_state(spark, job, left, right)
    assert {r["phase"] for r in job.shard_summary()} == {"live"}


def test_files_populate_commits_checkpoints(spark: SparkSession, tmp_path: Path) -> None:
    """Shards populated by the files read are checkpointed and committed like any job:
    with every working copy lost, the next apply restores them and stays exact."""
    rng = random.Random(49)
    left, right = Counter(customers(rng, 40)), Counter(sales(rng, 300, 50))
    job = spark_io.SparkJoin(
        spark, "cs", left=parquet_of(spark, left, CUSTOMER, tmp_path / "c"),
        right=parquet_of(spark, right, SALES, tmp_path / "s"), left_key=["c_customer_sk"],
        right_key=["ss_customer_sk"], how="left", state_dir=tmp_path / "state", shards=2,
        checkpoint_uri=tmp_path / "durable", local_dir=tmp_path / "local")
    total = zset(job.populate(), OUT_COLS)
    assert job.last_report is not None and [j.side for j in job.last_report.jobs] == ["both"]
    assert set(job.manifest.checkpoints) == {"shard-00000", "shard-00001"}
    shutil.rmtree(tmp_path / "local")  # a new executor, a wiped disk: no working copy
    changes = mutate(rng, right, new_sale, 50)
    total = add(total, zset(job.apply("right", changes_df(spark, changes, SALES)), OUT_COLS))
    report = job.last_report
    assert report is not None
    assert {s.detail["checkpoint"]["sync"] for j in report.jobs for s in j.shards} == {
        "restored"}
    right = apply_to(right, changes)
    assert total == spark_join(spark, left, right, "left")
    check_state(spark, job, left, right)


def test_read_rule_and_refusals(spark: SparkSession, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` shuffles snapshots that are not files, and files beyond
    DIRECT_MAX_SHARDS; ``read="files"`` on a filtered scan fails before anything runs."""
    rng = random.Random(45)
    left, right = Counter(customers(rng, 40)), Counter(sales(rng, 300, 50))
    cfiles = parquet_of(spark, left, CUSTOMER, tmp_path / "c")
    sfiles = parquet_of(spark, right, SALES, tmp_path / "s")
    expected = spark_join(spark, left, right, "left")

    job = make_job(spark, tmp_path / "a", cfiles.filter("c_customer_sk >= 0"), sfiles,
                   how="left")
    with pytest.raises(population.PopulationError, match=r"read='files'.*Filter"):
        job.populate(read="files")
    with pytest.raises(population.PopulationError, match=r"read="):
        job.populate(read="direct")
    assert job.manifest.populating is None  # refused before anything was recorded

    monkeypatch.setattr(spark_io.job, "DIRECT_MAX_SHARDS", 1)
    job = make_job(spark, tmp_path / "b", cfiles, sfiles, how="left")
    out = job.populate()
    report = job.last_report
    assert report is not None and [j.side for j in report.jobs] == ["left", "right"]
    assert zset(out, OUT_COLS) == expected

    job = make_job(spark, tmp_path / "c", cfiles, sfiles, how="left")
    out = job.populate(read="files")  # explicit: the shard count does not matter
    assert job.last_report is not None and [j.side for j in job.last_report.jobs] == ["both"]
    assert zset(out, OUT_COLS) == expected


# ---- apply: collected on the driver, or shuffled ---------------------------------------------


@pytest.mark.parametrize("route", ["collect", "shuffle"])
def test_apply_is_exactly_once_on_either_route(spark: SparkSession, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               route: str) -> None:
    """Changes match Spark's join; an op_id applies once; tasks that die after their
    push committed (the job fails) leave nothing applied on any shard (they are rolled
    back), and the same op_id then applies the change exactly once."""
    if route == "shuffle":
        monkeypatch.setattr(spark_io.routing, "COLLECT_MAX_ROWS", 0)
    rng = random.Random(46 if route == "collect" else 47)
    left, right = Counter(customers(rng, 50)), Counter(sales(rng, 300, 60))
    job = make_job(spark, tmp_path, df(spark, left, CUSTOMER), df(spark, right, SALES),
                   shards=3)
    total = zset(job.populate(), OUT_COLS)

    changes = mutate(rng, right, new_sale, 60)
    group = f"apply-{route}"
    spark.sparkContext.setJobGroup(group, "apply")
    out = job.apply("right", changes_df(spark, changes, SALES), op_id="once")
    if route == "collect":
        assert jobs_run(spark, group) == 2  # the probe and the apply, nothing else
    first = zset(out, OUT_COLS)
    right = apply_to(right, changes)
    total = add(total, first)
    assert total == spark_join(spark, left, right, "inner")
    again = job.apply("right", changes_df(spark, changes, SALES), op_id="once")
    assert zset(again, OUT_COLS) == first
    report = job.last_report
    assert report is not None
    assert report.replayed_shards == sum(len(j.shards) for j in report.jobs) > 0

    import spark_io.job as sj

    run_job = sj.run_job  # the test wraps the job runner

    def dies_after_commit(spark_: Any, frame: Any, task: Any, side: str) -> Any:
        if not isinstance(task, ApplyTask):
            return run_job(spark_, frame, task, side)

        def task_dies(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for report in task(batches):
                os._exit(1)  # committed and written; the report never reaches the driver
                yield report

        return run_job(spark_, frame, task_dies, side)

    changes = mutate(rng, left, customer, 60)
    monkeypatch.setattr(sj, "run_job", dies_after_commit)
    with pytest.raises(spark_io.SparkJobError, match=r"(?i)crash|exit|worker|fail") as err:
        job.apply("left", changes_df(spark, changes, CUSTOMER), op_id="killed")
    notes = getattr(err.value, "__notes__", [])
    assert any("op_id='killed'" in n for n in notes)
    assert any("rolled back" in n for n in notes)
    check_state(spark, job, left, right)  # nothing of it was applied on any shard
    monkeypatch.setattr(sj, "run_job", run_job)
    out = job.apply("left", changes_df(spark, changes, CUSTOMER), op_id="killed")
    report = job.last_report
    assert report is not None and report.replayed_shards == 0
    left = apply_to(left, changes)
    total = add(total, zset(out, OUT_COLS))
    assert total == spark_join(spark, left, right, "inner")
    check_state(spark, job, left, right)


def test_empty_changes_run_no_apply_job(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(48)
    left, right = Counter(customers(rng, 30)), Counter(sales(rng, 100, 40))
    job = make_job(spark, tmp_path, df(spark, left, CUSTOMER), df(spark, right, SALES))
    job.populate()
    changes = changes_df(spark, mutate(rng, left, customer, 40), CUSTOMER)

    spark.sparkContext.setJobGroup("known-empty", "apply")
    out = job.apply("left", changes.limit(0))
    assert jobs_run(spark, "known-empty") == 0  # the optimizer proved it empty: no job
    assert job.last_report is not None and job.last_report.jobs == ()
    assert out.count() == 0

    spark.sparkContext.setJobGroup("found-empty", "apply")
    out = job.apply("left", changes.filter("c_customer_sk > 1000000"))
    assert jobs_run(spark, "found-empty") == 1  # the probe finds no row; nothing to apply
    assert job.last_report is not None and job.last_report.jobs == ()
    assert out.count() == 0

    sink = job.foreach_batch_sink("left", tmp_path / "sink")
    spark.sparkContext.setJobGroup("empty-batch", "sink")
    sink(changes.limit(0), 0)
    # A micro-batch of a source without data: an RDD of no partitions.
    sink(spark.createDataFrame(spark.sparkContext.emptyRDD(), changes.schema), 1)
    assert jobs_run(spark, "empty-batch") == 0
    for batch in (0, 1):
        batch_dir = tmp_path / "sink" / f"batch_id={batch}"
        assert [p.name for p in batch_dir.iterdir()] == ["_joinstate_report.json"]
    check_state(spark, job, left, right)
