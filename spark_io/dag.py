"""One Spark job per operation: every stage of a distributed plan, chained by the shuffle.

An operation (a population, an ``apply``, a micro-batch) of a
:class:`~spark_io.SparkPipeline` runs as **one Spark action**, however many stages its
:class:`planner.distribute.DistributedPlan` has::

    seeds (one per shard) -> stage 0 tasks -> partitionBy(shards, identity)
                          -> stage 1 tasks -> partitionBy ... -> collect()

Each stage is ``mapPartitionsWithIndex`` over ``shards`` partitions: partition ``i``
is shard ``i``, whose task (:class:`StageTask`) takes the (stage, shard) store (kept
open by its Python worker since an earlier task, or the task runs in the worker of this
host that keeps it: :mod:`spark_io.storekeeper`), pushes what the stage reads there and
yields records (:mod:`spark_io.stagerun`): exchange rows keyed by the shard that reads
them, its report, and everything it was handed for later stages.  The driver collects
the last stage's records: the reports (and any error a task met).  No driver round trip
between stages, no Parquet between them; the graph's outputs are written to Parquet by
the tasks that compute them.

**What a task reads.**  The change (:class:`ChangeRef`) is either collected on the
driver (a small change, shipped whole with the tasks; each routes the rows it reads)
or Parquet files (a population, a large change): each task reads every file of each
source it has a delivery of, keeps the rows routed to its shard (for a copied source,
all of them), so no row passes through the JVM before it is pushed.  A task that reads
nothing (no delivery row, no exchange row) does not open its store.

**Exactly once.**  ``apply`` pushes each input of a (stage, shard) as one transaction
with commit id ``<base>:<stage>:<input>``, the undo of the operation recorded in the
same write batch (:class:`spark_io._worker.UndoPlan`): a retried task replays what
its store committed and sends the same rows on; a failed operation is rolled back on
every store by the driver.  A population starts from empty stores, so every task
attempt starts its store from empty (with checkpoints, by opening it as no checkpoint)
and loads it whole again; the operation's outputs are the last attempt's.

**Errors a retry cannot cure** (an over-retraction, a unique key broken, a commit id
reused with another change) end the task normally: it sends an abort record to every
shard of the next stage, whose tasks apply nothing and pass it on, and the driver
raises the error and rolls the operation back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from joinstate.schema import WEIGHT
from spark_io import handover, storekeeper
from spark_io._profile import TaskUsage
from spark_io._worker import OUTPUT_PARQUET, UndoPlan, options_from_dict
from spark_io.errors import (
    SparkIOError,
    SparkJobError,
    error_detail,
    error_from_detail,
    reported,
    task_reason,
    translate_task_error,
)
from spark_io.manifest import ShardStorage, shard_key
from spark_io.outputs import OutputDir
from spark_io.stagerun import ABORT, REPORT, ROWS, PlanRef, StageRun, deliveries, from_ipc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from pyspark.sql import SparkSession

    from planner.distribute import DistributedPlan

__all__ = ["ChangeRef", "OperationSpec", "StageTask", "owes_row", "run_operation",
           "stage_key", "stage_tasks"]

Record = tuple[int, tuple[Any, ...]]


def stage_key(stage: int, shard: int) -> str:
    """The store key (path under the state directory) of (``stage``, ``shard``)."""
    return shard_key(shard, f"stage{stage}")


def _identity(shard: int) -> int:
    return shard


@dataclass(frozen=True)
class OperationSpec:
    """What every task of one operation needs to know about it.

    ``kind``: ``populate`` (stores start empty; loaded with the population driver) or
    ``apply`` (pushes with commit ids ``<commit_base>:<stage>:<input>``).  ``undo``: the
    undo plan of an apply without checkpoints.  ``replay_only``: the operation was
    committed; tasks may only replay what their stores recorded.
    """

    pipeline: str
    op: str
    kind: str
    output_dir: str
    commit_base: str = ""
    undo: UndoPlan | None = None
    replay_only: bool = False
    batch_rows: int = 200_000
    strategy: str | None = None
    order: tuple[str, ...] | None = None
    """Sources in the order their deliveries are pushed (default: the plan's)."""
    forget: tuple[str, int] | None = None
    """``(prefix, first batch kept)``: after its pushes, a store drops the commit records
    of a stream's micro-batches before that one."""
    owes: bool = False
    """Stores holding a global aggregate run even without input, go live and hand over
    the row they owe their outputs (:func:`owes_row`): a population's, whose attempts
    each start from an empty store, so the row is sent by whichever attempt counts.
    (An ``apply`` before any population hands it over with the first push that reaches
    the store, from the push's commit record on a retry.)"""


@dataclass(frozen=True)
class ChangeRef:
    """An operation's change as tasks read it: collected tables, or Parquet files.

    ``tables``: source -> IPC bytes of its change (with ``_weight``); ``files``: source ->
    (Parquet files, their columns, whether they carry ``_weight``) read by the tasks.
    """

    tables: Mapping[str, bytes] = field(default_factory=dict)
    files: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], bool]] = field(
        default_factory=dict)
    rows: Mapping[str, int] = field(default_factory=dict)

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources the change touches."""
        return (*self.tables, *self.files)

    def only(self, sources: Iterable[str]) -> ChangeRef:
        """The part of this change that is of ``sources`` (what one stage reads).

        Each stage's tasks carry their own change in their closure, so a stage that
        reads no source of the change (one fed by exchanges only) ships none of it.
        """
        keep = set(sources)
        return ChangeRef(tables={s: b for s, b in self.tables.items() if s in keep},
                         files={s: f for s, f in self.files.items() if s in keep},
                         rows={s: n for s, n in self.rows.items() if s in keep})

    def pieces(self, plan: DistributedPlan, stage: int, shard: int, source: str,
               batch_rows: int) -> Iterator[tuple[str, pa.Table]]:
        """``(input name, rows)`` of ``source``'s change this (stage, shard) reads."""
        if source in self.tables:
            yield from deliveries(plan, stage, shard, source, from_ipc(self.tables[source]))
            return
        files, columns, weighted = self.files[source]
        for f in files:
            pf = pq.ParquetFile(f)
            for batch in pf.iter_batches(batch_size=batch_rows, columns=list(columns)):
                table = pa.Table.from_batches([batch])
                if not weighted:
                    table = table.append_column(
                        pa.field(WEIGHT, pa.int64(), nullable=False),
                        pa.array(np.ones(table.num_rows, np.int64)))
                yield from deliveries(plan, stage, shard, source, table)


