"""The population driver: load both sides of a join, emit the initial output, go live.

Phases: plan (the planner decides the small side, order, strategy, memtables and
compaction policy from the inputs' statistics and the store's recorded history:
:func:`planner.plan.plan_for_join`; when no size is known the driver counts in lockstep
and plans again); set up per-side memtables while the families are still empty;
stream batches in the chosen order, dispatching events to the compaction policies;
ingest what is pending; switch
the join to the live phase and clear the progress markers; record what was measured for
the planner's next decision.  Whatever happens, the compaction guard re-enables every
column family a policy disabled.

Crash safety (see :mod:`population.resume`): every batch commits its side's progress
marker in its own transaction, through the WAL; a batch's output is delivered *before*
its transaction becomes durable (``Join.apply(before_commit=...)``; bulk-written
batches become durable when their run is ingested), so a crash can only make outputs
be delivered again, from a batch index the resumed run reports, never lose one.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import psutil

from compaction import (
    AsymmetricPolicy,
    BatchWritten,
    BulkLoadPolicy,
    CompactionControl,
    CompactionPolicy,
    Event,
    Guard,
    PopulationEnded,
    PopulationStarted,
    RocksDBDefaults,
    SideFinished,
    ThresholdCrossed,
    guarded,
)
from joinstate import IndexOptions, Pipeline, SchemaMismatchError
from joinstate.activity import counter_delta, statistics_counters
from planner.history import read_history, record_population
from planner.plan import Plan, plan_for_join
from planner.stats import SourceStats, gather
from population.bulk import SstIngester, remove_staging
from population.errors import BulkLoadRefused, PopulationError
from population.pipeline import PipelineReport, populate_pipeline
from population.progress import Progress
from population.report import Report, SideReport
from population.resume import (
    EMPTY_DIGEST,
    Marker,
    OutputBatch,
    batch_digest,
    completed,
    markers,
    raise_interrupted,
    sink_takes_batch,
    source_identity,
)
from population.sources import DEFAULT_BATCH_ROWS, Source, count_small
from population.strategy import CompactionName, Strategy, fixed_choices, from_plan, preset

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    import pyarrow as pa

    from joinstate import Database, Join, SideName
    from joinstate.options import Memtable

__all__ = ["ORDERS", "populate"]

log = logging.getLogger(__name__)

Order = Literal["small-first", "interleaved", "as-given"]
ORDERS: tuple[str, ...] = ("small-first", "interleaved", "as-given")
SIDES: tuple[SideName, SideName] = ("left", "right")
SAMPLE_INTERVAL = 0.25
"""Default seconds between samples of L0 counts and RSS (a property read costs a few µs)."""

POLICIES: dict[CompactionName, Callable[[], CompactionPolicy]] = {
    "rocksdb": RocksDBDefaults,
    "epsio": AsymmetricPolicy,
    "bulk-load": BulkLoadPolicy,
}
"""The main compaction policy of each ``Strategy.compaction``; the guard always runs too."""


def _policies(strategy: Strategy) -> list[CompactionPolicy]:
    main = POLICIES[strategy.compaction]()
    return [main, Guard(strategy.l0_limit, strategy.pending_bytes_limit)]


def _dir_bytes(path: Any) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                continue  # a file removed by a background compaction meanwhile
    return total


class _Run:
    """The mutable state of one population run (the public face is :func:`populate`)."""

    def __init__(self, join: Join, store: Database, strategy: Strategy,
                 small: SideName, order: str, sources: dict[str, Source],
                 sink: Callable[..., Any] | None, progress: Progress,
                 sample_interval: float, *, small_from: str = "", batch_rows: int = 0,
                 identity: Mapping[str, dict[str, Any] | None] | None = None,
                 go_live: bool = True) -> None:
        self.go_live = go_live
        self.join, self.store, self.strategy = join, store, strategy
        self.small, self.order = small, order
        self.small_from, self.batch_rows = small_from, batch_rows
        self.identity = dict(identity or {})
        self.sources, self.out_sink, self.progress = sources, sink, progress
        self.sink_takes_batch = sink is not None and sink_takes_batch(sink)
        self.sample_interval = sample_interval
        # Durable progress of each side: batches and rows applied by this and earlier
        # (interrupted) runs, and the running digest of the input batches read.
        self.index: dict[str, int] = dict.fromkeys(SIDES, 0)
        self.total_rows: dict[str, int] = dict.fromkeys(SIDES, 0)
        self.digest: dict[str, str] = dict.fromkeys(SIDES, EMPTY_DIGEST)
        indexes = {s: join.index(s) for s in SIDES}
        self.index_cf = {s: indexes[s].column_family for s in SIDES}
        self.control = CompactionControl(store, indexes)
        self.control.small = small
        self.policies = _policies(strategy)
        self.ingester = (SstIngester(store, strategy.bulk_run_rows, join.name)
                         if strategy.bulk else None)
        self.bulk_sides = {s for s in SIDES if strategy.bulk and indexes[s].bulk_loadable}
        self.t0 = time.perf_counter()
        self.proc = psutil.Process()
        self.rss_start = self.proc.memory_info().rss
        self.peak_rss = self.rss_start
        self.last_sample = -1.0
        self.l0_samples: list[tuple[float, dict[str, int]]] = []
        self.l0_max: dict[str, int] = {}
        self.alerted: set[tuple[str, str]] = set()
        self.rows = dict.fromkeys(SIDES, 0)
        self.batches = dict.fromkeys(SIDES, 0)
        self.deletes = dict.fromkeys(SIDES, 0)
        self.seconds = dict.fromkeys(SIDES, 0.0)
        self.finished_at: dict[str, float] = {}
        self.memtables: dict[str, Memtable | None] = dict.fromkeys(SIDES)
        self.output_rows = 0
        self.output_weight = 0

    # ---- events -----------------------------------------------------------------------

    def dispatch(self, event: Event) -> None:
        for p in self.policies:
            p.observe(event, self.control)

    def sample(self, force: bool = False) -> None:
        now = time.perf_counter() - self.t0
        if not force and now - self.last_sample < self.sample_interval:
            return
        self.last_sample = now
        self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        snap: dict[str, int] = {}
        for side in SIDES:
            for cf in self.control.data_cfs(side):
                n = self.control.l0_files(cf)
                snap[cf] = n
                self.l0_max[cf] = max(self.l0_max.get(cf, 0), n)
                if n > self.strategy.l0_limit and (cf, "l0") not in self.alerted:
                    self.alerted.add((cf, "l0"))
                    self.dispatch(ThresholdCrossed(cf, "l0_files", n, self.strategy.l0_limit))
                limit = self.strategy.pending_bytes_limit
                if limit is not None and (cf, "pending") not in self.alerted:
                    pending = self.control.pending_bytes(cf)
                    if pending > limit:
                        self.alerted.add((cf, "pending"))
                        self.dispatch(ThresholdCrossed(cf, "pending_compaction_bytes",
                                                       pending, limit))
        self.l0_samples.append((round(now, 3), snap))

    # ---- setup ------------------------------------------------------------------------

    def setup_memtables(self) -> None:
        """Give each side's index its memtable, while the family is still empty."""
        for side in SIDES:
            cf = self.index_cf[side]
            current = self.store.options.resolved(cf).memtable
            want = (self.strategy.small_memtable if side == self.small
                    else self.strategy.big_memtable)
            self.memtables[side] = current
            if want is None or want == current:
                continue
            if self.join.rows(side):
                # Loaded by an earlier call (a driver loading one side per call): its
                # memtable was chosen then; nothing to do, nothing to warn about.
                log.debug("keeping the memtable of %s: the side is already loaded", cf)
                continue
            try:
                self.store.recreate_empty(cf, IndexOptions(memtable=want))
                self.memtables[side] = want
            except SchemaMismatchError as exc:
                log.warning("keeping the %s memtable of %s: %s", current, cf, exc)
        size = self.strategy.big_write_buffer_size
        if size is not None:
            big = self.control.other(self.small)
            self.store.set_cf_options(self.index_cf[big], {"write_buffer_size": str(size)})

    def restore_write_buffer(self) -> None:
        if self.strategy.big_write_buffer_size is None:
            return
        cf = self.index_cf[self.control.other(self.small)]
        default = self.store.options.resolved(cf).write_buffer_size
        self.store.set_cf_options(cf, {"write_buffer_size": str(default)})

    # ---- the schedule -----------------------------------------------------------------

    def schedule(self) -> Iterator[tuple[SideName, pa.RecordBatch | None]]:
        """Yield ``(side, batch)``; ``(side, None)`` once when a side is exhausted."""
        if self.order == "interleaved":
            first = self.small
            sides = [first, self.control.other(first)]
            live = list(sides)
            while live:
                for side in list(live):
                    b = self.sources[side].next()
                    if b is None:
                        live.remove(side)
                    yield side, b
            return
        first = self.small if self.order == "small-first" else "left"
        for side in (first, self.control.other(first)):
            while True:
                b = self.sources[side].next()
                yield side, b
                if b is None:
                    break

    # ---- writing ----------------------------------------------------------------------

    def marker(self, side: SideName, batches: int, rows: int, digest: str, done: bool
               ) -> bytes:
        """The progress marker of ``side`` after ``batches`` batches (JSON bytes)."""
        return Marker(
            side=side, batches=batches, rows=rows, digest=digest, done=done,
            strategy=self.strategy.to_dict(), order=self.order, small=self.small,
            small_from=self.small_from, batch_rows=self.batch_rows,
            source=self.identity.get(side), go_live=self.go_live,
        ).to_bytes()

    def deliver(self, side: SideName, index: int, out: pa.Table) -> None:
        """Count ``out`` and hand it to the sink (with its batch, if the sink takes it)."""
        if not out.num_rows:
            return
        self.output_rows += out.num_rows
        self.output_weight += int(np.asarray(out.column("_weight")).sum())
        if self.out_sink is not None:
            if self.sink_takes_batch:
                self.out_sink(out, OutputBatch(side, index))
            else:
                self.out_sink(out)

    def apply(self, side: SideName, batch: Any) -> None:
        t = time.perf_counter()
        other = self.control.other(side)
        index, n = self.index[side], batch.num_rows
        digest = batch_digest(self.digest[side], batch)
        marker = self.marker(side, index + 1, self.total_rows[side] + n, digest, False)
        prepared = self.join.prepare(side, batch)
        deletes = prepared.retracted  # rows retracted, with multiplicity
        ing = self.ingester
        out = None
        bulk = False
        if ing is not None:
            if ing.has_pending(other):
                ing.ingest(other)  # this push probes the other side: make it visible
            if side in self.bulk_sides and not deletes:
                try:
                    out = self.join.apply(side, prepared, sink=ing.sink(side), progress=marker)
                    bulk = True
                except BulkLoadRefused as exc:
                    log.info("falling back to a WriteBatch: %s", exc)
            if out is None and ing.has_pending(side):
                ing.ingest(side)  # deletes read this side's own entries
        if out is None:
            # Deliver first, then make the batch durable (see the module docstring).
            self.join.apply(side, prepared, progress=marker,
                            before_commit=lambda o: self.deliver(side, index, o))
        else:
            self.deliver(side, index, out)  # durable only once its run is ingested
        if bulk and ing is not None:
            ing.maybe_ingest(side)
        self.index[side] += 1
        self.total_rows[side] += n
        self.digest[side] = digest
        self.rows[side] += n
        self.batches[side] += 1
        self.deletes[side] += deletes
        self.seconds[side] += time.perf_counter() - t
        self.progress.update(side, n)
        self.dispatch(BatchWritten(side, prepared.rows, deletes))
        self.sample()

    def finish_side(self, side: SideName) -> None:
        t = time.perf_counter()
        if self.ingester is not None and self.ingester.has_pending(side):
            self.ingester.ingest(side)
        schema = self.join.left_side.schema if side == "left" else self.join.right_side.schema
        done = self.marker(side, self.index[side], self.total_rows[side], self.digest[side],
                           True)
        self.join.apply(side, self.join.prepare(side, schema.empty_table()), progress=done)
        self.dispatch(SideFinished(side, small=side == self.small))
        self.seconds[side] += time.perf_counter() - t
        self.finished_at[side] = round(time.perf_counter() - self.t0, 4)
        self.sample(force=True)

    def run(self) -> None:
        self.setup_memtables()
        self.dispatch(PopulationStarted(self.small))
        self.sample(force=True)
        for side, batch in self.schedule():
            if batch is None:
                self.finish_side(side)
            else:
                self.apply(side, batch)
        if self.ingester is not None:
            self.ingester.ingest_all()


