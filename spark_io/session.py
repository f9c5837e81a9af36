"""A local SparkSession configured for joinstate (tests, benchmarks, laptops).

Nothing here runs at import time: :func:`local_session` starts Spark when called.

For a cluster, set the same things in ``spark-submit``/``SparkSession.builder``:

* ``spark.sql.execution.arrow.pyspark.enabled=true`` and a large
  ``spark.sql.execution.arrow.maxRecordsPerBatch`` (batches are WriteBatches);
* ``spark.speculation=false``: a speculative copy of a task would meet the shard's
  RocksDB LOCK and fail (one writer per shard);
* executors' Python must have ``joinstate`` installed (``PYSPARK_PYTHON``);
* ``state_dir`` must be a path the driver and every executor see as the same
  directory (shared storage): it holds the manifest and the operation outputs, and,
  without ``checkpoint_uri``, the shards themselves.  With ``checkpoint_uri`` (a
  ``pyarrow.fs`` URI every executor reaches) the shards are checkpointed there at each
  commit and their working copies may be executor-local (``local_dir=``): see
  :mod:`spark_io.job`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import SparkSession

__all__ = ["LOCAL_CONF", "local_session"]

LOCAL_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.speculation": "false",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
}
"""What :func:`local_session` sets (overridable with ``conf=``)."""


def local_session(
    app_name: str = "joinstate", cores: int | str = "*", *,
    conf: Mapping[str, str] | None = None, log_level: str = "WARN",
) -> SparkSession:
    """Get or create a ``local[cores]`` SparkSession set up for joinstate.

    Arrow on, UI off, 4 shuffle partitions, UTC session time zone, speculation off,
    and Python workers running this interpreter (``PYSPARK_PYTHON`` is set to
    ``sys.executable`` unless already set), so executors import the same joinstate.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
