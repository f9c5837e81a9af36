"""The driver's face for pipelines: :class:`SparkPipeline`, a graph kept on Spark.

::

    sp = spark_io.SparkPipeline.from_sql(spark, '''
            SELECT c.region, sum(o.amount) AS total, count(*) AS n
            FROM orders o JOIN customers c ON o.customer_id = c.id
            GROUP BY c.region ORDER BY total DESC LIMIT 10''',
        sources={"orders": orders_df, "customers": customers_df}, state_dir="/data/view")
    sp.populate()                                   # the DataFrames given to from_sql
    outs = sp.apply("orders", changes_df)          # {output: DataFrame of _weight changes}
    top = sp.read("result")                        # the view now: ORDER BY ... LIMIT applied
    query = stream.writeStream.foreachBatch(sp.foreach_batch_sink("orders", "/data/out"))

**The plan.**  The graph is cut into stages by the distributed planner
(:func:`planner.distribute.plan_distribution`, ``explain()`` prints every choice with
its reason): small sources copied to every shard where every consumer takes a copy,
the others hashed by the key their first consumer wants (look-ahead), exchanges only
where an operator's rows must meet on another key, and an exact aggregate (counts,
sums of integers or decimals) whose input must move summed where its input lies first
(:mod:`planner.rules.partition_partial`).  The plan is fixed by the first
operation (a population plans with the row counts of its sources) and recorded in the
manifest as its decisions, so the state directory is always read with the plan that
wrote it.

**One Spark job per operation** (:mod:`spark_io.dag`): a population, an ``apply`` (of
one source or several), a micro-batch runs every stage as one task per shard, chained by
Spark's shuffle; the driver does not take part between stages.  An empty change runs
nothing.  A population's first-stage tasks read the sources' Parquet files themselves
(each its own shard's rows; a DataFrame that is not a plain Parquet scan is written to
Parquet first).

**Exactly once.**  Operations are eager; the returned DataFrames read Parquet files
written once.  An ``apply`` or micro-batch is an operation (:mod:`spark_io.operation`):
its change is evaluated once and recorded with its digest before the job; every
(stage, shard) push carries a commit id of the operation and its undo (without
checkpoints) in one write batch, so a retried task replays; if any task fails, or the
driver dies before the commit, every store is rolled back (at once, or by the next
operation).  The same ``op_id`` again with the same change returns the recorded
outputs; with another change it is refused before any task runs.  A population starts
from empty stores and is all or nothing: a failed (or interrupted) one leaves empty
stores, and ``populate`` runs it again from the start.

**Reading.**  An output declared ``materialize=True`` (``from_sql`` does so) keeps its
contents in the stores: :meth:`read` returns them as a DataFrame, every shard's rows,
then ``ORDER BY`` and ``LIMIT`` applied.

Checkpoints (``checkpoint_uri=``): every store a task changed is checkpointed to
``<checkpoint_uri>/stageK/shard-NNNNN/`` by that task; the driver commits the new ids in
the manifest when the operation succeeded; tasks open stores as exactly the committed
checkpoints, so stores may live on executor-local disk (``local_dir=``).

State layout::

    <state_dir>/stageK/shard-NNNNN          one RocksDB store per (stage, shard)
    <state_dir>/_spark/pipeline-<name>.json  the manifest (definition, plan, commits)
    <state_dir>/_spark/ops/...               operation records, the writer lease
    <outputs>/<operation>/<output>/          each operation's output change sets
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joinstate import WEIGHT, Graph, JoinStateError, SchemaMismatchError
from joinstate.catalog import spec_diff
from joinstate.names import pipeline_owner, validate_name
from joinstate.schema import check_column_types
from planner.distribute import DistributedPlan, from_decisions, plan_distribution
from planner.rules.join_order import JOIN_RULES
from planner.stats import SourceStats, given
from spark_io import args, handover, warmup
from spark_io._worker import RollbackTask, UndoPlan, open_store, options_from_dict, options_to_dict
from spark_io.dag import ChangeRef, OperationResult, OperationSpec, run_operation, stage_key
from spark_io.errors import PopulationStateError, SparkIOError
from spark_io.executors import check_executors
from spark_io.frames import parquet_files
from spark_io.lifecycle import (
    check_session,
    complete_output_dir,
    default_outputs,
    failed_apply_note,
    local_outputs,
    open_output_dir,
    operation_id,
    run_job,
    write_report,
)
from spark_io.manifest import PipelineManifest, ShardStorage, other_owners, pipeline_manifest_path
from spark_io.operation import Operations, change_digest, collect_change, read_change
from spark_io.outputs import OutputDir
from spark_io.report import JobReport, ShardReport, SparkReport
from spark_io.stagerun import PlanRef, from_ipc, to_ipc
from spark_io.storekeeper import stage_store
from spark_io.types import arrow_schema, arrow_type, spark_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyspark.sql import SparkSession

    from joinstate import StoreOptions

__all__ = ["SparkPipeline"]

DEFAULT_BATCH_ROWS = 200_000
"""Rows per push while a stage task populates its store (the population driver's)."""


class SparkPipeline:
    """A :class:`joinstate.Graph` maintained on Spark (see the module docstring).

    ``state_dir`` is a shared directory every executor sees (without ``checkpoint_uri``;
    with it, the driver's own); ``shards`` is fixed when the state is created.  Creating
    a ``SparkPipeline`` on a ``state_dir`` that holds this pipeline re-attaches to it; a
    different graph or shard count raises :class:`~joinstate.JoinSpecMismatchError`
    naming what differs.  ``name`` names the pipeline (manifest, commit records);
    ``keep_outputs`` is how many operation output directories are kept (``None``: all).
    ``stats`` (source -> :class:`planner.stats.SourceStats`) plans before the first
    population (which otherwise counts its sources' rows).  The object lives on the
    driver; one operation runs at a time per ``state_dir``.

    ``checkpoint_uri``, ``local_dir``, ``keep_checkpoints`` and ``output_uri`` as for
    :class:`spark_io.SparkJoin`.  Join types in the graph may be Spark's names.
    """

    def __init__(
        self, spark: SparkSession, graph: Graph,
        state_dir: str | Path, shards: int = 2, *, name: str = "pipeline",
        options: StoreOptions | None = None, keep_outputs: int | None = 20,
        checkpoint_uri: str | Path | None = None, local_dir: str | Path | None = None,
        keep_checkpoints: int = 3, output_uri: str | Path | None = None,
        stats: Mapping[str, SourceStats] | None = None, batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> None:
        check_session(spark)
        name = validate_name("pipeline", name)
        if not isinstance(graph, Graph):
            raise SchemaMismatchError(
                f"pipeline {name!r}: graph must be a joinstate.Graph (build streams with "
                "joinstate.source(...), name outputs with joinstate.Graph().output(...)), got "
                f"{type(graph).__name__}"
                + ("; a definition function is no longer called: pass the graph it built"
                   if callable(graph) else ""))
        state = args.check_state_dir(state_dir)
        shards = args.check_shards(shards)
        options = args.check_options(options)
        keep = args.check_keep_outputs(keep_outputs)
        uri = args.check_checkpoint_uri(checkpoint_uri)
        local = args.check_local_dir(local_dir, uri)
        keep_ck = args.check_keep_checkpoints(keep_checkpoints)
        out_uri = args.check_output_uri(output_uri)
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise SchemaMismatchError(f"batch_rows={batch_rows!r} must be an int >= 1")
        _check_spark_types(name, graph)
        wanted = PipelineManifest(name, shards, graph.spec(), uri)
        stored = PipelineManifest.read(state, name)
        path = pipeline_manifest_path(state, name)
        if stored is not None:
            stored.check_same(wanted, state)
            args.check_same_output_uri(out_uri, stored.output_uri or default_outputs(state, uri),
                                       f"pipeline {name!r}", state)
        args.check_sole_owner(other_owners(state, path), uri, state)
        check_executors(spark)  # before the manifest is written: a broken setup leaves none
        if stored is None:
            stored = wanted.replace(output_uri=out_uri or default_outputs(state, uri))
            stored.write(state)
        self.spark = spark
        self.graph = graph
        self.name = name
        self.state_dir = state
        self.shards = shards
        self.options = options
        self.keep_outputs = keep
        self.checkpoint_uri = uri
        self.local_dir = local
        self.keep_checkpoints = keep_ck
        self.batch_rows = batch_rows
        self.last_report: SparkReport | None = None
        self.last_timings: dict[str, float] = {}
        self._warmed = False
        """Seconds of the last operation's parts on the driver (change, job, outputs...)."""
        self._manifest = stored
        self._stats = dict(stats or {})
        self._plan: DistributedPlan | None = None
        self._ref: PlanRef | None = None
        self._defaults: dict[str, DataFrame] = {}
        self._owner = pipeline_owner(name)
        self._outputs = OutputDir(stored.output_uri or default_outputs(state, uri))
        self._ops = Operations(
            state, self._owner, f"pipeline {name!r} in {state}",
            "Re-attach (spark_io.SparkPipeline(spark, <the same graph>, "
            f"{str(state)!r}, name={name!r})) to continue from its committed state.",
            checkpointed=uri is not None)

    @classmethod
    def from_sql(cls, spark: SparkSession, sql: str, sources: Mapping[str, Any], *,
                 state_dir: str | Path, shards: int = 2, name: str = "result",
                 stats: Mapping[str, Any] | None = None,
                 also_unique: Mapping[str, Any] | None = None, **kwargs: Any) -> SparkPipeline:
        """A Spark pipeline maintaining ``sql``'s answer as its one output, ``name``.

        ``sources`` maps each table name of the query to a DataFrame, the name of a table
        of the session's catalog, a ``pyarrow.Schema`` or a ``planner.sql.Source`` (a
        schema with a unique key); a DataFrame's or table's schema is taken from it, and
        they are what :meth:`populate` loads when it is called without sources.  The SQL
        is compiled by :func:`planner.sql.define` on the driver (a query outside the
        incremental subset raises ``planner.sql.UnsupportedSQLError`` before any Spark
        job).  The answer is materialized: :meth:`read` returns it, its ``ORDER BY`` and
        ``LIMIT`` applied.  ``also_unique``: source name -> further unique keys (each a
        column or columns; as ``planner.sql.Source(also_unique=...)``), verified by the
        pipeline, which lets the planner keep a group by such a key where the rows lie
        (e.g. ``{"customer": ["c_customer_id"]}``).  ``stats``: row counts per source
        (an int, or anything with ``rows``) for the join order; samples of the data are
        not used here, so the same SQL always compiles to the same joins for a state
        that outlives the data it was planned on.  A state created by an earlier
        version, whose join-order rule rooted join groups at their largest input, is
        re-attached in the order it was laid out in.  Other keyword arguments are
        :class:`SparkPipeline`'s.
        """
        from planner.sql import Source, counts_only, define

        if not isinstance(sources, Mapping) or not sources:
            msg = ("sources must be a non-empty dict {table name in the query: DataFrame, "
                   "catalog table name, pyarrow.Schema or planner.sql.Source}")
            raise SchemaMismatchError(msg)
        schemas: dict[str, Any] = {}
        frames: dict[str, DataFrame] = {}
        for s, value in sources.items():
            if isinstance(value, str):
                try:
                    value = spark.table(value)
                except Exception as exc:  # Spark's AnalysisException: no such table
                    raise SchemaMismatchError(
                        f"sources[{s!r}]={value!r}: the session's catalog has no such table "
                        f"({str(exc).splitlines()[0]})") from exc
            if isinstance(value, DataFrame):
                frames[s] = value
                schemas[s] = arrow_schema(value.schema)
            elif isinstance(value, pa.Schema | Source):
                schemas[s] = value
            else:
                raise SchemaMismatchError(
                    f"sources[{s!r}] must be a DataFrame, a catalog table name, a "
                    f"pyarrow.Schema or a planner.sql.Source, got {type(value).__name__}")
        for s, keys in (also_unique or {}).items():
            given_as = schemas.get(s)
            if given_as is None:
                raise SchemaMismatchError(
                    f"also_unique names {s!r}, which is not a source ({sorted(schemas)})")
            if isinstance(given_as, Source):
                if given_as.also_unique:
                    raise SchemaMismatchError(
                        f"sources[{s!r}] is a planner.sql.Source declaring also_unique "
                        "already; declare its further unique keys in one place")
                schemas[s] = Source(given_as.schema, given_as.unique_key, keys)
            else:
                schemas[s] = Source(given_as, also_unique=keys)
        # Row counts only: a join order estimated on samples of the data is kept in a
        # store's view record, which a Spark pipeline's state does not have yet, so the
        # same SQL re-attaching later must plan the same joins from the same counts.
        graph, _ = define(sql, schemas, name=name, materialize=True,
                          stats=counts_only(stats))
        graph = _as_recorded(graph, state_dir, name, lambda rule: define(
            sql, schemas, name=name, materialize=True, stats=counts_only(stats),
            join_rule=rule, peels=())[0])
        sp = cls(spark, graph, state_dir, shards, name=name, **kwargs)
        sp._defaults = frames
        return sp

    # ---- facts ----------------------------------------------------------------------------

    @property
    def sources(self) -> tuple[str, ...]:
        """Source names, in definition order."""
        return tuple(self.graph.sources)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Output names, in definition order."""
        return tuple(self.graph.outputs)

    def output_schema(self, name: str) -> T.StructType:
        """The Spark schema of output ``name``'s change sets (columns and ``_weight``)."""
        return spark_schema(self.graph.output_schema(name))

    def source_schema(self, name: str) -> T.StructType:
        """The Spark schema of source ``name``'s rows (without ``_weight``)."""
        return spark_schema(self.graph.source_schema(name))

    @property
    def plan(self) -> DistributedPlan:
        """The distributed plan.

        The recorded one, or (before the first operation) the one the planner makes now
        from the statistics given (see :meth:`explain`).
        """
        if self._plan is not None:
            return self._plan
        if self._manifest.plan is not None:
            self._plan = from_decisions(self.graph, self._manifest.plan, shards=self.shards,
                                        name=self.name, stats=self._stats)
            return self._plan
        return plan_distribution(self.graph, self._stats, shards=self.shards, name=self.name)

    @property
    def stages(self) -> list[dict[str, Any]]:
        """Every stage: what it receives, the operators it runs, what it sends on."""
        return self.plan.to_dict()["stages"]

    def explain(self) -> str:
        """The distributed plan in words: every choice, its reason and figures."""
        fixed = "" if self._manifest.plan is not None else (
            "(provisional: the first operation fixes the plan, a population with its "
            "sources' row counts)\n")
        return fixed + self.plan.explain()

    @property
    def outputs_uri(self) -> str:
        """Where operation outputs live (as for :attr:`spark_io.SparkJoin.outputs_uri`)."""
        return self._outputs.uri

    @property
    def outputs_dir(self) -> Path:
        """:attr:`outputs_uri` as a local path (:class:`SparkIOError` if it is not one)."""
        return local_outputs(self._outputs)

    # ---- operations -----------------------------------------------------------------------

    def populate(self, sources: Mapping[str, Any] | None = None, *,
                 order: Sequence[str] | None = None, resume: bool = False
                 ) -> dict[str, DataFrame]:
        """Load every source's snapshot; return every output's change set.

        ``sources``: source name -> a DataFrame, or Parquet files (a path, a directory or
        a list of them); by default the DataFrames :meth:`from_sql` was given.  Sources
        not given stay empty.  One Spark job loads every stage store (small sources
        first, or in ``order``).  Population happens once per state directory and is
        all or nothing: if it fails, the stores are left empty and ``populate`` may run
        again.  ``resume=True`` on a populated pipeline returns the population's outputs
        (if kept); on one whose population was interrupted it loads it again.
        """
        if sources is None:
            if not self._defaults:
                raise SchemaMismatchError(
                    f"populate() of pipeline {self.name!r} needs sources {{source name: "
                    f"DataFrame or Parquet path}} (sources: {list(self.sources)})")
            sources = self._defaults
        if not isinstance(sources, Mapping) or not sources:
            raise SchemaMismatchError(
                "sources must be a non-empty dict {source name: DataFrame or Parquet path}; "
                f"pipeline {self.name!r} has sources {list(self.sources)}")
        resume = args.check_bool(resume, "resume")
        for s in sources:
            self.graph.source_schema(s)  # raises naming the sources
        if order is not None:
            order = [str(s) for s in order]
            if sorted(order) != sorted(sources):
                raise SchemaMismatchError(
                    f"order={order!r} must name each of the given sources {sorted(sources)} "
                    "once")
        with self._ops.hold():
            self._resolve()
            if self._manifest.populated is not None:
                if resume:
                    return self._recorded_outputs(self._manifest.populated)
                raise PopulationStateError(
                    f"pipeline {self.name!r} in {self.state_dir} was populated already "
                    f"(operation {self._manifest.populated}); use apply() for changes, or "
                    "a new state_dir")
            return self._populate(sources, order)

    def _populate(self, sources: Mapping[str, Any], order: Sequence[str] | None
                  ) -> dict[str, DataFrame]:
        self.last_timings = {}
        clock = _Clock(self.last_timings)
        t0 = time.perf_counter()
        op = operation_id("populate")
        spills: list[OutputDir] = []
        try:
            files: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool]] = {}
            rows: dict[str, int] = {}
            for s, value in sources.items():
                paths, columns, weighted, n = self._snapshot_files(s, value, op, spills)
                files[s] = (paths, columns, weighted)
                rows[s] = n
            if self._manifest.plan is None:
                self._stats.update({s: given(s, n, snapshot=True,
                                             unique_key=self.graph.sources[s].unique_key)
                                    for s, n in rows.items()})
            plan = self._fix_plan()
            clock.lap("sources")  # their Parquet files found (or written), the plan fixed
            self._manifest = self._manifest.replace(populating=op)
            self._manifest.write(self.state_dir)
            self._wipe()
            out_dir, _ = open_output_dir(self._outputs, self._owner, op, "populate")
            clock.lap("record")
            spec = OperationSpec(self.name, op, "populate", out_dir.uri,
                                 batch_rows=self.batch_rows, owes=True,
                                 order=tuple(order) if order is not None else None)
            try:
                warm = self._warm_up()
                result = run_operation(self.spark, plan, self._plan_ref(), spec,
                                       self._storage(), options_to_dict(self.options),
                                       ChangeRef(files=files, rows=rows))
                warm()
                clock.lap("job")
            except BaseException as exc:
                self._wipe()
                with contextlib.suppress(OSError, pa.ArrowException):
                    out_dir.remove()
                self._manifest = self._manifest.replace(populating=None)
                self._manifest.write(self.state_dir)
                if isinstance(exc, Exception):
                    exc.add_note(f"populate operation {op} of pipeline {self.name!r} was "
                                 "undone: the stores are empty; populate() may run again")
                raise
        finally:
            for d in spills:
                d.remove()
        self._manifest = self._manifest.replace(
            populated=op, populating=None, checkpoints={
                **self._manifest.checkpoints, **result.checkpoints()},
            committed_op=op if self.checkpoint_uri else self._manifest.committed_op)
        self._manifest.write(self.state_dir)
        return self._finish(op, "populate", out_dir, result, t0)

    def apply(self, source: str | Mapping[str, DataFrame],
              changes: DataFrame | None = None, *, op_id: str | None = None
              ) -> dict[str, DataFrame]:
        """Apply changes (a source's columns + ``_weight``) as one operation.

        ``apply(source, changes)`` changes one source; ``apply({source: changes, ...})``
        several at once (one Spark job, one commit).  Returns every output's change set
        as a DataFrame over Parquet (eager, exactly once: see the module docstring); an
        output the change does not reach is empty.  The change is evaluated once and
        checked on the driver (types, NULL weights) before any task runs.  All stages
        and shards or none.  ``op_id`` already committed with the same change: the
        recorded outputs, nothing applied; with another change:
        :class:`joinstate.CommitConflictError` before any task runs.
        """
        if isinstance(source, Mapping):
            if changes is not None:
                msg = "apply({source: changes, ...}) takes no second argument"
                raise SchemaMismatchError(msg)
            given_changes = dict(source)
            if not given_changes:
                msg = "apply({}) names no source"
                raise SchemaMismatchError(msg)
        else:
            given_changes = {source: args.check_dataframe(changes, "changes")}
        rows = {s: self._checked(s, args.check_dataframe(df, f"changes[{s!r}]"))
                for s, df in given_changes.items()}
        op = args.check_op_id(op_id, "op_id") or operation_id("apply")
        self.last_timings = {}
        call = (f"apply({next(iter(rows))!r}, <the same changes>, op_id={op!r})"
                if len(rows) == 1 else f"apply(<the same changes>, op_id={op!r})")
        t0 = time.perf_counter()
        with self._ops.hold():
            self._resolve()
            out_dir, created = open_output_dir(self._outputs, self._owner, op, "apply")
            try:
                result = self._operate(rows, op, "apply", out_dir, f"spark-apply:{op}")
            except BaseException as exc:
                if created:
                    with contextlib.suppress(OSError, pa.ArrowException):
                        out_dir.remove()
                if isinstance(exc, Exception):
                    exc.add_note(failed_apply_note(op, call, self.checkpoint_uri is not None))
                raise
            return self._finish(op, "apply", out_dir, result, t0)

    def read(self, name: str) -> DataFrame:
        """The current contents of materialized output ``name``, as a DataFrame.

        Every shard's rows of the stage that keeps it (a row held k times appears k
        times), then the output's ``order_by`` and ``limit``.  One Spark job; nothing is
        written.
        """
        try:
            m = self.graph.materialized_output(name)
        except SchemaMismatchError as exc:
            raise SchemaMismatchError(f"pipeline {self.name!r}: {exc}") from None
        plan = self.plan
        stage = plan.stages[plan.outputs[name]]
        schema = self.graph.outputs[name].schema
        if self._manifest.plan is None:
            rows = m.node.schema.empty_table().drop_columns([m.count])
        else:
            task = _ReadTask(self._plan_ref(), stage.index, name, self.name, self._storage(),
                             options_to_dict(self.options))
            sc = self.spark.sparkContext
            blobs = sc.parallelize(list(range(self.shards)), self.shards).mapPartitions(
                task).collect()
            parts = [from_ipc(b) for b in blobs]
            rows = (pa.concat_tables(parts) if parts
                    else m.node.schema.empty_table().drop_columns([m.count]))
        rows = m.present(rows).cast(schema)
        return self.spark.createDataFrame(rows, spark_schema(schema))

    def foreach_batch_sink(
        self, source: str, output_path: str | Path, *, sink_id: str | None = None,
        retain: int = 2,
    ) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function applying each micro-batch to ``source`` exactly once.

        Each micro-batch is one operation as :meth:`apply` runs it (one Spark job; an
        empty batch runs none), under commit ids ``spark-stream:<sink_id>:<batch id>``;
        a replayed batch id with the same change gets the recorded outputs back, with
        another change raises :class:`joinstate.CommitConflictError`.  Output ``o`` of
        batch ``b`` goes to Parquet under ``<output_path>/<o>/batch_id=<b>/`` (replaced
        on replay).  ``sink_id`` names the stream (default: from ``source`` and
        ``output_path``).  Stores keep the commit records of the last ``retain`` batches.
        """
        self.graph.source_schema(source)  # raises naming the sources
        base = OutputDir(args.check_location(output_path, "output_path", SchemaMismatchError))
        sink_id = args.check_op_id(sink_id, "sink_id")
        retain = args.check_retain(retain)
        sid = sink_id or f"{source}-{hashlib.sha1(base.uri.encode()).hexdigest()[:12]}"
        prefix = f"spark-stream:{sid}:"

        def sink(batch_df: DataFrame, batch_id: int) -> None:
            self.last_timings = {}
            rows = self._checked(source, args.check_dataframe(batch_df, "batch_df"))
            t0 = time.perf_counter()
            op = f"stream-{sid}-{batch_id}"
            with self._ops.hold():
                self._resolve()
                work = self._outputs.child(op)
                work.remove()  # a failed attempt's leftovers
                try:
                    result = self._operate({source: rows}, op, "micro-batch", work,
                                           f"{prefix}{batch_id}",
                                           forget=(prefix, batch_id - retain + 1))
                    for o in self.outputs:
                        target = base.child(f"{o}/batch_id={batch_id}")
                        target.remove()
                        found = work.child(o)
                        if found.exists():
                            found.copy_to(target)
                        else:
                            target.make()
                finally:
                    work.remove()
                self._ops.log.forget(f"stream-{sid}-{batch_id - retain}")
            self._report(op, "micro-batch", base.uri, result, t0,
                         (base.child("_reports"), f"batch_id={batch_id}.json"))

        return sink

    # ---- the operation ----------------------------------------------------------------------

    def _operate(self, rows: Mapping[str, DataFrame], op: str, kind: str, out_dir: OutputDir,
                 commit_base: str, *, forget: tuple[str, int] | None = None
                 ) -> OperationResult:
        """One change (one or several sources) through every stage, as one Spark job.

        ``rows``: each source's change as the caller gave it, its column types checked
        (:meth:`_checked`).  The change is evaluated once and its digest recorded before
        the job: a small scan of Parquet files is read by the driver itself
        (:func:`spark_io.operation.read_change`), anything else through Spark, projected
        to the source's columns and ``_weight`` (:meth:`_conform`,
        :func:`spark_io.operation.collect_change`).  A committed ``op`` is replayed; on
        failure every store is rolled back.
        """
        spills: list[OutputDir] = []
        clock = _Clock(self.last_timings)
        try:
            tables: dict[str, bytes] = {}
            files: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool]] = {}
            counts: dict[str, int] = {}
            parts = []
            for s in sorted(rows):
                spill = self._outputs.child(f"_change-{op}-{uuid.uuid4().hex[:8]}")
                spills.append(spill)
                schema = self.graph.source_schema(s)
                change = read_change(rows[s], schema, s, f"source {s!r}")
                if change is None:
                    change = collect_change(self._conform(s, rows[s]), schema, s,
                                            f"source {s!r}", spill, run_job)
                parts.append(f"{s}={change.digest}")
                counts[s] = change.rows
                if change.table is not None:
                    if change.table.num_rows:
                        tables[s] = to_ipc(change.table)
                elif change.rows:
                    assert change.files is not None
                    files[s] = (_parquet_in(change.files), (*schema.names, WEIGHT), True)
            digest, _ = change_digest(",".join(parts), [])
            clock.lap("change")
            rec, replay = self._ops.start(op, kind, ",".join(sorted(rows)), digest,
                                          out_dir.uri)
            clock.lap("record")
            if not tables and not files:  # an empty change: nothing to run
                if not replay:
                    self._ops.commit(rec)
                return OperationResult((), 0.0)
            plan = self._fix_plan()
            undo = None if self.checkpoint_uri is not None else UndoPlan(
                self._owner, op, bytes.fromhex(digest))
            spec = OperationSpec(self.name, op, "apply", out_dir.uri, commit_base=commit_base,
                                 undo=undo, replay_only=replay, batch_rows=self.batch_rows,
                                 forget=forget)
            clock.lap("plan")
            try:
                warm = self._warm_up()
                result = run_operation(self.spark, plan, self._plan_ref(), spec,
                                       self._storage(), options_to_dict(self.options),
                                       ChangeRef(tables=tables, files=files, rows=counts))
                warm()
            except BaseException as exc:
                if not replay:
                    self._ops.abort(rec, exc, lambda r: self._rollback(r.op))
                raise
            clock.lap("job")
            if not replay:
                if self.checkpoint_uri is not None:
                    self._manifest = self._manifest.replace(
                        checkpoints={**self._manifest.checkpoints, **result.checkpoints()},
                        committed_op=op)
                    self._manifest.write(self.state_dir)
                self._ops.commit(rec)
            clock.lap("commit")
            return result
        finally:
            for d in spills:
                d.remove()

    def _fix_plan(self) -> DistributedPlan:
        """The plan, recorded in the manifest by the first operation."""
        plan = self.plan
        if self._manifest.plan is None:
            self._manifest = self._manifest.replace(
                plan=tuple(plan.to_dict()["decisions"]))
            self._manifest.write(self.state_dir)
            self._plan = plan
        return plan

    def _plan_ref(self) -> PlanRef:
        if self._ref is None:
            self._ref = PlanRef.of(self._fix_plan())
        return self._ref

    def _resolve(self) -> None:
        """Finish what a driver that died left: a population (undone), an operation."""
        if self._manifest.populating is not None:
            self._wipe()
            self._manifest = self._manifest.replace(populating=None)
            self._manifest.write(self.state_dir)
        self._ops.resolve(self._manifest.committed_op, lambda r: self._rollback(r.op))

    def _rollback(self, op: str) -> None:
        """One job rolling every (stage, shard) store back from ``op``'s undo records."""
        if self._manifest.plan is None:
            return
        stages = tuple(f"stage{k}" for k in range(len(self.plan.stages)))
        task = RollbackTask(self._storage(), options_to_dict(self.options),
                            UndoPlan(self._owner, "", rollback=(op,)), stages=stages)
        ids = self.spark.sparkContext.parallelize(list(range(self.shards)), self.shards)
        run_job(self.spark, ids, task, "rollback")

    def _wipe(self) -> None:
        """Empty every stage store (before and after a population that did not complete).

        With checkpoints nothing is committed yet: every task opens its store as no
        checkpoint, which starts it empty wherever it runs.
        """
        if self.checkpoint_uri is not None:
            return
        for d in self.state_dir.glob("stage*"):
            if d.is_dir():
                for store in sorted(d.glob("shard-*")):
                    if store.is_dir():  # handed over by the worker keeping it open
                        handover.wipe(store, f"store {d.name}/{store.name} of pipeline "
                                      f"{self.name!r}", "run one SparkPipeline operation")
                shutil.rmtree(d)

    # ---- plumbing -------------------------------------------------------------------------

    def _storage(self) -> ShardStorage:
        return self._manifest.storage(self.state_dir, self.local_dir, self.keep_checkpoints)

    def _checked(self, source: str, changes: DataFrame) -> DataFrame:
        """``changes`` unchanged, once its columns are checked castable to ``source``'s.

        Only the schema is read here.  The projection :meth:`_conform` builds costs a
        py4j call per column and an analysis of the plan in the JVM (0.1-0.4 s for the
        five q4 sources of one operation), so it is built only for a change Spark must
        evaluate, not for the small Parquet scan the driver reads itself.
        """
        schema = self.graph.source_schema(source)  # raises naming the sources
        have = {f.name: arrow_type(f.dataType, f.name) for f in changes.schema.fields}
        check_column_types(schema, have, f"source {source!r}")
        return changes

    def _conform(self, source: str, changes: DataFrame) -> DataFrame:
        """``source``'s columns (checked castable) and ``_weight`` as a long."""
        schema = self.graph.source_schema(source)
        self._checked(source, changes)
        weight = (F.col(WEIGHT).cast("long") if WEIGHT in changes.columns
                  else F.lit(1).cast("long")).alias(WEIGHT)
        return changes.select(*[F.col(n) for n in schema.names], weight)

    def _snapshot_files(self, source: str, value: Any, op: str, spills: list[OutputDir]
                        ) -> tuple[tuple[str, ...], tuple[str, ...], bool, int]:
        """A snapshot as Parquet files the tasks read: ``(files, columns, weighted, rows)``.

        A DataFrame that scans Parquet files is read from them; another is written to
        Parquet first (one job); a path names Parquet files (a file, a directory, a list).
        """
        schema = self.graph.source_schema(source)
        if isinstance(value, DataFrame):
            df = self._conform(source, value) if WEIGHT in value.columns else value
            cols = [*schema.names, *([WEIGHT] if WEIGHT in df.columns else [])]
            found, _ = parquet_files(df, cols, f"source {source!r}")
            if found is not None:
                return found.paths, tuple(found.columns), WEIGHT in cols, found.rows
            spill = self._outputs.child(f"_snapshot-{op}-{source}")
            spills.append(spill)
            self._conform(source, value).write.mode("overwrite").parquet(spill.spark_path)
            paths = _parquet_in(spill)
            return paths, (*schema.names, WEIGHT), True, _rows_in(paths)
        return _snapshot_paths(source, value, schema)

    def _warm_up(self) -> Callable[[], None]:
        """The session's one-time read set-up, in a thread during this pipeline's first job.

        See :mod:`spark_io.warmup`; returns the function that waits for it.
        """
        if self._warmed or not self.outputs:
            return lambda: None
        self._warmed = True
        name = self.outputs[0]
        return warmup.start(self.spark, self.graph.output_schema(name), self.output_schema(name))

    def _recorded_outputs(self, op: str) -> dict[str, DataFrame]:
        out_dir = self._outputs.child(op)
        if not out_dir.exists():
            raise PopulationStateError(
                f"pipeline {self.name!r} in {self.state_dir} was populated (operation {op}), "
                f"but its output {out_dir.uri} is gone (keep_outputs removed it?); the state "
                "is complete: use apply() for changes")
        return {o: self._read_output(out_dir.child(o), o) for o in self.outputs}

    def _finish(self, op: str, kind: str, out_dir: OutputDir, result: OperationResult,
                t0: float) -> dict[str, DataFrame]:
        """Report, apply retention, read the outputs."""
        clock = _Clock(self.last_timings)
        self._report(op, kind, out_dir.uri, result, t0)
        complete_output_dir(self._outputs, out_dir, self._owner, self.keep_outputs)
        clock.lap("report")
        outs = {o: self._read_output(out_dir.child(o), o) for o in self.outputs}
        clock.lap("outputs")
        self.last_timings["total"] = round(time.perf_counter() - t0, 4)
        return outs

    def _read_output(self, where: OutputDir, name: str) -> DataFrame:
        schema = self.output_schema(name)
        if not where.exists() or not where.holds_output():
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(where.spark_path)

    def _report(self, op: str, kind: str, output_path: str, result: OperationResult,
                t0: float, where: tuple[OutputDir, str] | None = None) -> None:
        """Keep the operation's report as :attr:`last_report`; write it as JSON."""
        stages: dict[int, list[ShardReport]] = {}
        for r in result.reports:
            stages.setdefault(int(r["stage"]), []).append(ShardReport(
                shard=int(r["shard"]), side=f"stage{r['stage']}", rows_in=int(r.get("rows_in", 0)),
                rows_out=int(r.get("rows_sent", 0)) + sum((r.get("outputs") or {}).values()),
                seconds=float(r.get("seconds", 0.0)), replayed=bool(r.get("replayed")),
                detail=dict(r)))
        jobs = tuple(JobReport(f"stage{k}", result.seconds, tuple(v))
                     for k, v in sorted(stages.items()))
        report = SparkReport(join=self.name, operation=op, kind=kind, shards=self.shards,
                             output_path=output_path, seconds=time.perf_counter() - t0,
                             jobs=jobs)
        self.last_report = report
        if where is None:
            write_report(report, self.state_dir / "_spark" / "reports" / f"{op}.json")
        else:
            where[0].write_text(where[1], report.to_json())


