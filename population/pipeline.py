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
* **auto**: asymmetric when the largest source is at least four times the smallest
  non-empty one, symmetric otherwise.

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
    srcs = {name: Source(name, data, rows_per_batch) for name, data in sources.items()}
    counts: dict[str, int] = {}
    for name, src in srcs.items():
        n = sizes.get(name) if sizes else None
        counts[name] = n if n is not None else (src.rows if src.rows is not None else -1)
    # Unknown sizes go last: they are usually the streams, not the dimensions.
    order = sorted(srcs, key=lambda s: (counts[s] < 0, counts[s], p.sources.index(s)))
    known = [c for c in counts.values() if c > 0]
    chosen = strategy
    if strategy == "auto":
        chosen = "asymmetric" if known and max(known) >= 4 * min(known) else "symmetric"
    report = PipelineReport(p.name, chosen if strategy != "auto" else f"auto->{chosen}",
                            order)
    store = p.store
    if store is None:
        raise PopulationError(f"pipeline {p.name!r} is bound to a closed state store")
    proc = psutil.Process()
    peak = proc.memory_info().rss
    takes_batch = sink is not None and sink_takes_batch(sink)
    total = sum(c for c in counts.values() if c > 0) or None
    bar = Progress(progress, total, f"populate {p.name}")
    control = CompactionControl(store, {})
    t0 = time.perf_counter()
    operators_before = p.operator_rows()
    try:
        with guarded(control):
            for i, name in enumerate(order):
                later = order[i:]
                written = {ix.name: ix for ix in p.source_indexes(name)}
                read_later = {ix.name for s in later for ix in p.probed_indexes(s)}
                if chosen == "asymmetric":
                    for ix_name, ix in written.items():
                        if ix_name not in read_later:
                            for cf in ix.data_column_families:
                                control.disable(cf, f"{name} loads; nothing reads {ix_name} "
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
                if mark is not None and index < skip:
                    raise PopulationInterruptedError(
                        f"pipeline {p.name!r}: source {name!r} has {index} batches, fewer "
                        f"than the {skip} the interrupted population loaded"
                    )
                t = time.perf_counter()
                p.push(name, p.source_schema(name).empty_table(),
                       progress=_marker(index, rows_done, digest, True))
                if chosen == "asymmetric":
                    later_reads = {ix.name for s in order[i + 1:] for ix in p.probed_indexes(s)}
                    for ix_name, ix in written.items():
                        if ix_name in later_reads:
                            for cf in ix.data_column_families:
                                control.compact(cf, f"{name} is loaded; later sources "
                                                    f"probe {ix_name}")
                load.seconds += time.perf_counter() - t
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
    return report
