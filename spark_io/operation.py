"""The lifecycle of a Spark operation on the driver: writer, record, change, commit.

Both drivers (:class:`spark_io.SparkJoin`, :class:`spark_io.SparkPipeline`) run their
``apply`` calls and micro-batches through what this module defines:

* **One writer per owner.**  A driver object may write a join's (or a pipeline's) state
  only if nobody else has since it attached or last wrote: :class:`WriterLease` keeps a
  generation number (one more per operation) and the token of the last writer in
  ``<state_dir>/_spark/ops/<owner>/writer.json`` and checks it, under an exclusive file
  lock on ``<state_dir>/_spark/.writer.lock``, at the start of every operation.  Another
  object that wrote in between makes this one stale
  (:class:`~spark_io.errors.WriterConflictError`: re-attach to continue from the state
  it committed); an operation running in another object or process at the same time
  is waited for, then refused (:class:`~spark_io.errors.StateDirBusyError`).  The lock
  is released when the operation ends or its process dies.
* **One record per operation id**, ``<state_dir>/_spark/ops/<owner>/<op>.json``
  (:class:`OperationRecord`: id, kind, target, a digest of the whole change, status),
  written atomically *before* any task runs, and the ``running`` pointer in
  ``writer.json`` naming it.  A committed id met again with the same digest replays
  the recorded outputs; with another digest it is refused
  (:class:`~joinstate.CommitConflictError`) before anything is written, wherever the
  change's rows would go.  A record marked ``rolled_back`` frees its id.
* **The change is materialised once** (:func:`collect_change`): a small one is
  collected to the driver as Arrow, a large one written to Parquet, digested by a job
  over those files and read from them by the tasks, so that the digest, the validation
  (types, NULL weights: :func:`change_sums`) and the tasks all see the same rows, even
  from a source that would give others on a second evaluation.
* **The commit point.**  Without checkpoints, each task pushes its shard's rows with an
  undo record of the operation in the same WriteBatch
  (:meth:`joinstate.db.Database.capturing_undo`), and the operation is committed when
  its record says ``committed``; if any task fails, the shards are rolled back from
  their undo records by a rollback job, and if the driver dies before the commit (or
  the rollback job fails), the next operation runs that job before anything else.  The
  undo records of committed operations are dropped by the next task that opens the
  store.  With ``checkpoint_uri`` the commit is the manifest's write of the new
  checkpoint ids, which also records the operation's id, and a failure leaves the
  committed checkpoints in place.  Either way, a driver that starts an operation first
  resolves the one a dead driver left ``running`` (:meth:`Operations.resolve`).

:class:`Operations` is that lifecycle for one driver object; the drivers supply what is
theirs (the tasks, the rollback job, the manifest).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import xxhash

from joinstate import CommitConflictError
from joinstate.codec import RowCodec
from joinstate.keys import row_hash
from joinstate.schema import conform_delta
from spark_io.errors import ManifestError, StateDirBusyError, WriterConflictError
from spark_io.manifest import write_durably
from spark_io.types import conform_batch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from pathlib import Path

    from pyspark.sql import DataFrame

    from spark_io.outputs import OutputDir

__all__ = [
    "LOCK_WAIT",
    "Change",
    "OperationLog",
    "OperationRecord",
    "Operations",
    "WriterLease",
    "change_digest",
    "change_sums",
    "collect_change",
    "read_change",
]

LOCK_WAIT = 30.0
"""Seconds an operation waits for another one on the same state_dir before refusing."""
_LOCK = ".writer.lock"
_WRITER = "writer.json"
_STATUSES = ("running", "committed", "rolled_back")


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically and durably (temporary file, fsync, rename)."""
    write_durably(path, json.dumps(data, indent=1, sort_keys=True))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is unreadable ({exc}); it is the driver's record of "
                            "operations: restore it or use a new state_dir") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{path} is not an operation record")
    return raw


# ---- the record --------------------------------------------------------------------------


