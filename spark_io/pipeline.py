"""The driver's face for pipelines: :class:`SparkPipeline`.

It runs a :class:`joinstate.Pipeline` definition on Spark, every stateful stage sharded
by its key.

::

    def q4(p: joinstate.Pipeline) -> None:           # builds the graph on the given pipeline
        customer = p.source("customer", schema=..., unique_key=["c_customer_sk"])
        sales = p.source("store_sales", schema=...)
        g = (sales.join(customer, on=("ss_customer_sk", "c_customer_sk"))
                  .group_by(["c_customer_id"]).aggregate(total=("sum", "ss_net_paid")))
        p.output("per_customer", g)

    sp = spark_io.SparkPipeline(spark, q4, "/data/q4-state", shards=8)
    outs = sp.populate({"customer": customer_df, "store_sales": sales_df})
    outs = sp.apply("store_sales", changes_df)       # {output name: DataFrame + _weight}
    sink = sp.foreach_batch_sink("store_sales", "/data/q4-out")   # for writeStream

**The definition** is a callable that builds the graph on the ``joinstate.Pipeline`` it is
given (sources, operators, ``p.output(...)``).  It runs once, on the driver, on a
store-less pipeline that records the graph; the graph is cut into stages
(:mod:`spark_io.stages`) and each stage's recipe (schemas and ``pyarrow.compute``
expressions, all picklable) is shipped to the executors, which rebuild the stage's own
small ``joinstate.Pipeline`` in each shard.  So the definition need not be importable on
executors, and a lambda or a notebook function will do.

**One operation** (``apply`` of one source, one source of ``populate``, one micro-batch)
runs the stages in topological order.  For each stage input that received changes, one
Spark job routes them by the stage's key (``mapInArrow`` + ``repartition``: partition
``i`` is shard ``i``) and pushes each shard's rows into the (stage, shard) store as one
transaction with a commit id derived from the operation.  A small change set (``apply``
and micro-batches, up to :data:`spark_io.routing.COLLECT_MAX_ROWS` rows per stage input)
is cut by shard on the driver instead, which reads an earlier stage's output files
itself: one job per stage input and no shuffle; the stage's outputs go to
Parquet under ``<outputs>/<operation>/<source>/n<node id>/``, and the
next stages read them from there.  Stage inputs that received nothing are skipped, so a
change that a filter drops, or that touches no group, stops early.

Exactly once.  As with :class:`spark_io.SparkJoin`, operations are **eager** and the
returned DataFrames read Parquet files written once.  An ``apply`` or micro-batch is
one operation (:mod:`spark_io.operation`): its change is evaluated once, checked on the
driver, and recorded with its digest before any task runs.  A retried task finds each
shard's commit id recorded and gets the recorded output back instead of applying again;
the same operation run again (``apply(..., op_id=<same id>)``, a replayed micro-batch
id) with the same change replays every stage, and with another change is refused
before any task runs.

Failures.  All stages and shards or none: without checkpoints every (stage, shard)
push records its undo in its own WriteBatch, and if any task of any stage fails, or
the driver dies before the operation is committed, every store is rolled back (at
once, or by the next operation).  With checkpoints the committed checkpoints are
simply kept.  A change the sources cannot take (deleting a row that is not there) is
refused by the first stage that indexes that source (its index holds the unfiltered
rows, as in-process) and reported by its task without failing it, so Spark logs no
failed task; the driver raises the library's error.  Population is not atomic but
resumable: ``populate(resume=True)`` skips the sources whose push completed (recorded
in the manifest) and replays the rest from their commit ids.

Change sets are consolidated per shard and push (as ``joinstate.Pipeline.push`` does);
an output fed by several stages or shards (a ``union_all`` of two stages' outputs, a
projection dropping the key) may hold a row in several parts whose weights sum to its
net change: consumers integrate by summing ``_weight``.

Checkpoints (``checkpoint_uri=``): every (stage, shard) store a job changed is
checkpointed by its task to ``<checkpoint_uri>/<stage>/shard-NNNNN/``; the driver keeps
the ids of the checkpoints it has committed in the manifest and commits an operation's
new ids only when the whole operation succeeded (``populate``: each source's push).  A
task opens a store as exactly the checkpoint it is given (the committed one, or the one
an earlier job of the same operation produced) and restores it when its working copy is
missing, older or ahead, so a failed ``apply`` leaves no trace in any shard, wherever
its tasks ran, and stores may live on executor-local disk (``local_dir=``).  Outputs
then default to ``<checkpoint_uri>/_outputs/`` (:mod:`spark_io.outputs`), so the
driver's ``state_dir`` (manifest, reports) need not be shared with the executors.

State layout::

    <state_dir>/<stage>/shard-NNNNN        one RocksDB store per (stage, shard)
    <state_dir>/_spark/pipeline-<name>.json  the manifest (definition, stages, shards)
    <state_dir>/_spark/outputs/<operation>/  Parquet output of populate/apply (without
                                             checkpoint_uri and output_uri)
    <state_dir>/_spark/reports/<operation>.json
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joinstate import WEIGHT, JoinSpecMismatchError, SchemaMismatchError
from joinstate._graph import SourceNode
from joinstate.catalog import spec_diff
from joinstate.names import pipeline_owner, validate_name
from joinstate.schema import check_column_types
from spark_io import args, routing
from spark_io._worker import OUTPUT_PARQUET, RollbackTask, UndoPlan, options_to_dict
from spark_io.errors import ManifestError, PopulationStateError
from spark_io.executors import check_executors
from spark_io.job import (
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
from spark_io.manifest import PARTITIONER, ShardStorage, other_owners
from spark_io.operation import OperationRecord, Operations, collect_change
from spark_io.outputs import OutputDir
from spark_io.report import JobReport, SparkReport
from spark_io.routing import SHARD, collect_small, partition_key_column
from spark_io.stages import (
    GraphRecorder,
    Stage,
    StageControlTask,
    StageInput,
    StagePlan,
    StageRouter,
    StageTask,
    plan_stages,
)
from spark_io.types import arrow_type, spark_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

    from joinstate import Pipeline, StoreOptions

__all__ = ["SparkPipeline"]

FORMAT = 1


def manifest_path(state_dir: Path, name: str) -> Path:
    """Where the manifest of pipeline ``name`` lives."""
    return state_dir / "_spark" / f"pipeline-{name}.json"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (temporary file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class SparkPipeline:
    """A :class:`joinstate.Pipeline` run on Spark, its stateful stages sharded by key.

    ``definition(p)`` builds the graph on the ``joinstate.Pipeline`` ``p`` it is given
    (see the module docstring); ``state_dir`` is a shared directory every executor sees
    (without ``checkpoint_uri``; with it, the driver's own); ``shards`` is fixed when the
    state is created.  Creating a
    ``SparkPipeline`` on a ``state_dir`` that holds this pipeline re-attaches to it; a
    different definition or shard count raises
    :class:`~joinstate.JoinSpecMismatchError` naming what differs.  ``name`` names the
    pipeline (manifest, commit records); ``keep_outputs`` is how many operation output
    directories are kept (``None``: all).  The object lives on the driver; run one
    operation at a time per ``state_dir``.

    ``checkpoint_uri``, ``local_dir``, ``keep_checkpoints`` and ``output_uri`` as for
    :class:`spark_io.SparkJoin`: stage stores are checkpointed to
    ``<checkpoint_uri>/<stage>/shard-NNNNN/`` (see the module docstring), their working
    copies may live on executor-local disk, and the state directory then holds this
    pipeline alone.  Join types in the definition may be Spark's names
    (``how="leftouter"``, ``"outer"``, ``"semi"`` ...; see :data:`spark_io.JOIN_TYPES`).
    """

    def __init__(
        self, spark: SparkSession, definition: Callable[[Pipeline], object],
        state_dir: str | Path, shards: int = 2, *, name: str = "pipeline",
        options: StoreOptions | None = None, keep_outputs: int | None = 20,
        checkpoint_uri: str | Path | None = None, local_dir: str | Path | None = None,
        keep_checkpoints: int = 3, output_uri: str | Path | None = None,
    ) -> None:
        check_session(spark)
        name = validate_name("pipeline", name)
        if not callable(definition):
            raise SchemaMismatchError(
                f"definition must be a callable (pipeline) -> None that builds the graph on "
                f"the joinstate.Pipeline it is given, got {type(definition).__name__}")
        state = args.check_state_dir(state_dir)
        shards = args.check_shards(shards)
        options = args.check_options(options)
        keep = args.check_keep_outputs(keep_outputs)
        uri = args.check_checkpoint_uri(checkpoint_uri)
        local = args.check_local_dir(local_dir, uri)
        keep_ck = args.check_keep_checkpoints(keep_checkpoints)
        out_uri = args.check_output_uri(output_uri)
        recorder = GraphRecorder(name)
        definition(recorder)
        plan = plan_stages(recorder, name)
        schemas = _spark_schemas(recorder, plan)
        spec = _spec(name, shards, recorder, plan)
        spec["checkpoint_uri"] = uri
        path = manifest_path(state, name)
        stored: dict[str, Any] | None = None
        if path.exists():
            stored = _read_manifest(path, name)
            diffs = spec_diff(stored["spec"], spec)
            if diffs:
                raise JoinSpecMismatchError(
                    f"pipeline {name!r} in {state} was created with a different definition "
                    f"or shard count ({'; '.join(diffs)}); use a new state_dir (or name)")
            args.check_same_output_uri(out_uri, _outputs_of(stored, state),
                                       f"pipeline {name!r}", state)
        args.check_sole_owner(other_owners(state, path), uri, state)
        check_executors(spark)  # before the manifest is written: a broken setup leaves none
        if stored is None:
            stored = {"format": FORMAT, "kind": "pipeline", "spec": spec, "populated": None,
                      "populating": None, "checkpoints": {},
                      "output_uri": out_uri or default_outputs(state, uri)}
            _write_json(path, stored)
        self.spark = spark
        self.name = name
        self.state_dir = state
        self.shards = shards
        self.options = options
        self.keep_outputs = keep
        self.plan: StagePlan = plan
        self.last_report: SparkReport | None = None
        self._recorder = recorder
        self._manifest = stored
        self._schemas = schemas
        self._owner = pipeline_owner(name)
        self.checkpoint_uri: str | None = stored["spec"].get("checkpoint_uri")
        self.local_dir = local
        self.keep_checkpoints = keep_ck
        # The checkpoint each (stage, shard) store is at: the committed ids (manifest),
        # plus, during an operation, those its jobs produced so far.
        self._current: dict[str, str] = dict(stored.get("checkpoints") or {})
        self._outputs = OutputDir(_outputs_of(stored, state))
        self._ops = Operations(
            state, self._owner, f"pipeline {name!r} in {state}",
            "Re-attach (spark_io.SparkPipeline(spark, <the same definition>, "
            f"{str(state)!r}, name={name!r})) to continue from its committed state.",
            checkpointed=uri is not None)

    @classmethod
    def from_sql(cls, spark: SparkSession, sql: str, sources: Mapping[str, Any], *,
                 state_dir: str | Path, shards: int = 2, name: str = "result",
                 stats: Mapping[str, Any] | None = None, **kwargs: Any) -> SparkPipeline:
        """A Spark pipeline maintaining ``sql``'s answer as its one output, ``name``.

        ``sources`` maps each source name to a ``pyarrow.Schema`` or a
        ``planner.sql.Source`` (schema and unique key); ``stats`` optionally maps a source
        to its row count for the join-order rule.  The SQL is compiled by
        :func:`planner.sql.define` inside the definition, on the driver, so a query
        outside the incremental subset raises ``planner.sql.UnsupportedSQLError`` before
        any Spark job.  The output is a stream of change sets (a Spark pipeline keeps no
        materialized result to read back), so a final ORDER BY or LIMIT is refused.
        Other keyword arguments (``options``, ``keep_outputs``, ``checkpoint_uri`` ...)
        are those of :class:`SparkPipeline`; the pipeline is named ``name`` too.
        """
        from planner.sql import define

        def definition(p: Pipeline) -> None:
            define(p, sql, sources, name=name, materialize=False, stats=stats)

        return cls(spark, definition, state_dir, shards, name=name, **kwargs)

    # ---- facts ----------------------------------------------------------------------------

    @property
    def sources(self) -> tuple[str, ...]:
        """Source names, in definition order."""
        return self._recorder.sources

    @property
    def outputs(self) -> tuple[str, ...]:
        """Output names, in definition order."""
        return self._recorder.outputs

    def output_schema(self, name: str) -> T.StructType:
        """The Spark schema of output ``name``'s change sets (columns and ``_weight``)."""
        return spark_schema(self._recorder.output_schema(name))

    def source_schema(self, name: str) -> T.StructType:
        """The Spark schema of source ``name``'s rows (without ``_weight``)."""
        return spark_schema(self._recorder.source_schema(name))

    @property
    def stages(self) -> list[dict[str, Any]]:
        """Every stage in run order: label, kind, key, inputs (and their keys), outputs."""
        return [s.describe() for s in self.plan.stages]

    def explain(self) -> str:
        """The stages in words."""
        lines = [f"pipeline {self.name!r}: {len(self.plan.stages)} stages over "
                 f"{self.shards} shards"]
        for s in self.plan.stages:
            ins = ", ".join(f"{i.name} (from {i.boundary_label}, routed by {list(i.key)})"
                            for i in s.inputs)
            made = ", ".join(self.plan.nodes[n].label for n in s.produces)
            lines.append(f"  {s.label}: {s.kind} keyed by {list(s.key)}; inputs {ins}; "
                         f"writes {made}")
        for o, nid in self.plan.outputs.items():
            lines.append(f"  output {o} = {self.plan.nodes[nid].label}")
        return "\n".join(lines)

    @property
    def outputs_uri(self) -> str:
        """Where operation outputs live (as for :attr:`spark_io.SparkJoin.outputs_uri`)."""
        return self._outputs.uri

    @property
    def outputs_dir(self) -> Path:
        """:attr:`outputs_uri` as a local path (:class:`SparkIOError` if it is not one)."""
        return local_outputs(self._outputs)

    # ---- operations -----------------------------------------------------------------------

    def populate(self, sources: Mapping[str, DataFrame], *, order: Sequence[str] | None = None,
                 resume: bool = False) -> dict[str, DataFrame]:
        """Load snapshot DataFrames into the sources; return every output's change set.

        Each source is pushed as one operation over all stages, in ``order``: by default
        sources with a unique key (dimensions) first, then by row count, smallest first,
        so that big pushes probe complete small indexes.  Sources not given stay empty.
        Population happens once per state directory.  If the call fails, the error says
        so and ``populate(<the same snapshots>, resume=True)`` continues it: sources whose
        push completed are skipped (the manifest records them with that push's
        checkpoints), a push cut short is replayed from its commit ids, not applied again.
        If the population completed but its caller never got the result (the driver died
        after recording it), ``populate(..., resume=True)`` returns the recorded outputs.
        Every stage store's pipeline is set live when the population completes.
        """
        if not isinstance(sources, Mapping) or not sources:
            raise SchemaMismatchError(
                "sources must be a non-empty dict {source name: DataFrame}; pipeline "
                f"{self.name!r} has sources {list(self.sources)}")
        resume = args.check_bool(resume, "resume")
        rows = {s: self._conform(s, args.check_dataframe(df, f"sources[{s!r}]"))
                for s, df in sources.items()}
        with self._ops.hold():
            self._resolve()
            if self._manifest.get("populated") is not None:
                if resume:
                    return self._populated_outputs()
                raise PopulationStateError(
                    f"pipeline {self.name!r} in {self.state_dir} was populated already "
                    f"(operation {self._manifest['populated']}); use apply() for changes, or "
                    "a new state_dir")
            return self._populate(rows, order, resume)

    def _populated_outputs(self) -> dict[str, DataFrame]:
        """The outputs of the recorded population (``populate(resume=True)`` after it)."""
        op = str(self._manifest["populated"])
        out_dir = self._outputs.child(op)
        if not out_dir.exists():
            raise PopulationStateError(
                f"pipeline {self.name!r} in {self.state_dir} was populated (operation {op}), "
                f"but its output {out_dir.uri} is gone (keep_outputs removed it?); the state "
                "is complete: use apply() for changes")
        sources = [n for n, is_dir in out_dir.entries() if is_dir and n in self.sources]
        return {o: self._read([out_dir.child(f"{s}/n{nid}") for s in sources],
                              self.output_schema(o))
                for o, nid in self.plan.outputs.items()}

    def _populate(self, rows: dict[str, DataFrame], order: Sequence[str] | None,
                  resume: bool) -> dict[str, DataFrame]:
        running = self._manifest.get("populating")
        if running is not None and not resume:
            raise PopulationStateError(
                f"pipeline {self.name!r} in {self.state_dir}: populate() (operation "
                f"{running['operation']}) was interrupted midway; call populate(<the same "
                "snapshots>, resume=True) to continue it, or use a new state_dir")
        if running is None and resume:
            raise PopulationStateError(
                f"pipeline {self.name!r}: resume=True continues an interrupted populate(), "
                "and none was interrupted")
        if order is not None:
            order = [str(s) for s in order]
            if sorted(order) != sorted(rows):
                raise SchemaMismatchError(
                    f"order={order!r} must name each of the given sources {sorted(rows)} once")
        elif running is not None:
            order = list(running["order"])
        else:
            order = self._default_order(rows)
        if running is not None and (list(running["order"]) != order):
            raise PopulationStateError(
                f"pipeline {self.name!r}: resume=True continues the interrupted populate() "
                f"with sources {running['order']}; got {order}")
        t0 = time.perf_counter()
        op = str(running["operation"]) if running is not None else operation_id("populate")
        if running is None:
            self._manifest["populating"] = {"operation": op, "order": order, "done": {}}
            _write_json(manifest_path(self.state_dir, self.name), self._manifest)
        populating = self._manifest["populating"]
        # Sources whose push completed (a resumed call skips them): recorded with the
        # checkpoints of that push, in one manifest write, before their commit ids are
        # forgotten; each with the nodes its push produced output for.
        done: dict[str, list[int]] = dict(populating.get("done") or {})
        out_dir, _ = open_output_dir(self._outputs, self._owner, op, "populate")
        jobs: list[JobReport] = []
        produced: dict[str, set[int]] = {}
        try:
            for s in order:
                if s in done:
                    produced[s] = {int(n) for n in done[s]}
                    continue
                produced[s] = self._propagate(s, rows[s], out_dir.child(s),
                                              f"spark-populate:{op}:", jobs, small=False)
                done[s] = sorted(produced[s])
                populating["done"] = dict(done)
                self._commit_checkpoints(always=True)
            jobs.append(self._control(forget_prefix=f"spark-populate:{op}:", go_live=True))
            self._commit_checkpoints()
        except BaseException as exc:
            self._rollback_checkpoints()
            if not out_dir.holds_output():  # resume=True creates it again
                out_dir.remove()
            if not isinstance(exc, Exception):
                raise
            exc.add_note(
                f"populate operation {op} of pipeline {self.name!r} is recorded as "
                "interrupted: once the cause is fixed, populate(<the same snapshots>, "
                "resume=True) continues it (completed pushes are not applied again)")
            raise
        self._manifest["populated"] = op
        self._manifest["populating"] = None
        _write_json(manifest_path(self.state_dir, self.name), self._manifest)
        return self._finish(op, "populate", out_dir, produced, jobs, t0)

    def apply(self, source: str, changes: DataFrame, *, op_id: str | None = None
              ) -> dict[str, DataFrame]:
        """Apply a change DataFrame (``source``'s columns + ``_weight``) to ``source``.

        Returns every output's change set as a DataFrame over Parquet (eager, exactly
        once: see the module docstring); an output the change does not reach is empty.
        The change is evaluated once and checked on the driver (types, NULL weights)
        before any task runs.  All stages and shards or none: the operation ``op_id``
        is recorded with a digest of the whole change first and committed when every
        stage has run; if any (stage, shard) fails, every store is rolled back (undo
        records, or the committed checkpoints with ``checkpoint_uri``) and the error
        says so.  ``apply`` with an ``op_id`` already committed returns the recorded
        outputs and applies nothing if the change is the same, and raises
        :class:`joinstate.CommitConflictError` before any task runs if it is not.
        """
        changes = args.check_dataframe(changes, "changes")
        op = args.check_op_id(op_id, "op_id") or operation_id("apply")
        rows = self._conform(source, changes)  # checked before any directory
        t0 = time.perf_counter()
        with self._ops.hold():
            self._resolve()
            out_dir, created = open_output_dir(self._outputs, self._owner, op, "apply")
            jobs: list[JobReport] = []
            with undone_on_failure(out_dir, created, failed_apply_note(
                    op, f"apply({source!r}, <the same changes>, op_id={op!r})",
                    self.checkpoint_uri is not None)):
                produced = self._operate(source, rows, op, "apply", out_dir,
                                         out_dir.child(source), f"spark-apply:{op}:", jobs)
            return self._finish(op, "apply", out_dir, {source: produced}, jobs, t0)

    def foreach_batch_sink(
        self, source: str, output_path: str | Path, *, sink_id: str | None = None,
        retain: int = 2,
    ) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function applying each micro-batch to ``source`` exactly once.

        Each micro-batch is an operation as :meth:`apply` runs one (all stages and
        shards or none, recorded with the digest of its change), committed under the
        commit ids ``spark-stream:<sink_id>:<batch id>:...``; a replayed batch id (Spark
        re-runs the last batch after a failure) with the same change gets the recorded
        outputs back and applies nothing, with another change raises
        :class:`joinstate.CommitConflictError`.  Output ``o`` of batch ``b`` goes to
        Parquet under ``<output_path>/<o>/batch_id=<b>/`` (replaced on replay; read it
        with ``spark.read.schema(sp.output_schema(o)).parquet(f"{output_path}/{o}")``).
        ``sink_id`` names the stream (default: from ``source`` and ``output_path``); a new
        query (batch ids from 0 again) needs a new one.  Each shard keeps the commit
        records of its last ``retain`` batches (and the driver their operation records).
        """
        self._recorder.source_schema(source)  # raises naming the sources
        base = OutputDir(args.check_location(output_path, "output_path", SchemaMismatchError))
        sink_id = args.check_op_id(sink_id, "sink_id")
        retain = args.check_retain(retain)
        sid = sink_id or f"{source}-{hashlib.sha1(base.uri.encode()).hexdigest()[:12]}"
        prefix = f"spark-stream:{sid}:"

        def sink(batch_df: DataFrame, batch_id: int) -> None:
            rows = self._conform(source, args.check_dataframe(batch_df, "batch_df"))
            t0 = time.perf_counter()
            op = f"stream-{sid}-{batch_id}"
            jobs: list[JobReport] = []
            with self._ops.hold():
                self._resolve()
                work = self._outputs.child(op)
                work.remove()  # a failed attempt's leftovers
                try:
                    produced = self._operate(
                        source, rows, op, "micro-batch", work, work.child(source),
                        f"{prefix}{batch_id}:", jobs, forget=(prefix, batch_id - retain + 1))
                    for o, nid in self.plan.outputs.items():
                        target = base.child(f"{o}/batch_id={batch_id}")
                        target.remove()
                        found = work.child(f"{source}/n{nid}")
                        if nid in produced and found.exists():
                            found.copy_to(target)
                        else:
                            target.make()
                finally:
                    work.remove()
                self._ops.log.forget(f"stream-{sid}-{batch_id - retain}")
            self._report(SparkReport(
                join=self.name, operation=op, kind="micro-batch", shards=self.shards,
                output_path=base.uri, seconds=time.perf_counter() - t0, jobs=tuple(jobs),
            ), (base.child("_reports"), f"batch_id={batch_id}.json"))

        return sink

    def _resolve(self) -> None:
        """Roll back (or mark committed) the operation a driver left running."""
        self._ops.resolve(self._manifest.get("committed_op"), lambda r: self._rollback(r.op))

    def _rollback(self, op: str) -> None:
        """One job rolling every (stage, shard) store back from ``op``'s undo records."""
        task = RollbackTask(self._storage(), options_to_dict(self.options),
                            UndoPlan(self._owner, "", rollback=(op,)),
                            stages=tuple(s.label for s in self.plan.stages))
        parallel = max(1, min(self.shards, self.spark.sparkContext.defaultParallelism))
        ids = self.spark.sparkContext.parallelize(list(range(self.shards)), parallel)
        run_job(self.spark, ids, task, "rollback")

    def _operate(self, source: str, rows: DataFrame, op: str, kind: str, op_dir: OutputDir,
                 out_dir: OutputDir, commit_base: str, jobs: list[JobReport], *,
                 forget: tuple[str, int] | None = None) -> set[int]:
        """Run one operation: ``rows`` pushed into ``source`` and on through every stage.

        The change is evaluated once (:func:`spark_io.operation.collect_change`) and its
        digest recorded before any task runs; a committed ``op`` is replayed.  On
        failure every store is rolled back.  Returns the nodes with output (as
        :meth:`_propagate`).
        """
        spill = self._outputs.child(f"_change-{op}-{uuid.uuid4().hex[:8]}")
        try:
            change = collect_change(rows, self._recorder.source_schema(source), source,
                                    f"source {source!r}", spill, run_job)
            rec, replay = self._ops.start(op, kind, source, change.digest, op_dir.uri)
            data: DataFrame | pa.Table
            if change.table is not None:
                data = change.table
            else:
                assert change.files is not None
                data = self.spark.read.schema(rows.schema).parquet(change.files.spark_path)
            undo = None if self.checkpoint_uri is not None else UndoPlan(
                self._owner, op, bytes.fromhex(change.digest))
            try:
                with self._checkpoint_commit(None if replay else rec):
                    return self._propagate(source, data, out_dir, commit_base, jobs,
                                           forget=forget, undo=undo, replay_only=replay)
            except BaseException as exc:
                if not replay:
                    self._ops.abort(rec, exc, lambda r: self._rollback(r.op))
                raise
        finally:
            spill.remove()

    # ---- plumbing -------------------------------------------------------------------------

    def _conform(self, source: str, changes: DataFrame) -> DataFrame:
        """``source``'s columns (checked castable) and ``_weight`` as a long."""
        schema = self._recorder.source_schema(source)  # raises naming the sources
        given = {f.name: arrow_type(f.dataType, f.name) for f in changes.schema.fields}
        check_column_types(schema, given, f"source {source!r}")
        if WEIGHT in given:
            weight = F.col(WEIGHT).cast("long").alias(WEIGHT)
        else:
            weight = F.lit(1).cast("long").alias(WEIGHT)
        return changes.select(*[F.col(n) for n in schema.names], weight)

    def _default_order(self, rows: Mapping[str, DataFrame]) -> list[str]:
        position = {s: i for i, s in enumerate(self.sources)}
        counts = {s: df.count() for s, df in rows.items()}
        return sorted(rows, key=lambda s: (self._recorder.source_unique_key(s) is None,
                                           counts[s], position[s]))

    def _propagate(self, source: str, rows: DataFrame | pa.Table, out_dir: OutputDir,
                   commit_base: str, jobs: list[JobReport], *,
                   forget: tuple[str, int] | None = None, small: bool = True,
                   undo: UndoPlan | None = None, replay_only: bool = False) -> set[int]:
        """Push ``rows`` into ``source`` and on through every stage.

        ``rows``: a DataFrame, or a change collected as Arrow.  Returns the ids of the
        nodes whose change sets are non-empty (written to ``<out_dir>/n<id>/``);
        appends every Spark job's report to ``jobs``.  With
        ``small`` (changes, not a population), a stage input of at most
        :data:`spark_io.routing.COLLECT_MAX_ROWS` rows is routed on the driver.
        ``undo``/``replay_only`` go to every stage task (:class:`StageTask`).
        """
        src_id = next(n.id for n in self.plan.nodes.values()
                      if isinstance(n, SourceNode) and n.name == source)
        produced: set[int] = set()
        uses = sum(i.boundary == src_id for s in self.plan.stages for i in s.inputs)
        if isinstance(rows, pa.Table):
            if rows.num_rows and src_id in self.plan.outputs.values():
                out_dir.child(f"n{src_id}").write_table("part-source.parquet", rows,
                                                        **OUTPUT_PARQUET)
                produced.add(src_id)
        elif uses > 1 or src_id in self.plan.outputs.values():
            # Evaluated once: every stage (and the output) must see the same change, even
            # if the DataFrame would differ when evaluated again (a growing source).
            where = out_dir.child(f"n{src_id}")
            rows.write.mode("overwrite").parquet(where.spark_path)
            rows = self.spark.read.schema(rows.schema).parquet(where.spark_path)
            produced.add(src_id)
        for stage in self.plan.stages:
            for inp in stage.inputs:
                if inp.boundary == src_id:
                    df = rows
                elif inp.boundary in produced:
                    where = out_dir.child(f"n{inp.boundary}")
                    table = where.read_small(routing.COLLECT_MAX_ROWS) if small else None
                    df = table if table is not None else self._read(
                        [where], self._schemas[inp.boundary])
                else:
                    continue
                task = StageTask(
                    self.name, stage, self._storage(), options_to_dict(self.options),
                    source=inp.name, output_dir=out_dir.uri, tag=f"{stage.label}.{inp.name}",
                    commit_id=f"{commit_base}{source}:{stage.label}:{inp.name}",
                    forget_prefix=forget[0] if forget else None,
                    keep_after=forget[1] if forget else None,
                    undo=undo, replay_only=replay_only,
                )
                routed = self._routed(df, stage, inp, small)
                if routed is None:  # no row: no shard changes, nothing to run
                    continue
                job = run_job(self.spark, routed, task, f"{stage.label}:{inp.name}")
                self._current.update(checkpoints_of(job))
                jobs.append(job)
                for shard in job.shards:
                    for out, n in shard.detail.get("rows", {}).items():
                        if n:
                            produced.add(int(out[1:]))
        return produced

    def _routed(self, df: DataFrame | pa.Table, stage: Stage, inp: StageInput, small: bool
                ) -> DataFrame | RDD[Any] | None:
        """``df`` cut by shard for the stage's task, or None if it has no rows.

        A small change set (an Arrow table the driver read from an earlier stage's
        output, or a DataFrame :func:`~spark_io.routing.collect_small` collects) is cut
        on the driver, one partition per shard it touches, each batch carrying its
        ``_shard``: one job without a shuffle, none at all for an empty one, which is
        what keeps a small ``apply`` through several stages quick.  Anything larger is
        routed by Spark (:meth:`_route`).
        """
        if isinstance(df, pa.Table):
            table: pa.Table | None = df
        else:
            table = collect_small(df) if small else None
            if table is None:
                return self._route(df, stage, inp)
        assert table is not None
        if not table.num_rows:
            return None
        router = StageRouter(inp, self.shards, stage.label)
        routed = pa.Table.from_batches(list(router(iter(table.combine_chunks().to_batches()))))
        shard = routed.column(SHARD).to_numpy()
        pieces = []
        for s in np.unique(shard).tolist():
            piece = routed.filter(pa.array(shard == s)).combine_chunks().to_batches()
            # One batch per shard: each becomes one partition, so one task writes the shard.
            pieces.append(piece[0] if len(piece) == 1 else pa.concat_batches(piece))
        return self.spark.sparkContext.parallelize(pieces, len(pieces))

    def _route(self, df: DataFrame, stage: Stage, inp: StageInput) -> DataFrame:
        """``df`` with a ``_shard`` column, partition ``i`` holding exactly shard ``i``."""
        schema = T.StructType([*df.schema.fields, T.StructField(SHARD, T.IntegerType(), False)])
        routed = df.mapInArrow(StageRouter(inp, self.shards, stage.label), schema)
        return routed.repartition(self.shards, partition_key_column(self.shards))

    def _read(self, dirs: list[OutputDir], schema: T.StructType) -> DataFrame:
        found = [d.spark_path for d in dirs if d.exists()]
        if not found:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*found)

    def _control(self, forget_prefix: str | None = None, go_live: bool = False) -> JobReport:
        parallel = max(1, min(self.shards, self.spark.sparkContext.defaultParallelism))
        ids = self.spark.range(0, self.shards, 1, numPartitions=parallel)
        task = StageControlTask(self.name, self.plan.stages, self._storage(),
                                options_to_dict(self.options), forget_prefix=forget_prefix,
                                go_live=go_live)
        job = run_job(self.spark, ids, task, "control")
        self._current.update(checkpoints_of(job))
        return job

    # ---- checkpoints ----------------------------------------------------------------------

    def _storage(self) -> ShardStorage:
        """Where stage stores live, expecting the checkpoints they are at now."""
        return ShardStorage(str(self.state_dir), self.checkpoint_uri, self.local_dir,
                            dict(self._current), self.keep_checkpoints,
                            committed=dict(self._manifest.get("checkpoints") or {}))

    def _commit_checkpoints(self, *, always: bool = False, op: str | None = None) -> None:
        """Record the checkpoints the operation's jobs produced: the commit.

        ``op`` (with checkpoints) is recorded in the same manifest write, naming the
        operation it commits; ``always`` writes the manifest even if nothing changed
        (it holds other news, such as a population's progress).
        """
        committed = self._manifest.get("checkpoints") or {}
        changed = self.checkpoint_uri is not None and (self._current != committed
                                                       or op is not None)
        if not (changed or always):
            return
        if self.checkpoint_uri is not None:
            self._manifest["checkpoints"] = dict(self._current)
            if op is not None:
                self._manifest["committed_op"] = op
        _write_json(manifest_path(self.state_dir, self.name), self._manifest)

    def _rollback_checkpoints(self) -> None:
        """Forget uncommitted checkpoints: the next task restores the committed ones."""
        self._current = dict(self._manifest.get("checkpoints") or {})

    @contextlib.contextmanager
    def _checkpoint_commit(self, rec: OperationRecord | None = None) -> Iterator[None]:
        """Commit the block's checkpoints if it succeeds, roll them back if not.

        ``rec``: the operation the block runs, marked committed after its checkpoints
        (without checkpoints, that mark is the commit).
        """
        try:
            yield
        except BaseException:
            self._rollback_checkpoints()
            raise
        self._commit_checkpoints(op=None if rec is None else rec.op)
        if rec is not None:
            self._ops.commit(rec)

    def _finish(self, op: str, kind: str, out_dir: OutputDir, produced: dict[str, set[int]],
                jobs: list[JobReport], t0: float) -> dict[str, DataFrame]:
        """Drop intermediate change sets, report, apply retention, read the outputs."""
        wanted = set(self.plan.outputs.values())
        for s, nodes in produced.items():
            for nid in nodes - wanted:
                out_dir.child(f"{s}/n{nid}").remove()
        self._report(SparkReport(
            join=self.name, operation=op, kind=kind, shards=self.shards,
            output_path=out_dir.uri, seconds=time.perf_counter() - t0, jobs=tuple(jobs),
        ))
        complete_output_dir(self._outputs, out_dir, self._owner, self.keep_outputs)
        return {
            o: self._read([out_dir.child(f"{s}/n{nid}") for s, nodes in produced.items()
                           if nid in nodes], self.output_schema(o))
            for o, nid in self.plan.outputs.items()
        }

    def _report(self, report: SparkReport, where: tuple[OutputDir, str] | None = None
                ) -> None:
        """Keep ``report`` as :attr:`last_report` and write it as JSON.

        To the driver's ``<state_dir>/_spark/reports/``; a micro-batch's to ``where``, next
        to its output.
        """
        self.last_report = report
        if where is None:
            write_report(report, self.state_dir / "_spark" / "reports"
                         / f"{report.operation}.json")
        else:
            where[0].write_text(where[1], report.to_json())


