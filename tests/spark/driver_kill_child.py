"""Child process of ``tests/spark/test_spark_driver_kill.py``: a Spark driver killed by -9.

Usage: ``python driver_kill_child.py '<json>'`` with keys ``root`` (the state lives in
``<root>/state``), ``driver`` (``"join"`` or ``"pipeline"``), ``checkpoint`` (bool) and
``kill``: ``[point, n]``.  The child starts its own ``local[2]`` SparkSession, then
populates the driver from the data of :func:`scenario` and applies one change with
``op_id="k1"``.

The kill is a SIGKILL of this process at the ``n``-th (1-based) passage of ``point``;
points are wrappers installed here only (monkey patches of this process, nothing in the
library): ``<when>:<what>`` with ``when`` one of ``before``/``after`` and ``what`` one of

* ``job``: a Spark job of the driver (``run_job``: a SparkJoin's populate and apply, a
  change spilled to Parquet, a rollback);
* ``write``: a durable write of the driver's files (manifests, operation records, the
  writer file);
* ``operation``: a pipeline operation's one Spark job (``run_operation``: every stage
  of a population, an apply), ``finish``: a pipeline's last step of an operation
  (reports, retention, the returned outputs).

Without a kill (``["none", 0]``) the child prints ``COUNTS <json>``: how often each
point was passed, the menu of kill points.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Row = tuple[Any, ...]


def scenario() -> dict[str, Any]:
    """Everything both processes build from one seed: snapshots and the change."""
    from sparkdata import customers, sales
    from test_spark_pipeline import snapshot, store_sale

    rng = random.Random(71)
    snap = snapshot(rng)
    change = [(r, -1) for r in sorted(snap["store_sales"], key=repr)[:4]]
    change += [(store_sale(rng, sk), 1) for sk in (1, 4, 7, 9, 11)]
    left, right = Counter(customers(rng, 30)), Counter(sales(rng, 90, 35))
    join_change = [(r, -1) for r in sorted(right, key=repr)[:3]]
    join_change += [((sk, 10**8 + sk, 2, 1.25), 1) for sk in (2, 5, 8, 13, 21)]
    return {"snap": snap, "change": change, "left": left, "right": right,
            "join_change": join_change}


def make_pipeline(spark: Any, root: Path, checkpoint: bool) -> Any:
    from test_spark_pipeline import definition_of, small_outputs

    import spark_io

    kw: dict[str, Any] = {}
    if checkpoint:
        kw = {"checkpoint_uri": str(root / "durable"), "local_dir": root / "local"}
    return spark_io.SparkPipeline(spark, definition_of(small_outputs()), root / "state",
                                  shards=3, **kw)


def pipeline_frames(spark: Any, data: dict[str, Any]) -> dict[str, Any]:
    from test_spark_pipeline import CUSTOMER, SS, spark_frame

    return {"customer": spark_frame(spark, CUSTOMER, list(data["snap"]["customer"].items())),
            "store_sales": spark_frame(spark, SS, list(data["snap"]["store_sales"].items()))}


def make_join(spark: Any, root: Path, checkpoint: bool, data: dict[str, Any]) -> Any:
    from sparkdata import CUSTOMER, SALES, df

    import spark_io

    kw: dict[str, Any] = {}
    if checkpoint:
        kw = {"checkpoint_uri": root / "durable", "local_dir": root / "local"}
    return spark_io.SparkJoin(
        spark, "cs", left=df(spark, data["left"], CUSTOMER), right=df(spark, data["right"], SALES),
        left_key=["c_customer_sk"], right_key=["ss_customer_sk"], how="left",
        state_dir=root / "state", shards=3, **kw)


def _install(point: str, n: int, counts: Counter[str]) -> None:
    import importlib

    import spark_io.job as sj
    import spark_io.manifest as sm
    import spark_io.pipeline as sp

    try:
        so: Any = importlib.import_module("spark_io.operation")
    except ImportError:  # a spark_io without operation records
        so = object()

    def wrap(what: str, fn: Any) -> Any:
        def wrapped(*a: Any, **kw: Any) -> Any:
            counts[f"before:{what}"] += 1
            if point == f"before:{what}" and counts[point] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            out = fn(*a, **kw)
            counts[f"after:{what}"] += 1
            if point == f"after:{what}" and counts[point] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        return wrapped

    for owner, name, what in ((sj, "run_job", "job"), (sp, "_write_json", "write"),
                              (so, "write_json", "write"), (sm.Manifest, "write", "write"),
                              (sm.PipelineManifest, "write", "write"),
                              (sp, "run_operation", "operation"),
                              (sp.SparkPipeline, "_finish", "finish")):
        if hasattr(owner, name):
            setattr(owner, name, wrap(what, getattr(owner, name)))
    sp.run_job = sj.run_job


def main(spec: dict[str, Any]) -> None:
    from sparkdata import SALES, changes_df
    from test_spark_pipeline import SS, spark_frame

    import spark_io

    root = Path(spec["root"])
    point, n = spec["kill"]
    counts: Counter[str] = Counter()
    spark = spark_io.local_session("driver-kill-child", cores=2, log_level="ERROR")
    data = scenario()
    _install(point, int(n), counts)
    if spec["driver"] == "pipeline":
        sp = make_pipeline(spark, root, spec["checkpoint"])
        sp.populate(pipeline_frames(spark, data))
        sp.apply("store_sales", spark_frame(spark, SS, data["change"]), op_id="k1")
    else:
        job = make_join(spark, root, spec["checkpoint"], data)
        job.populate()
        job.apply("right", changes_df(spark, data["join_change"], SALES), op_id="k1")
    print("COUNTS " + json.dumps(dict(counts)), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
