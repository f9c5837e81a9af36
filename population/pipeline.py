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
(JSON: batches, rows, the running digest of the input, done, and the run's
``batch_rows`` and strategy); the outputs of a batch go to the sink before its
transaction is written, so a crash re-delivers, never loses.  ``resume=True`` continues
with the recorded parameters (an argument that contradicts them is refused, naming it),
skips what the markers say was loaded, checking the digests; what follows the loaded
batches may be new input (a corrected file).  Going live is one write: the phase and the
markers' removal together (:meth:`joinstate.Pipeline.go_live`), so a crash leaves either
the markers or a live pipeline, never a population a resume would load again.
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


def _marker(batches: int, rows: int, digest: str, done: bool, params: Mapping[str, Any]
            ) -> bytes:
    """A source's progress marker: its progress and the run's parameters (JSON)."""
    return json.dumps({"batches": batches, "rows": rows, "digest": digest, "done": done,
                       **params}).encode()


def _read_marker(p: Pipeline, source: str) -> dict[str, Any] | None:
    raw = p.progress(source)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        # Markers written before the run's parameters were recorded have none (None).
        br = doc.get("batch_rows")
        return {"batches": int(doc["batches"]), "rows": int(doc["rows"]),
                "digest": str(doc["digest"]), "done": bool(doc["done"]),
                "batch_rows": None if br is None else int(br),
                "strategy": doc.get("strategy")}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PopulationError(
            f"pipeline {p.name!r}: the progress marker of source {source!r} is unreadable "
            f"({exc}); drop the state (store.drop_pipeline({p.name!r})), define the "
            "pipeline again and populate it from scratch") from exc


def _progress_text(p: Pipeline, found: Mapping[str, dict[str, Any]]) -> str:
    """Each source's progress: ``"customer: 1 batch, 200 rows, done; sales: nothing"``."""
    parts = []
    for s in p.sources:
        m = found.get(s)
        if m is None:
            parts.append(f"{s}: nothing loaded")
        else:
            parts.append(f"{s}: {m['batches']} batch{'es' if m['batches'] != 1 else ''}, "
                         f"{m['rows']:,} rows{', done' if m['done'] else ''}")
    return "; ".join(parts)


def _drop_remedy(p: Pipeline) -> str:
    return (f"or discard it with store.drop_pipeline({p.name!r}), define the pipeline again "
            "and populate it from scratch")


def _interrupted(p: Pipeline, found: Mapping[str, dict[str, Any]], detail: str = ""
                 ) -> PopulationInterruptedError:
    """The error for an interrupted population: progress, what a resume takes, remedies."""
    any_marker = next(iter(found.values()))
    params = ", ".join(f"{k} {any_marker[k]!r}" for k in ("batch_rows", "strategy")
                       if any_marker.get(k) is not None)
    loaded = [f"{s}'s first {m['batches']}" for s, m in found.items() if m["batches"]]
    empty = [s for s in p.sources if s not in found or not found[s]["batches"]]
    takes = ("each source with batches loaded must yield those same batches first ("
             + ", ".join(loaded) + "; checked by digest)" if loaded else
             "no batch is loaded yet")
    after = ("; the batches after them"
             + (f" and the sources with nothing loaded ({', '.join(empty)})" if empty else "")
             + " may be new input, e.g. a corrected file")
    where = f" in {p.store.path}" if p.store is not None else ""
    msg = (f"pipeline {p.name!r}{where} holds an interrupted population ("
           f"{_progress_text(p, found)}{'; ' + params if params else ''}). Continue it with "
           f"populate(..., resume=True): {takes}{after}; {_drop_remedy(p)}")
    return PopulationInterruptedError(f"{detail}: {msg}" if detail else msg,
                                      {s: dict(m) for s, m in found.items()})


