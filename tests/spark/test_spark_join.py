"""SparkJoin end to end: populate, apply changes, compare with Spark's own join.

The contract: the running sum of every output DataFrame equals Spark's join of the
integrated inputs, and each side's state equals its integrated input, for inner and
left outer joins, with NULL keys, duplicate rows, and an IntegerType key on one side
against a LongType key on the other.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
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

import joinstate
import spark_io
from spark_io._worker import PopulateTask
from spark_io.manifest import shard_path
from spark_io.routing import ShardRouter, partition_keys

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark




def make_job(spark: SparkSession, tmp_path: Path, how: str, left: Counter, right: Counter,
             shards: int = 4) -> spark_io.SparkJoin:
    return spark_io.SparkJoin(
        spark, "customer_sales", left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
        left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how=how,
        state_dir=tmp_path / "state", shards=shards,
    )


def test_router_matches_core_shard_of(tmp_path: Path) -> None:
    """Executors route without a Join; they must agree with Join.shard_of, int32 vs int64."""
    ls = pa.schema([("k", pa.int32()), ("v", pa.string())])
    rs = pa.schema([("k", pa.int64())])
    manifest = spark_io.manifest.Manifest(
        "j", 7, joinstate.Side(ls, key=["k"]), joinstate.Side(rs, key=["k"]))
    keys = [*range(-50, 300), None]
    left = pa.table({"k": pa.array(keys, pa.int32()), "v": [str(k) for k in keys]})
    right = pa.table({"k": pa.array(keys, pa.int64())})
    with joinstate.StateStore(tmp_path / "s") as store:
        join = manifest.join(store)
        expected = join.shard_of("left", left, 7)
        assert (join.shard_of("right", right, 7) == expected).all()
    assert (ShardRouter(manifest, "left").shard_of(left)[:-1] == expected[:-1]).all()
    assert (ShardRouter(manifest, "right").shard_of(right)[:-1] == expected[:-1]).all()
    assert expected[-1] == 0  # the core sends a NULL key to shard 0 ...
    legacy = manifest.replace(partitioner=spark_io.manifest.PARTITIONER)
    assert (ShardRouter(legacy, "left").shard_of(left) == expected).all()  # ... old joins too


def test_null_key_rows_are_spread_by_their_values() -> None:
    """NULL-key rows spread over the shards; a row's shard is a function of its values.

    Equal rows in other representations (int32 vs int64, -0.0 vs 0.0, a large string,
    a _weight column, a decimal of another scale) go to the same shard, so a change to a
    row meets it; with a unique key, the unique key alone decides.
    """
    from decimal import Decimal

    schema = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("x", pa.float64()),
                        ("s", pa.string()), ("d", pa.decimal128(7, 2))])
    manifest = spark_io.manifest.Manifest(
        "j", 4, joinstate.Side(schema, key=["k"]), joinstate.Side(schema, key=["k"]))
    router = ShardRouter(manifest, "left")
    n = 4000
    rows = pa.table({"k": pa.nulls(n, pa.int64()), "n": pa.array(range(n), pa.int64()),
                     "x": [0.0] * n, "s": [f"row {i}" for i in range(n)],
                     "d": pa.array([Decimal(i) / 100 for i in range(n)], pa.decimal128(7, 2))})
    shards = router.shard_of(rows)
    counts = Counter(shards.tolist())
    assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > n / 4 * 0.85, counts
    assert (router.shard_of(rows) == shards).all()  # deterministic
    other = pa.table({"k": pa.nulls(n, pa.int32()), "n": pa.array(range(n), pa.int32()),
                      "x": [-0.0] * n, "s": pa.array([f"row {i}" for i in range(n)],
                                                      pa.large_string()),
                      "d": pa.array([Decimal(i) / 100 for i in range(n)],
                                    pa.decimal128(12, 4)),
                      "_weight": pa.array([-1] * n, pa.int64())})
    assert (router.shard_of(other) == shards).all()
    keyed = [r for r in range(n) if r % 3]  # NULL-key rows among keyed ones keep shards
    mixed = pa.concat_tables([rows.take(keyed).set_column(0, "k", pa.array(keyed, pa.int64())),
                              rows]).combine_chunks()
    assert (router.shard_of(mixed)[len(keyed):] == shards).all()
    unique = spark_io.manifest.Manifest(
        "j", 4, joinstate.Side(schema, key=["k"], unique_key=["n"]),
        joinstate.Side(schema, key=["k"]))
    changed = rows.set_column(3, "s", pa.array(["changed"] * n))
    by_key = ShardRouter(unique, "left")
    assert (by_key.shard_of(changed) == by_key.shard_of(rows)).all()


@pytest.mark.parametrize("shards", [1, 2, 4, 7, 8])
def test_partition_i_holds_shard_i(spark: SparkSession, shards: int) -> None:
    """The partition keys make Spark's hash partitioner the identity on shard numbers."""
    from pyspark.sql import functions as F

    keys = partition_keys(shards)
    got = spark.createDataFrame([(k,) for k in keys], "v long").select(
        F.pmod(F.hash("v"), F.lit(shards)).alias("p")).collect()
    assert [r.p for r in got] == list(range(shards))


