"""The population reports: what was loaded, how long it took, what RocksDB did meanwhile.

One population run measures the same things whatever it loads; a join's report shows
them per side (:class:`Report`, with :class:`SideReport`), a pipeline's per source,
operator and index (:class:`PipelineReport`, with :class:`SourceLoad`).  JSON-
serialisable, so a benchmark can keep them and a planner can learn from the statistics
of earlier runs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PipelineReport", "Report", "SideReport", "SourceLoad"]


@dataclass(frozen=True)
class SideReport:
    """One side: rows and batches applied, seconds spent, how they were written.

    ``bulk_entries`` counts index entries (consolidated rows) written as SST files.
    """

    rows: int
    batches: int
    seconds: float
    deletes: int = 0
    finished_at: float | None = None
    bulk_entries: int = 0
    sst_files: int = 0
    memtable: str | None = None

    @property
    def rows_per_second(self) -> float:
        """Return rows applied per second spent on this side."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Report:
    """Everything :func:`population.populate` measured.

    Byte counts come from RocksDB statistics, diffed over the population (DB-wide, so
    they include every column family of the store).  ``bytes_written`` is what reached
    the disk: WAL + memtable flushes + compaction output + ingested SST files.
    ``l0_samples`` is ``[seconds since start, {column family: L0 files}]`` sampled at most
    every ``sample_interval`` seconds; ``actions`` lists every compaction switch.

    A resumed population (``populate(..., resume=True)``) reports what *this call* did in
    ``sides`` and the output fields; ``resumed`` gives, per side, what the interrupted
    run had durably loaded (``batches``, ``rows``, ``done``: skipped here), and
    ``redelivered`` the first batch index per side whose output this call delivers
    again (outputs of batches ``>= redelivered[side]`` that the interrupted run delivered
    are delivered again; earlier ones never are).  Both are empty for a fresh run.

    ``plan`` is the planner's plan of this population (:meth:`planner.plan.Plan.to_dict`:
    every decision with its reason and figures) and ``explain`` the same as a readable
    tree; :meth:`summary` ends with it.
    """

    join: str
    strategy: dict[str, Any]
    reason: str
    order: str
    small_side: str | None
    small_side_from: str
    sides: dict[str, SideReport]
    output_rows: int
    output_weight: int
    wall_seconds: float
    bytes_written: int
    ingested_bytes: int
    rocksdb: dict[str, int]
    l0_samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    l0_max: dict[str, int] = field(default_factory=dict)
    state_bytes: int = 0
    rss_start: int = 0
    peak_rss: int = 0
    actions: list[dict[str, Any]] = field(default_factory=list)
    phase: str = "live"
    resumed: dict[str, dict[str, Any]] = field(default_factory=dict)
    redelivered: dict[str, int] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    explain: str = ""

    @property
    def rows(self) -> int:
        """Return rows applied on both sides."""
        return sum(s.rows for s in self.sides.values())

    @property
    def compaction_bytes(self) -> int:
        """Bytes RocksDB compaction read plus wrote during the population."""
        return int(self.rocksdb.get("compaction_read_bytes", 0)
                   + self.rocksdb.get("compaction_write_bytes", 0))

    @property
    def compaction_seconds(self) -> float:
        """Wall time RocksDB spent in compactions during the population (all threads)."""
        return self.rocksdb.get("compaction_micros", 0) / 1e6

    @property
    def stall_seconds(self) -> float:
        """Time writers were stalled by RocksDB (too many L0 files, pending bytes)."""
        return self.rocksdb.get("stall_micros", 0) / 1e6

    @property
    def rows_per_second(self) -> float:
        """Return input rows per wall-clock second."""
        return self.rows / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict (JSON-able) including the derived rates."""
        d = dataclasses.asdict(self)
        d["rows"] = self.rows
        d["rows_per_second"] = round(self.rows_per_second, 1)
        d["compaction_bytes"] = self.compaction_bytes
        d["compaction_seconds"] = self.compaction_seconds
        d["stall_seconds"] = self.stall_seconds
        for name, s in self.sides.items():
            d["sides"][name]["rows_per_second"] = round(s.rows_per_second, 1)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        """Serialise to JSON."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """Rebuild a report from :meth:`to_dict` output (derived fields are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        side_names = {f.name for f in dataclasses.fields(SideReport)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["sides"] = {
            s: SideReport(**{k: v for k, v in r.items() if k in side_names})
            for s, r in d["sides"].items()
        }
        kw["l0_samples"] = [(t, dict(v)) for t, v in d.get("l0_samples", [])]
        return cls(**kw)

    def summary(self) -> str:
        """Return a few human-readable lines (what the CLI prints)."""
        mib = 1 << 20
        lines = [
            f"join {self.join}: strategy {self.strategy.get('name')} ({self.reason or 'given'})"
            f", order {self.order}, small side {self.small_side} ({self.small_side_from})",
        ]
        if self.resumed:
            lines.append("  resumed: " + ", ".join(
                f"{s} after {r['batches']} batches ({r['rows']:,} rows)"
                for s, r in sorted(self.resumed.items())
            ) + "; outputs re-delivered from batch " + ", ".join(
                f"{s} {i}" for s, i in sorted(self.redelivered.items())))
        for name, s in self.sides.items():
            lines.append(
                f"  {name:<5} {s.rows:>12,} rows {s.batches:>6} batches {s.seconds:8.2f} s "
                f"{s.rows_per_second:>12,.0f} rows/s  bulk {s.bulk_entries:,} entries in "
                f"{s.sst_files} SST files"
            )
        lines.append(
            f"  output {self.output_rows:,} rows (weight {self.output_weight:,}); wall "
            f"{self.wall_seconds:.2f} s = {self.rows_per_second:,.0f} rows/s"
        )
        lines.append(
            f"  written {self.bytes_written / mib:,.1f} MiB, compaction read+write "
            f"{self.compaction_bytes / mib:,.1f} MiB in "
            f"{self.rocksdb.get('compaction_micros', 0) / 1e6:.2f} s, stalls "
            f"{self.rocksdb.get('stall_micros', 0) / 1e6:.2f} s, L0 max "
            f"{max(self.l0_max.values(), default=0)}, state {self.state_bytes / mib:,.1f} MiB, "
            f"peak RSS {self.peak_rss / mib:,.0f} MiB"
        )
        if self.explain:
            lines += ["  " + line for line in self.explain.splitlines()]
        return "\n".join(lines)


@dataclass
class SourceLoad:
    """What loading one pipeline source took (this call)."""

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
    """What :func:`population.populate` measured loading a pipeline.

    ``strategy``: the one that ran (``auto-><name>`` when the planner chose it);
    ``order``: the sources in load order; per source, operator (rows of change produced)
    and index (rows, entries after the load); the compaction ``actions``; rows of change
    per output; ``redelivered``: per source whose batches a resumed call pushed again,
    the first batch index whose output it delivered again.
    """

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
    """What RocksDB looked like during the load, over time: ``{"t", "source", "rows",
    "stall_micros", "l0", "pending", "bytes"}`` per sample (see
    :class:`population.sampling.Sampler`)."""

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
        d = dataclasses.asdict(self)
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
