"""Spark operations are all-or-nothing and exactly-once, on both drivers.

An operation (``apply``, a micro-batch) is recorded on the driver, with a digest of the
whole change, before any task runs; a reused operation id with another change is
refused before anything is written, wherever its rows would go (one shard, several,
none).  A failure in any shard (or any stage) leaves every shard as it was, byte for
byte; a second driver object writing after another one is refused; a task's error
reaches the driver as the library's one-line error, without a failed Spark task.

Shard stores are compared through their bytes (every column family, every key), read
in this process between operations, so no Spark job is needed to check them.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: pipeline_oracle

import pipeline_oracle as po
from sparkdata import (
    CUSTOMER,
    OUT_COLS,
    SALES,
    SALES_COLS,
    add,
    apply_to,
    changes_df,
    customers,
    df,
    sales,
    spark_join,
    zset,
)
from test_spark_pipeline import (
    SS,
    Twin,
    check,
    definition_of,
    integrate,
    small_outputs,
    snapshot,
    spark_frame,
    store_sale,
)

import joinstate
import spark_io
from spark_io.routing import ShardRouter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
UNDO = b"undo\x00"


# ---- helpers -------------------------------------------------------------------------------


def store_bytes(root: Path) -> dict[str, dict[str, dict[bytes, bytes]]]:
    """Every key and value of every shard store under ``root``, per family.

    Undo records are left out: those of committed operations are dropped lazily, by
    the next task that opens the store, so they come and go with no change of state.
    """
    import rocksdict as rd

    out: dict[str, dict[str, dict[bytes, bytes]]] = {}
    for current in sorted(root.rglob("CURRENT")):
        path = current.parent
        names = [n for n in rd.Rdict.list_cf(str(path), rd.Options(raw_mode=True))]
        db = rd.Rdict(str(path), rd.Options(raw_mode=True),
                      column_families={n: rd.Options(raw_mode=True) for n in names
                                       if n != "default"},
                      access_type=rd.AccessType.read_only(False))
        try:
            families: dict[str, dict[bytes, bytes]] = {}
            for name in names:
                cf = db.get_column_family(name)
                families[name] = {k: v for k, v in cf.items()
                                  if not (name == "__meta__" and k.startswith(UNDO))}
                del cf
            out[str(path.relative_to(root))] = families
        finally:
            db.close()
            del db
    return out


def join_job(spark: SparkSession, root: Path, left: Counter[Row], right: Counter[Row],
             **kw: Any) -> spark_io.SparkJoin:
    return spark_io.SparkJoin(
        spark, "cs", left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
        left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how="left",
        state_dir=root / "state", **{"shards": 4, **kw})


def sales_by_shard(job: spark_io.SparkJoin, rng: random.Random, n: int = 40
                   ) -> dict[int, list[Row]]:
    """New sales (fresh tickets) grouped by the shard the join routes them to."""
    rows = [(rng.randrange(60), 10**7 + rng.randrange(10**6), 1, 1.5) for _ in range(n)]
    table = pa.Table.from_pylist(
        [dict(zip(job.manifest.right.schema.names, r, strict=True)) for r in rows],
        schema=job.manifest.right.schema)
    out: dict[int, list[Row]] = {}
    for r, s in zip(rows, ShardRouter(job.manifest, "right").shard_of(table).tolist(),
                    strict=True):
        out.setdefault(int(s), []).append(r)
    return out


def pipeline_sales_by_shard(sp: spark_io.SparkPipeline, rng: random.Random, n: int = 40
                            ) -> dict[int, list[Row]]:
    """New store sales grouped by the shard of the first stage that indexes them."""
    rows = [store_sale(rng, rng.randrange(12)) for _ in range(n)]
    rows = [r for r in rows if r[0] is not None]
    first = sp.plan.deliveries_of("store_sales")[0]
    table = po.make_delta(SS.schema, [(r, 1) for r in rows]).drop_columns(["_weight"])
    shards = sp.plan.route(first.partitioning, table)
    assert shards is not None, "store_sales is copied to every shard: no shard of its own"
    out: dict[int, list[Row]] = {}
    for r, s in zip(rows, shards.tolist(), strict=True):
        out.setdefault(int(s), []).append(r)
    return out


def failing_stage(stage: int, error: BaseException, mark: Path | None = None) -> Any:
    """A stand-in for :class:`spark_io.dag.StageTask` whose tasks of ``stage`` raise
    ``error`` (a class local to this function: Spark pickles it by value).  The tasks of
    other stages that end leave a file ``stage<k>-shard<i>`` in ``mark``."""
    import spark_io.dag as dag

    real = dag.StageTask

    class Failing:
        def __init__(self, *a: Any) -> None:
            self.task = real(*a)

        def __call__(self, shard: int, records: Any) -> Any:
            if self.task.stage == stage:
                raise error
            yield from self.task(shard, records)
            if mark is not None:
                (mark / f"stage{self.task.stage}-shard{shard}").touch()

    return Failing


class JoinCase:
    """A SparkJoin with its integrated inputs and output (the oracle: Spark's join)."""

    def __init__(self, spark: SparkSession, root: Path, **kw: Any) -> None:
        rng = random.Random(61)
        self.spark, self.root, self.rng = spark, root, rng
        self.left, self.right = Counter(customers(rng, 40)), Counter(sales(rng, 160, 50))
        self.job = join_job(spark, root, self.left, self.right, **kw)
        self.total = zset(self.job.populate(), OUT_COLS)
        self.by_shard = sales_by_shard(self.job, rng)

    def frame(self, rows: list[tuple[Row, int]]) -> DataFrame:
        return changes_df(self.spark, rows, SALES)

    def apply(self, rows: list[tuple[Row, int]], **kw: Any) -> DataFrame:
        out = self.job.apply("right", self.frame(rows), **kw)
        self.total = add(self.total, zset(out, OUT_COLS))
        self.right = apply_to(self.right, rows)
        return out

    def check(self) -> None:
        assert self.total == spark_join(self.spark, self.left, self.right, "left")


class PipelineCase:
    """A SparkPipeline (a join stage, then an aggregate stage) and its in-process twin."""

    def __init__(self, spark: SparkSession, root: Path, **kw: Any) -> None:
        rng = random.Random(62)
        self.spark, self.root, self.rng = spark, root, rng
        self.outputs = small_outputs()
        snap = snapshot(rng)
        self.twin = Twin(root / "twin", self.outputs)
        self.sp = spark_io.SparkPipeline(spark, definition_of(self.outputs), root / "state",
                                         **{"shards": 4, **kw})
        self.got: dict[str, Counter[Row]] = {o: Counter() for o in self.outputs}
        frames = {s: spark_frame(spark, self.twin.sources[s], list(snap[s].items()))
                  for s in ("customer", "store_sales")}
        integrate(self.got, self.sp.populate(frames), self.outputs)
        for s in ("customer", "store_sales"):
            self.twin.push(s, list(snap[s].items()))
        self.current = Counter(snap["store_sales"])
        self.by_shard = pipeline_sales_by_shard(self.sp, rng)

    def frame(self, rows: list[tuple[Row, int]]) -> DataFrame:
        return spark_frame(self.spark, SS, rows)

    def apply(self, rows: list[tuple[Row, int]], **kw: Any) -> dict[str, DataFrame]:
        outs = self.sp.apply("store_sales", self.frame(rows), **kw)
        integrate(self.got, outs, self.outputs)
        self.twin.push("store_sales", rows)
        self.current = po.zadd(self.current, po.consolidate(rows))
        return outs

    def check(self) -> None:
        check(self.got, self.twin, "pipeline")

    def close(self) -> None:
        self.twin.close()


def pick(by_shard: dict[int, list[Row]], shards: list[int], n: int = 1) -> list[Row]:
    return [r for s in shards for r in by_shard[s][:n]]


# ---- item: an op id is checked against the whole change -------------------------------------


def test_join_op_id_reused_with_another_change_is_refused_everywhere(
        spark: SparkSession, tmp_path: Path) -> None:
    case = JoinCase(spark, tmp_path)
    shards = sorted(case.by_shard)
    assert len(shards) == 4
    a = pick(case.by_shard, [shards[0]])
    b = pick(case.by_shard, [shards[1]], 2)[1:]
    several = pick(case.by_shard, shards[:3])
    for rows_a, rows_b, op in ((a, b, "one"), (several, several[:-1], "several"),
                               ([], a, "none-first"), (a[:0] + b, [], "none-second")):
        first = case.apply([(r, 1) for r in rows_a], op_id=op)
        before = store_bytes(tmp_path / "state")
        with pytest.raises(joinstate.CommitConflictError, match=op):
            case.job.apply("right", case.frame([(r, 1) for r in rows_b]), op_id=op)
        assert store_bytes(tmp_path / "state") == before, op
        # The same change under the same id: the recorded output, nothing applied again.
        again = case.job.apply("right", case.frame([(r, 1) for r in rows_a]), op_id=op)
        assert zset(again, OUT_COLS) == zset(first, OUT_COLS)
        assert store_bytes(tmp_path / "state") == before, op
    case.check()


def test_pipeline_op_id_reused_with_another_change_is_refused_everywhere(
        spark: SparkSession, tmp_path: Path) -> None:
    case = PipelineCase(spark, tmp_path)
    try:
        shards = sorted(case.by_shard)
        assert len(shards) >= 3
        a = pick(case.by_shard, [shards[0]])
        b = pick(case.by_shard, [shards[1]])
        several = pick(case.by_shard, shards[:3])
        for rows_a, rows_b, op in ((a, b, "one"), (several, several[:-1], "several"),
                                   ([], a, "none-first"), (b, [], "none-second")):
            first = case.apply([(r, 1) for r in rows_a], op_id=op)
            before = store_bytes(tmp_path / "state")
            with pytest.raises(joinstate.CommitConflictError, match=op):
                case.sp.apply("store_sales", case.frame([(r, 1) for r in rows_b]), op_id=op)
            assert store_bytes(tmp_path / "state") == before, op
            again = case.sp.apply("store_sales", case.frame([(r, 1) for r in rows_a]),
                                  op_id=op)
            for o in case.outputs:
                names = case.outputs[o].schema.names
                assert zset(again[o], names) == zset(first[o], names)
            assert store_bytes(tmp_path / "state") == before, op
        case.check()
    finally:
        case.close()


# ---- item: all shards or none --------------------------------------------------------------


@pytest.mark.parametrize("checkpointed", [False, True], ids=["shared", "checkpoints"])
def test_join_error_in_one_shard_leaves_every_shard_untouched(
        spark: SparkSession, tmp_path: Path, checkpointed: bool) -> None:
    kw: dict[str, Any] = {}
    if checkpointed:
        kw = {"checkpoint_uri": tmp_path / "durable", "local_dir": tmp_path / "local"}
    case = JoinCase(spark, tmp_path, **kw)
    shards = sorted(case.by_shard)
    good = pick(case.by_shard, shards, 2)

    def state() -> Any:
        return (zset(case.job.state("right"), SALES_COLS) if checkpointed
                else store_bytes(tmp_path / "state"))

    before = state()
    # A NULL weight in a change spread over every shard: refused before any task runs.
    nulls = changes_df(spark, [(r, 1) for r in good[:-1]], SALES).union(
        spark.createDataFrame([(*good[-1], None)], SALES + ", _weight long"))
    with pytest.raises(joinstate.SchemaMismatchError, match="_weight"):
        case.job.apply("right", nulls, op_id="nulls")
    assert case.job.last_report is None or case.job.last_report.operation != "nulls"
    # A weight that is not an integer is refused too, naming the column.
    floats = spark.createDataFrame([(*r, 1.0) for r in good], SALES + ", _weight double")
    with pytest.raises(joinstate.SchemaMismatchError, match="_weight"):
        case.job.apply("right", floats)
    # A retraction of a row that is not there, in the last shard only: nothing applied.
    missing = (case.by_shard[shards[-1]][-1], -1)
    with pytest.raises(joinstate.OverRetractionError):
        case.job.apply("right", case.frame([(r, 1) for r in good] + [missing]),
                       op_id="bad")
    assert state() == before
    # The same id with the corrected change applies it, once.
    case.apply([(r, 1) for r in good], op_id="bad")
    case.check()


@pytest.mark.parametrize("checkpointed", [False, True], ids=["shared", "checkpoints"])
def test_pipeline_error_in_one_shard_leaves_every_shard_untouched(
        spark: SparkSession, tmp_path: Path, checkpointed: bool) -> None:
    kw: dict[str, Any] = {}
    if checkpointed:
        kw = {"checkpoint_uri": str(tmp_path / "durable"), "local_dir": tmp_path / "local"}
    case = PipelineCase(spark, tmp_path, **kw)
    try:
        shards = sorted(case.by_shard)
        good = pick(case.by_shard, shards, 2)
        before = None if checkpointed else store_bytes(tmp_path / "state")
        nulls = case.frame([(r, 1) for r in good[:-1]]).union(
            spark.createDataFrame([(*good[-1], None)], case.frame([]).schema))
        with pytest.raises(joinstate.SchemaMismatchError, match="_weight"):
            case.sp.apply("store_sales", nulls)
        missing = ((shards[-1], 6, 9, Decimal("1.23")), -1)
        bad = case.frame([(r, 1) for r in good] + [missing])
        with pytest.raises(joinstate.OverRetractionError):
            case.sp.apply("store_sales", bad, op_id="bad")
        if before is not None:
            assert store_bytes(tmp_path / "state") == before
        case.apply([(r, 1) for r in good], op_id="bad")
        case.check()
    finally:
        case.close()


def test_pipeline_failure_in_a_later_stage_rolls_back_the_earlier_ones(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The join stage commits on every shard, then the aggregate stage's tasks fail (in
    the same Spark job): the join stage's shards are rolled back too."""
    import spark_io.dag as dag

    case = PipelineCase(spark, tmp_path)
    try:
        assert len(case.sp.plan.stages) == 2
        shards = sorted(case.by_shard)
        rows = [(r, 1) for r in pick(case.by_shard, shards, 2)]
        before = store_bytes(tmp_path / "state")
        monkeypatch.setattr(dag, "StageTask", failing_stage(1, joinstate.StateIOError(
            "injected: the aggregate stage's disk is gone")))
        with pytest.raises(joinstate.StateIOError, match="injected"):
            case.sp.apply("store_sales", case.frame(rows), op_id="two-stages")
        assert store_bytes(tmp_path / "state") == before
        monkeypatch.undo()
        case.apply(rows, op_id="two-stages")
        case.check()
    finally:
        case.close()


# ---- item: one writer per state_dir --------------------------------------------------------


def test_a_second_driver_object_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(63)
    left, right = Counter(customers(rng, 30)), Counter(sales(rng, 80, 35))
    kw = {"checkpoint_uri": tmp_path / "durable", "local_dir": tmp_path / "local",
          "shards": 2}
    first = join_job(spark, tmp_path, left, right, **kw)
    first.populate()
    second = spark_io.SparkJoin.open(spark, "cs", tmp_path / "state",
                                     local_dir=tmp_path / "local")
    change = [((3, 10**8, 1, 2.5), 1)]
    first.apply("right", changes_df(spark, change, SALES))
    with pytest.raises(spark_io.WriterConflictError, match=r"SparkJoin\.open"):
        second.apply("right", changes_df(spark, [((4, 10**8 + 1, 1, 2.5), 1)], SALES))
    want = zset(df(spark, apply_to(right, change), SALES), SALES_COLS)
    assert zset(first.state("right"), SALES_COLS) == want

    # Two pipelines on one state_dir that both populate: the second is refused.
    outputs = small_outputs()
    snap = snapshot(rng)
    twin = Twin(tmp_path / "twin", outputs)
    try:
        frames = {s: spark_frame(spark, twin.sources[s], list(snap[s].items()))
                  for s in ("customer", "store_sales")}
        pkw = {"checkpoint_uri": str(tmp_path / "pdurable"), "local_dir": tmp_path / "plocal"}
        one = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "pstate", **pkw)
        two = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "pstate", **pkw)
        got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
        integrate(got, one.populate(frames), outputs)
        with pytest.raises((spark_io.WriterConflictError, spark_io.PopulationStateError)):
            two.populate(frames)
        for s in ("customer", "store_sales"):
            twin.push(s, list(snap[s].items()))
        rows = [(store_sale(rng, 2), 1)]
        integrate(got, one.apply("store_sales", spark_frame(spark, SS, rows)), outputs)
        twin.push("store_sales", rows)
        with pytest.raises(spark_io.WriterConflictError):
            two.apply("store_sales", spark_frame(spark, SS, [(store_sale(rng, 3), 1)]))
        # A re-attached pipeline continues from the state the first one committed.
        three = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "pstate",
                                       **pkw)
        rows = [(store_sale(rng, 5), 1)]
        integrate(got, three.apply("store_sales", spark_frame(spark, SS, rows)), outputs)
        twin.push("store_sales", rows)
        check(got, twin, "after the second pipeline was refused")
    finally:
        twin.close()