@pytest.mark.parametrize("how", [pytest.param("inner", marks=pytest.mark.slow), "left"])
def test_populate_then_apply_matches_spark_join(spark: SparkSession, tmp_path: Path,
                                                how: str) -> None:
    rng = random.Random(4 if how == "inner" else 5)
    left, right = Counter(customers(rng)), Counter(sales(rng))
    job = make_job(spark, tmp_path, how, left, right)

    out = job.populate(strategy="auto")
    total = zset(out, OUT_COLS)
    assert total == spark_join(spark, left, right, how)
    report = job.last_report
    assert report is not None
    assert [j.side for j in report.jobs] == ["left", "right"]  # small side's job first
    assert report.rows_in == left.total() + right.total()
    assert {r["phase"] for r in job.shard_summary()} == {"live"}

    rounds = [
        ("left", lambda c: mutate(rng, c, customer, 200)),
        ("right", lambda c: mutate(rng, c, new_sale, 200)),
        ("right", lambda c: mutate(rng, c, new_sale, 200)),
        ("left", lambda c: mutate(rng, c, customer, 200)),
    ]
    for side, make in rounds:
        current = left if side == "left" else right
        changes = make(current)
        delta = job.apply(side, changes_df(spark, changes, CUSTOMER if side == "left"
                                           else SALES))
        total = add(total, zset(delta, OUT_COLS))
        if side == "left":
            left = apply_to(left, changes)
        else:
            right = apply_to(right, changes)
        assert total == spark_join(spark, left, right, how), f"after {side} changes"

    assert zset(job.state("left"), CUSTOMER_COLS) == via_spark(spark, left, CUSTOMER,
                                                                CUSTOMER_COLS)
    assert zset(job.state("right"), SALES_COLS) == via_spark(spark, right, SALES, SALES_COLS)


def test_output_dataframe_evaluates_once(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(6)
    left, right = Counter(customers(rng, 40)), Counter(sales(rng, 200, 50))
    job = make_job(spark, tmp_path, "inner", left, right)
    job.populate()
    changes = [(customer(rng, 5, "-new"), 1), (customer(rng, 99, "-new"), 1)]
    out = job.apply("left", changes_df(spark, changes, CUSTOMER))
    first = zset(out, OUT_COLS)
    assert out.count() == out.count() == sum(first.values())
    assert zset(out, OUT_COLS) == first
    assert zset(job.state("left"), CUSTOMER_COLS) == via_spark(
        spark, apply_to(left, changes), CUSTOMER, CUSTOMER_COLS)

    # The same op_id again: every shard returns its recorded output, nothing is re-applied.
    again = job.apply("left", changes_df(spark, changes, CUSTOMER), op_id="fixed-id")
    assert zset(again, OUT_COLS) == first  # applied now (first use of "fixed-id")
    replay = job.apply("left", changes_df(spark, changes, CUSTOMER), op_id="fixed-id")
    assert zset(replay, OUT_COLS) == first
    assert job.last_report is not None and job.last_report.replayed_shards >= 1
    expected = apply_to(apply_to(left, changes), changes)
    assert zset(job.state("left"), CUSTOMER_COLS) == via_spark(spark, expected, CUSTOMER,
                                                                CUSTOMER_COLS)


def test_open_reattaches_and_routes_identically(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(7)
    left, right = Counter(customers(rng, 60)), Counter(sales(rng, 300, 70))
    make_job(spark, tmp_path, "left", left, right, shards=3).populate()

    job = spark_io.SparkJoin.open(spark, "customer_sales", tmp_path / "state")
    assert (job.shards, job.how) == (3, "left")
    assert job.manifest.left.key == ("c_customer_sk",)
    changes = [(new_sale(rng, 10), 1), (new_sale(rng, 65), 1)]
    out = job.apply("right", changes_df(spark, changes, SALES))
    right2 = apply_to(right, changes)
    # Rows for existing keys found their customers: same routing as at population time.
    full = add(spark_join(spark, left, right, "left"), zset(out, OUT_COLS))
    assert full == spark_join(spark, left, right2, "left")

    with pytest.raises(spark_io.SparkIOError, match="snapshot"):
        job.populate()
    with pytest.raises(joinstate.JoinSpecMismatchError, match="shards"):
        make_job(spark, tmp_path, "left", left, right, shards=5)
    with pytest.raises(spark_io.ManifestError, match="no join"):
        spark_io.SparkJoin.open(spark, "other", tmp_path / "state")


def test_populate_runs_once(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(8)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 50, 25))
    job = make_job(spark, tmp_path, "inner", left, right, shards=2)
    job.populate()
    with pytest.raises(spark_io.PopulationStateError, match="populated already"):
        job.populate()
    again = make_job(spark, tmp_path, "inner", left, right, shards=2)  # same spec re-attaches
    with pytest.raises(spark_io.PopulationStateError):
        again.populate()


def test_shard_loaded_outside_population_is_refused(spark: SparkSession, tmp_path: Path
                                                    ) -> None:
    """A shard whose side holds rows that no population put there (no progress marker)."""
    rng = random.Random(12)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 50, 25))
    job = make_job(spark, tmp_path, "inner", left, right, shards=2)
    with joinstate.StateStore(shard_path(job.state_dir, 0)) as store:
        join = job.manifest.join(store)
        join.push("left", pa.Table.from_pylist([
            {"c_customer_sk": None, "c_name": "half", "c_birth": None, "c_balance": None,
             "c_flag": None, "c_seen": None, "c_score": None}],
            schema=job.manifest.left.schema))
    with pytest.raises(spark_io.PopulationStateError, match="no population ran on it"):
        job.populate()