def _conflicts(strategy: str | Strategy | None, order: str | None, batch_rows: int | None,
               rec: Marker) -> list[str]:
    """Explicit arguments of a resumed call that contradict the interrupted run."""
    bad: list[str] = []
    name = rec.strategy.get("name")
    if isinstance(strategy, Strategy):
        mine = {k: v for k, v in strategy.to_dict().items() if k != "reason"}
        theirs = {k: v for k, v in rec.strategy.items() if k != "reason"}
        if mine != theirs:
            bad.append(f"strategy={strategy.name!r} (a Strategy that differs from the "
                       f"interrupted run's {name!r})")
    elif strategy is not None and strategy not in ("auto", name):
        bad.append(f"strategy={strategy!r} (the interrupted run used {name!r})")
    if order is not None and order != rec.order:
        bad.append(f"order={order!r} (the interrupted run used {rec.order!r})")
    if batch_rows is not None and batch_rows != rec.batch_rows:
        bad.append(f"batch_rows={batch_rows!r} (the interrupted run used {rec.batch_rows})")
    return bad


def _side_stats(join: Join, data: Mapping[str, Any], sources: Mapping[str, Source],
                known: Mapping[str, int | None]) -> dict[str, SourceStats]:
    """Statistics of both inputs: sampled from tables and Parquet files, else their sizes.

    Iterators and readers are never touched here (only their batches are loaded).
    """
    out: dict[str, SourceStats] = {}
    for s in SIDES:
        side = join.left_side if s == "left" else join.right_side
        src = sources[s]
        if src.snapshot:
            st = gather(data[s], s, keys=[tuple(side.key)], unique_key=side.unique_key)
        else:
            st = SourceStats(s, src.rows, src.rows or 0, None, src.snapshot,
                             tuple(side.unique_key) if side.unique_key else None,
                             origin="table" if src.snapshot else "stream")
        if known[s] is not None and known[s] != st.rows:
            st = st.replace(rows=known[s], rows_at_least=known[s], origin="given")
        out[s] = st
    return out