# ---- item: errors a user can act on ---------------------------------------------------------


def test_errors_are_named_and_immediate(spark: SparkSession, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(64)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 40, 25))

    # A state_dir that is a file: refused at once, before any Spark job.
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    t0 = time.perf_counter()
    with pytest.raises(joinstate.NotAStateStoreError, match="afile"):
        spark_io.SparkJoin(spark, "cs", left=df(spark, left, CUSTOMER),
                           right=df(spark, right, SALES), left_key=["c_customer_sk"],
                           right_key=["ss_customer_sk"], state_dir=afile)
    with pytest.raises(joinstate.NotAStateStoreError, match="afile"):
        spark_io.SparkPipeline(spark, definition_of(small_outputs()), afile)
    assert time.perf_counter() - t0 < 2.0

    # apply before populate: refused, saying to populate first; populate then works.
    job = join_job(spark, tmp_path, left, right, shards=2)
    with pytest.raises(spark_io.PopulationStateError, match="populate"):
        job.apply("right", changes_df(spark, [((1, 5, 1, 1.0), 1)], SALES))
    total = zset(job.populate(), OUT_COLS)
    assert total == spark_join(spark, left, right, "left")

    # A task's error reaches the driver as the library's error, without a failed task
    # (Spark logs every failed task with its whole traceback).
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("over-retraction", "an apply a shard refuses")
    try:
        with pytest.raises(joinstate.OverRetractionError) as info:
            job.apply("right", changes_df(spark, [((1, 99, 1, 1.0), -1)], SALES))
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup("over-retraction")]
    assert jobs and all(j is not None and j.status == "SUCCEEDED" for j in jobs), jobs

    # A worker that dies on every attempt: a JoinStateError naming the cause.
    import spark_io.job as sj

    real = sj.run_job

    def dying(spark_: Any, frame: Any, task: Any, side: str) -> Any:
        def dies(batches: Any) -> Any:
            import os

            os._exit(3)
            yield from task(batches)

        return real(spark_, frame, dies, side)

    monkeypatch.setattr(sj, "run_job", dying)
    with pytest.raises(joinstate.JoinStateError, match=r"(?i)worker|crash|exit"):
        job.apply("right", changes_df(spark, [((2, 77, 1, 1.0), 1)], SALES))
    monkeypatch.setattr(sj, "run_job", real)
    assert zset(job.state("right"), SALES_COLS) == zset(df(spark, right, SALES),
                                                          SALES_COLS)


