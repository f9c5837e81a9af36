"""Population of a whole pipeline: every source loaded once, small sources first.

The strategies carry over from a single join, decided per index instead of per side:

* **order**: sources by row count, smallest first, across the whole pipeline (TPC-DS q4:
  date_dim and customer before any sales), so that every big push probes indexes that
  are complete and compact, and the small sources' pushes probe empty big indexes.
* **asymmetric** (Epsio's policy, generalised): before a source loads, auto-compaction
  stops on every index it writes that neither it nor any later source reads (during
  this population, such an index is only written); when a source finishes, the indexes
  it wrote that later sources read are compacted once, so their probes are cheap.
  Compaction comes back on every family at the end, on every exit path.
* **symmetric**: RocksDB's defaults throughout (the baseline).
* **auto**: asks the planner (:func:`planner.plan.plan_pipeline`), which also decides
  the order and each index's compaction schedule; its rule is asymmetric when the
  largest source is at least four times the smallest non-empty one (or whatever earlier
  runs recorded in the store measured faster), symmetric otherwise.

The order and the per-index schedules are the plan's decisions in every case (a fixed
strategy is given to the planner, which records it as given); the report carries the
plan and its explanation, and a fresh run records what it measured for the next plan.

Bulk SST ingestion is not offered for pipelines: a pipeline push also updates
aggregate state and probes indexes written in the same load, so its transaction reads
state, and a bulk sink cannot take a transaction that reads (its pending writes would
be invisible to the reads).

Crash safety: each push commits its source's progress marker in the same transaction
(JSON: batches, rows, the running digest of the input, done); the outputs of a batch go
to the sink before its transaction is written, so a crash re-delivers, never loses.
``resume=True`` skips what the markers say was loaded, checking the digests.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from compaction import CompactionControl, guarded
from joinstate.names import pipeline_owner
from planner.history import read_history, record_population
from planner.plan import plan_pipeline
from planner.stats import SourceStats, gather
from population.errors import PopulationError, PopulationInterruptedError
from population.progress import Progress
from population.resume import EMPTY_DIGEST, OutputBatch, batch_digest, sink_takes_batch
from population.sources import Source

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import pyarrow as pa

    from joinstate import Pipeline

__all__ = ["PIPELINE_STRATEGIES", "PipelineReport", "populate_pipeline"]

log = logging.getLogger(__name__)

PIPELINE_STRATEGIES = ("symmetric", "asymmetric", "auto")
DEFAULT_PIPELINE_BATCH_ROWS = 200_000
"""Rows per push: bigger than a join's default, since every push pays the fixed cost of
every operator it reaches."""


@dataclass
class SourceLoad:
    """What loading one source took."""

    name: str
    rows: int = 0
    batches: int = 0
    seconds: float = 0.0
    skipped_batches: int = 0

    @property
    def rows_per_second(self) -> float:
        """Input rows per second of this source's pushes."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PipelineReport:
    """The report of :func:`populate_pipeline`: per source, per operator, per index."""

    pipeline: str
    strategy: str
    order: list[str]
    seconds: float = 0.0
    sources: list[SourceLoad] = field(default_factory=list)
    operators: dict[str, int] = field(default_factory=dict)
    indexes: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    output_rows: dict[str, int] = field(default_factory=dict)
    peak_rss_bytes: int = 0
    redelivered: dict[str, int] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    """The planner's plan of this population (every decision, reason and figures)."""
    explain: str = ""
    """The plan as a readable tree (:meth:`summary` ends with it)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """What RocksDB looked like during the load, over time (see :class:`Sampler`)."""

    @property
    def rows(self) -> int:
        """Input rows loaded by this call."""
        return sum(s.rows for s in self.sources)

    @property
    def rows_per_second(self) -> float:
        """Input rows per second over the whole call."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (for benchmark results)."""
        d = asdict(self)
        d["rows"] = self.rows
        d["rows_per_second"] = round(self.rows_per_second, 1)
        for s, src in zip(d["sources"], self.sources, strict=True):
            s["rows_per_second"] = round(src.rows_per_second, 1)
        return d

    def summary(self) -> str:
        """A few readable lines."""
        lines = [f"pipeline {self.pipeline!r}: {self.rows:,} rows in {self.seconds:.2f} s "
                 f"({self.rows_per_second:,.0f} rows/s), strategy {self.strategy}"]
        for s in self.sources:
            lines.append(f"  {s.name}: {s.rows:,} rows, {s.batches} pushes, {s.seconds:.2f} s")
        for op, n in self.operators.items():
            lines.append(f"  {op}: {n:,} rows of change")
        if self.explain:
            lines += ["  " + line for line in self.explain.splitlines()]
        return "\n".join(lines)