class _Clock:
    """Laps of the driver's work, added to a dict of seconds."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into
        self.t = time.perf_counter()

    def lap(self, what: str) -> None:
        now = time.perf_counter()
        self.into[what] = round(self.into.get(what, 0.0) + now - self.t, 4)
        self.t = now


class _ReadTask:
    """Read a materialized output from one (stage, shard) store: IPC bytes, or nothing."""

    def __init__(self, plan: PlanRef, stage: int, output: str, pipeline: str,
                 storage: ShardStorage, options: dict[str, Any] | None) -> None:
        self.plan = plan
        self.stage = stage
        self.output = output
        self.pipeline = pipeline
        self.storage = storage
        self.options = options

    def __call__(self, shards: Any) -> Any:
        from joinstate import Pipeline

        plan = self.plan.get()
        st = plan.stages[self.stage]
        for shard in shards:
            graph = st.graph_for(shard)
            key = stage_key(self.stage, shard)
            if graph is None or self.output not in graph.materialized or \
                    not self.storage.exists(key):
                continue
            # A shard's first rows in order, hidden ordering columns kept: the reader
            # merges the shards' and orders and limits once more.
            m = graph.materialized_output(self.output)
            owner = f"stage {self.stage}, shard {shard} of pipeline {self.pipeline!r}"
            if self.storage.checkpoint_uri is None:  # read-only: nobody's LOCK is needed
                with open_store(self.storage, key, options_from_dict(self.options),
                                read_only=True, owner=owner) as opened:
                    p = Pipeline(opened.store, self.pipeline, graph)
                    held = m.present(p.held(self.output), hide=False)
            else:  # the working copy, kept open by this worker (or handed over)
                with stage_store(self.storage, key, options_from_dict(self.options),
                                 pipeline=self.pipeline, graph=graph,
                                 owner=owner) as (_, p):
                    held = m.present(p.held(self.output), hide=False)
            yield to_ipc(held)


def _check_spark_types(name: str, graph: Graph) -> None:
    """Every source and output has Spark types (named otherwise)."""
    try:
        for s in graph.sources:
            spark_schema(graph.source_schema(s))
        for o in graph.outputs:
            spark_schema(graph.output_schema(o))
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(f"pipeline {name!r}: {exc}") from exc


def _parquet_in(directory: OutputDir) -> tuple[str, ...]:
    """The Parquet files of a directory Spark wrote (local paths), in name order."""
    if not directory.is_local:
        raise SparkIOError(f"{directory.uri}: tasks read changes from a local or shared file "
                           "system only; give the pipeline an output_uri there")
    return tuple(str(p) for p in sorted(directory.local_path.glob("*.parquet")))


def _rows_in(paths: Sequence[str]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


def _snapshot_paths(source: str, value: Any, schema: pa.Schema
                    ) -> tuple[tuple[str, ...], tuple[str, ...], bool, int]:
    """Parquet files given by path: every file, its columns checked against ``schema``."""
    import pyarrow.parquet as pq

    items = value if isinstance(value, list | tuple) else [value]
    if not items or not all(isinstance(v, str | Path) for v in items):
        raise SchemaMismatchError(
            f"sources[{source!r}] must be a DataFrame, or Parquet files (a path, a directory, "
            f"or a list of them), got {type(value).__name__}")
    paths: list[str] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            paths += sorted(str(f) for f in p.rglob("*.parquet") if not f.name.startswith(
                (".", "_")))
        elif p.is_file():
            paths.append(str(p))
        else:
            raise SchemaMismatchError(f"sources[{source!r}]: {str(p)!r} is neither a Parquet "
                                      "file nor a directory of them")
    if not paths:
        raise SchemaMismatchError(f"sources[{source!r}]: no Parquet file under {value!r}")
    file_schema = pq.ParquetFile(paths[0]).schema_arrow
    have = {f.name: f.type for f in file_schema}
    check_column_types(schema, have, f"source {source!r} ({paths[0]})")
    weighted = WEIGHT in have
    if weighted and not pa.types.is_integer(have[WEIGHT]):
        raise SchemaMismatchError(f"sources[{source!r}]: column {WEIGHT!r} of {paths[0]} is "
                                  f"{have[WEIGHT]}, not an integer")
    return (tuple(paths), (*schema.names, *([WEIGHT] if weighted else [])), weighted,
            _rows_in(paths))


def _as_recorded(graph: Graph, state_dir: str | Path, name: str,
                 before: Callable[[str], Graph]) -> Graph:
    """``graph``, or the same SQL planned as a state created earlier recorded it.

    A state's manifest keeps the graph it was created with, and its stores are laid out
    in that graph's join order.  The join-order rule has changed since some states were
    created (:data:`~planner.rules.join_order.JOIN_RULES`: a group was once rooted at
    its largest input; an input was once a lookup only when all its joins were on its
    unique key), and GROUP BYs over joins were once never aggregated before their last
    joins; such a state must re-attach to the plan it holds, not be refused because the
    planner has changed.  ``before(rule)`` plans the SQL with an earlier rule, peeling
    no join off an aggregate (as then); a plan is used only when it is exactly the
    recorded graph, the latest rule first (different SQL still fails in the
    constructor, naming what differs).
    """
    try:
        stored = PipelineManifest.read(args.check_state_dir(state_dir), name)
    except JoinStateError:
        return graph  # the constructor reports a bad directory or manifest, named
    if stored is None or not spec_diff(stored.graph, graph.spec()):
        return graph
    for rule in reversed(JOIN_RULES[:-1]):
        old = before(rule)
        if not spec_diff(stored.graph, old.spec()):
            return old
    return graph