def test_populate_resume_after_it_was_recorded_returns_its_output(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver killed between recording a population and returning: resume=True returns
    the recorded output (here the kill is a BaseException after the record)."""
    rng = random.Random(65)
    left, right = Counter(customers(rng, 20)), Counter(sales(rng, 40, 25))
    job = join_job(spark, tmp_path, left, right, shards=2)

    class Killed(BaseException):
        pass

    def killed(*a: Any, **kw: Any) -> None:
        raise Killed

    monkeypatch.setattr(spark_io.SparkJoin, "_finish", killed)
    with pytest.raises(Killed):
        job.populate()
    monkeypatch.undo()
    job = join_job(spark, tmp_path, left, right, shards=2)
    assert zset(job.populate(resume=True), OUT_COLS) == spark_join(spark, left, right, "left")

    outputs = small_outputs()
    snap = snapshot(rng)
    twin = Twin(tmp_path / "twin", outputs)
    try:
        frames = {s: spark_frame(spark, twin.sources[s], list(snap[s].items()))
                  for s in ("customer", "store_sales")}
        sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "pstate")
        monkeypatch.setattr(spark_io.SparkPipeline, "_report", killed)
        with pytest.raises(Killed):
            sp.populate(frames)
        monkeypatch.undo()
        sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "pstate")
        got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
        integrate(got, sp.populate(frames, resume=True), outputs)
        for s in ("customer", "store_sales"):
            twin.push(s, list(snap[s].items()))
        check(got, twin, "resumed after the population was recorded")

        # Every stage shard's pipeline is live once the population completed.
        from cli_runner import run as joinstate_command

        result = joinstate_command("inspect", tmp_path / "pstate")
        assert result.exit_code == 0, result.output
        assert "phase live" in result.output
        assert "phase population" not in result.output, result.output
    finally:
        twin.close()


@pytest.mark.parametrize("checkpointed", [False, True], ids=["shared", "checkpoints"])
def test_pipeline_population_stopped_after_its_job_resumes_once(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        checkpointed: bool) -> None:
    """The driver stops (a BaseException, as a kill leaves it) after the population's
    Spark job, before the manifest records the population: the stores hold every row
    once, but nothing says so; a resumed population starts them over and loads every
    source once more, never on top of the first load (``test_spark_driver_kill`` does
    this with a real SIGKILL)."""
    import spark_io.pipeline as spp

    kw: dict[str, Any] = {}
    if checkpointed:
        kw = {"checkpoint_uri": str(tmp_path / "durable"), "local_dir": tmp_path / "local"}
    outputs = small_outputs()
    snap = snapshot(random.Random(66))
    twin = Twin(tmp_path / "twin", outputs)
    try:
        frames = {s: spark_frame(spark, twin.sources[s], list(snap[s].items()))
                  for s in ("customer", "store_sales")}
        sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "state", **kw)

        class Killed(BaseException):
            pass

        real = spp.run_operation

        def job_then_die(*a: Any, **k: Any) -> Any:
            real(*a, **k)
            raise Killed

        monkeypatch.setattr(spp, "run_operation", job_then_die)
        with pytest.raises(Killed):
            sp.populate(frames)
        monkeypatch.undo()
        sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "state", **kw)
        got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
        integrate(got, sp.populate(frames, resume=True), outputs)
        assert sp.last_report is not None and sp.last_report.kind == "populate"
        for s in ("customer", "store_sales"):
            twin.push(s, list(snap[s].items()))
        check(got, twin, "resumed population")
        rows = [(store_sale(random.Random(1), 3), 1)]
        integrate(got, sp.apply("store_sales", spark_frame(spark, SS, rows)), outputs)
        twin.push("store_sales", rows)
        check(got, twin, "an apply after the resumed population")
    finally:
        twin.close()


def test_replayed_micro_batch_with_another_change_is_refused(
        spark: SparkSession, tmp_path: Path) -> None:
    """A micro-batch id is an operation id: replayed with another change (reaching other
    shards), it is refused before anything is written and its recorded output stays."""
    case = JoinCase(spark, tmp_path / "join")
    shards = sorted(case.by_shard)
    a = [(r, 1) for r in pick(case.by_shard, [shards[0]])]
    b = [(r, 1) for r in pick(case.by_shard, [shards[1]])]
    sink = case.job.foreach_batch_sink("right", tmp_path / "sink", sink_id="s")
    sink(case.frame(a), 0)
    batch = tmp_path / "sink" / "batch_id=0"
    first = zset(spark.read.schema(case.job.output_schema).parquet(str(batch)), OUT_COLS)
    before = store_bytes(tmp_path / "join" / "state")
    with pytest.raises(joinstate.CommitConflictError):
        sink(case.frame(b), 0)
    assert store_bytes(tmp_path / "join" / "state") == before
    assert zset(spark.read.schema(case.job.output_schema).parquet(str(batch)),
                OUT_COLS) == first
    sink(case.frame(a), 0)  # Spark's own replay: the recorded output again
    assert zset(spark.read.schema(case.job.output_schema).parquet(str(batch)),
                OUT_COLS) == first
    assert store_bytes(tmp_path / "join" / "state") == before

    pcase = PipelineCase(spark, tmp_path / "pipeline")
    try:
        pshards = sorted(pcase.by_shard)
        a = [(r, 1) for r in pick(pcase.by_shard, [pshards[0]])]
        b = [(r, 1) for r in pick(pcase.by_shard, [pshards[1]])]
        psink = pcase.sp.foreach_batch_sink("store_sales", tmp_path / "psink", sink_id="p")
        psink(pcase.frame(a), 0)
        out = tmp_path / "psink" / "per_customer" / "batch_id=0"
        schema = pcase.sp.output_schema("per_customer")
        names = pcase.outputs["per_customer"].schema.names
        first = zset(spark.read.schema(schema).parquet(str(out)), names)
        before = store_bytes(tmp_path / "pipeline" / "state")
        with pytest.raises(joinstate.CommitConflictError):
            psink(pcase.frame(b), 0)
        assert store_bytes(tmp_path / "pipeline" / "state") == before
        assert zset(spark.read.schema(schema).parquet(str(out)), names) == first
    finally:
        pcase.close()
