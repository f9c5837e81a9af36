"""Executor-side work: open a shard, apply its rows, write its output, report.

Everything here runs inside ``mapInArrow`` tasks on executors; the driver only builds
the task objects (small, picklable: the :class:`~spark_io.manifest.Manifest`, paths, an
operation id) and collects the report rows they yield.

Lifecycle of a task, whatever the operation:

1. It receives the Arrow batches of one Spark partition (a ``mapInArrow`` partition
   after :func:`spark_io.routing.route`, or an RDD partition holding one batch the
   driver cut with :func:`spark_io.routing.split`).  That is exactly one shard; if a
   partition ever held several, they are processed one after the other (the first
   streams, the others are buffered), never two at once.
2. For each shard it opens the shard's :class:`joinstate.StateStore` in a ``with``
   block, so the RocksDB directory is closed when the shard is done, when the task
   fails, and when Spark stops the task.  Opening a shard another task or process
   holds raises :class:`~spark_io.errors.ShardBusyError` (RocksDB's LOCK is the
   guard: at most one writer per shard, ever).
3. It writes the shard's output rows to one Parquet file: first under a hidden
   temporary name, renamed into place only once complete, so readers never see a
   partial file and a failed attempt leaves nothing behind but a dot-file.
4. It yields one report row per shard (:data:`spark_io.report.REPORT_SCHEMA`).

Checkpointed shards (``checkpoint_uri``).  Step 2 then opens the shard's working copy
as exactly the checkpoint the driver committed for it (:class:`~spark_io.manifest.ShardStorage`,
:func:`joinstate.working_copy.open_checkpoint`): a copy that is missing (a new executor, a
lost disk), older, or holds writes no committed checkpoint has (an attempt that died
before its checkpoint, a job that failed elsewhere) is replaced by that checkpoint
first.  When the task's work on the shard ends cleanly and RocksDB wrote anything, the
task checkpoints the shard (uploading only new files) before it reports, and the
report carries the new checkpoint id; the driver commits the ids once the whole job
succeeded.  A task that dies before its checkpoint leaves nothing a later task would
use, so its retry starts from the committed checkpoint again.

All shards or none (``apply``, micro-batches; without checkpoints).  A task of an
operation opens each store with the operation's :class:`UndoPlan`: before anything
else, undo records the store holds of other operations of the same owner are settled
(rolled back if the driver says the operation was not committed, dropped otherwise:
the driver resolves an uncommitted operation before it starts the next), and one of
this operation's with another digest refuses the task
(:class:`~joinstate.CommitConflictError`).  Then every transaction of the task records
its undo in its own WriteBatch (:meth:`joinstate.db.Database.capturing_undo`), so the
driver can roll every shard back if any task fails (:class:`RollbackTask`).

Errors a retry cannot cure are reported, not raised (:func:`spark_io.errors.reported`):
the task yields one report row carrying the error and ends normally, and the driver
raises it; so Spark neither retries the task nor logs its traceback.

What survives a task retry (or the same operation run again):

* ``apply`` and the streaming sink push each shard's whole input as **one** WriteBatch
  carrying the operation's commit id, with the output recorded in that same batch.  A
  retried task finds the id committed, applies nothing, and rewrites the Parquet file
  from the recorded output: exactly-once state, identical output.
* ``populate`` is a bulk load of many batches, each committed with the population's
  durable progress marker (:mod:`population.resume`).  Its output goes to one Parquet
  file per input batch, ``<side>-shard-<shard>-<batch index>.parquet``, each written
  under a hidden name and renamed, so a file is complete or absent and delivering a
  batch's output again replaces the file.  A retried task (attempt > 0), or any task
  of ``SparkJoin.populate(resume=True)``, finds its shard half loaded and *resumes*:
  it removes the output files of the batches the state does not hold, then
  ``population.populate(..., resume=True)`` skips the batches it does hold (checking
  their digest) and loads and delivers the rest.  A first attempt that finds an
  interrupted population raises :class:`~spark_io.errors.PopulationStateError`
  (the driver asks for ``resume=True``).  Each side is marked loaded per shard when it
  finishes; a task finding its side marked has nothing to do and reports a replay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

import population
from joinstate import (
    CommitConflictError,
    IndexOptions,
    Join,
    SideName,
    StateStore,
    StoreOptions,
)
from joinstate.directory import hold_directory
from joinstate.names import undo_prefix
from joinstate.transaction import apply_undo, drop_undo, undo_tags
from joinstate.working_copy import open_checkpoint
from spark_io import handover
from spark_io.errors import PopulationStateError, error_detail, reported
from spark_io.manifest import Manifest, ShardStorage, shard_key
from spark_io.outputs import OutputDir, parquet_out
from spark_io.routing import SHARD
from spark_io.types import conform_batch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "OUTPUT_PARQUET",
    "ApplyTask",
    "ControlTask",
    "OpenShard",
    "PopulateTask",
    "RollbackTask",
    "StateTask",
    "UndoPlan",
    "in_operation",
    "open_raw",
    "open_shard",
    "open_store",
    "options_from_dict",
    "options_to_dict",
    "populate_shard",
    "reports_errors",
    "settle_undo",
]

OUTPUT_PARQUET: dict[str, Any] = {"use_dictionary": False, "write_statistics": False}
"""How tasks write output Parquet.  Output is written once and read whole (a change set),
so the encoder's two costliest extras buy little: dictionaries (a join repeats each
left row's strings for every match, but snappy compresses most of that away) and
min/max statistics (each file spans the whole key range, so they skip no file).
Without them a task writes output ~40% faster, files ~35% larger."""


# ---- store options travel as plain dicts (MappingProxyType does not pickle) ---------------

def options_to_dict(options: StoreOptions | None) -> dict[str, Any] | None:
    """``options`` as picklable keyword arguments of :class:`StoreOptions`."""
    if options is None:
        return None
    kw = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    kw["index_overrides"] = {
        k: dataclasses.asdict(v) for k, v in options.index_overrides.items()
    }
    return kw


def options_from_dict(kw: dict[str, Any] | None) -> StoreOptions | None:
    """The inverse of :func:`options_to_dict`."""
    if kw is None:
        return None
    kw = dict(kw)
    kw["index_overrides"] = {k: IndexOptions(**v) for k, v in kw["index_overrides"].items()}
    return StoreOptions(**kw)


def interrupted_population(join: Join, where: str, resume: bool) -> dict[str, Any]:
    """The shard's interrupted-population markers; refused unless ``resume``.

    A shard whose earlier ``populate()`` stopped midway must be continued on purpose
    (``populate(resume=True)``), never silently loaded again from the start.
    """
    found = population.interrupted(join)
    if found and not resume:
        progress = "; ".join(f"{s} side: {m.describe()}" for s, m in sorted(found.items()))
        raise PopulationStateError(
            f"{where}: an earlier populate() was interrupted midway ({progress}); call "
            "populate(resume=True) to continue it, or use a new state_dir"
        )
    return dict(found)


# ---- shards ---------------------------------------------------------------------------------

@dataclass
class OpenShard:
    """A shard store open for one task (:func:`open_store`).

    ``sync`` says how the working copy was found: ``"shared"`` (no checkpoints),
    ``"local"`` (exactly the committed checkpoint), ``"restored"`` or ``"new"``.
    ``checkpoint`` is the id the shard is at: the committed one, or after a clean exit
    with writes, the new one.
    """

    store: StateStore
    key: str
    sync: str
    checkpoint: str | None = None
    undone: int = 0
    """Operations rolled back from their undo records when the store was opened."""

    def report(self) -> dict[str, Any]:
        """The store's key and checkpoint id, for the driver to commit.

        Also how the working copy was found, where it is and which task attempt used it
        (for diagnosis).
        """
        return {"store": self.key, "id": self.checkpoint, "sync": self.sync,
                "path": str(self.store.path), "attempt": _task_attempt()}


@dataclass(frozen=True)
class UndoPlan:
    """How a task of operation ``op`` of ``owner`` treats undo records (module docstring).

    ``note`` is the operation's digest (kept in its undo records); ``rollback`` the
    operations of ``owner`` the driver knows were not committed.
    """

    owner: str
    op: str
    note: bytes = b""
    rollback: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        """The undo tag of the operation in a store."""
        return f"{self.owner}:{self.op}"


def settle_undo(store: StateStore, plan: UndoPlan, where: str) -> int:
    """Settle the undo records ``store`` holds of ``plan.owner``'s other operations.

    Rolled back if listed in ``plan.rollback``, dropped (committed) otherwise; returns
    how many operations were rolled back.  Runs on a store nothing is attached to yet.
    """
    undone = 0
    for tag, note in undo_tags(store).items():
        owner, _, op = tag.partition(":")
        if owner != plan.owner:
            continue  # another join's, in a state directory several share
        if op == plan.op:
            if note != plan.note:
                raise CommitConflictError(
                    f"{where}: operation {op!r} was started here with another change "
                    "(its digest differs); a retry must repeat the same change, a new "
                    "change needs a new op_id; nothing was applied")
        elif op in plan.rollback:
            apply_undo(store, tag)
            undone += 1
        else:
            drop_undo(store, tag)
    return undone


def open_raw(storage: ShardStorage, key: str, options: StoreOptions | None, *,
             read_only: bool = False, owner: str = "", hint: str = "") -> OpenShard:
    """Shard store ``key`` opened (the caller closes it), handed over if another holds it.

    Without checkpoints it is the directory every task shares.  With them, the local
    working copy is opened as exactly the committed checkpoint (restored if it is not).
    A store another process keeps open is asked for (:func:`spark_io.handover.take`);
    one that is not handed over in time raises :class:`~spark_io.errors.ShardBusyError`
    (``owner`` and ``hint`` word it).  ``read_only`` opens without RocksDB's LOCK, so
    it waits for nobody.
    """
    path = storage.local_path(key)
    expected = storage.checkpoints.get(key)
    what = owner or f"shard {key}"

    def attempt() -> tuple[StateStore, str]:
        if not read_only and path.is_dir():
            # Nobody may hold the store: its holder may be closing it (the store's own
            # check of its files, before RocksDB's LOCK is taken, must not race that),
            # and a working copy may be replaced before it is opened.
            with hold_directory(path, f"open {what}"):
                pass
        if storage.checkpoint_uri is None:
            return StateStore(path, options, read_only=read_only), "shared"
        path.parent.mkdir(parents=True, exist_ok=True)
        return open_checkpoint(storage.uri(key), path, expected, options,
                               read_only=read_only)

    if read_only:
        store, sync = attempt()
    else:
        store, sync = handover.take(path, attempt, what, hint)
    return OpenShard(store, key, sync, expected)


@contextmanager
def open_store(storage: ShardStorage, key: str, options: StoreOptions | None, *,
               read_only: bool = False, owner: str = "", hint: str = "",
               undo: UndoPlan | None = None) -> Iterator[OpenShard]:
    """Shard store ``key`` open for the ``with`` block, closed after (:func:`open_raw`).

    With checkpoints, a clean exit after writes checkpoints the working copy (see the
    module docstring).  ``undo`` settles other operations' undo records first, then
    captures this one's.
    """
    shard = open_raw(storage, key, options, read_only=read_only, owner=owner, hint=hint)
    with shard.store, in_operation(storage, shard, undo, read_only, owner):
        yield shard


@contextmanager
def in_operation(storage: ShardStorage, shard: OpenShard, undo: UndoPlan | None,
                 read_only: bool, owner: str) -> Iterator[None]:
    """The ``with`` block as a task's work on an open shard store.

    ``undo`` settles other operations' undo records first, then captures this one's;
    with checkpoints, a clean exit after writes checkpoints the store
    (``shard.checkpoint`` becomes the new id).
    """
    store = shard.store
    capture: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if undo is not None and not read_only:
        shard.undone = settle_undo(store, undo, owner or f"shard {shard.key}")
        capture = store.capturing_undo(undo_prefix(undo.tag), undo.note)
    before = store.last_sequence() if storage.checkpoint_uri and not read_only else None
    with capture:
        yield
    if before is not None and store.last_sequence() != before:
        info = store.checkpoint(storage.uri(shard.key), keep=storage.keep,
                                protect=storage.protected(shard.key))
        shard.checkpoint = info.id


@contextmanager
def open_shard(
    manifest: Manifest, storage: ShardStorage | str, shard: int,
    options: StoreOptions | None = None, *, read_only: bool = False,
) -> Iterator[Join]:
    """The join in shard ``shard``'s store, open for the ``with`` block and closed after.

    ``storage``: the join's :class:`ShardStorage` (a plain state directory means no
    checkpoints).  ``read_only`` opens without RocksDB's LOCK.
    """
    where = storage if isinstance(storage, ShardStorage) else ShardStorage(str(storage))
    with open_store(where, shard_key(shard), options, read_only=read_only,
                    owner=f"shard {shard} of join {manifest.name!r}",
                    hint="run one SparkJoin operation") as opened:
        yield manifest.join(opened.store)


def side_rows(join: Join, side: SideName) -> int:
    """Rows (NULL-key rows included) currently stored on ``side``, from counters."""
    return join.rows(side)


def _split(batch: pa.RecordBatch) -> list[tuple[int, pa.Table]]:
    """``batch`` cut by its ``_shard`` column (usually a single piece), that column dropped."""
    if batch.num_rows == 0:
        return []
    table = pa.Table.from_batches([batch])
    shards = np.asarray(table.column(SHARD).to_numpy(), dtype=np.int64)
    table = table.drop_columns([SHARD])
    if (shards == shards[0]).all():
        return [(int(shards[0]), table)]
    return [
        (int(s), table.filter(pa.array(shards == s)))
        for s in np.unique(shards).tolist()
    ]


def by_shard(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, Iterator[pa.Table]]]:
    """Group a partition's batches by shard, one shard at a time.

    The first shard's pieces stream (bounded memory); pieces of any other shard met on
    the way are buffered and handed out after it.  Each inner iterator must be consumed
    before the next group is requested.
    """
    it = iter(batches)
    pending: dict[int, list[pa.Table]] = {}
    first: tuple[int, pa.Table] | None = None
    for batch in it:
        pieces = _split(batch)
        if pieces:
            first = pieces[0]
            for s, t in pieces[1:]:
                pending.setdefault(s, []).append(t)
            break
    if first is None:
        return
    current, head = first

    def stream() -> Iterator[pa.Table]:
        yield head
        for batch in it:
            for s, t in _split(batch):
                if s == current:
                    yield t
                else:
                    pending.setdefault(s, []).append(t)
        for t in pending.pop(current, []):
            yield t

    yield current, stream()
    for s in sorted(pending):
        yield s, iter(pending.pop(s))


def _report(shard: int, side: str, rows_in: int, rows_out: int, seconds: float,
            replayed: bool = False, detail: dict[str, Any] | None = None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"shard": shard, "side": side, "rows_in": rows_in, "rows_out": rows_out,
          "seconds": seconds, "replayed": replayed,
          "detail": json.dumps(detail or {}, default=str)}],
        schema=pa.schema([
            pa.field("shard", pa.int32(), False), pa.field("side", pa.string(), False),
            pa.field("rows_in", pa.int64(), False), pa.field("rows_out", pa.int64(), False),
            pa.field("seconds", pa.float64(), False), pa.field("replayed", pa.bool_(), False),
            pa.field("detail", pa.string(), False),
        ]),
    )


def reports_errors(call: Callable[[Any, Iterator[Any]], Iterator[pa.RecordBatch]]
                   ) -> Callable[[Any, Iterator[Any]], Iterator[pa.RecordBatch]]:
    """Make a task report errors a retry cannot cure instead of raising them.

    The task yields one more report row (shard -1) whose detail holds the error
    (:func:`spark_io.errors.error_detail`) and ends normally, after reading the rest of
    its input; the driver raises it (:func:`spark_io.lifecycle.run_job`).  Other errors are
    raised as before (Spark may retry them).
    """

    @functools.wraps(call)
    def task(self: Any, batches: Iterator[Any]) -> Iterator[pa.RecordBatch]:
        rest = iter(batches)
        t0 = time.perf_counter()
        try:
            yield from call(self, rest)
        except Exception as exc:
            if not reported(exc):
                raise
            for _ in rest:  # the input must be read to its end for Spark to finish
                pass
            yield _report(-1, "error", 0, 0, time.perf_counter() - t0,
                          detail={"error": error_detail(exc)})

    return task


# ---- population: the one place that decides how a shard is loaded --------------------------

def populate_shard(
    join: Join, side: SideName, batches: Iterator[pa.Table], *, strategy: str,
    sizes: dict[str, int] | None, sink: Callable[..., Any], go_live: bool = True,
    resume: bool = False,
) -> dict[str, Any]:
    """Load ``batches`` into ``side`` of one shard's join; output deltas go to ``sink``.

    ``go_live`` is False for the first (small side's) job, so the join stays in the
    population phase until the second job has loaded the other side.  ``resume``
    continues an interrupted population of this shard (see the module docstring).

    The ``population`` driver runs with the other side empty (that side is loaded, or
    will be, by the other job) and the join's strategy.  Returns a JSON-able report.
    The caller owns the join's phase.
    """
    other: SideName = "right" if side == "left" else "left"
    sources: dict[SideName, Any] = {side: batches, other: []}
    report = population.populate(
        join, sources["left"], sources["right"], strategy=strategy, order="small-first",
        sink=sink, progress=False, sizes=sizes, go_live=go_live, resume=resume,
    )
    return {"driver": "population", **report.to_dict()}


class _BatchFiles:
    """Population output of one shard: one Parquet file per input batch, atomically."""

    def __init__(self, directory: OutputDir, shard: int) -> None:
        self.directory = directory
        self.shard = shard
        self.rows = 0

    def name(self, side: str, index: int) -> str:
        return f"{side}-shard-{self.shard:05d}-{index:08d}.parquet"

    def write(self, table: pa.Table, batch: population.OutputBatch) -> None:
        """Write (or replace: a re-delivery) the output of one input batch."""
        self.directory.write_table(self.name(batch.side, batch.index), table,
                                   **OUTPUT_PARQUET)
        self.rows += table.num_rows

    def remove_from(self, side: str, first: int) -> None:
        """Remove the files of ``side``'s batches ``>= first`` (and temporary files)."""
        prefix = f"{side}-shard-{self.shard:05d}-"
        for entry, _ in self.directory.entries():
            name = entry.lstrip(".")
            if not name.startswith(prefix):
                continue
            if entry.startswith("."):
                self.directory.delete_file(entry)  # an attempt's unfinished file
                continue
            try:
                index = int(name[len(prefix):].split(".")[0])
            except ValueError:
                continue
            if index >= first:
                self.directory.delete_file(entry)


def _task_attempt() -> int:
    """The current Spark task's attempt number (0 for the first; 0 outside Spark)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return 0
    ctx = TaskContext.get()
    return 0 if ctx is None else int(ctx.attemptNumber())


# ---- tasks ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ShardTask:
    manifest: Manifest
    storage: ShardStorage
    options: dict[str, Any] | None

    @property
    def state_dir(self) -> str:
        return self.storage.state_dir

    @contextmanager
    def open(self, shard: int, read_only: bool = False, undo: UndoPlan | None = None
             ) -> Iterator[tuple[Join, OpenShard]]:
        """The shard's join and its :class:`OpenShard` (for the checkpoint report)."""
        with open_store(self.storage, shard_key(shard), options_from_dict(self.options),
                        read_only=read_only, owner=f"shard {shard} of join {self.manifest.name!r}",
                        hint="run one SparkJoin operation", undo=undo) as opened:
            yield self.manifest.join(opened.store), opened

    def conformed(self, side: SideName, pieces: Iterator[pa.Table]) -> Iterator[pa.Table]:
        schema = self.manifest.side(side).schema
        for t in pieces:
            yield conform_batch(t, schema)


@dataclass(frozen=True)
class PopulateTask(_ShardTask):
    """Load one side of every shard this task receives (population job 1 or 2).

    ``final`` is true for the second job: the shard goes live when it is done.
    ``resume`` continues interrupted populations (a retried attempt always does).
    """

    side: SideName = "left"
    output_dir: str = ""
    strategy: str = "auto"
    sizes: dict[str, int] | None = None
    final: bool = False
    resume: bool = False

    @property
    def marker(self) -> str:
        return f"spark-populate:{self.side}"

    @reports_errors
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        resume = self.resume or _task_attempt() > 0
        for shard, pieces in by_shard(batches):
            t0 = time.perf_counter()
            empty = self.manifest.side(self.side).schema.empty_table()
            with self.open(shard) as (join, opened):
                if self._loaded(join):
                    # Loaded by an earlier attempt or run (which may have died after its
                    # population finished, before marking the side): its output files
                    # are complete.
                    if not join.committed(self.marker):
                        join.push(self.side, empty, commit_id=self.marker)
                    if self.final and join.phase != "live":
                        join.set_phase("live")  # the driver visits only unreached shards
                    for _ in pieces:
                        pass
                    rows_in, rows_out, replayed, detail = 0, 0, True, {}
                else:
                    first = self._resume_point(join, shard, resume)
                    files = _BatchFiles(OutputDir(self.output_dir), shard)
                    files.remove_from(self.side, first)
                    counted = _Counted(self.conformed(self.side, pieces))
                    detail = populate_shard(join, self.side, iter(counted),
                                            strategy=self.strategy, sizes=self.sizes,
                                            sink=files.write, go_live=self.final,
                                            resume=resume)
                    # Mark this side loaded (an empty push: the commit id, one WriteBatch).
                    join.push(self.side, empty, commit_id=self.marker)
                    join.set_phase("live" if self.final else "population")
                    rows_in, rows_out, replayed = counted.rows, files.rows, False
            yield _report(shard, self.side, rows_in, rows_out, time.perf_counter() - t0,
                          replayed=replayed, detail={**detail, "checkpoint": opened.report()})

    def _loaded(self, join: Join) -> bool:
        """Whether this side of the shard is loaded.

        Marked, or its population finished (and the attempt died before marking it):
        live for the second job, both progress markers done for the first.
        """
        if join.committed(self.marker):
            return True
        if self.final:
            return join.phase == "live"
        return population.completed(population.markers(join))

    def _resume_point(self, join: Join, shard: int, resume: bool) -> int:
        """The first batch of this side whose output this attempt delivers (again)."""
        where = f"shard {shard} of join {join.name!r} in {self.state_dir}"
        found = interrupted_population(join, where, resume)
        if not found and side_rows(join, self.side):
            raise PopulationStateError(
                f"{where}: the {self.side} side holds rows but no population ran on it "
                "(apply() before populate()?); population loads an empty side: use a new "
                "state_dir to repopulate"
            )
        mine = found.get(self.side)
        return mine.batches if mine is not None else 0


class _Counted:
    """An iterator of tables that counts the rows it hands out."""

    def __init__(self, tables: Iterator[pa.Table]) -> None:
        self.tables = tables
        self.rows = 0

    def __iter__(self) -> Iterator[pa.Table]:
        for t in self.tables:
            self.rows += t.num_rows
            yield t


@dataclass(frozen=True)
class ApplyTask(_ShardTask):
    """Apply one change set (or micro-batch) to ``side``, exactly once per shard.

    ``commit_id`` is committed with each shard's change and output in one WriteBatch.
    ``forget`` (a commit-id prefix, ``retain``) drops older ids of the same stream after
    a successful push, so recorded outputs do not accumulate.  ``undo``: the operation's
    :class:`UndoPlan` (None with checkpoints, which roll back by themselves).
    ``replay_only``: the driver recorded the operation as committed, so each shard must
    replay its recorded output; a shard without the record applies nothing and refuses.
    """

    side: SideName = "left"
    output_dir: str = ""
    commit_id: str = ""
    forget_prefix: str | None = None
    keep_after: int | None = None
    undo: UndoPlan | None = None
    replay_only: bool = False

    @reports_errors
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for shard, pieces in by_shard(batches):
            t0 = time.perf_counter()
            tables = list(self.conformed(self.side, pieces))
            delta = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            with self.open(shard, undo=self.undo) as (join, opened):
                replayed = join.committed(self.commit_id)
                if self.replay_only and not replayed:
                    raise CommitConflictError(
                        f"shard {shard} of join {join.name!r}: commit id {self.commit_id!r} "
                        "is recorded as committed by the driver, but this shard no longer "
                        "holds it (forgotten after the stream's retain= batches?), so its "
                        "output cannot be replayed; nothing was applied")
                out = join.push(self.side, delta, commit_id=self.commit_id)
                if self.forget_prefix is not None and self.keep_after is not None:
                    join.forget_commits(keep=self._keep)
            with parquet_out(OutputDir(self.output_dir), f"part-shard-{shard:05d}.parquet",
                             OUTPUT_PARQUET) as f:
                f.write(out)
            yield _report(shard, self.side, delta.num_rows, out.num_rows,
                          time.perf_counter() - t0, replayed=replayed,
                          detail={"checkpoint": opened.report()})

    def _keep(self, commit_id: str) -> bool:
        prefix = self.forget_prefix
        if prefix is None or self.keep_after is None or not commit_id.startswith(prefix):
            return True
        try:
            return int(commit_id[len(prefix):]) >= self.keep_after
        except ValueError:
            return True


@dataclass(frozen=True)
class ControlTask(_ShardTask):
    """Visit shards by number (input: batches whose first column holds them), one at a time.

    ``go_live`` sets each shard's phase to live (creating shards no row reached);
    every visit reports the shard's row counters and phase.
    """

    go_live: bool = False

    @reports_errors
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for shard in batch.column(0).to_pylist():
                t0 = time.perf_counter()
                with self.open(int(shard)) as (join, opened):
                    if self.go_live:
                        join.set_phase("live")
                    detail = {"phase": join.phase, "left_rows": side_rows(join, "left"),
                              "right_rows": side_rows(join, "right")}
                yield _report(int(shard), "both", 0, 0, time.perf_counter() - t0,
                              detail={**detail, "checkpoint": opened.report()})


@dataclass(frozen=True)
class StateTask(_ShardTask):
    """Yield the consolidated state of ``side`` of each shard.

    Shards are opened read-only (no LOCK), so reading state never blocks a writer; a
    shard no row ever reached has no state (no directory, no checkpoint) and contributes
    nothing.  A checkpointed shard is read as its committed checkpoint.
    """

    side: SideName = "left"
    schema: pa.Schema | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for shard in batch.column(0).to_pylist():
                if not self.storage.exists(shard_key(int(shard))):
                    continue
                with self.open(int(shard), read_only=True) as (join, _):
                    state = join.state(self.side)
                if self.schema is not None:
                    state = state.select(self.schema.names).cast(self.schema)
                yield from state.to_batches()



@dataclass(frozen=True)
class RollbackTask:
    """Roll back uncommitted operations in every store of the shards this task visits.

    Input: batches (or shard numbers) whose first column holds shard numbers; for each,
    the stores ``shard_key(shard, stage)`` of every entry of ``stages`` (``(None,)`` for
    a join) that exist.  The undo records of ``plan.rollback`` are applied, other
    operations' of the same owner dropped (:func:`settle_undo`); one report row per
    store, ``detail["undone"]`` saying how many operations it rolled back.
    """

    storage: ShardStorage
    options: dict[str, Any] | None
    plan: UndoPlan
    stages: tuple[str | None, ...] = (None,)

    @reports_errors
    def __call__(self, batches: Iterator[Any]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            shards = batch.column(0).to_pylist() if isinstance(batch, pa.RecordBatch) \
                else [batch]
            for shard in (int(s) for s in shards):
                for stage in self.stages:
                    key = shard_key(shard, stage)
                    if not self.storage.exists(key):
                        continue
                    t0 = time.perf_counter()
                    with open_store(self.storage, key, options_from_dict(self.options),
                                    owner=f"store {key} of {self.plan.owner!r}",
                                    undo=self.plan) as opened:
                        undone = opened.undone
                    yield _report(shard, stage or "rollback", 0, 0, time.perf_counter() - t0,
                                  detail={"undone": undone})