def _plan(join: Join, store: Database, stats: Mapping[str, SourceStats], order: str | None,
          fixed: Mapping[str, Any]) -> Plan:
    """The planner's decisions for this population (``fixed``: choices not to decide)."""
    return plan_for_join(join, stats["left"], stats["right"],
                         history=read_history(store, join.name), order=order, **fixed)


def _skip(join: Join, side: str, source: Source, rec: Marker,
          found: Mapping[str, Marker], identity: dict[str, Any] | None) -> None:
    """Read past the batches ``rec`` says are loaded, checking they are the same ones.

    Raises :class:`~population.PopulationInterruptedError` if the input changed.
    """

    def changed(why: str) -> None:
        raise_interrupted(join, found, f"cannot resume: the {side} side's input changed ({why})")

    before = rec.source or {}
    if identity and before.get("bytes") is not None and identity.get("bytes") != before["bytes"]:
        changed(f"{before.get('path')} had {before['bytes']} bytes, "
                f"{identity.get('path')} has {identity.get('bytes')}")
    digest, rows = EMPTY_DIGEST, 0
    for i in range(rec.batches):
        b = source.next()
        if b is None:
            changed(f"it ends after {i} batches, {rec.batches} were loaded")
            break
        digest = batch_digest(digest, b)
        rows += b.num_rows
    if rows != rec.rows or digest != rec.digest:
        changed(f"its first {rec.batches} batches hold {rows:,} rows with digest {digest}; "
                f"the loaded ones held {rec.rows:,} rows with digest {rec.digest}")
    if rec.done and source.next() is not None:
        changed(f"it has more than the {rec.batches} batches that were loaded in full")