def test_population_killed_midway_resumes_exactly(spark: SparkSession, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python workers loading the big side die (os._exit) after a few batches; the
    job fails, a plain populate() refuses, populate(resume=True) finishes the half-loaded
    shards: output and state exactly Spark's."""
    rng = random.Random(13)
    left, right = Counter(customers(rng, 60)), Counter(sales(rng, 1200, 70))
    job = make_job(spark, tmp_path, "left", left, right, shards=2)
    run_job = spark_io.SparkJoin._run_job  # noqa: SLF001 (the test wraps the job runner)

    def crashing(self: spark_io.SparkJoin, df: Any, task: Any, side: str) -> Any:
        if not (isinstance(task, PopulateTask) and task.final):
            return run_job(self, df, task, side)
        inner = task

        def dies_midway(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            def some(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for i, b in enumerate(batches):
                    if i == 4:
                        os._exit(1)  # the worker dies: nothing is cleaned up
                    yield b

            yield from inner(some(batches))

        return run_job(self, df, dies_midway, side)

    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    spark.conf.set(key, "40")  # many batches per shard
    try:
        monkeypatch.setattr(spark_io.SparkJoin, "_run_job", crashing)
        with pytest.raises(Exception, match=r"(?i)crash|exit|worker|fail"):
            job.populate()
        monkeypatch.undo()
        with pytest.raises(spark_io.PopulationStateError, match=r"resume=True"):
            job.populate()
        out = job.populate(resume=True)
    finally:
        spark.conf.set(key, "65536")
    assert zset(out, OUT_COLS) == spark_join(spark, left, right, "left")
    assert zset(job.state("left"), CUSTOMER_COLS) == via_spark(spark, left, CUSTOMER,
                                                                CUSTOMER_COLS)
    assert zset(job.state("right"), SALES_COLS) == via_spark(spark, right, SALES, SALES_COLS)
    report = job.last_report
    assert report is not None
    small_job, big_job = report.jobs
    assert all(s.replayed for s in small_job.shards)  # loaded before the crash: skipped
    resumed = [s.detail["resumed"] for s in big_job.shards]
    assert any(r.get("right", {}).get("batches", 0) >= 1 for r in resumed), resumed
    assert {r["phase"] for r in job.shard_summary()} == {"live"}


def test_second_writer_on_a_shard_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(9)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 50, 25))
    job = make_job(spark, tmp_path, "inner", left, right, shards=2)
    job.populate()
    changes = [(customer(rng, None, "-null"), 1)]  # a NULL key: its shard by its values
    target = int(ShardRouter(job.manifest, "left").shard_of(
        pa.Table.from_pylist([dict(zip(CUSTOMER_COLS, changes[0][0], strict=True))],
                             job.manifest.left.schema))[0])
    with joinstate.StateStore(shard_path(job.state_dir, target)), \
            pytest.raises(spark_io.ShardBusyError, match=rf"shard {target} .* already open"):
        job.apply("left", changes_df(spark, changes, CUSTOMER))
    assert isinstance(spark_io.ShardBusyError("x"), joinstate.StateLockedError)
    job.apply("left", changes_df(spark, changes, CUSTOMER))  # lock released: it works now
    assert zset(job.state("left"), CUSTOMER_COLS) == via_spark(
        spark, apply_to(left, changes), CUSTOMER, CUSTOMER_COLS)


def test_changes_are_checked_on_the_driver(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(10)
    left, right = Counter(customers(rng, 10)), Counter(sales(rng, 20, 10))
    job = make_job(spark, tmp_path, "inner", left, right, shards=2)
    bad = spark.createDataFrame([("x", 1, 2, 3.0)],
                                "ss_customer_sk string, ss_ticket long, ss_qty int, ss_paid double")
    with pytest.raises(joinstate.SchemaMismatchError, match="'ss_customer_sk' has type string"):
        job.apply("right", bad)
    short = spark.createDataFrame([(1, 1)], "ss_customer_sk long, ss_ticket long")
    with pytest.raises(joinstate.SchemaMismatchError, match="missing column 'ss_qty'"):
        job.apply("right", short)
    extra = spark.createDataFrame([(1, 2, 3, 4.0, 5)],
                                  "ss_customer_sk long, ss_ticket long, ss_qty int, "
                                  "ss_paid double, junk int")
    with pytest.raises(joinstate.SchemaMismatchError, match="junk"):
        job.apply("right", extra)
