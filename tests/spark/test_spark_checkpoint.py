"""Checkpointed shards: durable at ``checkpoint_uri``, working copies anywhere.

In the test session's ``local[2]`` Spark, working copies live in their own
``local_dir`` and are deleted, replaced by stale copies or written behind the driver's
back between operations; results must still equal Spark's own join (SparkJoin) or the
in-process pipeline and DuckDB (SparkPipeline).  A driver that fails after its tasks
succeeded commits nothing: every shard is rolled back, wherever it ran.

Shards that really move between executors: ``local-cluster[2,1,1024]`` (two executor
JVMs, each with its own Python workers and its own working directory, so a relative
``local_dir`` is executor-local), with a killed Python worker in the middle of an
``apply``.  One SparkContext per JVM, so that scenario runs in its own Python process:
this file is also that process's script (``python test_spark_checkpoint.py cluster DIR``).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: pipeline_oracle

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
from joinstate import checkpoint as ck
from spark_io.manifest import shard_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]



def make_job(spark: SparkSession, root: Path, left: Counter[Row], right: Counter[Row], *,
             how: str = "left", shards: int = 2, local_dir: str | Path | None = None,
             keep: int = 2) -> spark_io.SparkJoin:
    return spark_io.SparkJoin(
        spark, "cs", left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
        left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how=how,
        state_dir=root / "state", shards=shards, checkpoint_uri=root / "durable",
        local_dir=root / "local" if local_dir is None else local_dir, keep_checkpoints=keep)


def syncs(job: Any) -> list[str]:
    """How each task found its shard in the last operation (``local``, ``restored``...)."""
    report = job.last_report
    assert report is not None
    return [s.detail["checkpoint"]["sync"] for j in report.jobs for s in j.shards]


def working_copy(job: spark_io.SparkJoin, shard: int) -> Path:
    return job.storage.local_path(shard_key(shard))


class Tracked:
    """A SparkJoin's inputs and integrated output, checked against Spark's own join."""

    def __init__(self, spark: SparkSession, job: spark_io.SparkJoin, left: Counter[Row],
                 right: Counter[Row], how: str) -> None:
        self.spark, self.job, self.how = spark, job, how
        self.left, self.right = left, right
        self.total: Counter[Row] = Counter()

    def populate(self) -> None:
        self.total = zset(self.job.populate(), OUT_COLS)
        self.check("populate")

    def apply(self, side: str, changes: list[tuple[Row, int]], **kw: Any) -> None:
        schema = CUSTOMER if side == "left" else SALES
        out = self.job.apply(side, changes_df(self.spark, changes, schema), **kw)
        self.total = add(self.total, zset(out, OUT_COLS))
        if side == "left":
            self.left = apply_to(self.left, changes)
        else:
            self.right = apply_to(self.right, changes)
        self.check(f"apply {side}")

    def check(self, where: str) -> None:
        assert self.total == spark_join(self.spark, self.left, self.right, self.how), where

    def check_state(self, job: spark_io.SparkJoin | None = None) -> None:
        job = job or self.job
        assert zset(job.state("left"), CUSTOMER_COLS) == via_spark(
            self.spark, self.left, CUSTOMER, CUSTOMER_COLS)
        assert zset(job.state("right"), SALES_COLS) == via_spark(
            self.spark, self.right, SALES, SALES_COLS)


# ---- SparkJoin -----------------------------------------------------------------------------


@pytest.mark.slow
def test_lost_and_stale_working_copies_are_restored(spark: SparkSession, tmp_path: Path
                                                    ) -> None:
    rng = random.Random(31)
    left, right = Counter(customers(rng, 60)), Counter(sales(rng, 400, 80))
    job = make_job(spark, tmp_path, left, right)
    t = Tracked(spark, job, left, right, "left")
    t.populate()
    committed = dict(job.manifest.checkpoints)
    assert set(committed) == {"shard-00000", "shard-00001"}
    for key, cid in committed.items():
        assert ck.latest_checkpoint(job.storage.uri(key)).id == cid  # type: ignore[union-attr]

    t.apply("right", mutate(rng, t.right, new_sale, 80))
    assert set(syncs(job)) == {"local"}  # the copies were exactly the committed checkpoints
    stale = tmp_path / "stale-shard-0"
    shutil.copytree(working_copy(job, 0), stale)  # a copy one commit behind, from now on
    t.apply("left", mutate(rng, t.left, customer, 80))

    # Shard 0's copy goes back one commit; shard 1's is lost (a new executor, a wiped disk).
    shutil.rmtree(working_copy(job, 0))
    shutil.copytree(stale, working_copy(job, 0))
    shutil.rmtree(working_copy(job, 1))
    t.apply("right", mutate(rng, t.right, new_sale, 80))
    assert sorted(syncs(job)) == ["restored", "restored"]
    t.check_state()

    # A write behind the driver's back (no checkpoint) is discarded, not used.
    with joinstate.StateStore(working_copy(job, 1)) as store:
        store.join("cs").push("left", one_customer(job, 10**6))
    t.check_state()

    # The micro-batch sink commits too; and a re-attached job on fresh working copies
    # (another machine) reads the same state.
    sink = job.foreach_batch_sink("right", tmp_path / "sink")
    changes = mutate(rng, t.right, new_sale, 80)
    sink(changes_df(spark, changes, SALES), 0)
    t.right = apply_to(t.right, changes)
    t.total = add(t.total, zset(spark.read.schema(job.output_schema).parquet(
        str(tmp_path / "sink" / "batch_id=0")), OUT_COLS))
    t.check("micro-batch 0")
    assert job.manifest.checkpoints != committed
    elsewhere = spark_io.SparkJoin.open(spark, "cs", tmp_path / "state",
                                        local_dir=tmp_path / "elsewhere")
    t.check_state(elsewhere)
    restored = sorted(p.parent.name for p in (tmp_path / "elsewhere").rglob("CURRENT"))
    assert restored == ["shard-00000", "shard-00001"]


@pytest.mark.slow  # ~1 min: retention, re-attaching and a sink over checkpoint URIs
def test_outputs_need_no_shared_state_dir(spark: SparkSession, tmp_path: Path) -> None:
    """With checkpoint_uri, operation outputs go to ``<checkpoint_uri>/_outputs`` (or
    ``output_uri``), which executors reach anyway; the driver's state_dir keeps only the
    manifest and reports.  Retention and re-attaching work there; a sink takes a URI."""
    rng = random.Random(35)
    left, right = Counter(customers(rng, 40)), Counter(sales(rng, 200, 50))

    def join(name: str, where: str, **kw: Any) -> spark_io.SparkJoin:
        return spark_io.SparkJoin(
            spark, name, left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
            left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how="left",
            state_dir=tmp_path / f"state{where}", shards=2,
            checkpoint_uri=tmp_path / f"durable{where}", **kw)

    job = join("cs", "", local_dir=tmp_path / "local", keep_outputs=2)
    outputs = tmp_path / "durable" / "_outputs"
    assert job.outputs_uri == str(outputs) and job.outputs_dir == outputs
    t = Tracked(spark, job, left, right, "left")
    t.populate()
    for i in range(3):
        t.apply("right", mutate(rng, t.right, new_sale, 30), op_id=f"op-{i}")
    assert sorted(p.name for p in outputs.iterdir()) == ["op-1", "op-2"]  # keep_outputs=2
    state_files = sorted(str(p.relative_to(tmp_path / "state"))
                         for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert "_spark/cs.json" in state_files
    # The driver's own files: manifest, reports, operation records, the writer's lock.
    assert all(f in ("_spark/cs.json", "_spark/.writer.lock")
               or f.startswith(("_spark/reports/", "_spark/ops/cs/")) for f in state_files)

    # A micro-batch sink writing to a URI (any pyarrow.fs location Spark reads too).
    sink_uri = (tmp_path / "sink").as_uri()
    sink = job.foreach_batch_sink("right", sink_uri)
    changes = mutate(rng, t.right, new_sale, 30)
    sink(changes_df(spark, changes, SALES), 0)
    t.right = apply_to(t.right, changes)
    t.total = add(t.total, zset(spark.read.schema(job.output_schema).parquet(
        f"{sink_uri}/batch_id=0"), OUT_COLS))
    t.check("micro-batch 0 to a URI")
    assert (tmp_path / "sink" / "batch_id=0" / "_joinstate_report.json").exists()

    # Re-attaching finds the outputs where they were; another output_uri is refused.
    again = spark_io.SparkJoin.open(spark, "cs", tmp_path / "state",
                                    local_dir=tmp_path / "local")
    assert again.outputs_uri == job.outputs_uri
    with pytest.raises(joinstate.OptionsError, match=r"output_uri=.*created with output_uri"):
        join("cs", "", output_uri=tmp_path / "elsewhere")
    mine = join("cs2", "2", output_uri=(tmp_path / "out2").as_uri())
    assert zset(mine.populate(), OUT_COLS) == spark_join(spark, left, right, "left")
    assert [p.name.startswith("populate-") for p in (tmp_path / "out2").iterdir()] == [True]


def one_customer(job: spark_io.SparkJoin, sk: int) -> Any:
    import pyarrow as pa

    schema = job.manifest.left.schema
    row: dict[str, Any] = {f.name: None for f in schema}
    row.update(c_customer_sk=sk, c_name="behind the driver's back")
    return pa.Table.from_pylist([row], schema=schema)


def test_a_job_the_driver_did_not_commit_is_rolled_back(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every task of an apply checkpoints its shard, then the driver dies before it records
    the checkpoints: the next operation finds every shard at its committed checkpoint, and
    the same op_id applies the change exactly once."""
    rng = random.Random(32)
    left, right = Counter(customers(rng, 60)), Counter(sales(rng, 400, 80))
    job = make_job(spark, tmp_path, left, right, keep=1)  # the committed one stays anyway
    t = Tracked(spark, job, left, right, "left")
    t.populate()
    committed = dict(job.manifest.checkpoints)
    real = spark_io.job.run_job

    def dies_after_the_tasks(*args: Any, **kw: Any) -> Any:
        real(*args, **kw)
        raise RuntimeError("the driver died before recording the checkpoints")

    changes = mutate(rng, t.right, new_sale, 80)
    monkeypatch.setattr(spark_io.job, "run_job", dies_after_the_tasks)
    with pytest.raises(RuntimeError, match="driver died") as err:
        job.apply("right", changes_df(spark, changes, SALES), op_id="lost-commit")
    monkeypatch.undo()
    assert any("rolled back" in n and "op_id='lost-commit'" in n
               for n in getattr(err.value, "__notes__", []))
    assert not (tmp_path / "durable" / "_outputs" / "lost-commit").exists()  # undone
    assert job.manifest.checkpoints == committed
    for shard in (0, 1):  # the tasks did commit and checkpoint their shards
        with joinstate.StateStore(working_copy(job, shard), read_only=True) as store:
            assert store.join("cs").committed("spark-apply:lost-commit")
        latest = ck.latest_checkpoint(job.storage.uri(shard_key(shard)))
        assert latest is not None and latest.id != committed[shard_key(shard)]
    t.check_state()  # as before the failed apply: reading restored the committed copies
    for shard in (0, 1):
        mine = ck.local_checkpoint(working_copy(job, shard))
        assert mine is not None and mine.id == committed[shard_key(shard)]
    t.apply("right", changes, op_id="lost-commit")  # exactly once, from the committed state
    assert job.last_report is not None and job.last_report.replayed_shards == 0
    t.check_state()