def _resume_parameters(p: Pipeline, found: Mapping[str, dict[str, Any]],
                       strategy: str | None, batch_rows: int | None
                       ) -> tuple[str | None, int | None]:
    """The interrupted run's strategy and batch_rows, checked against explicit arguments.

    Markers record them (older markers do not: then the arguments, as given, apply).
    An explicit argument that contradicts them is refused, naming it.
    """
    recorded = {(m.get("strategy"), m.get("batch_rows")) for m in found.values()}
    if len(recorded) > 1:
        raise _interrupted(p, found, "the sources' progress markers disagree on the run's "
                                     "parameters, so it cannot be resumed")
    (was_strategy, was_rows), = recorded
    bad = []
    if batch_rows is not None and was_rows is not None and batch_rows != was_rows:
        bad.append(f"batch_rows={batch_rows!r} (the interrupted run used {was_rows})")
    if strategy is not None and was_strategy is not None and strategy != was_strategy:
        bad.append(f"strategy={strategy!r} (the interrupted run used {was_strategy!r})")
    if bad:
        raise PopulationError(
            f"pipeline {p.name!r}: resume=True continues the interrupted population with its "
            f"own parameters; these arguments contradict them: {'; '.join(bad)}. Leave them "
            "out (or pass the same values)")
    return (strategy if strategy is not None else was_strategy,
            batch_rows if batch_rows is not None else was_rows)


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

    An interrupted population raises :class:`~population.PopulationInterruptedError`
    (each source's progress, what a resume accepts, and the other remedy,
    ``store.drop_pipeline(name)``); ``resume=True`` continues it with the interrupted
    run's ``batch_rows`` and ``strategy`` (leave them out, or pass the same values).
    """
    if strategy is not None and strategy not in PIPELINE_STRATEGIES:
        raise PopulationError(
            f"strategy={strategy!r}: a pipeline is populated with one of "
            f"{PIPELINE_STRATEGIES} (bulk SST ingestion needs transactions that never read "
            "state, and a pipeline's pushes read its aggregates and indexes)"
        )
    if batch_rows is not None and (isinstance(batch_rows, bool)
                                   or not isinstance(batch_rows, int) or batch_rows < 1):
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
        raise _interrupted(p, found)
    if found:
        strategy, batch_rows = _resume_parameters(p, found, strategy, batch_rows)
        missing = [s for s, m in found.items() if m["batches"] and s not in sources]
        if missing:
            raise _interrupted(p, found, f"cannot resume: no input given for {missing}, "
                                         "which the interrupted population loaded from")
    strategy = "auto" if strategy is None else strategy
    rows_per_batch = DEFAULT_PIPELINE_BATCH_ROWS if batch_rows is None else batch_rows
    params = {"batch_rows": rows_per_batch, "strategy": strategy}
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
                            raise _changed(p, name, skip, rows_per_batch,
                                           "they are not the batches that were loaded "
                                           "(their digest differs)")
                        bar.update(name, batch.num_rows)
                        continue
                    if mark is not None and index == skip:
                        report.redelivered.setdefault(name, index)
                    t = time.perf_counter()
                    marker = _marker(index + 1, rows_done + batch.num_rows, digest, False,
                                     params)

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
                    raise _changed(p, name, skip, rows_per_batch,
                                   f"it ends after {index} batch{'es' if index != 1 else ''}")
                t = time.perf_counter()
                p.push(name, p.source_schema(name).empty_table(),
                       progress=_marker(index, rows_done, digest, True, params))
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
        p.go_live()  # phase and markers in one write: no crash leaves one without
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


def _changed(p: Pipeline, source: str, loaded: int, batch_rows: int, why: str
             ) -> PopulationInterruptedError:
    """The error for a resume whose input of ``source`` is not what was loaded."""
    return PopulationInterruptedError(
        f"pipeline {p.name!r}: the input of source {source!r} differs from the one the "
        f"interrupted population loaded: its first {loaded} batch"
        f"{'es' if loaded != 1 else ''} (batch_rows={batch_rows}) were loaded, and {why}. "
        "A resume needs those batches unchanged (what follows them may be new); "
        f"{_drop_remedy(p)}")


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
