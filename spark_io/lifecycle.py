"""The lifecycle every Spark operation shares, whichever driver runs it.

:class:`spark_io.SparkJoin` and :class:`spark_io.SparkPipeline` run each operation (a
population, an ``apply``, a micro-batch) through the same steps, kept here once: a
fresh operation id, the operation's output directory with its marker (created before
the job, marked finished after it, older finished ones pruned to ``keep_outputs``),
the Spark job itself with task failures surfaced as the library errors they carry,
the checkpoints its tasks report, what a failed ``apply`` left behind, and the report
written beside the outputs.  What an operation *does* — its tasks, its record of
exactly-once (:mod:`spark_io.operation`) — is each driver's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import RDD

from joinstate import SchemaMismatchError
from spark_io.errors import (
    SparkIOError,
    SparkJobError,
    error_from_detail,
    task_reason,
    translate_task_error,
)
from spark_io.executors import check_executors
from spark_io.outputs import OutputDir
from spark_io.report import REPORT_SCHEMA, JobReport, ShardReport

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

    from spark_io.report import SparkReport

__all__ = [
    "OUTPUTS_UNDER_CHECKPOINTS",
    "REPORT_NAME",
    "check_session",
    "checkpoints_of",
    "complete_output_dir",
    "default_outputs",
    "failed_apply_note",
    "local_outputs",
    "open_output_dir",
    "operation_id",
    "run_job",
    "undone_on_failure",
    "write_report",
]

log = logging.getLogger(__name__)

_MARKER = "_joinstate_operation.json"
"""In each operation output directory: join, operation, kind, and when it finished
(``_``-prefixed: Spark's Parquet reader skips it)."""
OUTPUTS_UNDER_CHECKPOINTS = "_outputs"
"""With ``checkpoint_uri``, outputs default to ``<checkpoint_uri>/_outputs/``."""
REPORT_NAME = "_joinstate_report.json"
"""A micro-batch's report, next to its output."""


def operation_id(kind: str) -> str:
    """A fresh operation id: ``<kind>-<UTC time>-<8 hex digits>``."""
    return f"{kind}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def check_session(spark: object) -> None:
    """Raise :class:`SchemaMismatchError` unless ``spark`` is a ``SparkSession``."""
    from pyspark.sql import SparkSession

    if not isinstance(spark, SparkSession):
        raise SchemaMismatchError(
            f"spark must be a pyspark.sql.SparkSession, got {type(spark).__name__}")


def run_job(spark: SparkSession, df: DataFrame | RDD[Any], task: Callable[..., Any],
            side: str) -> JobReport:
    """Run ``task`` over ``df`` and collect its report rows.

    A DataFrame runs as ``df.mapInArrow(task, REPORT_SCHEMA)``; an RDD (shard numbers
    or Arrow batches the driver made, one partition per shard) as
    ``rdd.mapPartitions(task)``.  RDD jobs use the Python workers the executor probe
    started (:func:`check_executors`), so they start no interpreter.  A task failure
    carrying a joinstate, population or spark_io error is raised as that error
    (Spark's exception on ``err.spark_error``).
    """
    check_executors(spark)  # cached: one probe job per session
    t0 = time.perf_counter()
    try:
        if isinstance(df, RDD):
            rows: list[Any] = df.mapPartitions(task).flatMap(_report_rows).collect()
        else:
            rows = df.mapInArrow(task, REPORT_SCHEMA).collect()
    except Exception as exc:  # Spark wraps task failures; surface the library error
        if isinstance(exc, SparkIOError) or not _from_spark(exc):
            raise
        err = translate_task_error(exc)
        if err is None:
            err = SparkJobError(
                f"a Spark job ({side}) failed outside joinstate: {task_reason(exc)}; see the "
                "executor logs (err.spark_error holds Spark's exception)")
        # Spark's exception (with the executor's traceback) stays on err.spark_error.
        err.spark_error = exc  # type: ignore[attr-defined]
        raise err from None
    shards = tuple(ShardReport.from_row(r) for r in rows)
    for shard in shards:
        if "error" in shard.detail:  # a task reported the library error it met
            err = error_from_detail(shard.detail["error"])
            err.spark_error = None  # type: ignore[attr-defined]  # no task failed
            raise err from None
    return JobReport(side=side, seconds=time.perf_counter() - t0, shards=shards)


def _from_spark(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's (py4j's or pyspark's) report of a failed job."""
    module = type(exc).__module__
    return module.startswith(("py4j", "pyspark"))


def _report_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """A task's report batch as rows (runs on executors, after the task, in RDD jobs)."""
    rows: list[dict[str, Any]] = batch.to_pylist()
    return rows


def checkpoints_of(job: JobReport) -> dict[str, str]:
    """``{store key: checkpoint id}`` reported by a job's tasks (checkpointed shards)."""
    out: dict[str, str] = {}
    for shard in job.shards:
        ck = shard.detail.get("checkpoint")
        if isinstance(ck, dict) and ck.get("id"):
            out[str(ck["store"])] = str(ck["id"])
    return out


def failed_apply_note(op: str, call: str, checkpointed: bool) -> str:
    """What a failed ``apply`` left behind and how to complete it (added to the error)."""
    how = ("rolled back to their committed checkpoints" if checkpointed
           else "rolled back from their undo records")
    return (f"apply operation id {op!r} was not committed: shards that ran it are {how}; "
            f"{call}, or with a corrected change, applies it once")


@contextlib.contextmanager
def undone_on_failure(out_dir: OutputDir, created: bool, note: str) -> Iterator[None]:
    """On failure, remove the output directory the operation created, then re-raise.

    ``note`` (how to complete the operation) is added to the error.
    """
    try:
        yield
    except BaseException as exc:
        if created:
            with contextlib.suppress(OSError, pa.ArrowException):
                out_dir.remove()
        if isinstance(exc, Exception):
            exc.add_note(note)
        raise


def open_output_dir(outputs: OutputDir, owner: str, operation: str, kind: str
                    ) -> tuple[OutputDir, bool]:
    """``<outputs>/<operation>`` with its marker, and whether this call created it."""
    out_dir = outputs.child(operation)
    created = not out_dir.exists()
    out_dir.make()
    if _read_marker(out_dir) is None:
        out_dir.write_text(_MARKER, json.dumps({"join": owner, "operation": operation,
                                                "kind": kind}))
    return out_dir, created


def complete_output_dir(outputs: OutputDir, out_dir: OutputDir, owner: str,
                        keep: int | None) -> None:
    """Mark ``out_dir`` finished (now); keep ``owner``'s newest ``keep`` finished ones."""
    info = _read_marker(out_dir) or {"join": owner,
                                     "operation": out_dir.uri.rstrip("/").rsplit("/", 1)[-1]}
    info["finished"] = time.time()
    out_dir.write_text(_MARKER, json.dumps(info))
    if keep is None:
        return
    finished = []
    for name, is_dir in outputs.entries():
        d = outputs.child(name)
        if not is_dir or d == out_dir:
            continue
        m = _read_marker(d)
        if m is None or m.get("join") != owner or "finished" not in m:
            continue  # another owner's, an unfinished (resumable) one, or not ours
        finished.append((float(m["finished"]), name, d))
    finished.sort(reverse=True)
    for _, _, d in finished[max(0, keep - 1):]:
        log.info("keep_outputs=%d: removing old output %s", keep, d.uri)
        with contextlib.suppress(OSError, pa.ArrowException):
            d.remove()


def default_outputs(state_dir: Path, checkpoint_uri: str | None) -> str:
    """Where a new join or pipeline keeps operation outputs unless ``output_uri`` says.

    With checkpoints, under the checkpoint location (which every executor reaches, so
    the driver's ``state_dir`` need not be shared); else in ``state_dir``.
    """
    if checkpoint_uri is not None:
        return OutputDir(checkpoint_uri).child(OUTPUTS_UNDER_CHECKPOINTS).uri
    return str(state_dir / "_spark" / "outputs")


def local_outputs(outputs: OutputDir) -> Path:
    """``outputs`` as a local path, or :class:`SparkIOError` saying where they are."""
    if not outputs.is_local:
        raise SparkIOError(
            f"operation outputs live at {outputs.uri}, not on a local file system; use "
            "outputs_uri (and pyarrow.fs or Spark to read it)")
    return outputs.local_path


def write_report(report: SparkReport, path: Path) -> None:
    """Write ``report`` as JSON to ``path`` and log its summary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.to_json())
    log.info("%s", report.summary())


def _read_marker(directory: OutputDir) -> dict[str, Any] | None:
    text = directory.read_text(_MARKER)
    try:
        raw = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None
