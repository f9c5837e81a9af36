"""One population run: the loop that loads a maintained target's inputs, batch by batch.

The run executes a :class:`Program` (what the plan decided: the strategy, the inputs in
load order, whether they interleave, the small input, the compaction policies) over any
:class:`~joinstate.maintained.Maintained` target:

* **memtables** are chosen per index while its family is still empty (the small input's
  indexes get the strategy's small memtable, the others its big one);
* each **batch** is pushed with its input's progress marker in the same transaction;
  its outputs go to the sink *before* the transaction is written (``before_commit``),
  so a crash re-delivers, never loses;
* an input whose pushes may go to a **bulk sink** (:meth:`Maintained.bulk_loadable`, a
  join side without a degree family) is written as sorted SST runs when the strategy
  says bulk and the batch retracts nothing; before any push, the pending runs of the
  other inputs are ingested (the push probes them), and a batch the sink refuses falls
  back to a WriteBatch;
* the **events** (started, batch written, input finished, thresholds crossed, ended) go
  to every compaction policy; the sampler watches the thresholds and records samples.

:func:`population.populate` builds the program and the report; this module only runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow.compute as pc

from compaction import (
    BatchWritten,
    CompactionControl,
    PopulationStarted,
    SideFinished,
)
from joinstate import IndexOptions, SchemaMismatchError
from population.bulk import SstIngester
from population.errors import BulkLoadRefused
from population.resume import (
    EMPTY_DIGEST,
    GO_LIVE,
    Marker,
    OutputBatch,
    batch_digest,
    sink_takes_batch,
)
from population.sampling import Sampler

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    import pyarrow as pa

    from compaction import CompactionPolicy, Event
    from joinstate import SideName
    from joinstate.maintained import Maintained
    from joinstate.options import Memtable
    from population.progress import Progress
    from population.sources import Source
    from population.strategy import Strategy

__all__ = ["Program", "Run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Program:
    """What a run executes, as the plan (or an interrupted run's markers) decided it.

    ``sequence``: the inputs this run loads, in load order; ``interleaved``: alternate
    their batches (the first listed first) instead of loading each whole in turn;
    ``order``: the order as markers and reports record it (a join's mode name or the
    list of inputs); ``small``: the small input, if the plan has one, and how it was
    known (``small_from``).
    """

    strategy: Strategy
    sequence: list[str]
    interleaved: bool
    order: str | list[str]
    small: str | None
    small_from: str
    batch_rows: int
    policies: list[CompactionPolicy] = field(default_factory=list)


class Run:
    """The mutable state of one population run (the public face is ``populate``)."""

    def __init__(self, target: Maintained, program: Program, sources: Mapping[str, Source],
                 sink: Callable[..., Any] | None, value_of: Callable[[dict[str, pa.Table]], Any],
                 progress: Progress, sample_interval: float, *,
                 identity: Mapping[str, dict[str, Any] | None], go_live: bool) -> None:
        store = target.store
        assert store is not None  # populate() checked it
        self.target, self.store, self.program = target, store, program
        self.strategy = program.strategy
        self.sources, self.out_sink, self.value_of = sources, sink, value_of
        self.sink_takes_batch = sink is not None and sink_takes_batch(sink)
        self.progress = progress
        self.identity = dict(identity)
        self.go_live = go_live
        inputs = program.sequence
        # Durable progress of each input: batches and rows applied by this and earlier
        # (interrupted) runs, and the running digest of the input batches read.
        self.index: dict[str, int] = dict.fromkeys(inputs, 0)
        self.total_rows: dict[str, int] = dict.fromkeys(inputs, 0)
        self.digest: dict[str, str] = dict.fromkeys(inputs, EMPTY_DIGEST)
        self.written = {s: target.written_indexes(s) for s in inputs}
        self.control = CompactionControl(store, self.written)
        self.control.small = cast("SideName | None", program.small)
        self.policies = program.policies
        strategy = program.strategy
        self.ingester = (SstIngester(store, strategy.bulk_run_rows, target.owner)
                         if strategy.bulk else None)
        self.bulk_inputs = {s for s in inputs if strategy.bulk and target.bulk_loadable(s)}
        # A pipeline's pushes write their blind inserts (new index and source-record
        # entries) as SST files ingested with the push: the same state, without the
        # memtable insert, flush and compactions of rows written once.
        self.push_options: dict[str, Any] = (
            {"ingest": frozenset(target.column_families())}
            if getattr(target, "kind", "") == "pipeline" else {})
        self.t0 = time.perf_counter()
        self.sampler = Sampler(store, target.column_families(), sample_interval,
                               self.dispatch, l0_limit=strategy.l0_limit,
                               pending_bytes_limit=strategy.pending_bytes_limit, t0=self.t0)
        self.rows = dict.fromkeys(inputs, 0)
        self.batches = dict.fromkeys(inputs, 0)
        self.skipped = dict.fromkeys(inputs, 0)
        self.deletes = dict.fromkeys(inputs, 0)
        self.seconds = dict.fromkeys(inputs, 0.0)
        self.finished_at: dict[str, float] = {}
        self.memtables: dict[str, Memtable | None] = dict.fromkeys(inputs)
        self.output_rows: dict[str, int] = dict.fromkeys(target.output_names, 0)
        self.output_weight: dict[str, int] = dict.fromkeys(target.output_names, 0)
        self.resumed_at: dict[str, int] = {}
        self.pushed_after_resume: set[str] = set()
        self.loaded_rows = 0

    # ---- events -----------------------------------------------------------------------

    def dispatch(self, event: Event) -> None:
        """Give ``event`` to every compaction policy."""
        for p in self.policies:
            p.observe(event, self.control)

    def sample(self, source: str | None, force: bool = False) -> None:
        """A sample of RocksDB's state (at most every ``sample_interval`` unless forced).

        ``source=None``: the closing sample, credited to the input loaded last (so each
        input's last sample holds the rows loaded up to its end).
        """
        if source is None:
            source = self.sampler.samples[-1]["source"] if self.sampler.samples else ""
        self.sampler.take(source, self.loaded_rows, force)

    # ---- setup ------------------------------------------------------------------------

    def setup_memtables(self) -> None:
        """Give each input's indexes their memtable, while the families are still empty."""
        small = self.program.small
        for name in self.program.sequence:
            want = (self.strategy.small_memtable if name == small
                    else self.strategy.big_memtable)
            for info in self.written[name]:
                cf = info.column_family
                current = self.store.options.resolved(cf).memtable
                self.memtables[name] = current
                if want is None or want == current:
                    continue
                if info.rows:
                    # Loaded by an earlier call (a driver loading one side per call): its
                    # memtable was chosen then; nothing to do, nothing to warn about.
                    log.debug("keeping the memtable of %s: the index is already loaded", cf)
                    continue
                try:
                    self.store.recreate_empty(cf, IndexOptions(memtable=want))
                    self.memtables[name] = want
                except SchemaMismatchError as exc:
                    log.warning("keeping the %s memtable of %s: %s", current, cf, exc)
        size = self.strategy.big_write_buffer_size
        if size is not None and small is not None:
            for cf in self._big_index_cfs():
                self.store.set_cf_options(cf, {"write_buffer_size": str(size)})

    def restore_write_buffer(self) -> None:
        """Give the big inputs' indexes their configured write buffer back."""
        if self.strategy.big_write_buffer_size is None or self.program.small is None:
            return
        for cf in self._big_index_cfs():
            default = self.store.options.resolved(cf).write_buffer_size
            self.store.set_cf_options(cf, {"write_buffer_size": str(default)})

    def _big_index_cfs(self) -> list[str]:
        return [i.column_family for s in self.program.sequence if s != self.program.small
                for i in self.written[s]]

    # ---- the schedule -----------------------------------------------------------------

    def schedule(self) -> Iterator[tuple[str, pa.RecordBatch | pa.Table | None]]:
        """Yield ``(input, batch)``; ``(input, None)`` once when an input is exhausted."""
        sequence = self.program.sequence
        if self.program.interleaved:
            live = list(sequence)
            while live:
                for name in list(live):
                    b = self.sources[name].next()
                    if b is None:
                        live.remove(name)
                    yield name, b
            return
        for name in sequence:
            while True:
                b = self.sources[name].next()
                yield name, b
                if b is None:
                    break

    # ---- writing ----------------------------------------------------------------------

    def marker(self, name: str, batches: int, rows: int, digest: str, done: bool) -> bytes:
        """The progress marker of ``name`` after ``batches`` batches (JSON bytes)."""
        p = self.program
        return Marker(
            side=name, batches=batches, rows=rows, digest=digest, done=done,
            strategy=self.strategy.to_dict(), order=p.order, small=p.small,
            small_from=p.small_from, batch_rows=p.batch_rows,
            source=self.identity.get(name), go_live=self.go_live, inputs=list(p.sequence),
        ).to_bytes()

    def deliver(self, batch: OutputBatch, outs: dict[str, pa.Table]) -> None:
        """Count ``outs`` and hand them to the sink (with their batch, if it takes it)."""
        if not any(t.num_rows for t in outs.values()):
            return
        for name, t in outs.items():
            if t.num_rows:
                self.output_rows[name] = self.output_rows.get(name, 0) + t.num_rows
                self.output_weight[name] = (self.output_weight.get(name, 0)
                                            + int(np.asarray(t.column("_weight")).sum()))
        if self.out_sink is not None:
            value = self.value_of(outs)
            if self.sink_takes_batch:
                self.out_sink(value, batch)
            else:
                self.out_sink(value)

    def apply(self, name: str, batch: pa.RecordBatch | pa.Table) -> None:
        """Push one batch of ``name`` with its marker (bulk-written when it can be)."""
        t = time.perf_counter()
        index, n = self.index[name], batch.num_rows
        digest = batch_digest(self.digest[name], batch)
        marker = self.marker(name, index + 1, self.total_rows[name] + n, digest, False)
        deletes = _retracted(batch)
        at = OutputBatch(name, index)
        ing = self.ingester
        outs = None
        if ing is not None:
            for other in self.program.sequence:
                if other != name and ing.has_pending(other):
                    ing.ingest(other)  # this push probes the other inputs: make them visible
            if name in self.bulk_inputs and not deletes:
                try:
                    outs = self.target.push_change(name, batch, sink=ing.sink(name),
                                                   progress=marker)
                except BulkLoadRefused as exc:
                    log.info("falling back to a WriteBatch: %s", exc)
            if outs is None and ing.has_pending(name):
                ing.ingest(name)  # deletes read this input's own entries
        if outs is None:
            # Deliver first, then make the batch durable (see the module docstring).
            self.target.push_change(name, batch, progress=marker,
                                    before_commit=lambda o: self.deliver(at, o),
                                    **self.push_options)
        else:
            self.deliver(at, outs)  # durable only once its run is ingested
            assert ing is not None
            ing.maybe_ingest(name)
        if name in self.resumed_at:
            self.pushed_after_resume.add(name)
        self.index[name] += 1
        self.total_rows[name] += n
        self.digest[name] = digest
        self.rows[name] += n
        self.batches[name] += 1
        self.deletes[name] += deletes
        self.loaded_rows += n
        self.seconds[name] += time.perf_counter() - t
        self.progress.update(name, n)
        self.dispatch(BatchWritten(cast("SideName", name), n, deletes))
        self.sample(name)

    def finish(self, name: str) -> None:
        """``name`` is exhausted: ingest its run, commit its done marker, tell the policies."""
        t = time.perf_counter()
        if self.ingester is not None and self.ingester.has_pending(name):
            self.ingester.ingest(name)
        done = self.marker(name, self.index[name], self.total_rows[name], self.digest[name],
                           True)
        self.target.push_change(name, self.target.input_schema(name).empty_table(),
                                progress=done)
        self.dispatch(SideFinished(cast("SideName", name), small=name == self.program.small))
        self.seconds[name] += time.perf_counter() - t
        self.finished_at[name] = round(time.perf_counter() - self.t0, 4)
        self.sample(name, force=True)

    def resume_from(self, found: Mapping[str, Marker]) -> None:
        """Continue after the batches ``found`` says are durable (already skipped)."""
        self.resumed_at = {s: m.batches for s, m in found.items()}
        for s, m in found.items():
            self.index[s], self.total_rows[s], self.digest[s] = m.batches, m.rows, m.digest
            self.skipped[s] = m.batches

    def run(self) -> None:
        """Memtables, then every batch of every input in the program's order."""
        self.setup_memtables()
        self.dispatch(PopulationStarted(cast("SideName | None", self.program.small)))
        self.sample("", force=True)
        for name, batch in self.schedule():
            if batch is None:
                self.finish(name)
            else:
                self.apply(name, batch)
        if self.ingester is not None:
            self.ingester.ingest_all()

    def hand_over(self) -> dict[str, pa.Table]:
        """Go live: the phase, the markers' removal and what is owed, in one write."""
        return self.target.go_live(before_commit=lambda o: self.deliver(GO_LIVE, o))


def _retracted(batch: pa.RecordBatch | pa.Table) -> int:
    """Rows ``batch`` retracts, with multiplicity (minus its negative weights' sum)."""
    if "_weight" not in batch.schema.names:
        return 0
    w = np.asarray(pc.fill_null(batch.column("_weight"), 0).to_numpy(zero_copy_only=False))
    neg = w[w < 0]
    if not len(neg):
        return 0
    if float(np.abs(neg.astype(np.float64)).sum()) < 2.0**62:
        return -int(neg.sum())
    return -sum(neg.tolist())