class _Spool:
    """An input's rows as they arrive, kept in a local file until they are pushed."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.files: dict[str, tuple[Any, list[int]]] = {}
        self.rows: dict[str, int] = {}

    def add(self, name: str, blob: bytes) -> None:
        if name not in self.files:
            f = open(os.path.join(self.folder, f"{len(self.files)}.ipc"), "w+b")  # noqa: SIM115
            self.files[name] = (f, [])
        f, sizes = self.files[name]
        f.write(blob)
        sizes.append(len(blob))

    def tables(self, name: str) -> Iterator[pa.Table]:
        f, sizes = self.files[name]
        f.flush()
        f.seek(0)
        for n in sizes:
            yield from_ipc(f.read(n))

    def close(self) -> None:
        for f, _ in self.files.values():
            f.close()


@dataclass(frozen=True)
class StageTask:
    """``mapPartitionsWithIndex`` function of one stage: partition ``i`` is shard ``i``."""

    plan: PlanRef
    stage: int
    storage: ShardStorage
    options: dict[str, Any] | None
    spec: OperationSpec
    change: ChangeRef
    delegate: bool = True
    """Whether the task may be handed to the worker of this host keeping its store."""

    def __call__(self, shard: int, records: Iterable[Record]) -> Iterator[Record]:
        """Run the stage on ``shard``; yield the records for later stages and the driver.

        Unless it populates, the task runs in the Python worker of this host that
        keeps the (stage, shard) store open, if another does (:func:`storekeeper.
        delegate`), so that the store need not be handed over and opened again.
        """
        if self.delegate and self.spec.kind != "populate":
            given = list(records)
            path = self.storage.local_path(stage_key(self.stage, shard))
            done = storekeeper.delegate(path, dataclasses.replace(self, delegate=False),
                                        shard, given)
            if done is not None:
                yield from done
                return
            records = given
        t0, usage = time.perf_counter(), TaskUsage()
        plan = self.plan.get()
        st = plan.stages[self.stage]
        report: dict[str, Any] = {"stage": self.stage, "shard": shard, "pid": os.getpid()}
        spool_dir = tempfile.mkdtemp(prefix=f"joinstate-s{self.stage}-{shard}-")
        spool = _Spool(spool_dir)
        aborted = False
        try:
            for rec in records:
                payload = rec[1]
                if payload[0] == ROWS and payload[1] == self.stage:
                    spool.add(payload[2], payload[3])
                    continue
                if payload[0] == ABORT:
                    aborted = True
                if payload[0] != "seed":
                    yield (shard, payload)  # for later stages, or the driver
            if aborted:
                report["skipped"] = "an earlier stage met an error"
            else:
                yield from self._run(plan, st, shard, spool, report)
        except Exception as exc:
            if not reported(exc):
                raise
            report["error"] = error_detail(exc)
            for s in range(plan.shards):
                yield (s, (ABORT, report["error"]))
        finally:
            spool.close()
            shutil.rmtree(spool_dir, ignore_errors=True)
        report["seconds"] = round(time.perf_counter() - t0, 4)
        report.update(usage.report())
        yield (shard, (REPORT, report))

    def _run(self, plan: DistributedPlan, st: Any, shard: int, spool: _Spool,
             report: dict[str, Any]) -> Iterator[Record]:
        spec = self.spec
        graph = st.graph_for(shard)
        names = [n for n in spool.files]
        touched = [s for s in plan.order if s in self.change.sources
                   and any(d.source == s and st.reads(shard, d.name) for d in st.deliveries)]
        pieces: dict[str, list[pa.Table]] | None = None
        if spec.kind != "populate":  # a collected change: route it before opening
            pieces = {}
            for s in touched:
                for name, rows in self.change.pieces(plan, self.stage, shard, s,
                                                     spec.batch_rows):
                    pieces.setdefault(name, []).append(rows)
            touched = [s for s in touched if any(
                d.source == s and d.name in pieces for d in st.deliveries)]
        owes = spec.owes and owes_row(graph)
        if graph is None or not (names or touched or owes):
            if names:
                msg = (f"internal: shard {shard} runs nothing in stage {self.stage}, yet was "
                       f"sent rows of {names}")
                raise SparkIOError(msg)
            report["idle"] = True
            return
        key = stage_key(self.stage, shard)
        populate = spec.kind == "populate"
        owner = f"stage {self.stage}, shard {shard} of pipeline {spec.pipeline!r}"
        hint = "run one SparkPipeline operation"
        if populate and self.storage.checkpoint_uri is None:
            handover.wipe(self.storage.local_path(key), owner, hint)
        t_open = time.perf_counter()
        options = options_from_dict(self.options)
        with storekeeper.stage_store(
                self.storage, key, options, pipeline=spec.pipeline, graph=graph,
                undo=None if populate else spec.undo, owner=owner, hint=hint,
                fresh=populate, report=report) as (opened, pipe):
            report["open_seconds"] = round(time.perf_counter() - t_open, 4)
            run = StageRun(plan, self.stage, shard, pipe, order_of=spec.order)
            t_work = time.perf_counter()
            if populate:
                yield from self._populate(plan, run, shard, spool, touched, report)
            else:
                assert pieces is not None
                yield from self._apply(run, shard, spool, pieces, report)
            yield from run.finish()
            report["work_seconds"] = round(time.perf_counter() - t_work, 4)
            report["outputs"] = self._write_outputs(run, shard)
        report.update(pushes=run.pushes, rows_in=run.rows_in, rows_sent=run.rows_sent,
                      checkpoint=opened.report() if opened.checkpoint else None,
                      undone=opened.undone)

    def _apply(self, run: StageRun, shard: int, spool: _Spool,
               todo: dict[str, list[pa.Table]], report: dict[str, Any]) -> Iterator[Record]:
        spec = self.spec
        for name in spool.files:
            todo.setdefault(name, []).extend(spool.tables(name))
        replayed = 0
        for name in run.order(todo):
            table = pa.concat_tables(todo[name]) if len(todo[name]) > 1 else todo[name][0]
            commit = f"{spec.commit_base}:{self.stage}:{name}"
            assert run.pipeline is not None
            if run.pipeline.committed(commit):
                replayed += 1
            elif spec.replay_only:
                msg = (f"operation {spec.op!r} was committed, but stage {self.stage}, shard "
                       f"{shard} no longer holds its record of input {name!r} (forgotten "
                       "by retention); its outputs cannot be replayed")
                raise SparkIOError(msg)
            yield from run.push(name, table, commit_id=commit)
        report["replayed"] = replayed
        if spec.forget is not None:
            prefix, first = spec.forget
            assert run.pipeline is not None
            report["forgotten"] = run.pipeline.forget_commits(
                lambda c: _batch(c, prefix) is None or (_batch(c, prefix) or 0) >= first)

    def _populate(self, plan: DistributedPlan, run: StageRun, shard: int, spool: _Spool,
                  touched: list[str], report: dict[str, Any]) -> Iterator[Record]:
        """The population driver over this store's inputs, its outputs sent as they come.

        The driver runs in a thread; its sink hands each push's routed records over a
        bounded queue to this generator, so a population streams (bounded memory)
        however much it sends.
        """
        from population import populate

        spec = self.spec
        assert run.pipeline is not None
        pipe = run.pipeline

        def delivered(s: str, name: str) -> Iterator[pa.Table]:
            # A source delivered twice to this store (a self-join on two keys) is read
            # once per delivery.
            for n, rows in self.change.pieces(plan, self.stage, shard, s, spec.batch_rows):
                if n == name:
                    yield rows

        data: dict[str, Any] = {}
        sizes: dict[str, int] = {}
        st = plan.stages[self.stage]
        for s in touched:
            names = [d.name for d in st.deliveries if d.source == s and st.reads(shard, d.name)]
            for name in names:
                data[name] = delivered(s, name)
                sizes[name] = self.change.rows.get(s, 0)
        for name in spool.files:
            data[name] = spool.tables(name)
            sizes[name] = 1 << 40  # after the deliveries: they are what it probes

        def work(put: Callable[[Any], None]) -> None:
            def sink(outs: dict[str, pa.Table]) -> None:
                sent = run.route(outs)
                if sent:
                    put(sent)

            rep = populate(pipe, strategy=spec.strategy, sink=sink, progress=False,
                           sources=data, batch_rows=spec.batch_rows, sizes=sizes,
                           go_live=False)
            sink(pipe.go_live())
            report["population"] = {"strategy": rep.strategy, "order": rep.order,
                                    "seconds": rep.seconds}
            run.pushes += sum(s.batches for s in rep.sources)
            run.rows_in += sum(s.rows for s in rep.sources)

        for sent in _threaded(work):
            yield from sent

    def _write_outputs(self, run: StageRun, shard: int) -> dict[str, int]:
        """Each graph output's changes from this task, one Parquet file each."""
        out_dir = OutputDir(self.spec.output_dir)
        rows = {}
        for name in run.outputs:
            table = run.output(name)
            if table is None:
                continue
            target = out_dir.child(name)
            target.write_table(f"part-s{self.stage}-{shard:05d}.parquet", table,
                               **OUTPUT_PARQUET)
            rows[name] = table.num_rows
        return rows


