"""The driver's face: :class:`SparkJoin` plans Spark jobs over the shards of one join.

Where things run:

* **Driver** (this module): validates schemas, writes the manifest, routes DataFrames
  (:func:`spark_io.routing.route`), runs one Spark job per step, collects per-shard
  report rows, and returns the output as a DataFrame over Parquet files.  The driver
  never opens a shard's RocksDB itself.
* **Executors** (:mod:`spark_io._worker`): one ``mapInArrow`` task per shard opens the
  shard, applies its rows, writes its output file, and reports.

Exactly-once evaluation.  :meth:`SparkJoin.populate` and :meth:`SparkJoin.apply` are
**eager**: the Spark jobs run when the method is called, each output row is written
once to Parquet under ``<state_dir>/_spark/outputs/<operation>/``, and the returned
DataFrame is a lazily evaluated ``spark.read.parquet`` of those files.  Evaluating it
any number of times (``count()``, ``show()``, ``collect()``) reads the same rows and
never touches the state.  Eagerness is deliberate: a lazily applied change would be
applied in whatever order actions happen to run, and a change DataFrame over a growing
source could differ between evaluations.  Within a job, task retries are covered by
commit ids (``apply``, the streaming sink) or resumed from durable progress markers
(``populate``); see :mod:`spark_io._worker`.  ``apply(..., op_id=...)`` with an id used
before returns the recorded output instead of applying again, which makes a driver-side
retry safe too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import shutil
import time
import uuid
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from joinstate import WEIGHT, SchemaMismatchError, Side, SideName, StoreOptions, output_schema
from joinstate.keys import key_plan
from joinstate.schema import check_column_types
from population.strategy import small_side as choose_small_side
from spark_io import args
from spark_io._worker import (
    ApplyTask,
    ControlTask,
    PopulateTask,
    StateTask,
    options_to_dict,
)
from spark_io.errors import PopulationStateError, SparkIOError, translate_task_error
from spark_io.executors import check_executors
from spark_io.manifest import Manifest, manifest_path
from spark_io.report import REPORT_SCHEMA, JobReport, ShardReport, SparkReport
from spark_io.routing import route
from spark_io.types import arrow_schema, arrow_type, spark_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "undone_on_failure",
    "SparkJoin",
    "check_session",
    "complete_output_dir",
    "open_output_dir",
    "operation_id",
    "run_job",
    "write_report",
]

log = logging.getLogger(__name__)

_SIDES: tuple[SideName, SideName] = ("left", "right")
_MARKER = "_joinstate_operation.json"
"""In each operation output directory: join, operation, kind, and when it finished
(``_``-prefixed: Spark's Parquet reader skips it)."""


def _operation_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def _side_of(df: DataFrame, key: Sequence[str], unique_key: Sequence[str] | None,
             label: str) -> Side:
    fields = [f for f in df.schema.fields if f.name != WEIGHT]
    names = [f.name for f in fields]
    args.check_columns(key, names, f"{label}_key")
    if unique_key is not None:
        args.check_columns(unique_key, names, f"{label}_unique_key")
    try:
        schema = arrow_schema(T.StructType(fields))
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(f"{label} side: {exc}") from exc
    return Side(schema, key=list(key), unique_key=None if unique_key is None else list(unique_key))


def _output_schema(manifest: Manifest) -> pa.Schema:
    """The join's output schema, by the core's own rules (validates key types too)."""
    key_plan(manifest.left.schema, manifest.left.key, manifest.right.schema, manifest.right.key)
    return output_schema(manifest.left, manifest.right, manifest.how, manifest.suffixes)


class SparkJoin:
    """A join whose state is sharded over RocksDB directories and driven from Spark.

    ``SparkJoin(spark, name, left=df, right=df, left_key=..., right_key=..., how=...,
    state_dir=..., shards=...)`` creates the join (or re-attaches to the same spec in
    ``state_dir``); :meth:`open` re-attaches from the manifest alone.  The object lives
    on the driver and is not thread-safe; run one operation at a time per ``state_dir``.

    Every argument is checked on the driver before anything is written.  ``how`` takes
    Spark's join types and aliases (``"outer"``/``"full_outer"`` -> ``"full"``,
    ``"leftsemi"`` -> ``"left_semi"`` ..., case-insensitive; see
    :data:`spark_io.args.JOIN_TYPES`).  Before the first Spark job of a session, one
    probe task checks that executors can import joinstate
    (:func:`spark_io.check_executors`).  ``keep_outputs`` is how many operation output
    directories (``<state_dir>/_spark/outputs/<operation>/``) of this join are kept:
    after each successful ``populate``/``apply`` the oldest beyond that are deleted
    (never the one just returned; ``None`` keeps all).
    """

    def __init__(
        self, spark: SparkSession, name: str, *, left: DataFrame, right: DataFrame,
        left_key: Sequence[str], right_key: Sequence[str], how: str = "inner",
        state_dir: str | Path, shards: int = 8,
        left_unique_key: Sequence[str] | None = None,
        right_unique_key: Sequence[str] | None = None,
        suffixes: tuple[str, str] = ("", "_right"),
        options: StoreOptions | None = None,
        keep_outputs: int | None = 20,
    ) -> None:
        # Every argument first: nothing is written and no job runs if one is wrong.
        _check_session(spark)
        name = args.check_name(name)
        left = args.check_dataframe(left, "left")
        right = args.check_dataframe(right, "right")
        lkey = args.check_key(left_key, "left_key")
        rkey = args.check_key(right_key, "right_key")
        luniq = args.check_key(left_unique_key, "left_unique_key", optional=True)
        runiq = args.check_key(right_unique_key, "right_unique_key", optional=True)
        assert lkey is not None and rkey is not None
        how = args.normalize_how(how)
        state = args.check_path(state_dir, "state_dir")
        shards = args.check_shards(shards)
        suffixes = args.check_suffixes(suffixes)
        options = args.check_options(options)
        keep = args.check_keep_outputs(keep_outputs)
        manifest = Manifest(
            name=name, shards=shards, how=how, suffixes=suffixes,
            left=_side_of(left, lkey, luniq, "left"),
            right=_side_of(right, rkey, runiq, "right"),
        )
        out_schema = _output_schema(manifest)  # validates the spec with the core's rules
        stored: Manifest | None = None
        if manifest_path(state, name).exists():
            stored = Manifest.read(state, name)
            stored.check_same(manifest, state)
        check_executors(spark)  # before the manifest is written: a broken setup leaves none
        if stored is None:
            manifest.write(state)
        else:
            manifest = stored
        self._attach(spark, manifest, state, options, out_schema, {"left": left, "right": right},
                     keep)

    @classmethod
    def open(cls, spark: SparkSession, name: str, state_dir: str | Path,
             options: StoreOptions | None = None, *, keep_outputs: int | None = 20
             ) -> SparkJoin:
        """Re-attach to join ``name`` in ``state_dir``.

        Shards, keys, schemas and ``how`` come from its manifest, so rows route exactly
        as before.
        """
        _check_session(spark)
        name = args.check_name(name)
        state = args.check_path(state_dir, "state_dir")
        options = args.check_options(options)
        keep = args.check_keep_outputs(keep_outputs)
        manifest = Manifest.read(state, name)
        out_schema = _output_schema(manifest)
        check_executors(spark)
        job = cls.__new__(cls)
        cls._attach(job, spark, manifest, state, options, out_schema, None, keep)
        return job

    def _attach(self, spark: SparkSession, manifest: Manifest, state_dir: Path,
                options: StoreOptions | None, out_schema: pa.Schema,
                snapshots: dict[str, DataFrame] | None, keep_outputs: int | None) -> None:
        self.keep_outputs = keep_outputs
        self._snapshots = snapshots
        self.spark = spark
        self.manifest = manifest
        self.state_dir = state_dir
        self.options = options
        self.arrow_output_schema = out_schema
        self.output_schema: T.StructType = spark_schema(out_schema)
        self.last_report: SparkReport | None = None

    # ---- facts ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The join's name (also its name in every shard's catalog)."""
        return self.manifest.name

    @property
    def shards(self) -> int:
        """Number of shards (fixed when the state was created)."""
        return self.manifest.shards

    @property
    def how(self) -> str:
        """The join type."""
        return self.manifest.how

    def side_schema(self, side: SideName) -> T.StructType:
        """The Spark schema of ``side``'s rows (without ``_weight``)."""
        return spark_schema(self.manifest.side(side).schema)

    # ---- population -----------------------------------------------------------------------

    def populate(self, strategy: str = "auto", *,
                 small_side: SideName | None = None, resume: bool = False) -> DataFrame:
        """Load the snapshot DataFrames; return the initial output (left, right, ``_weight``).

        Two Spark jobs, small side first (the side with fewer rows, or ``small_side``),
        then the big side, which probes the loaded small side; inside each task the
        ``population`` driver runs ``strategy`` on its shard.  Then every shard goes live.
        Eager (see the module docstring); the combined report is :attr:`last_report`
        and ``<state_dir>/_spark/reports/<operation>.json``.  Population happens once per
        state directory.

        Failures.  A retried task resumes its shard where the failed attempt stopped
        (see :mod:`spark_io._worker`).  If the whole call failed (the job ran out of task
        attempts, the driver died), calling ``populate(resume=True)`` on the same
        snapshots continues it: shards already loaded are skipped, half-loaded ones
        resume, and the returned DataFrame holds exactly the output of an uninterrupted
        run (one file per input batch, re-delivered batches replace their file).  Without
        ``resume=True`` such a call raises :class:`PopulationStateError`; the other remedy
        is a new ``state_dir``.  Within a partition, rows are sorted before loading so
        that a resumed task sees the same batches as the failed one (resuming checks a
        digest of the batches it skips and refuses input that changed).

        ``strategy`` is a :func:`population.preset` name or ``"auto"``; ``small_side``
        ``None``, ``"left"`` or ``"right"``: checked before anything runs
        (:class:`population.PopulationError`).  If the call fails, its output directory
        is removed unless it holds output a ``populate(resume=True)`` continues.
        """
        strategy = args.check_strategy(strategy)
        small_side = args.check_small_side(small_side)
        resume = args.check_bool(resume, "resume")
        if self._snapshots is None:
            raise SparkIOError(
                f"join {self.name!r} was re-attached with SparkJoin.open(), which has no "
                "snapshot DataFrames; populate() runs on the SparkJoin(...) that created it"
            )
        if self.manifest.populated is not None:
            raise PopulationStateError(
                f"join {self.name!r} in {self.state_dir} was populated already (operation "
                f"{self.manifest.populated}); use apply() for changes, or a new state_dir"
            )
        running = self.manifest.populating
        if running is not None and not resume:
            raise PopulationStateError(
                f"join {self.name!r} in {self.state_dir}: populate() (operation "
                f"{running.get('operation')}) was interrupted midway; call "
                "populate(resume=True) with the same snapshots to continue it, or use a new "
                "state_dir"
            )
        t0 = time.perf_counter()
        check_executors(self.spark)
        counts: dict[str, int] = {s: self._snapshots[s].count() for s in _SIDES}
        small: SideName = small_side or choose_small_side(counts)
        if running is not None:
            for name, mine, theirs in (("small_side", small, running.get("small_side")),
                                       ("strategy", strategy, running.get("strategy"))):
                if mine != theirs:
                    raise PopulationStateError(
                        f"join {self.name!r}: resume=True continues the interrupted populate() "
                        f"with {name}={theirs!r}; got {name}={mine!r}"
                    )
            op = str(running["operation"])
        else:
            op = _operation_id("populate")
            self.manifest = self.manifest.replace(populating={
                "operation": op, "small_side": small, "strategy": strategy})
            self.manifest.write(self.state_dir)
        big: SideName = "right" if small == "left" else "left"
        sizes: dict[str, int] = {s: math.ceil(counts[s] / self.shards) for s in _SIDES}
        out_dir, _ = self._output_dir(op, "populate")
        jobs = []
        try:
            for side, final in ((small, False), (big, True)):
                task = PopulateTask(
                    self.manifest, str(self.state_dir), options_to_dict(self.options),
                    side=side, output_dir=str(out_dir), strategy=strategy, sizes=sizes,
                    final=final, resume=resume,
                )
                rows = self._snapshot_rows(side)
                # A deterministic order per shard: a resumed task must meet the same batches.
                routed = route(rows, self.manifest, side).sortWithinPartitions(*rows.columns)
                jobs.append(self._run_job(routed, task, side))
            self._control(go_live=True)
        except BaseException as exc:
            # populate(resume=True) continues into this directory; keep it if it holds
            # output (an empty one is simply created again).
            if not _holds_output(out_dir):
                shutil.rmtree(out_dir, ignore_errors=True)
            if isinstance(exc, Exception) and not isinstance(exc, PopulationStateError):
                exc.add_note(
                    f"populate operation {op} of join {self.name!r} is recorded as "
                    "interrupted: once the cause is fixed, populate(resume=True) with the "
                    "same snapshots continues it")
            raise
        self.manifest = self.manifest.replace(populated=op, populating=None)
        self.manifest.write(self.state_dir)
        self._finish(SparkReport(
            join=self.name, operation=op, kind="populate", shards=self.shards,
            output_path=str(out_dir), seconds=time.perf_counter() - t0, jobs=tuple(jobs),
            strategy=strategy, small_side=small,
        ))
        self._completed(out_dir)
        return self._read(out_dir)

    def _snapshot_rows(self, side: SideName) -> DataFrame:
        assert self._snapshots is not None
        df = self._snapshots[side]
        cols = list(self.manifest.side(side).schema.names)
        return df.select(*cols, *([WEIGHT] if WEIGHT in df.columns else []))

    # ---- live changes ---------------------------------------------------------------------

    def apply(self, side: SideName, changes: DataFrame, *, op_id: str | None = None
              ) -> DataFrame:
        """Apply a change DataFrame (the side's columns + ``_weight``) to ``side``.

        Returns the output change set as a DataFrame over Parquet (eager, exactly once:
        see the module docstring).  Each shard's part of the change is one WriteBatch
        committed with the operation id; calling ``apply`` again with the same ``op_id``
        returns the recorded output and applies nothing.  ``op_id``: letters, digits,
        ``.``, ``_``, ``-``.

        If the call fails, the output directory it created is removed, and the error
        carries a note with the operation id: shards that finished have committed it,
        so ``apply(side, changes, op_id=<that id>)`` completes the change exactly once.
        """
        side = args.check_side(side)
        changes = args.check_dataframe(changes, "changes")
        op = args.check_op_id(op_id, "op_id") or _operation_id("apply")
        rows = self._conform_changes(side, changes)  # schema checked before any directory
        out_dir, created = self._output_dir(op, "apply")
        with undone_on_failure(out_dir, created, (
                f"apply operation id {op!r}: shards that finished committed it; "
                f"apply({side!r}, <the same changes>, op_id={op!r}) completes it exactly "
                "once")):
            self._apply(side, rows, commit_id=f"spark-apply:{op}", out_dir=out_dir,
                        operation=op, kind="apply")
        self._completed(out_dir)
        return self._read(out_dir)

    def foreach_batch_sink(
        self, side: SideName, output_path: str | Path, *, sink_id: str | None = None,
        retain: int = 2,
    ) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function applying each micro-batch to ``side`` exactly once.

        The micro-batch's id is committed with each shard's change in one WriteBatch;
        a replayed batch id (Spark re-runs the last batch after a failure) returns the
        output recorded the first time.  Output goes to Parquet under
        ``<output_path>/batch_id=<id>/``, replaced on replay, so the sink is idempotent;
        ``spark.read.parquet(output_path)`` reads every batch with a ``batch_id`` column.

        ``sink_id`` names the stream in the commit ids (default: from ``side`` and
        ``output_path``).  A new query (new checkpoint, batch ids from 0 again) needs a
        new ``sink_id`` or ``output_path``.  Each shard keeps the ids of its last
        ``retain`` batches.
        """
        side = args.check_side(side)
        base = args.check_path(output_path, "output_path")
        sink_id = args.check_op_id(sink_id, "sink_id")
        retain = args.check_retain(retain)
        sid = sink_id or f"{side}-{hashlib.sha1(str(base).encode()).hexdigest()[:12]}"
        prefix = f"spark-stream:{sid}:"

        def sink(batch_df: DataFrame, batch_id: int) -> None:
            rows = self._conform_changes(side, args.check_dataframe(batch_df, "batch_df"))
            out_dir = base / f"batch_id={batch_id}"
            if out_dir.exists():
                shutil.rmtree(out_dir)  # a replay: rewritten from the recorded outputs
            out_dir.mkdir(parents=True)
            try:
                self._apply(side, rows, commit_id=f"{prefix}{batch_id}", out_dir=out_dir,
                            operation=f"{sid}-{batch_id}", kind="micro-batch",
                            forget=(prefix, batch_id - retain + 1),
                            report_path=out_dir / "_joinstate_report.json")
            except BaseException:
                # Spark runs the batch again after a restart; no partial batch meanwhile.
                shutil.rmtree(out_dir, ignore_errors=True)
                raise

        return sink

    def _apply(self, side: SideName, rows: DataFrame, *, commit_id: str, out_dir: Path,
               operation: str, kind: str, forget: tuple[str, int] | None = None,
               report_path: Path | None = None) -> None:
        """Apply conformed change rows (:meth:`_conform_changes`)."""
        t0 = time.perf_counter()
        task = ApplyTask(
            self.manifest, str(self.state_dir), options_to_dict(self.options), side=side,
            output_dir=str(out_dir), commit_id=commit_id,
            forget_prefix=forget[0] if forget else None,
            keep_after=forget[1] if forget else None,
        )
        job = self._run_job(route(rows, self.manifest, side), task, side)
        self._finish(SparkReport(
            join=self.name, operation=operation, kind=kind, shards=self.shards,
            output_path=str(out_dir), seconds=time.perf_counter() - t0, jobs=(job,),
        ), report_path)

    def _conform_changes(self, side: SideName, changes: DataFrame) -> DataFrame:
        """Select the side's columns (checked castable) and ``_weight`` as a long."""
        side = args.check_side(side)
        schema = self.manifest.side(side).schema
        given = {f.name: f.dataType for f in changes.schema.fields}
        check_column_types(schema, {n: arrow_type(t, n) for n, t in given.items()}, side)
        if WEIGHT in given:
            weight = F.col(WEIGHT).cast("long").alias(WEIGHT)
        else:
            weight = F.lit(1).cast("long").alias(WEIGHT)
        return changes.select(*[F.col(n) for n in schema.names], weight)

    # ---- inspection ------------------------------------------------------------------------

    def state(self, side: SideName) -> DataFrame:
        """The consolidated state of ``side`` over all shards (columns + ``_weight``).

        Lazily evaluated and read-only, but each evaluation opens every shard, so do not
        evaluate it while an operation on this join runs (it would meet a locked shard).
        """
        side = args.check_side(side)
        check_executors(self.spark)
        schema = T.StructType([*self.side_schema(side).fields,
                               T.StructField(WEIGHT, T.LongType(), False)])
        task = StateTask(self.manifest, str(self.state_dir), options_to_dict(self.options),
                         side=side, schema=arrow_schema(schema))
        return self._shard_ids().mapInArrow(task, schema)

    def shard_summary(self) -> list[dict[str, Any]]:
        """Per shard: phase and row counters of both sides (one small Spark job)."""
        return [
            {"shard": r.shard, **r.detail}
            for r in sorted(self._control(go_live=False).shards, key=lambda r: r.shard)
        ]

    # ---- plumbing --------------------------------------------------------------------------

    def _shard_ids(self) -> DataFrame:
        parallel = max(1, min(self.shards, self.spark.sparkContext.defaultParallelism))
        return self.spark.range(0, self.shards, 1, numPartitions=parallel)

    def _control(self, go_live: bool) -> JobReport:
        task = ControlTask(self.manifest, str(self.state_dir), options_to_dict(self.options),
                           go_live=go_live)
        return self._run_job(self._shard_ids(), task, "both")

    def _run_job(self, df: DataFrame, task: Callable[..., Any], side: str) -> JobReport:
        return run_job(self.spark, df, task, side)

    @property
    def outputs_dir(self) -> Path:
        """Where operation outputs live: ``<state_dir>/_spark/outputs/``."""
        return self.state_dir / "_spark" / "outputs"

    def _output_dir(self, operation: str, kind: str) -> tuple[Path, bool]:
        """The operation's output directory, and whether this call created it."""
        return open_output_dir(self.outputs_dir, self.name, operation, kind)

    def _completed(self, out_dir: Path) -> None:
        """Mark ``out_dir`` finished (now), then apply the ``keep_outputs`` retention."""
        complete_output_dir(self.outputs_dir, out_dir, self.name, self.keep_outputs)

    def _read(self, path: Path) -> DataFrame:
        return self.spark.read.schema(self.output_schema).parquet(str(path))

    def _finish(self, report: SparkReport, path: Path | None = None) -> None:
        """Keep ``report`` as :attr:`last_report` and write it as JSON.

        Next to Parquet output the file is named ``_...``, which Spark's readers skip.
        """
        self.last_report = report
        write_report(report, path or self.state_dir / "_spark" / "reports"
                     / f"{report.operation}.json")


# ---- pieces shared with spark_io.pipeline ------------------------------------------------


def operation_id(kind: str) -> str:
    """A fresh operation id: ``<kind>-<UTC time>-<8 hex digits>``."""
    return _operation_id(kind)


def check_session(spark: object) -> None:
    """Raise :class:`SchemaMismatchError` unless ``spark`` is a ``SparkSession``."""
    _check_session(spark)


def run_job(spark: SparkSession, df: DataFrame, task: Callable[..., Any], side: str
            ) -> JobReport:
    """Run ``df.mapInArrow(task, REPORT_SCHEMA)`` and collect its report rows.

    A task failure carrying a joinstate, population or spark_io error is raised as that
    error (Spark's exception on ``err.spark_error``).
    """
    check_executors(spark)  # cached: one probe task per session
    t0 = time.perf_counter()
    try:
        rows = df.mapInArrow(task, REPORT_SCHEMA).collect()
    except Exception as exc:  # Spark wraps task failures; surface the library error
        err = translate_task_error(exc)
        if err is None:
            raise
        # Spark's exception (with the executor's traceback) stays on err.spark_error.
        raise err from None
    return JobReport(side=side, seconds=time.perf_counter() - t0,
                     shards=tuple(ShardReport.from_row(r) for r in rows))


@contextlib.contextmanager
def undone_on_failure(out_dir: Path, created: bool, note: str) -> Iterator[None]:
    """On failure, remove the output directory the operation created, then re-raise.

    ``note`` (how to complete the operation) is added to the error.
    """
    try:
        yield
    except BaseException as exc:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        if isinstance(exc, Exception):
            exc.add_note(note)
        raise


def open_output_dir(outputs_dir: Path, owner: str, operation: str, kind: str
                    ) -> tuple[Path, bool]:
    """``<outputs_dir>/<operation>`` with its marker, and whether this call created it."""
    path = outputs_dir / operation
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    marker = path / _MARKER
    if not marker.exists():
        marker.write_text(json.dumps({"join": owner, "operation": operation, "kind": kind}))
    return path, created


def complete_output_dir(outputs_dir: Path, out_dir: Path, owner: str, keep: int | None
                        ) -> None:
    """Mark ``out_dir`` finished (now); keep ``owner``'s newest ``keep`` finished ones."""
    marker = out_dir / _MARKER
    info = _read_marker(out_dir) or {"join": owner, "operation": out_dir.name}
    info["finished"] = time.time()
    marker.write_text(json.dumps(info))
    if keep is None:
        return
    finished = []
    for d in outputs_dir.iterdir():
        m = _read_marker(d)
        if m is None or m.get("join") != owner or "finished" not in m:
            continue  # another owner's, an unfinished (resumable) one, or not ours
        if d != out_dir:
            finished.append((float(m["finished"]), d.name, d))
    finished.sort(reverse=True)
    for _, _, d in finished[max(0, keep - 1):]:
        log.info("keep_outputs=%d: removing old output %s", keep, d)
        shutil.rmtree(d, ignore_errors=True)


def write_report(report: SparkReport, path: Path) -> None:
    """Write ``report`` as JSON to ``path`` and log its summary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.to_json())
    log.info("%s", report.summary())


def _check_session(spark: object) -> None:
    from pyspark.sql import SparkSession

    if not isinstance(spark, SparkSession):
        raise SchemaMismatchError(
            f"spark must be a pyspark.sql.SparkSession, got {type(spark).__name__}")


def _read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads((directory / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _holds_output(directory: Path) -> bool:
    """Whether ``directory`` holds a visible (non ``.``/``_``) file."""
    with contextlib.suppress(OSError):
        return any(not f.name.startswith((".", "_")) for f in directory.iterdir())
    return False