def _spark_schemas(recorder: GraphRecorder, plan: StagePlan) -> dict[int, T.StructType]:
    """Spark schemas (with ``_weight``) of every change set that crosses Spark.

    Also checks that every source and output has Spark types, naming the column otherwise.
    """
    out: dict[int, T.StructType] = {}
    try:
        for s in recorder.sources:
            spark_schema(recorder.source_schema(s))
        for o in recorder.outputs:
            spark_schema(recorder.output_schema(o))
        for nid, schema in plan.materialized.items():
            out[nid] = spark_schema(_with_weight(schema))
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(f"pipeline {recorder.name!r}: {exc}") from exc
    return out


def _with_weight(schema: pa.Schema) -> pa.Schema:
    import pyarrow as pa

    return schema.append(pa.field(WEIGHT, pa.int64(), nullable=False))


def _spec(name: str, shards: int, recorder: GraphRecorder, plan: StagePlan) -> dict[str, Any]:
    """Everything that must agree for a state directory to be re-attached."""
    return {
        "name": name, "shards": shards, "partitioner": PARTITIONER,
        "operators": {n.label: n.spec() for n in recorder.recorded_nodes},
        "outputs": dict(plan.outputs),
        "stages": {s.label: s.describe() for s in plan.stages},
    }


def _outputs_of(manifest: dict[str, Any], state_dir: Path) -> str:
    """Where a pipeline's outputs live (manifests of before ``output_uri``: state_dir)."""
    uri = manifest.get("output_uri")
    return str(uri) if uri else str(state_dir / "_spark" / "outputs")


def _read_manifest(path: Path, name: str) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is not a readable pipeline manifest: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("kind") != "pipeline":
        raise ManifestError(f"{path} is not a format-{FORMAT} pipeline manifest")
    if not isinstance(raw.get("spec"), dict) or raw["spec"].get("name") != name:
        raise ManifestError(f"{path} describes another pipeline, not {name!r}")
    return raw