def owes_row(graph: Any) -> bool:
    """Whether a stage graph holds a global aggregate (it owes its outputs a first row)."""
    return graph is not None and any(n.kind == "agg" and not n.keys for n in graph.nodes)


def _batch(commit_id: str, prefix: str) -> int | None:
    """The micro-batch number of a stream commit id ``<prefix><batch>:...``."""
    if not commit_id.startswith(prefix):
        return None
    head = commit_id[len(prefix):].split(":", 1)[0]
    return int(head) if head.isdigit() else None


_DONE = object()


def _threaded(work: Callable[[Callable[[Any], None]], None]) -> Iterator[Any]:
    """Run ``work(put)`` in a thread; yield what it puts, then re-raise what it raised."""
    q: queue.Queue[Any] = queue.Queue(maxsize=8)
    failed: list[BaseException] = []
    stop = threading.Event()

    def put(item: Any) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.5)
                return
            except queue.Full:
                continue
        msg = "the consumer of this population stopped"
        raise RuntimeError(msg)

    def target() -> None:
        try:
            work(put)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            failed.append(exc)
        finally:
            with contextlib.suppress(queue.Full):
                q.put(_DONE, timeout=5)

    thread = threading.Thread(target=target, name="joinstate-populate", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                break
            yield item
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]


