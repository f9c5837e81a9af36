"""The driver's face: :class:`SparkJoin` plans Spark jobs over the shards of one join.

Where things run:

* **Driver** (this module): validates schemas, writes the manifest, decides how rows
  reach the shards (Parquet files read by the tasks themselves, a small change set cut
  by shard on the driver, or Spark's shuffle: :mod:`spark_io.frames`,
  :mod:`spark_io.routing`), runs one Spark job per step, collects per-shard report
  rows, and returns the output as a DataFrame over Parquet files.  The driver never
  opens a shard's RocksDB itself.
* **Executors** (:mod:`spark_io._worker`, :mod:`spark_io._direct`): one task per shard
  opens the shard, applies its rows, writes its output files, and reports.

Jobs per operation: ``populate`` runs one job when both snapshots are Parquet files
(``read="files"``), else a counting job and one job per side; ``apply`` and a
micro-batch run one small collecting job and one job over the shards the change
touches (none for an empty change), or one routing job for a large change.

Checkpoints.  With ``checkpoint_uri=``, every task that changed a shard checkpoints it
(:mod:`joinstate.checkpoint`) before it reports, and the driver records each shard's
new checkpoint id in the manifest once the job has succeeded: that record is the
commit.  Tasks open a shard as exactly its committed checkpoint, restoring it when
the working copy is missing, older or ahead (:mod:`spark_io._worker`), so shards may
live on executor-local disk (``local_dir=``) and move between executors, and a failed
job's writes are rolled back wherever they landed.  Outputs then go under the
checkpoint location (:mod:`spark_io.outputs`), so no executor needs the driver's
``state_dir``: it holds the manifest and reports, which only the driver reads.

Exactly-once evaluation.  :meth:`SparkJoin.populate` and :meth:`SparkJoin.apply` are
**eager**: the Spark jobs run when the method is called, each output row is written
once to Parquet under ``<outputs>/<operation>/`` (:attr:`SparkJoin.outputs_uri`), and the returned
DataFrame is a lazily evaluated ``spark.read.parquet`` of those files.  Evaluating it
any number of times (``count()``, ``show()``, ``collect()``) reads the same rows and
never touches the state.  Eagerness is deliberate: a lazily applied change would be
applied in whatever order actions happen to run, and a change DataFrame over a growing
source could differ between evaluations.  Within a job, task retries are covered by
commit ids (``apply``, the streaming sink) or resumed from durable progress markers
(``populate``); see :mod:`spark_io._worker`.  ``apply(..., op_id=...)`` with an id
committed before returns the recorded output instead of applying again (and refuses
another change under it), which makes a driver-side retry safe too.

All shards or none.  An ``apply`` or micro-batch is one operation
(:mod:`spark_io.operation`): recorded with a digest of its whole change before any
task runs, committed once every shard applied its part, and rolled back on every shard
if any failed (from undo records the tasks wrote with their push, or, with checkpoints,
by keeping the committed ones).  One driver object writes a state directory's join at
a time (:class:`~spark_io.errors.WriterConflictError` for a stale one).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joinstate import WEIGHT, SchemaMismatchError, Side, SideName, StoreOptions, output_schema
from joinstate.keys import key_plan
from joinstate.schema import check_column_types
from planner.plan import plan_join
from planner.stats import given as given_stats
from population.errors import PopulationError
from spark_io import args
from spark_io._direct import DirectPopulateTask
from spark_io._worker import (
    ApplyTask,
    ControlTask,
    PopulateTask,
    RollbackTask,
    StateTask,
    UndoPlan,
    options_to_dict,
)
from spark_io.errors import (
    PopulationStateError,
    SparkIOError,
)
from spark_io.executors import check_executors
from spark_io.frames import ParquetFiles, count_rows, parquet_files
from spark_io.lifecycle import (
    REPORT_NAME,
    check_session,
    checkpoints_of,
    complete_output_dir,
    default_outputs,
    failed_apply_note,
    local_outputs,
    open_output_dir,
    operation_id,
    run_job,
    undone_on_failure,
    write_report,
)
from spark_io.manifest import Manifest, ShardStorage, manifest_path, other_owners
from spark_io.operation import OperationRecord, Operations, collect_change
from spark_io.outputs import OutputDir
from spark_io.report import JobReport, SparkReport
from spark_io.routing import SHARD, route, split
from spark_io.types import arrow_schema, arrow_type, spark_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from pathlib import Path

    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SparkJoin",
    "check_session",
    "checkpoints_of",
    "complete_output_dir",
    "failed_apply_note",
    "local_outputs",
    "open_output_dir",
    "operation_id",
    "run_job",
    "undone_on_failure",
    "write_report",
]

log = logging.getLogger(__name__)

_SIDES: tuple[SideName, SideName] = ("left", "right")
READS = ("auto", "files", "shuffle")
"""How ``populate`` reads the snapshots (see :meth:`SparkJoin.populate`)."""
DIRECT_MAX_SHARDS = 16
"""``read="auto"`` reads files directly up to this many shards.

