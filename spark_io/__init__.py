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

This is the only package (with ``bench``) that imports pyspark; ``joinstate``,
``population`` and ``compaction`` never do.  See :mod:`spark_io.job` for what runs on
the driver and what on executors, and :mod:`spark_io._worker` for what survives a task
retry.
"""

from spark_io.errors import ManifestError, PopulationStateError, ShardBusyError, SparkIOError
from spark_io.job import SparkJoin
from spark_io.report import SparkReport
from spark_io.session import local_session

__all__ = [
    "ManifestError",
    "PopulationStateError",
    "ShardBusyError",
    "SparkIOError",
    "SparkJoin",
    "SparkReport",
    "local_session",
]
