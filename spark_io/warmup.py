"""The driver's one-time Spark set-up, done while the first operation's job runs.

The first Parquet DataFrame a Spark session resolves costs it ~1-1.5 s (the data source
and its classes are loaded, the analyzer warms up), and the first empty DataFrame
~0.25 s; later ones cost ~20 ms.  An operation ends by resolving a DataFrame per output,
so the first operation of a session would pay that after its job, while the driver
had been waiting idle for the job.  :func:`start` resolves one Parquet DataFrame and
one empty DataFrame of a given schema in a thread while the job runs; the operation
waits for it (bounded) before reading its outputs.  Nothing of the operation depends
on it: a failure here only means the outputs pay the set-up themselves.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["WAIT_SECONDS", "start"]

log = logging.getLogger(__name__)

WAIT_SECONDS = 30.0
"""Longest an operation waits for the set-up before reading its outputs anyway."""


def start(spark: Any, schema: pa.Schema, spark_schema: StructType) -> Callable[[], None]:
    """Start the set-up in a daemon thread; return the function that waits for it."""

    def run() -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="joinstate-warmup-") as d:
                path = Path(d) / "empty.parquet"
                pq.write_table(schema.empty_table(), path)
                spark.read.schema(spark_schema).parquet(path.as_uri()).schema  # noqa: B018
                spark.createDataFrame([], spark_schema).schema  # noqa: B018
        except Exception as exc:  # only a missed speed-up: the outputs set up themselves
            log.debug("the driver's Spark set-up during the job failed: %s", exc)

    thread = threading.Thread(target=run, name="joinstate-spark-warmup", daemon=True)
    thread.start()
    return lambda: thread.join(WAIT_SECONDS)
