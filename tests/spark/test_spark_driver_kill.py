"""A Spark driver killed with SIGKILL, then resumed by another driver: exactly once.

A child process (``driver_kill_child.py``, its own ``local[2]`` SparkSession) populates a
SparkPipeline or a SparkJoin and applies one change with ``op_id="k1"``, and is killed
at a chosen point: before or after any Spark job or any durable write of the driver.
This process then re-attaches to the same state directory, calls
``populate(resume=True)`` (or ``populate()`` if the kill came before any population was
recorded) and ``apply(..., op_id="k1")`` again: the outputs returned, integrated, must
equal the oracle (the in-process pipeline and DuckDB; Spark's own join), and the state
must hold every row exactly once.

The default run kills a pipeline's population after its Spark job loaded every store
and before the manifest records the population: a resumed population must start the
stores over, not load every source on top of the first load; the ``slow`` matrix kills
at seeded points of the whole run, with and without ``checkpoint_uri``, on both drivers.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from driver_kill_child import make_join, make_pipeline, pipeline_frames, scenario
from sparkdata import (
    OUT_COLS,
    SALES,
    SALES_COLS,
    apply_to,
    changes_df,
    df,
    spark_join,
    zset,
)
from test_spark_pipeline import SS, Twin, check, integrate, small_outputs, spark_frame

import spark_io

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

CHILD = Path(__file__).resolve().parent / "driver_kill_child.py"
Row = tuple[Any, ...]


def run_child(root: Path, driver: str, checkpoint: bool, kill: tuple[str, int]
              ) -> dict[str, int] | None:
    """Run the child; the counts of its kill points if it was not killed, else None."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    spec = {"root": str(root), "driver": driver, "checkpoint": checkpoint, "kill": list(kill)}
    done = subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=900, check=False)
    if kill[0] == "none":
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("COUNTS ")]
        assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-5000:])
        counts: dict[str, int] = json.loads(lines[-1][len("COUNTS "):])
        return counts
    assert done.returncode == -9, (
        f"the child was not killed at {kill}", done.stdout[-3000:], done.stderr[-5000:])
    return None


def resume_pipeline(spark: SparkSession, root: Path, checkpoint: bool) -> None:
    data = scenario()
    outputs = small_outputs()
    twin = Twin(root / "twin", outputs)
    try:
        sp = make_pipeline(spark, root, checkpoint)
        frames = pipeline_frames(spark, data)
        try:
            outs = sp.populate(frames, resume=True)
        except spark_io.PopulationStateError as exc:
            if "none was interrupted" not in str(exc):
                raise
            outs = sp.populate(frames)  # killed before the population was recorded
        got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
        integrate(got, outs, outputs)
        for s in ("customer", "store_sales"):
            twin.push(s, list(data["snap"][s].items()))
        check(got, twin, "the population, resumed after the kill")
        integrate(got, sp.apply("store_sales", spark_frame(spark, SS, data["change"]),
                                op_id="k1"), outputs)
        twin.push("store_sales", data["change"])
        check(got, twin, "apply k1, repeated after the kill")
        # The state holds each row once: a further change probes it and must agree too.
        more = [(r, -1) for r in sorted(twin.inputs["store_sales"], key=repr)[-3:]]
        integrate(got, sp.apply("store_sales", spark_frame(spark, SS, more)), outputs)
        twin.push("store_sales", more)
        check(got, twin, "a change after the kill")
    finally:
        twin.close()


def resume_join(spark: SparkSession, root: Path, checkpoint: bool) -> None:
    data = scenario()
    job = make_join(spark, root, checkpoint, data)
    total = zset(job.populate(resume=True), OUT_COLS)
    assert total == spark_join(spark, data["left"], data["right"], "left")
    out = job.apply("right", changes_df(spark, data["join_change"], SALES), op_id="k1")
    right = apply_to(data["right"], data["join_change"])
    total.update(zset(out, OUT_COLS))
    total = Counter({k: v for k, v in total.items() if v})
    assert total == spark_join(spark, data["left"], right, "left")
    assert zset(job.state("right"), SALES_COLS) == zset(df(spark, right, SALES), SALES_COLS)


def killed_and_resumed(spark: SparkSession, root: Path, driver: str, checkpoint: bool,
                       kill: tuple[str, int]) -> None:
    run_child(root, driver, checkpoint, kill)
    if driver == "pipeline":
        resume_pipeline(spark, root, checkpoint)
    else:
        resume_join(spark, root, checkpoint)


@pytest.mark.slow
def test_pipeline_population_killed_after_its_job(spark: SparkSession, tmp_path: Path
                                                   ) -> None:
    killed_and_resumed(spark, tmp_path, "pipeline", False, ("after:operation", 1))


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", [False, True], ids=["shared", "checkpoints"])
@pytest.mark.parametrize("driver", ["pipeline", "join"])
def test_driver_killed_at_seeded_points(spark: SparkSession, tmp_path: Path, driver: str,
                                        checkpoint: bool) -> None:
    counts = run_child(tmp_path / "reference", driver, checkpoint, ("none", 0))
    assert counts is not None
    menu = [(p, i) for p, c in sorted(counts.items())
            if p.split(":")[1] in ("job", "write") for i in range(1, c + 1)]
    rng = random.Random(f"{driver}-{checkpoint}")
    chosen = rng.sample(menu, min(6, len(menu)))
    if driver == "pipeline":  # after the population's job, before its last step
        chosen.append(("before:finish", 1))
    for n, kill in enumerate(chosen):
        killed_and_resumed(spark, tmp_path / f"kill-{n}", driver, checkpoint, kill)
