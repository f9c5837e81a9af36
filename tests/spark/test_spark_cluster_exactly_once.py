"""All shards or none, exactly once, on ``local-cluster[2,1,1024]`` (two executor JVMs).

The same contracts as ``test_spark_operations.py``, on executors that are other
processes with their own Python workers (``spark.task.maxFailures=4``), without
checkpoints (the shards are shared directories; undo records are the rollback):

* an op id reused with another change is refused, nothing written;
* a change that one shard refuses (an over-retraction) leaves every shard byte-identical,
  on a SparkJoin and through a SparkPipeline's stages;
* a Python worker killed right after its shard committed, on the first attempt: Spark
  retries the task, which replays; the change is applied once;
* a worker killed on every attempt: a ``SparkJobError``, every shard rolled back, and
  the same op id then applies the change once;
* a pipeline's stage stores stay open in the workers between operations (every task
  finds its store kept), and killing those workers loses nothing: the next operation
  reopens the stores and applies its change once.

One SparkContext per JVM, so the scenario runs in its own Python process: this file is
also that process's script (``python test_spark_cluster_exactly_once.py cluster DIR``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_exactly_once_on_a_local_cluster(tmp_path: Path) -> None:
    from test_spark_checkpoint import spark_home_for_cluster

    home = spark_home_for_cluster(tmp_path)
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, __file__, "cluster", str(tmp_path)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                          check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout[-4000:], done.stderr[-6000:])
    result = json.loads(lines[-1][len("RESULT "):])
    print(json.dumps(result, indent=1))
    assert result["master"] == "local-cluster[2,1,1024]"
    assert result["conflict"] == "CommitConflictError"
    assert result["over_retraction"] == "OverRetractionError"
    assert result["retried_attempts"] >= 1
    assert result["dead_every_attempt"] == "SparkJobError"
    assert result["pipeline_over_retraction"] == "OverRetractionError"
    assert result["pipeline_kept"] == ["kept"]
    assert result["checks"] == result["checks_expected"]


def cluster_scenario(root: Path) -> dict[str, Any]:
    """Run in its own process by the test above."""
    from pyspark.sql import SparkSession
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
    from test_spark_operations import (
        PipelineCase,
        pick,
        sales_by_shard,
        store_bytes,
    )

    import joinstate
    import spark_io
    import spark_io.job as sj
    from spark_io._worker import ApplyTask
    from spark_io.session import LOCAL_CONF

    builder = SparkSession.builder.master("local-cluster[2,1,1024]").appName("exactly-once")
    conf = {**LOCAL_CONF, "spark.executor.memory": "768m", "spark.task.maxFailures": "4",
            "spark.default.parallelism": "4", "spark.sql.shuffle.partitions": "4"}
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {"master": spark.sparkContext.master}
    checks: list[str] = []
    try:
        rng = random.Random(81)
        left, right = Counter(customers(rng, 40)), Counter(sales(rng, 200, 50))
        job = spark_io.SparkJoin(
            spark, "cs", left=df(spark, left, CUSTOMER), right=df(spark, right, SALES),
            left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how="left",
            state_dir=root / "state", shards=4)
        total = zset(job.populate(), OUT_COLS)
        by_shard = sales_by_shard(job, rng)
        shards = sorted(by_shard)
        state = root / "state"

        def check(where: str) -> None:
            assert total == spark_join(spark, left, right, "left"), where
            assert zset(job.state("right"), SALES_COLS) == zset(df(spark, right, SALES),
                                                                 SALES_COLS), where
            checks.append(where)

        a = [(r, 1) for r in pick(by_shard, shards[:2])]
        total = add(total, zset(job.apply("right", changes_df(spark, a, SALES), op_id="a"),
                                OUT_COLS))
        right = apply_to(right, a)
        check("apply a")
        before = store_bytes(state)
        other = [(r, 1) for r in pick(by_shard, shards[2:], 2)[1:]]
        try:
            job.apply("right", changes_df(spark, other, SALES), op_id="a")
        except joinstate.CommitConflictError as exc:
            result["conflict"] = type(exc).__name__
        assert store_bytes(state) == before
        checks.append("conflict wrote nothing")

        missing = (by_shard[shards[-1]][-1], -1)  # never inserted
        good = [(r, 1) for r in pick(by_shard, shards, 2)[4:]]
        try:
            job.apply("right", changes_df(spark, [*good, missing], SALES), op_id="b")
        except joinstate.OverRetractionError as exc:
            result["over_retraction"] = type(exc).__name__
        assert store_bytes(state) == before
        checks.append("over-retraction rolled back")

        real = sj.run_job

        def dies_after_commit(every: bool) -> Any:
            def runner(spark_: Any, frame: Any, task: Any, side: str) -> Any:
                if not isinstance(task, ApplyTask):
                    return real(spark_, frame, task, side)

                def task_dies(batches: Any) -> Any:
                    from pyspark import TaskContext

                    ctx = TaskContext.get()
                    for report in task(batches):
                        if ctx is not None and ctx.partitionId() == 1 and (
                                every or ctx.attemptNumber() == 0):
                            os._exit(1)  # committed; the report never reaches the driver
                        yield report

                return real(spark_, frame, task_dies, side)

            return runner

        sj.run_job = dies_after_commit(every=False)  # type: ignore[assignment]
        try:
            out = job.apply("right", changes_df(spark, good, SALES), op_id="b")
        finally:
            sj.run_job = real  # type: ignore[assignment]
        assert job.last_report is not None
        result["retried_attempts"] = sum(
            s.detail["checkpoint"]["attempt"] > 0 for j in job.last_report.jobs
            for s in j.shards)
        total = add(total, zset(out, OUT_COLS))
        right = apply_to(right, good)
        check("a worker killed after its commit, retried")

        c = [(r, 1) for r in pick(by_shard, shards, 3)[8:]]
        before = store_bytes(state)
        sj.run_job = dies_after_commit(every=True)  # type: ignore[assignment]
        try:
            job.apply("right", changes_df(spark, c, SALES), op_id="c")
        except spark_io.SparkJobError as exc:
            result["dead_every_attempt"] = type(exc).__name__
        finally:
            sj.run_job = real  # type: ignore[assignment]
        assert store_bytes(state) == before
        total = add(total, zset(job.apply("right", changes_df(spark, c, SALES), op_id="c"),
                                OUT_COLS))
        right = apply_to(right, c)
        check("a worker killed on every attempt, rolled back, then applied once")

        case = PipelineCase(spark, root / "pipeline")
        try:
            pshards = sorted(case.by_shard)
            rows = [(r, 1) for r in pick(case.by_shard, pshards, 2)]
            before = store_bytes(root / "pipeline" / "state")
            bad = case.frame([*rows, ((pshards[-1], 6, 9, Decimal("1.23")), -1)])
            try:
                case.sp.apply("store_sales", bad, op_id="p")
            except joinstate.OverRetractionError as exc:
                result["pipeline_over_retraction"] = type(exc).__name__
            assert store_bytes(root / "pipeline" / "state") == before
            case.apply(rows, op_id="p")
            case.check()
            checks.append("pipeline rolled back across stages, then applied once")

            # Stage stores stay open in the executors' Python workers between operations
            # (a task runs in the worker keeping its store, whichever executor Spark
            # picks); a worker killed loses them, and the next operation reopens them.
            case.apply([(r, 1) for s in pshards for r in case.by_shard[s][2:3]], op_id="q")
            assert case.sp.last_report is not None
            busy = [t.detail for j in case.sp.last_report.jobs for t in j.shards
                    if not t.detail.get("idle")]
            result["pipeline_kept"] = sorted({str(t.get("kept")) for t in busy})
            for pid in {int(t["pid"]) for t in busy}:
                os.kill(pid, signal.SIGKILL)
            case.apply([(r, 1) for s in pshards for r in case.by_shard[s][3:4]], op_id="r")
            case.check()
            checks.append("pipeline keepers killed, then applied once")
        finally:
            case.close()
    finally:
        spark.stop()
    result["checks"] = checks
    result["checks_expected"] = [
        "apply a", "conflict wrote nothing", "over-retraction rolled back",
        "a worker killed after its commit, retried",
        "a worker killed on every attempt, rolled back, then applied once",
        "pipeline rolled back across stages, then applied once",
        "pipeline keepers killed, then applied once"]
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["cluster"]:
        print("RESULT " + json.dumps(cluster_scenario(Path(sys.argv[2]))))