# ---- the driver -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OperationResult:
    """What the tasks of one operation reported, and how long the job took."""

    reports: tuple[dict[str, Any], ...]
    seconds: float

    def checkpoints(self) -> dict[str, str]:
        """``{store key: new checkpoint id}`` reported by tasks (checkpointed stores)."""
        out = {}
        for r in self.reports:
            ck = r.get("checkpoint")
            if isinstance(ck, dict) and ck.get("id"):
                out[str(ck["store"])] = str(ck["id"])
        return out

    def outputs(self) -> dict[str, int]:
        """Rows written per graph output."""
        out: dict[str, int] = {}
        for r in self.reports:
            for name, n in (r.get("outputs") or {}).items():
                out[name] = out.get(name, 0) + int(n)
        return out


def stage_tasks(plan: DistributedPlan, ref: PlanRef, spec: OperationSpec,
                storage: ShardStorage, options: dict[str, Any] | None, change: ChangeRef
                ) -> list[StageTask]:
    """The task function of every stage of one operation, in stage order.

    Each carries only the part of the change its stage reads (:meth:`ChangeRef.only`):
    Spark pickles a stage's function into every task of it (and broadcasts it when it
    is large), so a stage fed by exchanges alone ships no change rows.
    """
    return [StageTask(ref, k, storage, options, spec,
                      change.only(d.source for d in st.deliveries))
            for k, st in enumerate(plan.stages)]