def _marker(batches: int, rows: int, digest: str, done: bool) -> bytes:
    return json.dumps({"batches": batches, "rows": rows, "digest": digest,
                       "done": done}).encode()


def _read_marker(p: Pipeline, source: str) -> dict[str, Any] | None:
    raw = p.progress(source)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return {"batches": int(doc["batches"]), "rows": int(doc["rows"]),
                "digest": str(doc["digest"]), "done": bool(doc["done"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise PopulationError(f"pipeline {p.name!r}: the progress marker of source {source!r} "
                              f"is unreadable ({exc}); drop the state and populate again"
                              ) from exc


def populate_pipeline(
    p: Pipeline,
    sources: Mapping[str, Any],
    strategy: str | None = None,
    *,
    sink: Callable[..., Any] | None = None,
    progress: bool = True,
    batch_rows: int | None = None,
    sizes: Mapping[str, int] | None = None,
    resume: bool = False,
    go_live: bool = True,
) -> PipelineReport:
    """Load every source of ``p`` once, smallest first; see the module docstring.

    ``sources``: source name -> a pyarrow Table, RecordBatch(Reader), Parquet path or
    iterable of batches (sources left out stay empty).  ``sink`` gets each push's
    outputs (``{output: change set}``; a two-argument sink also gets the
    ``OutputBatch(source, index)``).  ``sizes`` gives row counts the inputs do not know.
    """
    strategy = "auto" if strategy is None else strategy
    if strategy not in PIPELINE_STRATEGIES:
        raise PopulationError(
            f"strategy={strategy!r}: a pipeline is populated with one of "
            f"{PIPELINE_STRATEGIES} (bulk SST ingestion needs transactions that never read "
            "state, and a pipeline's pushes read its aggregates and indexes)"
        )
    rows_per_batch = DEFAULT_PIPELINE_BATCH_ROWS if batch_rows is None else batch_rows
    if isinstance(rows_per_batch, bool) or not isinstance(rows_per_batch, int) \
            or rows_per_batch < 1:
        raise PopulationError(f"batch_rows={batch_rows!r} must be an int >= 1")
    unknown = [s for s in sources if s not in p.sources]
    if unknown:
        raise PopulationError(f"pipeline {p.name!r} has no source(s) {unknown} (sources: "
                              f"{list(p.sources)})")
    p.compile()
    if p.phase == "live":
        raise PopulationError(
            f"pipeline {p.name!r} is already live; population loads it once, live changes "
            "go through p.push()"
        )
    found = {s: m for s in p.sources if (m := _read_marker(p, s)) is not None}
    if found and not resume:
        raise PopulationInterruptedError(
            f"pipeline {p.name!r} holds an interrupted population ("
            + ", ".join(f"{s}: {m['batches']} batches, {m['rows']} rows"
                        f"{' (done)' if m['done'] else ''}" for s, m in found.items())
            + "); call populate(..., resume=True) with the same inputs to continue, or drop "
            "the state and start again", {s: dict(m) for s, m in found.items()},
        )
    store = p.store
    if store is None:
        raise PopulationError(f"pipeline {p.name!r} is bound to a closed state store")
    srcs = {name: Source(name, data, rows_per_batch) for name, data in sources.items()}
    stats = {name: _stats(p, name, data, srcs[name], sizes) for name, data in sources.items()}
    owner = pipeline_owner(p.name)
    plan = plan_pipeline(p, stats, history=read_history(store, owner),
                         strategy=None if strategy == "auto" else strategy)
    order: list[str] = list(plan.get("order"))
    chosen: str = plan.get("strategy")
    # Per index: the sources before which it stops compacting / after which it is
    # compacted (the plan's compaction decisions, executed as they stand).
    schedule = {d.subject: d.choice for d in plan.where("compaction")}
    infos = {ix.column_family: ix for ix in p.indexes()}
    report = PipelineReport(p.name, chosen if strategy != "auto" else f"auto->{chosen}",
                            order, plan=plan.to_dict(), explain=plan.explain())
    proc = psutil.Process()
    peak = proc.memory_info().rss
    takes_batch = sink is not None and sink_takes_batch(sink)
    total = sum(st.rows for st in stats.values() if st.rows) or None
    bar = Progress(progress, total, f"populate {p.name}")
    control = CompactionControl(store, {})
    t0 = time.perf_counter()
    sampler = Sampler(p, t0)  # report samples only: nothing below depends on them
    operators_before = p.operator_rows()
    try:
        with guarded(control):
            for name in order:
                for cf, plan_ix in schedule.items():
                    if name in plan_ix.get("disable_before", ()):
                        for data_cf in infos[cf].data_column_families:
                            control.disable(data_cf, f"{name} loads; nothing reads {cf} "
                                                     "during the rest of population")
                load = SourceLoad(name)
                report.sources.append(load)
                mark = found.get(name)
                skip = mark["batches"] if mark else 0
                digest = EMPTY_DIGEST
                index = 0
                rows_done = 0
                while True:
                    batch = srcs[name].next()
                    if batch is None:
                        break
                    digest = batch_digest(digest, batch)
                    if index < skip:
                        index += 1
                        rows_done += batch.num_rows
                        load.skipped_batches += 1
                        if index == skip and mark is not None and digest != mark["digest"]:
                            raise PopulationInterruptedError(
                                f"pipeline {p.name!r}: source {name!r} differs from the "
                                f"input of the interrupted population (digest after {skip} "
                                "batches); resume needs the same input"
                            )
                        bar.update(name, batch.num_rows)
                        continue
                    if mark is not None and index == skip:
                        report.redelivered.setdefault(name, index)
                    t = time.perf_counter()
                    marker = _marker(index + 1, rows_done + batch.num_rows, digest, False)

                    def deliver(outs: dict[str, pa.Table], _i: int = index,
                                _n: str = name) -> None:
                        for o, tbl in outs.items():
                            report.output_rows[o] = report.output_rows.get(o, 0) + tbl.num_rows
                        if sink is not None and any(t.num_rows for t in outs.values()):
                            if takes_batch:
                                sink(outs, OutputBatch(_n, _i))
                            else:
                                sink(outs)

                    p.push(name, batch, progress=marker, before_commit=deliver)
                    index += 1
                    rows_done += batch.num_rows
                    load.rows += batch.num_rows
                    load.batches += 1
                    load.seconds += time.perf_counter() - t
                    bar.update(name, batch.num_rows)
                    peak = max(peak, proc.memory_info().rss)
                    sampler.take(name, load.rows)
                if mark is not None and index < skip:
                    raise PopulationInterruptedError(
                        f"pipeline {p.name!r}: source {name!r} has {index} batches, fewer "
                        f"than the {skip} the interrupted population loaded"
                    )
                t = time.perf_counter()
                p.push(name, p.source_schema(name).empty_table(),
                       progress=_marker(index, rows_done, digest, True))
                for cf, plan_ix in schedule.items():
                    if name in plan_ix.get("compact_after", ()):
                        for data_cf in infos[cf].data_column_families:
                            control.compact(data_cf, f"{name} is loaded; later sources "
                                                     f"probe {cf}")
                load.seconds += time.perf_counter() - t
                sampler.take(name, load.rows, force=True)
    finally:
        bar.close()
    p.settle()
    if go_live:
        p.clear_progress()
        p.set_phase("live")
    report.seconds = round(time.perf_counter() - t0, 4)
    after = p.operator_rows()
    report.operators = {k: v - operators_before.get(k, 0) for k, v in after.items()}
    report.indexes = [{"column_family": ix.column_family, "layout": ix.layout,
                       "rows": ix.rows, "entries": ix.entries} for ix in p.indexes()]
    report.actions = [asdict(a) for a in control.actions]
    report.peak_rss_bytes = peak
    report.samples = sampler.samples
    if not found:
        _record(p, report, chosen)
    return report


def _stats(p: Pipeline, name: str, data: Any, src: Source,
           sizes: Mapping[str, int] | None) -> SourceStats:
    """Statistics of one source's input (iterators are never touched), sizes applied."""
    uk = p.source_unique_key(name)
    if src.snapshot:
        st = gather(data, name, unique_key=uk)
    else:
        st = SourceStats(name, src.rows, src.rows or 0, None, False, uk, origin="stream")
    n = sizes.get(name) if sizes else None
    if n is not None:
        st = st.replace(rows=n, rows_at_least=n, origin="given")
    return st


def _record(p: Pipeline, report: PipelineReport, strategy: str) -> None:
    """Record what a fresh population measured, for the planner's next plan of ``p``."""
    store = p.store
    if store is None:
        return
    indexes = {}
    for ix in p.indexes():
        size = sum(store.property_int(cf, prop) or 0 for cf in ix.column_families
                   for prop in ("rocksdb.total-sst-files-size",
                                "rocksdb.cur-size-all-mem-tables"))
        indexes[ix.column_family] = {"rows": ix.rows, "entries": ix.entries, "bytes": size}
    record_population(
        store, pipeline_owner(p.name), strategy=strategy, rows=report.rows,
        seconds=report.seconds, inputs={s.name: (s.rows, s.seconds) for s in report.sources},
        indexes=indexes, operators=report.operators,
    )


# ---- samples for reports (read-only; population never acts on them) --------------------

SAMPLE_INTERVAL = 0.05
"""Least seconds between two samples taken after a push (a sample reads four RocksDB
properties per column family and the statistics dump: well under a millisecond)."""


class Sampler:
    """Samples of RocksDB's state during a pipeline's population, for charts and reports.

    Each sample is ``{"t": seconds since the load started, "source": the source being
    loaded, "rows": input rows loaded by this call so far, "stall_micros": write stall
    time since the load started (DB-wide), "l0": {family: L0 files}, "pending": {family:
    estimated pending compaction bytes}, "bytes": {family: SST + memtable bytes}}`` over
    every column family of the pipeline.  Taken before the first push (source ``""``),
    between pushes at most every :data:`SAMPLE_INTERVAL` seconds, and always when a
    source finishes.
    """

    def __init__(self, p: Pipeline, t0: float) -> None:
        self.p = p
        self.t0 = t0
        self.rows_before = 0
        self.last = -SAMPLE_INTERVAL
        self.samples: list[dict[str, Any]] = []
        store = p.store
        self.stall0 = store.activity().get("stall_micros", 0) if store is not None else 0
        self.families = p.column_families()
        self.take("", 0, force=True)  # the state before the first push

    def take(self, source: str, source_rows: int, force: bool = False) -> None:
        """Record a sample (``source_rows``: rows of ``source`` loaded so far)."""
        now = time.perf_counter() - self.t0
        store = self.p.store
        if store is None or (not force and now - self.last < SAMPLE_INTERVAL):
            return
        self.last = now
        if self.samples and self.samples[-1]["source"] != source:
            self.rows_before = self.samples[-1]["rows"]
        props: dict[str, dict[str, int]] = {"l0": {}, "pending": {}, "bytes": {}}
        for cf in self.families:
            props["l0"][cf] = store.property_int(cf, "rocksdb.num-files-at-level0") or 0
            props["pending"][cf] = store.property_int(
                cf, "rocksdb.estimate-pending-compaction-bytes") or 0
            props["bytes"][cf] = (
                (store.property_int(cf, "rocksdb.total-sst-files-size") or 0)
                + (store.property_int(cf, "rocksdb.cur-size-all-mem-tables") or 0))
        self.samples.append({
            "t": round(now, 4), "source": source, "rows": self.rows_before + source_rows,
            "stall_micros": store.activity().get("stall_micros", 0) - self.stall0, **props,
        })
