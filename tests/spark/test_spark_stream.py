"""Structured Streaming into a SparkJoin: ``foreachBatch`` applies each micro-batch once.

A file source of change batches feeds ``job.foreach_batch_sink``; the query runs with
``trigger(availableNow=True)`` several times over one checkpoint: again with no new
files (nothing happens), after the last batch's commit was lost (Spark replays that
batch id: the shards return the recorded output and apply nothing), and with a new file
(only the new batch is applied).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from sparkdata import (
    OUT_COLS,
    SALES,
    SALES_COLS,
    add,
    apply_to,
    customers,
    df,
    mutate,
    sale,
    sales,
    spark_join,
    zset,
)

import spark_io

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark



def write_batch(spark: SparkSession, src: Path, n: int, changes: list) -> None:
    frame = spark.createDataFrame([(*r, w) for r, w in changes], SALES + ", _weight long")
    frame.coalesce(1).write.parquet(str(src / f"batch-{n:03d}"))


def run_query(spark: SparkSession, job: spark_io.SparkJoin, src: Path, out: Path,
              checkpoint: Path) -> None:
    stream = (spark.readStream.schema(SALES + ", _weight long")
              .option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
              .parquet(str(src)))
    query = (stream.writeStream.foreachBatch(job.foreach_batch_sink("right", out))
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None


def outputs(spark: SparkSession, out: Path) -> Counter:
    return zset(spark.read.parquet(str(out)), OUT_COLS)


def test_stream_applies_each_batch_once(spark: SparkSession, tmp_path: Path) -> None:
    from sparkdata import CUSTOMER

    rng = random.Random(11)
    left, right = Counter(customers(rng, 80)), Counter(sales(rng, 400, 90))
    job = spark_io.SparkJoin(
        spark, "stream_join", left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
        left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how="inner",
        state_dir=tmp_path / "state", shards=4,
    )
    initial = zset(job.populate(), OUT_COLS)
    src, out, ckpt = tmp_path / "src", tmp_path / "out", tmp_path / "ckpt"
    src.mkdir()

    def new_sale(r: random.Random, sk: int | None) -> tuple:
        return sale(r, sk, r.randrange(10**7, 10**8))

    for n in range(3):
        changes = mutate(rng, right, new_sale, 90, n=8)
        write_batch(spark, src, n, changes)
        right = apply_to(right, changes)
    run_query(spark, job, src, out, ckpt)
    assert sorted(p.name for p in out.iterdir()) == [f"batch_id={i}" for i in range(3)]
    expected = spark_join(spark, left, right, "inner")
    assert add(Counter(initial), outputs(spark, out)) == expected
    state = zset(job.state("right"), SALES_COLS)
    assert state == right

    # Same checkpoint, no new files: no batch runs, nothing changes.
    job2 = spark_io.SparkJoin.open(spark, "stream_join", tmp_path / "state")
    run_query(spark, job2, src, out, ckpt)
    assert job2.last_report is None
    assert zset(job2.state("right"), SALES_COLS) == state

    # The commit of batch 2 is lost (a crash after the sink ran): Spark replays batch 2.
    before = zset(spark.read.parquet(str(out / "batch_id=2")), OUT_COLS)
    for name in ("2", ".2.crc"):
        (ckpt / "commits" / name).unlink(missing_ok=True)
    run_query(spark, job2, src, out, ckpt)
    report = job2.last_report
    assert report is not None and report.operation.endswith("-2")
    assert report.replayed_shards == len(report.jobs[0].shards) > 0
    assert zset(spark.read.parquet(str(out / "batch_id=2")), OUT_COLS) == before
    assert zset(job2.state("right"), SALES_COLS) == state
    assert add(Counter(initial), outputs(spark, out)) == expected

    # A new file: only batch 3 is applied.
    changes = mutate(rng, right, new_sale, 90, n=5)
    write_batch(spark, src, 3, changes)
    right = apply_to(right, changes)
    run_query(spark, job2, src, out, ckpt)
    assert job2.last_report is not None and job2.last_report.operation.endswith("-3")
    assert job2.last_report.replayed_shards == 0
    assert add(Counter(initial), outputs(spark, out)) == spark_join(spark, left, right, "inner")
    assert zset(job2.state("right"), SALES_COLS) == right