@overload
def populate(
    join: Pipeline, left: None = None, right: None = None,
    strategy: str | Strategy | None = None, order: Order | str | None = None,
    sink: Callable[..., Any] | None = None, progress: bool = True, *,
    sources: Mapping[str, Any], sizes: Mapping[str, int] | None = None,
    batch_rows: int | None = None, go_live: bool = True,
    sample_interval: float = SAMPLE_INTERVAL, resume: bool = False,
) -> PipelineReport: ...


@overload
def populate(
    join: Join, left: Any, right: Any,
    strategy: str | Strategy | None = None, order: Order | str | None = None,
    sink: Callable[..., Any] | None = None, progress: bool = True, *,
    sources: None = None, sizes: Mapping[str, int] | None = None,
    batch_rows: int | None = None, go_live: bool = True,
    sample_interval: float = SAMPLE_INTERVAL, resume: bool = False,
) -> Report: ...


def populate(
    join: Join | Pipeline,
    left: Any = None,
    right: Any = None,
    strategy: str | Strategy | None = None,
    order: Order | str | None = None,
    sink: Callable[..., Any] | None = None,
    progress: bool = True,
    *,
    sources: Mapping[str, Any] | None = None,
    sizes: Mapping[str, int] | None = None,
    batch_rows: int | None = None,
    go_live: bool = True,
    sample_interval: float = SAMPLE_INTERVAL,
    resume: bool = False,
) -> Report | PipelineReport:
    """Load both sides of ``join`` from existing data, emit the initial output, go live.

    **Pipelines**: ``populate(pipeline, sources={name: data, ...}, strategy=...)`` loads
    every source of a :class:`joinstate.Pipeline`, smallest first, and returns a
    :class:`~population.pipeline.PipelineReport` (per source, operator and index); see
    :func:`population.pipeline.populate_pipeline` for what carries over.

    ``left``/``right``: a pyarrow Table, RecordBatch or RecordBatchReader, a Parquet
    path, or an iterable of record batches.  ``strategy``: ``"symmetric"``,
    ``"asymmetric"`` (the default), ``"bulk"``, ``"auto"`` (the planner decides, from
    the inputs' statistics and what earlier runs on this store measured) or a
    :class:`Strategy`.  Either way the report carries the plan (``report.plan``,
    ``report.explain``): every decision with the figures behind it.
    ``order``: ``"small-first"`` (the default) loads the whole small side first;
    ``"interleaved"`` alternates batches as a stream would (the small side finishes
    first); ``"as-given"`` loads left then right.  ``sizes`` (``{"left": n, "right":
    m}``) tells the driver the row counts when the inputs cannot; otherwise it counts.
    The small side is never inferred from its name.  ``batch_rows`` (default 65,536)
    cuts tables and Parquet files into batches.

    ``sink`` receives every non-empty output delta; a sink that takes a second argument
    also gets the :class:`~population.OutputBatch` ``(side, index)`` of the input batch
    it comes from.  Delivery is **at least once, with an exact re-delivery range**: a
    batch's output is delivered before the batch is durable, so a crash never loses an
    output; a resumed call reports in ``report.redelivered`` the first batch index per
    side whose output it delivers again, and delivers every later batch's output once.
    Dropping the interrupted run's outputs of batches ``>= redelivered[side]`` (or
    keeping the last delivery per ``(side, index)``) gives exactly the output of an
    uninterrupted run.

    **Interruptions.** Each batch commits its side's progress marker in its own
    transaction (:mod:`population.resume`), so after a crash, a kill -9 or an exception
    the state holds a known prefix of each input.  ``populate`` on such a join raises
    :class:`~population.PopulationInterruptedError` naming each side's progress; with
    ``resume=True`` it continues instead: it reads each input again, skips the batches
    already loaded (checking their digest: a changed input raises
    ``PopulationInterruptedError``), and reuses the interrupted run's strategy, order,
    small side and ``batch_rows`` (an explicit argument that contradicts them is an
    error naming it).  The result (state, summed output with the re-delivered range
    dropped) equals an uninterrupted run's.  ``resume=True`` on a join with no
    interrupted population is an ordinary call.  The other remedy is
    ``store.drop_join(name)``, then create and populate the join again.  The markers are
    cleared when the join goes live (a ``go_live=False`` call leaves them, both sides
    ``done``, for the next call to clear: it is not an interruption).

    ``go_live`` (default True) moves the join to the live phase at the end;
    ``go_live=False`` leaves it in the population phase, for drivers that load the sides
    in separate calls (Spark runs the small side's job, then the big side's).
    ``sample_interval`` is the least number of seconds between two samples of the L0
    file counts, pending compaction bytes and RSS; the guard's thresholds are checked at
    each sample, so 0 checks them after every batch.

    The resulting state and the sum of the output deltas do not depend on the strategy
    or the order.  Auto-compaction is re-enabled on every column family on every exit
    path (and a store reopened after a crash starts with it on).  Returns a
    :class:`Report`.
    """
    if isinstance(join, Pipeline):
        if left is not None or right is not None or order is not None:
            msg = (
                "a pipeline is populated with sources={name: data}; left=, right= and "
                "order= are for a single join (sources load smallest first)"
            )
            raise PopulationError(
                msg
            )
        if isinstance(strategy, Strategy):
            msg = (
                "a pipeline takes strategy= as a name: "
                                  "'symmetric', 'asymmetric' or 'auto'"
            )
            raise PopulationError(msg)
        return populate_pipeline(join, sources or {}, strategy, sink=sink, progress=progress,
                                 batch_rows=batch_rows, sizes=sizes, resume=resume,
                                 go_live=go_live)
    if sources is not None:
        msg = "sources= is for pipelines; a join takes left= and right="
        raise PopulationError(msg)
    if order is not None and order not in ORDERS:
        raise PopulationError(f"order={order!r} must be one of {ORDERS}")
    if not sample_interval >= 0:
        raise PopulationError(f"sample_interval={sample_interval!r} must be >= 0 seconds")
    if batch_rows is not None and (isinstance(batch_rows, bool)
                                   or not isinstance(batch_rows, int) or batch_rows < 1):
        raise PopulationError(f"batch_rows={batch_rows!r} must be an int >= 1")
    store = join.store
    if store is None or store.closed:
        raise PopulationError(f"join {join.name!r} is bound to a closed state store")
    if join.phase == "live":
        raise PopulationError(
            f"join {join.name!r} in {store.path} is already live; population loads a join "
            "once, live changes go through join.push()"
        )
    if sizes is not None:
        bad = [k for k in sizes if k not in SIDES]
        if bad or any(not isinstance(v, int) or v < 0 for v in sizes.values()):
            raise PopulationError(
                f"sizes={dict(sizes)!r} must map 'left'/'right' to row counts >= 0"
            )
    found = markers(join)
    if completed(found):  # an earlier go_live=False call finished: start afresh
        join.clear_progress()
        found = {}
    if found and not resume:
        raise_interrupted(join, found)
    # Nothing of this join is being ingested now (one writer): staging files are leftovers.
    remove_staging(store.path, join.name)
    # Rows loaded by an earlier call (a driver loading one side per call): this call's
    # figures are not a whole population, so they are not recorded for the planner.
    preloaded = any(join.rows(s) for s in SIDES)
    data = {"left": left, "right": right}
    identity: dict[str, dict[str, Any] | None] = {s: source_identity(data[s]) for s in SIDES}

    small: SideName
    side_sources: dict[str, Source]
    if found:
        rec = next(iter(found.values()))
        for other in found.values():
            if (other.strategy, other.order, other.small, other.batch_rows) != (
                    rec.strategy, rec.order, rec.small, rec.batch_rows):
                raise_interrupted(join, found, "the two sides' progress markers disagree on "
                                  "the run's parameters")
        bad = _conflicts(strategy, order, batch_rows, rec)
        if bad:
            raise PopulationError(
                f"join {join.name!r}: resume=True continues the interrupted population with "
                f"its own parameters; these arguments contradict them: {'; '.join(bad)}. "
                "Leave them out (or pass the same values)"
            )
        try:
            strat = Strategy(**rec.strategy)
        except TypeError as exc:
            raise_interrupted(join, found, f"its strategy is unreadable ({exc})")
        order, small, small_from = rec.order, rec.small, rec.small_from  # type: ignore[assignment]
        batch_rows = rec.batch_rows
        side_sources = {s: Source(s, data[s], batch_rows) for s in SIDES}
        for s, m in found.items():
            _skip(join, m.side, side_sources[s], m, found, identity[s])
        known: dict[str, int | None] = {s: side_sources[s].rows for s in SIDES}
        # The interrupted run's choices are fixed: the plan records them as given.
        plan = _plan(join, store, _side_stats(join, data, side_sources, known), order,
                     {**fixed_choices(strat), "small_side": small})
    else:
        batch_rows = batch_rows or DEFAULT_BATCH_ROWS
        side_sources = {s: Source(s, data[s], batch_rows) for s in SIDES}
        known = {s: side_sources[s].rows for s in SIDES}
        if sizes:
            known.update(sizes)
        strategy = "asymmetric" if strategy is None else strategy
        if isinstance(strategy, Strategy):
            fixed = fixed_choices(strategy)
        elif isinstance(strategy, str):
            fixed = {}
            if strategy != "auto":
                fixed["strategy"] = preset(strategy).name  # validates the name
        else:
            raise PopulationError(
                f"strategy must be a name or a population.Strategy, got "
                f"{type(strategy).__name__}"
            )
        stats = _side_stats(join, data, side_sources, known)
        plan = _plan(join, store, stats, order, fixed)
        decided: SideName | None = plan.get("small_side", join.name)
        small_from = "strategy" if fixed.get("small_side") is not None else "sizes"
        if decided is None:
            counted_small, counted_sizes = count_small(side_sources)
            known = {s: known[s] if known[s] is not None else counted_sizes[s] for s in SIDES}
            stats = {s: stats[s].replace(rows=known[s], rows_at_least=max(
                stats[s].rows_at_least, side_sources[s].rows_read), origin="counted")
                for s in SIDES}
            plan = _plan(join, store, stats, order, fixed)
            decided = plan.get("small_side", join.name)
            if decided is None:  # a tie in lockstep: the side that ran out first
                plan = _plan(join, store, stats, order, {**fixed, "small_side": counted_small})
                decided = counted_small
            small_from = "counted"
        small = decided
        order = plan.get("order")
        strat = strategy if isinstance(strategy, Strategy) else from_plan(plan, join.name)

    total = None
    if known["left"] is not None and known["right"] is not None:
        total = known["left"] + known["right"]
    bar = Progress(progress, total, f"populate {join.name}")
    run = _Run(join, store, strat, small, order, side_sources, sink, bar, sample_interval,
               small_from=small_from, batch_rows=batch_rows, identity=identity,
               go_live=go_live)
    # A side without a marker has nothing durable: its outputs all come again.
    redelivered: dict[str, int] = dict.fromkeys(SIDES, 0) if found else {}
    for s, m in found.items():
        run.index[s], run.total_rows[s], run.digest[s] = m.batches, m.rows, m.digest
        redelivered[s] = m.batches
    before = statistics_counters(store.statistics())
    log.info("%s %s with %s (%s), order %s, small side %s (%s)",
             "resuming" if found else "populating", join.name, strat.name,
             strat.reason or "given", order, small, small_from)
    failed = True
    try:
        with guarded(run.control):
            try:
                run.run()
                run.dispatch(PopulationEnded(failed=False))
                failed = False
            finally:
                if failed:
                    # The markers stay as they are: a resume continues from them.
                    if run.ingester is not None:
                        run.ingester.discard()
                    if not store.closed:
                        join.reload()
                    try:
                        run.dispatch(PopulationEnded(failed=True))
                    except Exception:
                        log.exception("a compaction policy failed while population failed")
                run.restore_write_buffer()
        join.settle()
        if go_live:
            join.go_live()  # phase and markers in one write: no crash leaves one without
    finally:
        bar.close()
        if run.ingester is not None:
            run.ingester.discard()
    run.sample(force=True)
    after = statistics_counters(store.statistics())
    activity = counter_delta(after, before)
    ingested = run.ingester.bytes if run.ingester is not None else 0
    written = (activity["wal_bytes"] + activity["flush_write_bytes"]
               + activity["compaction_write_bytes"] + ingested)
    ing = run.ingester
    sides: dict[str, SideReport] = {
        s: SideReport(
            rows=run.rows[s], batches=run.batches[s], seconds=round(run.seconds[s], 4),
            deletes=run.deletes[s], finished_at=run.finished_at.get(s),
            bulk_entries=ing.rows.get(s, 0) if ing is not None else 0,
            sst_files=ing.files.get(s, 0) if ing is not None else 0,
            memtable=run.memtables[s],
        )
        for s in SIDES
    }
    report = Report(
        join=join.name, strategy=strat.to_dict(), reason=strat.reason, order=order,
        small_side=small, small_side_from=small_from, sides=sides,
        output_rows=run.output_rows, output_weight=run.output_weight,
        wall_seconds=round(time.perf_counter() - run.t0, 4), bytes_written=written,
        ingested_bytes=ingested, rocksdb=activity, l0_samples=run.l0_samples,
        l0_max=run.l0_max, state_bytes=_dir_bytes(store.path), rss_start=run.rss_start,
        peak_rss=run.peak_rss,
        actions=[dict(vars(a)) for a in run.control.actions], phase=join.phase,
        resumed={s: m.summary() for s, m in found.items()}, redelivered=redelivered,
        plan=plan.to_dict(), explain=plan.explain(),
    )
    if not found and not preloaded and go_live:
        # What this run measured, for the planner's next decision on this join (only a
        # whole population in one call: a driver loading one side per call is not one).
        record_population(
            store, join.name, strategy=strat.name, rows=report.rows,
            seconds=report.wall_seconds,
            inputs={s: (run.rows[s], run.seconds[s]) for s in SIDES},
            indexes={join.index(s).column_family: {
                "rows": join.index(s).rows, "entries": join.index(s).entries}
                for s in SIDES},
        )
    log.info("population of %s done:\n%s", join.name, report.summary())
    return report