# ---- SparkPipeline ---------------------------------------------------------------------------


def test_pipeline_stage_stores_are_restored_and_rolled_back(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_spark_operations import failing_stage
    from test_spark_pipeline import (
        SS,
        Twin,
        changes,
        check,
        definition_of,
        integrate,
        small_outputs,
        snapshot,
        spark_frame,
        store_sale,
    )

    import spark_io.dag

    outputs = small_outputs()  # a join stage feeding an aggregate stage keyed differently
    rng = random.Random(33)
    snap = snapshot(rng)
    twin = Twin(tmp_path / "twin", outputs)
    sp = spark_io.SparkPipeline(
        spark, definition_of(outputs), tmp_path / "state", shards=2,
        checkpoint_uri=str(tmp_path / "durable"), local_dir=tmp_path / "local",
        keep_checkpoints=1)  # an operation's newer checkpoints never push out the committed
    manifest = tmp_path / "state" / "_spark" / "pipeline-pipeline.json"

    def committed() -> dict[str, str]:
        return dict(json.loads(manifest.read_text())["checkpoints"])

    got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
    try:
        frames = {s: spark_frame(spark, twin.sources[s], list(snap[s].items()))
                  for s in ("customer", "store_sales")}
        integrate(got, sp.populate(frames), outputs)
        for s in ("customer", "store_sales"):
            twin.push(s, list(snap[s].items()))
        check(got, twin, "after populate")
        stores = committed()
        assert {k.split("/")[0] for k in stores} == {f"stage{s.index}" for s in sp.plan.stages}
        assert all(ck.latest_checkpoint(ck.child_uri(str(tmp_path / "durable"), k)).id == v
                   for k, v in stores.items())  # type: ignore[union-attr]

        current = {s: Counter(c) for s, c in snap.items()}
        batches = [b for b in changes(rng, current) if b[0] in ("customer", "store_sales")]
        source, rows = batches[0]
        integrate(got, sp.apply(source, spark_frame(spark, twin.sources[source], rows)),
                  outputs)
        twin.push(source, rows)
        check(got, twin, "after apply")

        # Every working copy is lost: the next operation restores each store it opens.
        shutil.rmtree(tmp_path / "local")
        source, rows = batches[1]
        integrate(got, sp.apply(source, spark_frame(spark, twin.sources[source], rows)),
                  outputs)
        twin.push(source, rows)
        check(got, twin, "after losing every working copy")
        assert sp.last_report is not None
        assert {s.detail["checkpoint"]["sync"] for j in sp.last_report.jobs
                for s in j.shards if not s.detail.get("idle")} == {"restored"}

        # The micro-batch sink commits its batch's checkpoints too.
        before = committed()
        rows = [(store_sale(rng, 5), 1) for _ in range(4)]
        sink = sp.foreach_batch_sink("store_sales", tmp_path / "sink", sink_id="s")
        sink(spark_frame(spark, SS, rows), 0)
        twin.push("store_sales", rows)
        for o in outputs:
            frame = spark.read.schema(sp.output_schema(o)).parquet(
                str(tmp_path / "sink" / o / "batch_id=0"))
            integrate(got, {o: frame}, outputs)
        check(got, twin, "after a micro-batch")
        assert committed() != before

        # An apply whose second stage fails after its first ran (and checkpointed its
        # stores, in the same job): nothing of it stays anywhere.
        before = committed()
        marks = tmp_path / "marks"
        marks.mkdir()
        monkeypatch.setattr(spark_io.dag, "StageTask", failing_stage(
            1, joinstate.StateIOError("injected: lost the executors"), marks))
        lost = [(store_sale(rng, 3), 5)]
        with pytest.raises(joinstate.StateIOError, match="lost the executors"):
            sp.apply("store_sales", spark_frame(spark, SS, lost))
        monkeypatch.undo()
        assert committed() == before
        # the join stage ran to its end (and checkpointed what it changed) in that job
        assert any(p.name.startswith("stage0-") for p in marks.iterdir())
        # Customer 3 moves to another customer id: the join re-emits all of its sales
        # under both ids, so sales of the failed apply still held by a join shard would
        # show in the aggregate (which never saw them).
        old = next(r for r in twin.inputs["customer"] if r[0] == 3)
        rows = [(old, -1), ((3, "C99", old[2]), 1)]
        integrate(got, sp.apply("customer", spark_frame(spark, twin.sources["customer"],
                                                        rows)), outputs)
        twin.push("customer", rows)
        check(got, twin, "after a failed apply and the next one")
    finally:
        twin.close()


def test_pipeline_rollback_over_several_pushes_into_one_store(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source feeding both inputs of a self-join: one apply pushes twice into each join
    store (two checkpoints, ``keep_checkpoints=1``), then fails at the aggregate; the
    committed checkpoints survived retention and every store rolls back to them."""
    import pipeline_oracle as po
    import pyarrow as pa
    from pipeline_oracle import col
    from test_spark_operations import failing_stage
    from test_spark_pipeline import Twin, check, definition_of, integrate, spark_frame

    import spark_io.dag

    edges = po.Source("edges", pa.schema([("a", pa.int32()), ("b", pa.int64()),
                                          ("w", pa.int64())]))
    hop = edges.join(edges.filter(col("w") > 0), on=("b", "a"))
    outputs = {"hop": hop, "agg": hop.group_by(["a"], total=("sum", "w"), n=("count", None))}
    twin = Twin(tmp_path / "twin", outputs)
    sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "state", shards=2,
                                checkpoint_uri=tmp_path / "durable",
                                local_dir=tmp_path / "local", keep_checkpoints=1)
    rng = random.Random(35)

    def rows(n: int) -> list[tuple[Row, int]]:
        return [((rng.randrange(6), rng.randrange(6), rng.randrange(-2, 5)), 1)
                for _ in range(n)]

    got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
    try:
        first = rows(30)
        integrate(got, sp.populate({"edges": spark_frame(spark, edges, first)}), outputs)
        twin.push("edges", first)
        plan = sp.plan
        join_stage = next(st for st in plan.stages
                          if any(plan.graph.nodes[i].kind == "join" for i in st.nodes))
        # (the last stage with one: the sum is pre-aggregated in the join's stage)
        agg_stage = next(st for st in reversed(plan.stages)
                         if any(plan.graph.nodes[i].kind == "agg" for i in st.nodes))
        # edges reaches the join's store twice (once per side), so one apply pushes two
        # inputs into each join store; the aggregate runs in a later stage of the job
        assert len([d for d in join_stage.deliveries if d.source == "edges"]) == 2
        assert agg_stage.index > join_stage.index
        monkeypatch.setattr(spark_io.dag, "StageTask", failing_stage(
            agg_stage.index, joinstate.StateIOError("injected: lost the executors")))
        with pytest.raises(joinstate.StateIOError, match="lost the executors"):
            sp.apply("edges", spark_frame(spark, edges, rows(20)))
        monkeypatch.undo()
        more = rows(15) + [(r, -1) for r, _ in first[:5]]
        integrate(got, sp.apply("edges", spark_frame(spark, edges, more)), outputs)
        twin.push("edges", more)
        check(got, twin, "after a failed apply that pushed twice into each join store")
    finally:
        twin.close()


# ---- shards that really move: local-cluster, in a process of its own -------------------------


def spark_home_for_cluster(root: Path) -> Path:
    """A SPARK_HOME of links to the pip package's ``bin``/``jars``/...: standalone workers
    (which local-cluster starts) put executor working directories under
    ``$SPARK_HOME/work``, so this keeps them in ``root`` instead of site-packages."""
    import pyspark

    package = Path(pyspark.__file__).parent
    home = root / "spark-home"
    home.mkdir(parents=True)
    for name in ("bin", "jars", "sbin", "python", "conf"):
        if (package / name).exists():
            (home / name).symlink_to(package / name)
    return home


@pytest.mark.slow
def test_shards_move_between_executors_of_a_local_cluster(tmp_path: Path) -> None:
    """Two executor JVMs with executor-local working copies (a relative ``local_dir``):
    populate, applies, a shard's copies deleted on every executor, stale copies planted,
    a Python worker killed in the middle of an apply's checkpoint (Spark retries), and a
    SparkPipeline whose stage stores are all lost, whose last stage's Python workers die
    after their commit (Spark retries those tasks), whose job fails on every attempt and
    is retried under its op id, and whose op id is reused with another change (refused);
    every result checked in the child, exactly once.

    The driver's ``state_dir`` is not shared with the executors: it is renamed away for
    the duration of every Spark job (an executor reading it would fail, one writing it
    would be caught), so manifests and reports are the driver's alone and outputs go to
    ``<checkpoint_uri>/_outputs``."""
    home = spark_home_for_cluster(tmp_path)
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, __file__, "cluster", str(tmp_path)], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=900, check=False)
    took = time.monotonic() - t0
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout[-4000:], done.stderr[-6000:])
    result = json.loads(lines[-1][len("RESULT "):])
    print(json.dumps(result, indent=1), f"({took:.0f} s)")
    assert result["master"] == "local-cluster[2,1,1024]"
    assert len(result["executors"]) == 2  # two executor working directories were used
    assert result["restored_after_delete"] == ["restored"]
    assert result["restored_after_stale"] == ["restored"]
    assert result["killed_attempts"] >= 1 and result["retried_shard_attempt"] >= 1
    assert result["pipeline_syncs"] == ["restored"]
    # (with checkpoints a retry starts from the committed checkpoint, so it applies the
    # change again rather than replaying the dead attempt's commit: once either way)
    assert result["pipeline_retried_attempts"] >= 1
    assert result["op_id_refused"] and result["op_id_same_outputs"]
    assert result["failed_job_raised"]
    # The driver's state_dirs were away during every Spark job, and hold only the
    # manifests and reports; outputs went to the checkpoint locations.
    assert result["jobs_without_driver_state"] >= 10
    for state in ("state", "pstate"):
        files = result["driver_state_files"][state]
        assert files and all(f.startswith(("_spark/reports/", "_spark/.", "_spark/ops/"))
                             or f in ("_spark/cs.json", "_spark/pipeline-pipeline.json")
                             for f in files), files
    assert result["join_outputs"] and result["pipeline_outputs"]


def cluster_scenario(root: Path) -> dict[str, Any]:
    """Run in its own process by the test above (``python this_file.py cluster ROOT``)."""
    from pyspark.sql import SparkSession
    from test_spark_pipeline import (
        SS,
        Twin,
        changes,
        check,
        definition_of,
        integrate,
        small_outputs,
        snapshot,
        spark_frame,
        store_sale,
    )

    from spark_io._worker import ApplyTask
    from spark_io.session import LOCAL_CONF

    master = "local-cluster[2,1,1024]"
    builder = SparkSession.builder.master(master).appName("joinstate-checkpoint-cluster")
    conf = {**LOCAL_CONF, "spark.executor.memory": "768m", "spark.task.maxFailures": "4",
            "spark.default.parallelism": "4", "spark.sql.shuffle.partitions": "4"}
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(os.environ["SPARK_HOME"]) / "work" / spark.sparkContext.applicationId
    result: dict[str, Any] = {"master": spark.sparkContext.master}
    seen: dict[str, list[str]] = {}  # shard -> executor of each task that opened it

    def executor_of(path: str) -> str:
        return Path(path).relative_to(work).parts[0]

    def note(job: Any) -> list[dict[str, Any]]:
        out = []
        for j in job.last_report.jobs:
            for s in j.shards:
                ck_ = s.detail["checkpoint"]
                seen.setdefault(ck_["store"], []).append(executor_of(ck_["path"]))
                out.append(ck_)
        return out

    def copies(key: str) -> list[Path]:
        return sorted(work.glob(f"*/joinstate-local/*/{key}"))

    # The driver's state directories are not there while a Spark job runs: executors
    # must need neither (manifests are pickled into tasks, outputs go to the checkpoint
    # location).  An executor creating one would be caught when the job ends.
    import spark_io.job as sj
    import spark_io.pipeline as spp

    states = [root / "state", root / "pstate"]
    real_run_job, away_jobs = sj.run_job, []

    real_operation = spp.run_operation

    def away(run: Any) -> Any:
        def without_driver_state(*a: Any, **kw: Any) -> Any:
            moved = [d for d in states if d.exists()]
            for d in moved:
                d.rename(d.with_name(d.name + ".driver-only"))
            try:
                return run(*a, **kw)
            finally:
                for d in states:
                    assert not d.exists(), f"a task created the driver's {d}"
                for d in moved:
                    d.with_name(d.name + ".driver-only").rename(d)
                away_jobs.append(len(moved))

        return without_driver_state

    without_driver_state = away(real_run_job)
    sj.run_job = without_driver_state  # type: ignore[assignment]
    spp.run_job = without_driver_state  # type: ignore[assignment]
    spp.run_operation = away(real_operation)  # a pipeline operation's one job

    try:
        rng = random.Random(34)
        left, right = Counter(customers(rng, 80)), Counter(sales(rng, 600, 100))
        job = spark_io.SparkJoin(
            spark, "cs", left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
            left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how="left",
            state_dir=root / "state", shards=4, checkpoint_uri=root / "durable",
            local_dir="joinstate-local", keep_checkpoints=2)
        t = Tracked(spark, job, left, right, "left")
        t.populate()
        note(job)
        t.apply("right", mutate(rng, t.right, new_sale, 100))
        note(job)
        assert not (root / "state" / "shard-00000").exists()  # no shared copy anywhere

        # Shard 2's copies vanish on every executor.
        gone = copies("shard-00002")
        assert gone
        for p in gone:
            shutil.rmtree(p)
        t.apply("left", mutate(rng, t.left, customer, 100))
        result["restored_after_delete"] = [c["sync"] for c in note(job)
                                           if c["store"] == "shard-00002"]

        # Shard 3 gets a stale copy (one commit behind) on every executor.
        stale = root / "stale"
        shutil.copytree(copies("shard-00003")[0], stale)
        t.apply("right", mutate(rng, t.right, new_sale, 100))
        note(job)
        for executor in {p.parent.parent.parent for p in work.glob("*/joinstate-local/*/*")}:
            for tag in (executor / "joinstate-local").iterdir():
                target = tag / "shard-00003"
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(stale, target)
        t.apply("left", mutate(rng, t.left, customer, 100))
        result["restored_after_stale"] = [c["sync"] for c in note(job)
                                          if c["store"] == "shard-00003"]
        t.check_state()

        # A Python worker dies in the middle of shard 1's checkpoint, after its push
        # committed: Spark retries the task, which restores the committed checkpoint and
        # applies the change once.
        real = sj.run_job  # the test wraps the job runner (itself a wrapper, above)

        def killing(spark_: Any, frame: Any, task: Any, side: str) -> Any:
            if not isinstance(task, ApplyTask) or not task.commit_id.endswith("kill-me"):
                return real(spark_, frame, task, side)

            def dies_in_checkpoint(batches: Any) -> Any:
                from pyspark import TaskContext

                ctx = TaskContext.get()
                if ctx is not None and ctx.attemptNumber() == 0 and ctx.partitionId() == 1:
                    import joinstate.checkpoint.taking as jc

                    put, calls = jc._put_file, []  # noqa: SLF001

                    def put_then_die(*a: Any, **kw: Any) -> Any:
                        calls.append(1)
                        if len(calls) == 2:
                            os._exit(1)  # the worker dies halfway through the upload
                        return put(*a, **kw)

                    jc._put_file = put_then_die  # noqa: SLF001
                yield from task(batches)

            return real(spark_, frame, dies_in_checkpoint, side)

        sj.run_job = killing  # type: ignore[assignment]
        try:
            t.apply("right", mutate(rng, t.right, new_sale, 100), op_id="kill-me")
        finally:
            sj.run_job = real  # type: ignore[assignment]
        reports = note(job)
        retried = [c for c in reports if c["store"] == "shard-00001"]
        result["retried_shard_attempt"] = max(c["attempt"] for c in retried)
        result["killed_attempts"] = sum(c["attempt"] > 0 for c in reports)
        t.check_state()

        # A pipeline: every stage store's copies are lost between two applies.
        outputs = small_outputs()
        snap = snapshot(rng)
        twin = Twin(root / "twin", outputs)
        sp = spark_io.SparkPipeline(spark, definition_of(outputs), root / "pstate", shards=3,
                                    checkpoint_uri=str(root / "pdurable"),
                                    local_dir="joinstate-local")
        got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
        frames = {s: spark_frame(spark, twin.sources[s], list(snap[s].items()))
                  for s in ("customer", "store_sales")}
        integrate(got, sp.populate(frames), outputs)
        for s in ("customer", "store_sales"):
            twin.push(s, list(snap[s].items()))
        check(got, twin, "pipeline populate")
        current = {s: Counter(c) for s, c in snap.items()}
        for source, rows in changes(rng, current):
            if source not in ("customer", "store_sales"):
                continue
            for p in work.glob("*/joinstate-local/*/*/shard-*"):
                shutil.rmtree(p)  # every stage store, on every executor
            integrate(got, sp.apply(source, spark_frame(spark, twin.sources[source], rows)),
                      outputs)
            twin.push(source, rows)
            check(got, twin, f"pipeline apply {source}")
        assert sp.last_report is not None
        result["pipeline_syncs"] = sorted({s.detail["checkpoint"]["sync"]
                                           for j in sp.last_report.jobs for s in j.shards
                                           if s.detail.get("checkpoint")})

        # The last stage's Python workers die once each, after their store committed
        # the push (and checkpointed it) and before Spark has their records: Spark
        # retries those tasks alone (the earlier stage's shuffle output stays); each
        # retry opens its store as the committed checkpoint and applies the change.
        # Exactly once.
        import spark_io.dag as dag

        last = len(sp.plan.stages) - 1
        real_task = dag.StageTask

        class DiesAfterItsCommit:
            def __init__(self, *a: Any) -> None:
                self.task = real_task(*a)

            def __call__(self, shard: int, records: Any) -> Any:
                from pyspark import TaskContext

                out = list(self.task(shard, records))
                ctx = TaskContext.get()
                if self.task.stage == last and ctx is not None and ctx.attemptNumber() == 0:
                    os._exit(1)
                yield from out

        dag.StageTask = DiesAfterItsCommit  # type: ignore[assignment,misc]
        try:
            rows = [(store_sale(rng, rng.randrange(8)), 1) for _ in range(12)]
            integrate(got, sp.apply("store_sales", spark_frame(spark, SS, rows)), outputs)
        finally:
            dag.StageTask = real_task  # type: ignore[misc]
        twin.push("store_sales", rows)
        check(got, twin, "pipeline apply whose last stage's workers died once")
        attempts = [s.detail["checkpoint"]["attempt"] for j in sp.last_report.jobs
                    for s in j.shards if s.detail.get("checkpoint")]
        result["pipeline_retried_attempts"] = sum(a > 0 for a in attempts)
        result["pipeline_replayed"] = sp.last_report.replayed_shards

        # A job whose last stage fails on every attempt: rolled back everywhere; the same
        # op id retried (the job again) applies it once.
        class FailsEveryAttempt:
            def __init__(self, *a: Any) -> None:
                self.task = real_task(*a)

            def __call__(self, shard: int, records: Any) -> Any:
                if self.task.stage == last:
                    raise joinstate.StateIOError("injected: the last stage's disk is gone")
                yield from self.task(shard, records)

        rows = [(store_sale(rng, rng.randrange(8)), 1) for _ in range(6)]
        dag.StageTask = FailsEveryAttempt  # type: ignore[assignment,misc]
        try:
            sp.apply("store_sales", spark_frame(spark, SS, rows), op_id="retry-me")
            result["failed_job_raised"] = False
        except joinstate.StateIOError:
            result["failed_job_raised"] = True
        finally:
            dag.StageTask = real_task  # type: ignore[misc]
        integrate(got, sp.apply("store_sales", spark_frame(spark, SS, rows), op_id="retry-me"),
                  outputs)
        twin.push("store_sales", rows)
        check(got, twin, "pipeline job retried under its op id")

        # An op id used again with another change: refused before any task, nothing
        # applied; with the same change: the recorded outputs, nothing applied.
        rows = [(store_sale(rng, 4), 1) for _ in range(3)]
        first = sp.apply("store_sales", spark_frame(spark, SS, rows), op_id="once")
        integrate(got, first, outputs)
        twin.push("store_sales", rows)
        try:
            sp.apply("store_sales", spark_frame(spark, SS, rows[:2]), op_id="once")
            result["op_id_refused"] = False
        except joinstate.CommitConflictError:
            result["op_id_refused"] = True
        again = sp.apply("store_sales", spark_frame(spark, SS, rows), op_id="once")
        result["op_id_same_outputs"] = all(
            zset(again[o], outputs[o].schema.names) == zset(first[o], outputs[o].schema.names)
            for o in outputs)
        check(got, twin, "pipeline after a reused op id")
        twin.close()
        result["jobs_without_driver_state"] = sum(1 for n in away_jobs if n)
        result["driver_state_files"] = {
            d.name: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
            for d in states}
        result["join_outputs"] = sorted(p.name for p in (root / "durable" / "_outputs").iterdir())
        result["pipeline_outputs"] = sorted(
            p.name for p in (root / "pdurable" / "_outputs").iterdir())
        result["executors"] = sorted({e for v in seen.values() for e in v})
        result["moves"] = sum(a != b for v in seen.values() for a, b in itertools.pairwise(v))
        result["tasks_per_shard"] = {k: v for k, v in sorted(seen.items())}
    finally:
        sj.run_job, spp.run_job = real_run_job, real_run_job  # type: ignore[assignment]
        spp.run_operation = real_operation  # type: ignore[assignment]
        spark.stop()
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["cluster"]:
        print("RESULT " + json.dumps(cluster_scenario(Path(sys.argv[2]))))