def run_operation(spark: SparkSession, plan: DistributedPlan, ref: PlanRef,
                  spec: OperationSpec, storage: ShardStorage, options: dict[str, Any] | None,
                  change: ChangeRef) -> OperationResult:
    """Run every stage of ``plan`` for one operation as one Spark job (module docstring).

    A library error a task met is raised on the driver (the earliest stage's); a task
    that failed for another reason on every attempt raises :class:`SparkJobError`.
    """
    sc = spark.sparkContext
    n = plan.shards
    seeds: list[Record] = [(i, ("seed",)) for i in range(n)]
    rdd: Any = sc.parallelize(seeds, n)
    for k, task in enumerate(stage_tasks(plan, ref, spec, storage, options, change)):
        if k:
            rdd = rdd.partitionBy(n, _identity)
        # Not preservesPartitioning: a stage's records are keyed by the shard that reads
        # them, not by the shard that wrote them, and PySpark's partitionBy returns an RDD
        # that claims its partitioner unchanged (the next stage's records unrouted).
        rdd = rdd.mapPartitionsWithIndex(task, preservesPartitioning=False)
    t0 = time.perf_counter()
    try:
        records: list[Record] = rdd.collect()
    except Exception as exc:
        if isinstance(exc, SparkIOError) or not type(exc).__module__.startswith(
                ("py4j", "pyspark")):
            raise
        err = translate_task_error(exc)
        if err is None:
            err = SparkJobError(
                f"operation {spec.op} of pipeline {spec.pipeline!r} failed outside "
                f"joinstate: {task_reason(exc)}; see the executor logs (err.spark_error "
                "holds Spark's exception)")
        err.spark_error = exc  # type: ignore[attr-defined]
        raise err from None
    seconds = time.perf_counter() - t0
    reports = tuple(sorted((p[1] for _, p in records if p[0] == REPORT),
                           key=lambda r: (r["stage"], r["shard"])))
    errors = [r for r in reports if "error" in r]
    if errors:
        err = error_from_detail(errors[0]["error"])
        err.spark_error = None  # type: ignore[attr-defined]  # no task failed
        raise err
    stray = [p for _, p in records if p[0] == ROWS]
    if stray:
        msg = f"internal: operation {spec.op} sent rows no stage read: {stray[0][:3]}"
        raise SparkIOError(msg)
    return OperationResult(reports, seconds)


def report_json(result: OperationResult) -> str:
    """The reports as JSON."""
    return json.dumps({"seconds": round(result.seconds, 4), "tasks": list(result.reports)},
                      indent=1, sort_keys=True, default=str)
