"""spark_io: joinstate driven from PySpark, with join state sharded over RocksDB.

::

    import spark_io

    spark = spark_io.local_session()
    job = spark_io.SparkJoin(spark, "customer_sales", left=customers, right=sales,
                             left_key=["c_customer_sk"], right_key=["ss_customer_sk"],
                             state_dir="/data/state", shards=8)
    out = job.populate()                        # DataFrame: left cols, right cols, _weight
    out = job.apply("left", changes)            # changes: the side's columns + _weight
    query = stream.writeStream.foreachBatch(job.foreach_batch_sink("right", "/data/out"))

Without pyspark, ``import spark_io`` raises :class:`SparkNotInstalledError` (an
``ImportError``) saying ``pip install 'joinstate[spark]'``.

This is the only package (with ``bench``) that imports pyspark; ``joinstate``,
``population`` and ``compaction`` never do.  Two drivers, one lifecycle:
:mod:`spark_io.job` (:class:`SparkJoin`) and :mod:`spark_io.pipeline`
(:class:`SparkPipeline`, whose operations run as one Spark job: :mod:`spark_io.dag`) run
every operation through :mod:`spark_io.lifecycle` (ids, output directories, the job,
reports) and :mod:`spark_io.operation` (exactly once: the operation record, undo and
rollback); :mod:`spark_io._worker` says what survives a task retry.  A pipeline's stage
stores stay open in the executors' Python workers between tasks
(:mod:`spark_io.storekeeper`), handed over between workers on request
(:mod:`spark_io.handover`).
"""

from spark_io.errors import (
    INSTALL_HINT,
    ExecutorEnvironmentError,
    ManifestError,
    PopulationStateError,
    ShardBusyError,
    SparkIOError,
    SparkJobError,
    SparkNotInstalledError,
    StateDirBusyError,
    WriterConflictError,
)

try:
    import pyspark  # noqa: F401 (only to say what to install when it is missing)
except ImportError as _missing:
    raise SparkNotInstalledError(
        f"spark_io needs pyspark, which this Python ({__import__('sys').executable}) cannot "
        f"import ({_missing}): {INSTALL_HINT}",
        name="pyspark",
    ) from None

from spark_io.args import JOIN_TYPES
from spark_io.executors import check_executors
from spark_io.job import SparkJoin
from spark_io.pipeline import SparkPipeline
from spark_io.report import SparkReport
from spark_io.session import local_session

__all__ = [
    "JOIN_TYPES",
    "ExecutorEnvironmentError",
    "ManifestError",
    "PopulationStateError",
    "ShardBusyError",
    "SparkIOError",
    "SparkJobError",
    "SparkJoin",
    "SparkNotInstalledError",
    "SparkPipeline",
    "SparkReport",
    "StateDirBusyError",
    "WriterConflictError",
    "check_executors",
    "local_session",
]