Every task decodes every file of both snapshots and hashes every key: about 55 ns a
row per task (TPC-DS store_sales, SF1), so S shards spend S x 55 ns a row in all.  The
shuffle path spends about 2.3 us of CPU a row on the JVM scan, the Python router, the
shuffle, the sort and the second Arrow transfer (same data, 2 shards: 3.3 s of a 6.9 s
job beyond its tasks on 2 cores).  The break-even is near 40 shards; 16 leaves room
for slower shared storage, which every task reads in full.
"""
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
    directories (``<outputs_uri>/<operation>/``) of this join are kept:
    after each successful ``populate``/``apply`` the oldest beyond that are deleted
    (never the one just returned; ``None`` keeps all).

    ``checkpoint_uri`` (a local path or a ``pyarrow.fs`` URI: ``s3://``, ``gs://``,
    ``hdfs://``) makes the shards durable and movable: every commit checkpoints the
    shards it changed to ``<checkpoint_uri>/shard-NNNNN/``, keeping
    ``keep_checkpoints`` per shard, and a task restores a shard whose working copy is
    missing or not the committed checkpoint (see the module docstring).  With it,
    ``local_dir`` puts the working copies on each executor's own disk (a relative path
    is resolved in each executor's working directory), and ``state_dir`` may be the
    driver's own directory: it holds the manifest and reports, and operation outputs go
    to ``<checkpoint_uri>/_outputs/``.  ``output_uri`` (a path or ``pyarrow.fs`` URI
    that the driver, the executors and Spark's reader reach by one name) puts them
    elsewhere; it is recorded when the join is created.  ``checkpoint_uri`` is fixed
    when the join is created; a state directory with checkpoints holds that one join.
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
        checkpoint_uri: str | Path | None = None,
        local_dir: str | Path | None = None,
        keep_checkpoints: int = 3,
        output_uri: str | Path | None = None,
    ) -> None:
        # Every argument first: nothing is written and no job runs if one is wrong.
        check_session(spark)
        name = args.check_name(name)
        left = args.check_dataframe(left, "left")
        right = args.check_dataframe(right, "right")
        lkey = args.check_key(left_key, "left_key")
        rkey = args.check_key(right_key, "right_key")
        luniq = args.check_key(left_unique_key, "left_unique_key", optional=True)
        runiq = args.check_key(right_unique_key, "right_unique_key", optional=True)
        assert lkey is not None and rkey is not None
        how = args.normalize_how(how)
        state = args.check_state_dir(state_dir)
        shards = args.check_shards(shards)
        suffixes = args.check_suffixes(suffixes)
        options = args.check_options(options)
        keep = args.check_keep_outputs(keep_outputs)
        uri = args.check_checkpoint_uri(checkpoint_uri)
        local = args.check_local_dir(local_dir, uri)
        keep_ck = args.check_keep_checkpoints(keep_checkpoints)
        out_uri = args.check_output_uri(output_uri)
        manifest = Manifest(
            name=name, shards=shards, how=how, suffixes=suffixes,
            left=_side_of(left, lkey, luniq, "left"),
            right=_side_of(right, rkey, runiq, "right"), checkpoint_uri=uri,
            output_uri=out_uri or default_outputs(state, uri),
        )
        out_schema = _output_schema(manifest)  # validates the spec with the core's rules
        stored: Manifest | None = None
        if manifest_path(state, name).exists():
            stored = Manifest.read(state, name)
            # A join created before NULL-key rows were spread keeps routing as it did.
            manifest = manifest.replace(partitioner=stored.partitioner)
            stored.check_same(manifest, state)
            args.check_same_output_uri(out_uri, stored.outputs(state), f"join {name!r}", state)
        args.check_sole_owner(other_owners(state, manifest_path(state, name)), uri, state)
        check_executors(spark)  # before the manifest is written: a broken setup leaves none
        if stored is None:
            manifest.write(state)
        else:
            manifest = stored
        self._attach(spark, manifest, state, options, out_schema, {"left": left, "right": right},
                     keep, local, keep_ck)

    @classmethod
    def open(cls, spark: SparkSession, name: str, state_dir: str | Path,
             options: StoreOptions | None = None, *, keep_outputs: int | None = 20,
             local_dir: str | Path | None = None, keep_checkpoints: int = 3) -> SparkJoin:
        """Re-attach to join ``name`` in ``state_dir``.

        Shards, keys, schemas, ``how`` and the ``checkpoint_uri`` come from its manifest,
        so rows route exactly as before and shards are read as their committed
        checkpoints.  ``local_dir`` and ``keep_checkpoints`` as for ``SparkJoin(...)``.
        """
        check_session(spark)
        name = args.check_name(name)
        state = args.check_state_dir(state_dir)
        options = args.check_options(options)
        keep = args.check_keep_outputs(keep_outputs)
        keep_ck = args.check_keep_checkpoints(keep_checkpoints)
        manifest = Manifest.read(state, name)
        local = args.check_local_dir(local_dir, manifest.checkpoint_uri)
        out_schema = _output_schema(manifest)
        check_executors(spark)
        job = cls.__new__(cls)
        cls._attach(job, spark, manifest, state, options, out_schema, None, keep, local,
                    keep_ck)
        return job

    def _attach(self, spark: SparkSession, manifest: Manifest, state_dir: Path,
                options: StoreOptions | None, out_schema: pa.Schema,
                snapshots: dict[str, DataFrame] | None, keep_outputs: int | None,
                local_dir: str | None, keep_checkpoints: int) -> None:
        self.local_dir = local_dir
        self.keep_checkpoints = keep_checkpoints
        self.keep_outputs = keep_outputs
        self._snapshots = snapshots
        self.spark = spark
        self.manifest = manifest
        self.state_dir = state_dir
        self.options = options
        self.arrow_output_schema = out_schema
        self.output_schema: T.StructType = spark_schema(out_schema)
        self.last_report: SparkReport | None = None
        self._outputs = OutputDir(manifest.outputs(state_dir))
        self._ops = Operations(
            state_dir, manifest.name, f"join {manifest.name!r} in {state_dir}",
            f"Re-attach with spark_io.SparkJoin.open(spark, {manifest.name!r}, "
            f"{str(state_dir)!r}) to continue from its committed state.",
            checkpointed=manifest.checkpoint_uri is not None)

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

    @property
    def checkpoint_uri(self) -> str | None:
        """Where the shards are checkpointed (None: no checkpoints)."""
        return self.manifest.checkpoint_uri

    @property
    def storage(self) -> ShardStorage:
        """Where the shards live and the checkpoint each is committed at (tasks get this)."""
        return self.manifest.storage(self.state_dir, self.local_dir, self.keep_checkpoints)

    def side_schema(self, side: SideName) -> T.StructType:
        """The Spark schema of ``side``'s rows (without ``_weight``)."""
        return spark_schema(self.manifest.side(side).schema)

    # ---- population -----------------------------------------------------------------------

    def populate(self, strategy: str = "auto", *,
                 small_side: SideName | None = None, resume: bool = False,
                 read: str = "auto") -> DataFrame:
        """Load the snapshot DataFrames; return the initial output (left, right, ``_weight``).

        The small side (the side with fewer rows, or ``small_side``) is loaded first and
        the big side probes it; inside each task the ``population`` driver runs
        ``strategy`` on its shard, and every shard ends live.  How rows reach the shards
        (``read``):

        * ``"files"``: one Spark job of one task per shard; each task reads both
          snapshots' Parquet files with pyarrow and keeps its shard's rows
          (:mod:`spark_io._direct`).  Row counts come from the files' footers.  Needs
          both snapshots to be plain Parquet scans (:func:`spark_io.frames.parquet_files`).
        * ``"shuffle"``: per side, one job routes the rows (a Python router, a shuffle,
          a sort within each shard) to one task per shard; the small side's job first.
          Counting both snapshots takes one more job.
        * ``"auto"`` (default): ``"files"`` when both snapshots allow it and
          ``shards <= DIRECT_MAX_SHARDS`` (every task decodes every file, so the read
          grows with the shard count), else ``"shuffle"``.

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
        is a new ``state_dir``.  If the population completed but its caller never got the
        result (the driver died after recording it), ``populate(resume=True)`` returns
        the recorded output.  Within a partition, rows are sorted before loading so
        that a resumed task sees the same batches as the failed one (resuming checks a
        digest of the batches it skips and refuses input that changed); the ``"files"``
        read needs no sort (file order is the same every time).  A resumed call reads
        the way the interrupted one did.

        ``strategy`` is a :func:`population.preset` name or ``"auto"``; ``small_side``
        ``None``, ``"left"`` or ``"right"``; ``read`` one of :data:`READS`: checked
        before anything runs (:class:`population.PopulationError`).  If the call fails,
        its output directory is removed unless it holds output a
        ``populate(resume=True)`` continues.
        """
        strategy = args.check_strategy(strategy)
        small_side = args.check_small_side(small_side)
        resume = args.check_bool(resume, "resume")
        read = _check_read(read)
        if self._snapshots is None:
            raise SparkIOError(
                f"join {self.name!r} was re-attached with SparkJoin.open(), which has no "
                "snapshot DataFrames; populate() runs on the SparkJoin(...) that created it"
            )
        with self._ops.hold():
            self._resolve()
            if self.manifest.populated is not None:
                if resume:
                    return self._populated_output()
                raise PopulationStateError(
                    f"join {self.name!r} in {self.state_dir} was populated already (operation "
                    f"{self.manifest.populated}); use apply() for changes, or a new state_dir"
                )
            return self._populate(strategy, small_side, resume, read)

    def _populated_output(self) -> DataFrame:
        """The output of the recorded population (``populate(resume=True)`` after it)."""
        op = str(self.manifest.populated)
        out_dir = self._outputs.child(op)
        if not out_dir.exists():
            raise PopulationStateError(
                f"join {self.name!r} in {self.state_dir} was populated (operation {op}), "
                f"but its output {out_dir.uri} is gone (keep_outputs removed it?); the state "
                "is complete: use apply() for changes")
        self._completed(out_dir)
        return self._read(out_dir)

    def _populate(self, strategy: str, small_side: SideName | None, resume: bool, read: str
                  ) -> DataFrame:
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
        if running is not None and read == "auto":
            read = str(running.get("read", "shuffle"))  # resume reads as the first call did
        files = self._files(read, resuming=running is not None)
        frames = {} if files else {s: self._snapshot_rows(s) for s in _SIDES}
        counts: dict[str, int] = _counts(frames, files)
        sizes: dict[str, int] = {s: math.ceil(counts[s] / self.shards) for s in _SIDES}
        # The planner decides once, from what one shard loads (the workers' own plans see
        # the same sizes, so they agree): the small side and, for "auto", the strategy.
        plan = plan_join(given_stats("left", sizes["left"], snapshot=True),
                         given_stats("right", sizes["right"], snapshot=True), name=self.name,
                         how=self.manifest.how, small_side=small_side, shards=self.shards,
                         strategy=None if strategy == "auto" else strategy)
        small: SideName = plan.get("small_side", self.name)
        run_strategy: str = plan.get("strategy", self.name)
        if running is not None:
            for name, mine, theirs in (("small_side", small, running.get("small_side")),
                                       ("strategy", strategy, running.get("strategy")),
                                       ("read", "files" if files else "shuffle",
                                        running.get("read", "shuffle"))):
                if mine != theirs:
                    raise PopulationStateError(
                        f"join {self.name!r}: resume=True continues the interrupted populate() "
                        f"with {name}={theirs!r}; got {name}={mine!r}"
                    )
            op = str(running["operation"])
        else:
            op = operation_id("populate")
            self.manifest = self.manifest.replace(populating={
                "operation": op, "small_side": small, "strategy": strategy,
                "read": "files" if files else "shuffle"})
            self.manifest.write(self.state_dir)
        big: SideName = "right" if small == "left" else "left"
        out_dir, _ = self._output_dir(op, "populate")
        jobs: list[JobReport] = []
        try:
            if files:
                jobs.append(self._populate_files(files, out_dir, run_strategy, small, sizes,
                                                 resume))
            else:
                for side, final in ((small, False), (big, True)):
                    task = PopulateTask(
                        self.manifest, self.storage, options_to_dict(self.options),
                        side=side, output_dir=out_dir.uri, strategy=run_strategy,
                        sizes=sizes, final=final, resume=resume,
                    )
                    rows = frames[side]
                    # A deterministic order per shard: a resumed task meets the same batches.
                    routed = route(rows, self.manifest, side).sortWithinPartitions(*rows.columns)
                    jobs.append(self._run_job(routed, task, side))
                # Shards no row of the big side reached were not visited by its job.
                unvisited = set(range(self.shards)) - {r.shard for r in jobs[-1].shards}
                if unvisited:
                    self._control(go_live=True, shards=sorted(unvisited))
        except BaseException as exc:
            # populate(resume=True) continues into this directory; keep it if it holds
            # output (an empty one is simply created again).
            if not out_dir.holds_output():
                out_dir.remove()
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
            output_path=out_dir.uri, seconds=time.perf_counter() - t0, jobs=tuple(jobs),
            strategy=run_strategy if strategy != "auto" else f"auto->{run_strategy}",
            small_side=small,
        ))
        self._completed(out_dir)
        return self._read(out_dir)

    def _snapshot_columns(self, side: SideName) -> list[str]:
        """The columns population reads from ``side``'s snapshot (``_weight`` if it has one)."""
        assert self._snapshots is not None
        cols = list(self.manifest.side(side).schema.names)
        return cols + ([WEIGHT] if WEIGHT in self._snapshots[side].columns else [])

    def _snapshot_rows(self, side: SideName) -> DataFrame:
        assert self._snapshots is not None
        return self._snapshots[side].select(*self._snapshot_columns(side))

    def _files(self, read: str, resuming: bool = False
               ) -> dict[SideName, ParquetFiles] | None:
        """Both snapshots as Parquet files when ``read`` allows the ``"files"`` read.

        Raises :class:`population.PopulationError` for ``read="files"`` when a snapshot
        is not a plain Parquet scan, naming why.  ``resuming``: the read was the
        interrupted call's, which the message says.
        """
        if read == "shuffle" or (read == "auto" and self.shards > DIRECT_MAX_SHARDS):
            return None
        found: dict[SideName, ParquetFiles] = {}
        reasons = []
        assert self._snapshots is not None
        for side in _SIDES:
            files, why = parquet_files(self._snapshots[side], self._snapshot_columns(side),
                                       f"the {side} snapshot")
            if files is None:
                reasons.append(why)
            else:
                found[side] = files
        if not reasons:
            return found
        if read == "files" and resuming:
            raise PopulationError(
                f"join {self.name!r}: the interrupted populate() read the snapshots' Parquet "
                f"files directly and a resumed one must read the same batches, but now "
                f"{'; '.join(reasons)}. Pass the same snapshots (spark.read.parquet of the "
                "same files), or use a new state_dir")
        if read == "files":
            raise PopulationError(
                f"read='files' needs both snapshots to be plain scans of Parquet files "
                f"(spark.read.parquet(...), optionally .select(columns)): "
                f"{'; '.join(reasons)}. Use read='auto' (which then shuffles) or "
                "read='shuffle'")
        log.info("populate %s reads through a shuffle: %s", self.name, "; ".join(reasons))
        return None

    def _populate_files(self, files: dict[SideName, ParquetFiles], out_dir: OutputDir,
                        strategy: str, small: SideName, sizes: dict[str, int],
                        resume: bool) -> JobReport:
        """One job, one task per shard, each reading the files itself (:mod:`spark_io._direct`)."""
        task = DirectPopulateTask(
            self.manifest, self.storage, options_to_dict(self.options),
            files={str(s): f for s, f in files.items()}, output_dir=out_dir.uri,
            strategy=strategy, small=small, sizes=sizes, resume=resume,
        )
        ids = self.spark.sparkContext.parallelize(range(self.shards), self.shards)
        return self._run_job(ids, task, "both")

    # ---- live changes ---------------------------------------------------------------------

    def apply(self, side: SideName, changes: DataFrame, *, op_id: str | None = None
              ) -> DataFrame:
        """Apply a change DataFrame (the side's columns + ``_weight``) to ``side``.

        Returns the output change set as a DataFrame over Parquet (eager, exactly once:
        see the module docstring).  The change is evaluated once and checked on the
        driver first (column types, NULL weights: nothing runs if it is refused): up to
        :data:`spark_io.routing.COLLECT_MAX_ROWS` rows are collected and cut by shard on
        the driver, then applied by one job of one task per shard they reach (none for an
        empty change); a larger one is written to Parquet once and routed by a shuffle.

        All shards or none: the operation ``op_id`` (letters, digits, ``.``, ``_``,
        ``-``; default a fresh id) is recorded with a digest of the whole change before
        any task runs, and committed only when every shard has applied its part; if any
        shard fails, every shard is rolled back (from undo records, or to its committed
        checkpoint with ``checkpoint_uri``) and the error says so.  ``apply`` with an
        ``op_id`` already committed returns the recorded output and applies nothing if
        the change is the same, and raises :class:`joinstate.CommitConflictError` if it
        is not, before any task runs.  The join must have been populated first
        (:class:`~spark_io.PopulationStateError` otherwise).
        """
        side = args.check_side(side)
        changes = args.check_dataframe(changes, "changes")
        op = args.check_op_id(op_id, "op_id") or operation_id("apply")
        rows = self._conform_changes(side, changes)  # schema checked before any directory
        with self._ops.hold():
            self._ready("apply")
            out_dir, created = self._output_dir(op, "apply")
            with undone_on_failure(out_dir, created, failed_apply_note(
                    op, f"apply({side!r}, <the same changes>, op_id={op!r})",
                    self.checkpoint_uri is not None)):
                self._operate(side, rows, op=op, kind="apply", commit_id=f"spark-apply:{op}",
                              out_dir=out_dir)
            self._completed(out_dir)
        return self._read(out_dir)

    def foreach_batch_sink(
        self, side: SideName, output_path: str | Path, *, sink_id: str | None = None,
        retain: int = 2,
    ) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function applying each micro-batch to ``side`` exactly once.

        Each micro-batch is an operation as :meth:`apply` runs one (all shards or none,
        recorded with the digest of its change), whose id is the batch id; a replayed
        batch id (Spark re-runs the last batch after a failure) with the same change
        rewrites the output recorded the first time and applies nothing, with another
        change raises :class:`joinstate.CommitConflictError`.  Output goes to Parquet
        under ``<output_path>/batch_id=<id>/``, replaced on replay, so the sink is
        idempotent; ``spark.read.parquet(output_path)`` reads every batch with a
        ``batch_id`` column.

        A micro-batch of up to :data:`spark_io.routing.COLLECT_MAX_ROWS` rows costs one
        small job that collects it and one job of one task per shard it touches; an
        empty one costs that first job only (none when Spark's plan proves it empty),
        and leaves an empty ``batch_id=<id>`` directory with its report.

        ``sink_id`` names the stream in the commit ids (default: from ``side`` and
        ``output_path``).  A new query (new checkpoint, batch ids from 0 again) needs a
        new ``sink_id`` or ``output_path``.  Each shard keeps the ids of its last
        ``retain`` batches (and the driver their operation records).
        """
        side = args.check_side(side)
        base = OutputDir(args.check_location(output_path, "output_path", SchemaMismatchError))
        sink_id = args.check_op_id(sink_id, "sink_id")
        retain = args.check_retain(retain)
        sid = sink_id or f"{side}-{hashlib.sha1(base.uri.encode()).hexdigest()[:12]}"
        prefix = f"spark-stream:{sid}:"

        def sink(batch_df: DataFrame, batch_id: int) -> None:
            rows = self._conform_changes(side, args.check_dataframe(batch_df, "batch_df"))
            op = f"{sid}-{batch_id}"
            with self._ops.hold():
                self._ready("a micro-batch")
                out_dir = base.child(f"batch_id={batch_id}")
                self._operate(side, rows, commit_id=f"{prefix}{batch_id}", out_dir=out_dir,
                              op=op, kind="micro-batch", forget=(prefix, batch_id - retain + 1),
                              report_in=out_dir, rewrite=True)
                self._ops.log.forget(f"{sid}-{batch_id - retain}")

        return sink

    def _ready(self, what: str) -> None:
        """Resolve an operation a dead driver left; refuse a change before population.

        A change to an unpopulated join would make its population fail later.
        """
        self._resolve()
        if self.manifest.populated is None:
            raise PopulationStateError(
                f"join {self.name!r} in {self.state_dir} has not been populated, so {what} "
                "cannot be applied: call populate() first (with empty snapshots to start "
                "from no rows); nothing was applied")

    def _resolve(self) -> None:
        """Roll back (or mark committed) the operation a driver left running."""
        self._ops.resolve(self.manifest.committed_op,
                          lambda rec: self._rollback(rec.op, range(self.shards)))

    def _rollback(self, op: str, shards: Iterable[int]) -> None:
        """One job rolling every listed shard back from ``op``'s undo records."""
        ids = sorted(set(shards))
        if not ids:
            return
        task = RollbackTask(self.storage, options_to_dict(self.options),
                            UndoPlan(self.name, "", rollback=(op,)))
        batches = [pa.record_batch([pa.array([i], pa.int64())], names=["id"]) for i in ids]
        run_job(self.spark, self.spark.sparkContext.parallelize(batches, len(batches)), task,
                "rollback")

    def _operate(self, side: SideName, rows: DataFrame, *, op: str, kind: str, commit_id: str,
                 out_dir: OutputDir, forget: tuple[str, int] | None = None,
                 report_in: OutputDir | None = None, rewrite: bool = False) -> None:
        """Run one operation on conformed change rows (:meth:`_conform_changes`).

        The change is evaluated once (:func:`spark_io.operation.collect_change`) and its
        digest recorded before any task runs; a committed ``op`` is replayed.  A small
        change is cut by shard on the driver and applied by one job of one task per
        shard it touches (none if it is empty); a large one is routed by Spark
        (:mod:`spark_io.routing`).  On failure every shard is rolled back.  ``rewrite``
        (a micro-batch): ``out_dir`` is emptied once the change is known to be this
        operation's (a replay rewrites it from the recorded outputs), and removed if
        the operation fails (no partial batch meanwhile; Spark runs it again).
        """
        t0 = time.perf_counter()
        spill = self._outputs.child(f"_change-{op}-{uuid.uuid4().hex[:8]}")
        try:
            change = collect_change(rows, self.manifest.side(side).schema, side, side, spill,
                                    run_job)
            rec, replay = self._ops.start(op, kind, side, change.digest, out_dir.uri)
            if rewrite:
                out_dir.remove()
                out_dir.make()
            checkpointed = self.checkpoint_uri is not None
            task = ApplyTask(
                self.manifest, self.storage, options_to_dict(self.options), side=side,
                output_dir=out_dir.uri, commit_id=commit_id,
                forget_prefix=forget[0] if forget else None,
                keep_after=forget[1] if forget else None,
                undo=None if checkpointed else UndoPlan(self.name, op,
                                                        bytes.fromhex(change.digest)),
                replay_only=replay,
            )
            source: DataFrame | RDD[Any] | None = None
            touched: Iterable[int] = range(self.shards)
            if change.table is None:
                assert change.files is not None
                frame = self.spark.read.schema(rows.schema).parquet(change.files.spark_path)
                source = route(frame, self.manifest, side)
            else:
                pieces = split(change.table, self.manifest, side)
                touched = [int(p.column(SHARD)[0].as_py()) for p in pieces]
                if pieces:  # an empty change set needs no job: no shard changes
                    source = self.spark.sparkContext.parallelize(pieces, len(pieces))
            jobs: tuple[JobReport, ...] = ()
            try:
                if source is not None:
                    jobs = (run_job(self.spark, source, task, side),)
                if not replay:
                    self._commit_operation(rec, jobs)
            except BaseException as exc:
                if rewrite:
                    out_dir.remove()
                if not replay:
                    self._ops.abort(rec, exc, lambda r: self._rollback(r.op, touched))
                raise
        finally:
            spill.remove()
        self._finish(SparkReport(
            join=self.name, operation=op, kind=kind, shards=self.shards,
            output_path=out_dir.uri, seconds=time.perf_counter() - t0, jobs=jobs,
        ), report_in)

    def _commit_operation(self, rec: OperationRecord, jobs: Sequence[JobReport]) -> None:
        """Commit ``rec``.

        With checkpoints, the manifest's write of the new ids (which names the
        operation) is the commit, and its record follows; without, the record is.
        """
        if self.manifest.checkpoint_uri is not None:
            found: dict[str, str] = {}
            for job in jobs:
                found.update(checkpoints_of(job))
            self.manifest = self.manifest.replace(
                checkpoints={**self.manifest.checkpoints, **found}, committed_op=rec.op)
            self.manifest.write(self.state_dir)
        self._ops.commit(rec)

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
        With ``checkpoint_uri``, it reads each shard as the checkpoint committed when
        ``state()`` was called (a working copy that is not exactly it is restored first).
        """
        side = args.check_side(side)
        check_executors(self.spark)
        if self._ops.log.running() is not None:
            with self._ops.hold():
                self._resolve()
        schema = T.StructType([*self.side_schema(side).fields,
                               T.StructField(WEIGHT, T.LongType(), False)])
        task = StateTask(self.manifest, self.storage, options_to_dict(self.options),
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

    def _control(self, go_live: bool, shards: Sequence[int] | None = None) -> JobReport:
        """Visit ``shards`` (default: all), one task each, setting them live if ``go_live``."""
        task = ControlTask(self.manifest, self.storage, options_to_dict(self.options),
                           go_live=go_live)
        ids = list(range(self.shards)) if shards is None else list(shards)
        batches = [pa.record_batch([pa.array([i], pa.int64())], names=["id"]) for i in ids]
        source = self.spark.sparkContext.parallelize(batches, len(batches))
        return self._run_job(source, task, "both")

    def _run_job(self, df: DataFrame | RDD[Any], task: Callable[..., Any], side: str
                 ) -> JobReport:
        job = run_job(self.spark, df, task, side)
        self._commit_checkpoints(job)
        return job

    def _commit_checkpoints(self, job: JobReport) -> None:
        """Record the shards' new checkpoints: every job of a SparkJoin is a commit."""
        found = checkpoints_of(job)
        if self.manifest.checkpoint_uri is None or not found:
            return
        merged = {**self.manifest.checkpoints, **found}
        if merged != self.manifest.checkpoints:
            self.manifest = self.manifest.replace(checkpoints=merged)
            self.manifest.write(self.state_dir)

    @property
    def outputs_uri(self) -> str:
        """Where operation outputs live (:mod:`spark_io.outputs`).

        The ``output_uri`` the join was created with, else ``<checkpoint_uri>/_outputs``
        with checkpoints, else ``<state_dir>/_spark/outputs``.
        """
        return self._outputs.uri

    @property
    def outputs_dir(self) -> Path:
        """:attr:`outputs_uri` as a local path (:class:`SparkIOError` if it is not one)."""
        return local_outputs(self._outputs)

    def _output_dir(self, operation: str, kind: str) -> tuple[OutputDir, bool]:
        """The operation's output directory, and whether this call created it."""
        return open_output_dir(self._outputs, self.name, operation, kind)

    def _completed(self, out_dir: OutputDir) -> None:
        """Mark ``out_dir`` finished (now), then apply the ``keep_outputs`` retention."""
        complete_output_dir(self._outputs, out_dir, self.name, self.keep_outputs)

    def _read(self, out_dir: OutputDir) -> DataFrame:
        return self.spark.read.schema(self.output_schema).parquet(out_dir.spark_path)

    def _finish(self, report: SparkReport, report_in: OutputDir | None = None) -> None:
        """Keep ``report`` as :attr:`last_report` and write it as JSON.

        Reports go to the driver's ``<state_dir>/_spark/reports/``; a micro-batch's goes
        next to its Parquet output, named ``_joinstate_report.json`` (Spark's readers
        skip ``_`` names).
        """
        self.last_report = report
        if report_in is not None:
            report_in.write_text(REPORT_NAME, report.to_json())
            log.info("%s", report.summary())
            return
        write_report(report, self.state_dir / "_spark" / "reports"
                     / f"{report.operation}.json")


def _check_read(read: object) -> str:
    if read not in READS:
        raise PopulationError(f"read={read!r} must be one of {READS}")
    return str(read)


def _counts(frames: dict[SideName, DataFrame], files: dict[SideName, ParquetFiles] | None
            ) -> dict[str, int]:
    """Rows of each snapshot: from the Parquet footers when read as files, else one job."""
    if files:
        return {s: files[s].rows for s in _SIDES}
    return count_rows({s: frames[s] for s in _SIDES})