@dataclass(frozen=True)
class OperationRecord:
    """What the driver knows of one operation (see the module docstring).

    ``target`` is the side or source changed; ``digest`` the hex digest of the whole
    change (:func:`change_digest`); ``status`` one of ``running``, ``committed``,
    ``rolled_back``; ``output`` where its outputs were written.
    """

    op: str
    kind: str
    target: str
    digest: str
    status: str = "running"
    started: float = 0.0
    finished: float | None = None
    output: str | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: Path) -> OperationRecord:
        """Parse a record file's contents."""
        try:
            rec = cls(op=str(raw["op"]), kind=str(raw["kind"]), target=str(raw["target"]),
                      digest=str(raw["digest"]), status=str(raw["status"]),
                      started=float(raw.get("started") or 0.0),
                      finished=None if raw.get("finished") is None else float(raw["finished"]),
                      output=raw.get("output"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where} is not an operation record: {exc!r}") from exc
        if rec.status not in _STATUSES:
            raise ManifestError(f"{where}: unknown operation status {rec.status!r}")
        return rec

    def check_same_change(self, digest: str, target: str, owner: str) -> None:
        """Raise :class:`CommitConflictError` unless ``digest``/``target`` are this change's."""
        if digest != self.digest or target != self.target:
            raise CommitConflictError(
                f"operation id {self.op!r} of {owner} was already committed with a "
                f"different change (to {self.target!r}); a retry must repeat the same change "
                "to the same target, a new change needs a new op_id; nothing was applied")


class OperationLog:
    """The operation records and the writer file of one owner in a state directory."""

    def __init__(self, state_dir: Path, owner: str) -> None:
        self.state_dir = state_dir
        self.owner = owner
        self.folder = state_dir / "_spark" / "ops" / owner

    def _path(self, op: str) -> Path:
        return self.folder / f"{op}.json"

    def get(self, op: str) -> OperationRecord | None:
        """The record of ``op``, or None if it was never started."""
        raw = _read_json(self._path(op))
        return None if raw is None else OperationRecord.from_dict(raw, self._path(op))

    def writer(self) -> dict[str, Any]:
        """The writer file: ``generation``, ``writer`` token, ``running`` operation id."""
        raw = _read_json(self.folder / _WRITER)
        return raw if raw is not None else {"generation": 0, "writer": None, "running": None}

    def _set_writer(self, **changes: Any) -> dict[str, Any]:
        state = {**self.writer(), **changes}
        write_json(self.folder / _WRITER, state)
        return state

    def running(self) -> OperationRecord | None:
        """The operation a driver started and did not finish (committed or rolled back)."""
        op = self.writer().get("running")
        if not op:
            return None
        rec = self.get(str(op))
        if rec is None:  # died between the pointer and the record: nothing ran
            self._set_writer(running=None)
        return rec

    def begin(self, record: OperationRecord) -> OperationRecord:
        """Record ``record`` as running, durably, before any of its tasks runs."""
        rec = replace(record, status="running", started=time.time(), finished=None)
        write_json(self._path(rec.op), asdict(rec))
        self._set_writer(running=rec.op)
        return rec

    def finish(self, record: OperationRecord, status: str) -> OperationRecord:
        """Mark ``record`` committed or rolled back, then clear the running pointer."""
        if status not in ("committed", "rolled_back"):
            raise ValueError(f"internal: status {status!r}")
        rec = replace(record, status=status, finished=time.time())
        write_json(self._path(rec.op), asdict(rec))
        if self.writer().get("running") == rec.op:
            self._set_writer(running=None)
        return rec

    def forget(self, op: str) -> None:
        """Drop ``op``'s record (a stream's micro-batches beyond its retention)."""
        self._path(op).unlink(missing_ok=True)


# ---- one writer ------------------------------------------------------------------------------


class WriterLease:
    """A driver object's right to write one owner's state (see the module docstring).

    ``what`` names the object in messages (``"SparkJoin 'cs'"``), ``reattach`` says how
    to get a current one.  Not picklable; lives on the driver.
    """

    def __init__(self, log: OperationLog, what: str, reattach: str) -> None:
        self.log = log
        self.what = what
        self.reattach = reattach
        self.token = uuid.uuid4().hex
        writer = log.writer()
        self.seen = (int(writer.get("generation") or 0), writer.get("writer"))
        self._threads = threading.RLock()
        self._depth = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Be the one writer for the block: locked, and checked not stale.

        Re-entrant within a thread; another thread of the same object waits.
        """
        with self._threads:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            fd = self._lock()
            try:
                self._claim()
                self._depth = 1
                try:
                    yield
                finally:
                    self._depth = 0
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def _lock(self) -> int:
        path = self.log.state_dir / "_spark" / _LOCK
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise StateDirBusyError(
                        f"{self.what}: another operation on {self.log.state_dir} has been "
                        f"running for over {LOCK_WAIT:.0f} s (lock {path}); a state_dir takes "
                        "one operation at a time: wait for it, or stop the other driver"
                    ) from None
                time.sleep(0.05)
            except BaseException:
                os.close(fd)
                raise

    def _claim(self) -> None:
        writer = self.log.writer()
        current = (int(writer.get("generation") or 0), writer.get("writer"))
        if current != self.seen:
            raise WriterConflictError(
                f"{self.what}: another driver object wrote to {self.log.owner!r} in "
                f"{self.log.state_dir} after this one attached (writer generation "
                f"{current[0]}, this one knows {self.seen[0]}); its changes would be lost "
                f"if this one wrote now. {self.reattach}")
        generation = current[0] + 1  # every operation: a writer attached earlier is stale
        self.log._set_writer(generation=generation, writer=self.token)  # noqa: SLF001
        self.seen = (generation, self.token)


# ---- the change ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """A change materialised once: ``table`` (collected) or Parquet ``files``."""

    digest: str
    rows: int
    table: pa.Table | None = None
    files: OutputDir | None = None


def change_sums(schema: pa.Schema, tables: Iterable[pa.Table], what: str
                ) -> tuple[int, int, int]:
    """The additive parts of a change's digest: two 64-bit sums and the row count.

    Each row is conformed to ``schema`` by the core's own rules
    (:func:`joinstate.schema.conform_delta`: a value that does not fit, a NULL in a
    not-null column, a NULL weight raise :class:`~joinstate.SchemaMismatchError` naming
    ``what`` and the column), encoded and hashed as the core hashes rows (xxh3-128);
    the sums are of hash x weight over all rows (mod 2^64 per half), so they depend on
    the consolidated change only, neither on row order nor on how rows are split into
    tables, and parts computed apart add up (:func:`change_digest`).
    """
    codec = RowCodec(schema)
    lo = np.uint64(0)
    hi = np.uint64(0)
    n = 0
    for t in tables:
        if not t.num_rows:
            continue
        table, w = conform_delta(schema, conform_batch(t, schema), what)
        words = np.ascontiguousarray(row_hash(codec.encode(table)).matrix()).view("<u8")
        weights = w.view(np.uint64)
        with np.errstate(over="ignore"):
            lo = lo + (words[:, 0] * weights).sum(dtype=np.uint64)
            hi = hi + (words[:, 1] * weights).sum(dtype=np.uint64)
        n += table.num_rows
    return int(lo), int(hi), n


def change_digest(target: str, parts: Iterable[tuple[int, int, int]]) -> tuple[str, int]:
    """The hex digest of a change to ``target`` from its parts (:func:`change_sums`)."""
    lo = hi = n = 0
    for a, b, c in parts:
        lo, hi, n = (lo + a) % 2**64, (hi + b) % 2**64, n + c
    h = xxhash.xxh3_128(target.encode() + b"\x00")
    h.update(lo.to_bytes(8, "big") + hi.to_bytes(8, "big"))
    return h.hexdigest(), n


@dataclass(frozen=True)
class _DigestTask:
    """``mapInArrow`` function: the digest parts of the rows of one partition."""

    schema: pa.Schema
    what: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_io._worker import _report, reports_errors

        def parts(_: object, it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            lo, hi, n = change_sums(self.schema, (pa.Table.from_batches([b]) for b in it),
                                    self.what)
            yield _report(0, "digest", n, 0, 0.0, detail={"lo": lo, "hi": hi})

        yield from reports_errors(parts)(None, batches)


def read_change(df: DataFrame, schema: pa.Schema, target: str, what: str,
                max_rows: int | None = None) -> Change | None:
    """A small change that is a plain scan of Parquet files, read by the driver itself.

    ``df`` as the caller gave it (``schema``'s columns, perhaps ``_weight``): when it
    scans Parquet files pyarrow reads as Spark would (:func:`spark_io.frames.parquet_files`,
    footers only) holding at most ``max_rows`` rows (default
    :data:`spark_io.routing.COLLECT_MAX_ROWS`), they are read with pyarrow, without a
    Spark job; else None (the caller collects it through Spark).
    """
    import pyarrow.parquet as pq

    from spark_io import routing
    from spark_io.frames import parquet_files

    limit = routing.COLLECT_MAX_ROWS if max_rows is None else max_rows
    cols = [*schema.names, *(["_weight"] if "_weight" in df.columns else [])]
    found, _ = parquet_files(df, cols, what)
    if found is None or found.rows > limit:
        return None
    parts = [pq.read_table(p, columns=list(found.columns)) for p in found.paths]
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    if "_weight" not in table.column_names:
        table = table.append_column("_weight", pa.array(np.ones(table.num_rows, np.int64)))
    table = conform_batch(table, schema.append(pa.field("_weight", pa.int64())))
    table, w = conform_delta(schema, table, what)
    table = table.append_column(pa.field("_weight", pa.int64(), nullable=False),
                                pa.array(w, pa.int64()))
    digest, n = change_digest(target, [change_sums(schema, [table], what)])
    return Change(digest=digest, rows=n, table=table)


def collect_change(rows: DataFrame, schema: pa.Schema, target: str, what: str,
                   spill: OutputDir, run: Callable[..., Any]) -> Change:
    """``rows`` (conformed: ``schema``'s columns and ``_weight``) evaluated once.

    A change of at most :data:`spark_io.routing.COLLECT_MAX_ROWS` rows is collected as
    Arrow (:func:`spark_io.routing.collect_small`); a larger one is written to Parquet
    under ``spill`` by one Spark job and digested by another over those files (``run``:
    :func:`spark_io.lifecycle.run_job`), whose rows the tasks will read.  Validation errors
    (see :func:`change_sums`) are raised before any task of the operation runs.
    """
    from spark_io.routing import collect_small

    table = collect_small(rows)
    if table is not None:
        digest, n = change_digest(target, [change_sums(schema, [table], what)])
        return Change(digest=digest, rows=n, table=table)
    spill.remove()
    rows.write.mode("overwrite").parquet(spill.spark_path)
    frame = rows.sparkSession.read.schema(rows.schema).parquet(spill.spark_path)
    job = run(rows.sparkSession, frame, _DigestTask(schema, what), "digest")
    digest, n = change_digest(target, [(int(s.detail["lo"]), int(s.detail["hi"]), s.rows_in)
                                       for s in job.shards])
    return Change(digest=digest, rows=n, files=spill)


# ---- the lifecycle both drivers share -------------------------------------------------------


class Operations:
    """One owner's operations as one driver object runs them (see the module docstring).

    ``what`` names the owner in messages; ``reattach`` says how to get a current driver
    object; ``checkpointed``: commits are the manifest's (checkpoint ids), else the
    records' (undo records in the shards).
    """

    def __init__(self, state_dir: Path, owner: str, what: str, reattach: str,
                 checkpointed: bool) -> None:
        self.log = OperationLog(state_dir, owner)
        self.lease = WriterLease(self.log, what, reattach)
        self.what = what
        self.checkpointed = checkpointed

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Be the one writer for the block (:meth:`WriterLease.hold`)."""
        return self.lease.hold()

    def resolve(self, committed_op: str | None,
                rollback: Callable[[OperationRecord], object]) -> OperationRecord | None:
        """Finish the operation a driver left running (it died, or its rollback failed).

        Committed if its record or the manifest (``committed_op``, with checkpoints)
        says so; otherwise its shards are rolled back (``rollback``, a Spark job; with
        checkpoints nothing is needed, uncommitted checkpoints are never used) and its
        output directory removed.  Returns the record, or None if none was running.
        """
        rec = self.log.running()
        if rec is None:
            return None
        if rec.status == "committed" or (self.checkpointed and committed_op == rec.op):
            return self.log.finish(rec, "committed")
        if not self.checkpointed:
            rollback(rec)
        if rec.output:
            _remove(rec.output)
        return self.log.finish(rec, "rolled_back")

    def start(self, op: str, kind: str, target: str, digest: str, output: str
              ) -> tuple[OperationRecord, bool]:
        """Record ``op`` as running, or find it committed: ``(record, replay)``.

        A committed ``op`` with another digest or target raises
        :class:`~joinstate.CommitConflictError` (nothing was written).
        """
        rec = self.log.get(op)
        if rec is not None and rec.status == "committed":
            rec.check_same_change(digest, target, self.what)
            return rec, True
        return self.log.begin(OperationRecord(op, kind, target, digest, output=output)), False

    def commit(self, rec: OperationRecord) -> OperationRecord:
        """Mark ``rec`` committed (without checkpoints: the commit point itself)."""
        return self.log.finish(rec, "committed")

    def abort(self, rec: OperationRecord, exc: BaseException,
              rollback: Callable[[OperationRecord], object]) -> None:
        """After ``rec`` failed with ``exc``: roll its shards back and mark it so.

        Without checkpoints ``rollback`` runs (a Spark job); a failure of it, or an
        interruption (``exc`` not an ``Exception``), leaves the record running, and the
        next operation rolls it back first.  The outcome is added to ``exc`` as a note.
        """
        if not isinstance(exc, Exception):
            return
        try:
            if not self.checkpointed:
                rollback(rec)
            self.log.finish(rec, "rolled_back")
        except Exception as err:
            exc.add_note(
                f"operation {rec.op!r} of {self.what} failed, and rolling it back failed "
                f"too ({type(err).__name__}: {err}); the next operation rolls it back first")
        else:
            exc.add_note(
                f"operation {rec.op!r} of {self.what} was rolled back: nothing of it is "
                "applied on any shard; the same op_id may be used again")


def _remove(uri: str) -> None:
    from spark_io.outputs import OutputDir

    with contextlib.suppress(OSError, pa.ArrowException):
        OutputDir(uri).remove()
