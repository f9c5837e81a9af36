"""The population driver: load both sides of a join, emit the initial output, go live.

Phases: find the small side (strategy, given sizes, or counting); set up per-side
memtables while the families are still empty; stream batches in the chosen
order, dispatching events to the compaction policies; ingest what is pending; flush if
the WAL was off; switch the join to the live phase.  Whatever happens, the compaction
guard re-enables every column family a policy disabled, and the WAL switch is undone.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import psutil

from compaction import (
    BatchWritten,
    BulkLoadPolicy,
    CompactionControl,
    CompactionPolicy,
    EpsioPolicy,
    Event,
    Guard,
    PopulationEnded,
    PopulationStarted,
    RocksDBDefaults,
    SideFinished,
    ThresholdCrossed,
    guarded,
)
from joinstate import IndexOptions, SchemaMismatchError
from joinstate.activity import counter_delta, statistics_counters
from population.bulk import SstIngester
from population.errors import BulkLoadRefused, PopulationError
from population.progress import Progress
from population.report import Report, SideReport
from population.sources import DEFAULT_BATCH_ROWS, Source, count_small
from population.strategy import CompactionName, Strategy, choose, preset, small_side

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
    "epsio": EpsioPolicy,
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
                 sink: Callable[[pa.Table], Any] | None, progress: Progress,
                 sample_interval: float) -> None:
        self.join, self.store, self.strategy = join, store, strategy
        self.small, self.order = small, order
        self.sources, self.out_sink, self.progress = sources, sink, progress
        self.sample_interval = sample_interval
        indexes = {s: join.index(s) for s in SIDES}
        self.index_cf = {s: indexes[s].column_family for s in SIDES}
        self.control = CompactionControl(store, indexes)
        self.control.small = small
        self.policies = _policies(strategy)
        self.ingester = SstIngester(store, strategy.bulk_run_rows) if strategy.bulk else None
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

    def apply(self, side: SideName, batch: Any) -> None:
        t = time.perf_counter()
        other = self.control.other(side)
        prepared = self.join.prepare(side, batch)
        deletes = prepared.retracted  # rows retracted, with multiplicity
        ing = self.ingester
        out = None
        if ing is not None:
            if ing.has_pending(other):
                ing.ingest(other)  # this push probes the other side: make it visible
            if side in self.bulk_sides and not deletes:
                try:
                    out = self.join.apply(side, prepared, sink=ing.sink(side))
                    ing.maybe_ingest(side)
                except BulkLoadRefused as exc:
                    log.info("falling back to a WriteBatch: %s", exc)
            if out is None and ing.has_pending(side):
                ing.ingest(side)  # deletes read this side's own entries
        if out is None:
            out = self.join.apply(side, prepared)
        if out.num_rows:
            self.output_rows += out.num_rows
            self.output_weight += int(np.asarray(out.column("_weight")).sum())
            if self.out_sink is not None:
                self.out_sink(out)
        n = batch.num_rows
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


def populate(
    join: Join,
    left: Any,
    right: Any,
    strategy: str | Strategy = "asymmetric",
    order: Order | str = "small-first",
    sink: Callable[[pa.Table], Any] | None = None,
    progress: bool = True,
    *,
    sizes: Mapping[str, int] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    go_live: bool = True,
    sample_interval: float = SAMPLE_INTERVAL,
) -> Report:
    """Load both sides of ``join`` from existing data, emit the initial output, go live.

    ``left``/``right``: a pyarrow Table, RecordBatch or RecordBatchReader, a Parquet
    path, or an iterable of record batches.  ``strategy``: ``"symmetric"``,
    ``"asymmetric"``, ``"bulk"``, ``"auto"`` or a :class:`Strategy`.  ``order``:
    ``"small-first"`` loads the whole small side first; ``"interleaved"`` alternates
    batches as a stream would (the small side finishes first); ``"as-given"`` loads
    left then right.  ``sink`` receives every non-empty output delta.  ``sizes``
    (``{"left": n, "right": m}``) tells the driver the row counts when the inputs
    cannot; otherwise it counts.  The small side is never inferred from its name.

    ``go_live=False`` leaves the join in the population phase, for drivers that load
    the sides in separate calls (Spark runs the small side's job, then the big side's).
    ``sample_interval`` is the least number of seconds between two samples of the L0
    file counts, pending compaction bytes and RSS; the guard's thresholds are checked at
    each sample, so 0 checks them after every batch.

    The resulting state and the sum of the output deltas do not depend on the strategy
    or the order.  Auto-compaction is re-enabled on every column family on every exit
    path.  Returns a :class:`Report`.
    """
    if order not in ORDERS:
        raise PopulationError(f"order={order!r} must be one of {ORDERS}")
    if not sample_interval >= 0:
        raise PopulationError(f"sample_interval={sample_interval!r} must be >= 0 seconds")
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
    sources = {"left": Source("left", left, batch_rows), "right": Source("right", right,
                                                                          batch_rows)}
    known: dict[str, int | None] = {s: sources[s].rows for s in SIDES}
    if sizes:
        known.update(sizes)

    small: SideName
    if isinstance(strategy, Strategy) and strategy.small_side is not None:
        small, small_from = strategy.small_side, "strategy"
    elif known["left"] is not None and known["right"] is not None:
        small = small_side({"left": known["left"], "right": known["right"]})
        small_from = "sizes"
    else:
        small, counted_sizes = count_small(sources)
        small_from = "counted"
        known = {s: known[s] if known[s] is not None else counted_sizes[s] for s in SIDES}

    if isinstance(strategy, Strategy):
        strat = strategy
    elif strategy == "auto":
        big: SideName = "right" if small == "left" else "left"
        strat = choose(
            known, {s: sources[s].snapshot for s in SIDES},
            append_only_big=join.index(big).bulk_loadable,
        )
        if known[big] is None and small_from == "counted":
            strat = strat.replace(reason=strat.reason + f" ({small} side counted smaller)")
    elif isinstance(strategy, str):
        strat = preset(strategy)
    else:
        raise PopulationError(
            f"strategy must be a name or a population.Strategy, got {type(strategy).__name__}"
        )

    total = None
    if known["left"] is not None and known["right"] is not None:
        total = known["left"] + known["right"]
    bar = Progress(progress, total, f"populate {join.name}")
    run = _Run(join, store, strat, small, order, sources, sink, bar, sample_interval)
    before = statistics_counters(store.statistics())
    log.info("populating %s with %s (%s), order %s, small side %s (%s)", join.name,
             strat.name, strat.reason or "given", order, small, small_from)
    failed = True
    try:
        with guarded(run.control):
            try:
                if strat.wal is False:
                    with store.wal_disabled():
                        run.run()
                else:
                    run.run()
                run.dispatch(PopulationEnded(failed=False))
                failed = False
            finally:
                if failed:
                    if run.ingester is not None:
                        run.ingester.discard()
                        join.reload()
                    try:
                        run.dispatch(PopulationEnded(failed=True))
                    except Exception:
                        log.exception("a compaction policy failed while population failed")
                run.restore_write_buffer()
        if go_live:
            join.set_phase("live")
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
    )
    log.info("population of %s done:\n%s", join.name, report.summary())
    return report
