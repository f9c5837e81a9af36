"""What RocksDB has done: statistics counters and the live compaction switches.

Statistics are DB-wide and cumulative (rocksdict exposes no per-CF statistics), so a
caller that wants the work of one phase takes two snapshots and subtracts.  Whether
auto-compaction is currently disabled on a column family is read from RocksDB's latest
``OPTIONS-*`` file, which RocksDB rewrites on every ``SetOptions``: the ground truth, not
our bookkeeping.  The one home of these readings: the core's ``stats()``, compaction
policies and population reports all use this module.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "ACTIVITY_COUNTERS",
    "CF_PROPERTIES",
    "activity_counters",
    "auto_compaction_flags",
    "counter_delta",
    "rocksdb_activity",
    "statistics_counters",
]

CF_PROPERTIES = (
    "num-files-at-level0", "num-files-at-level1", "total-sst-files-size",
    "cur-size-all-mem-tables", "estimate-pending-compaction-bytes", "num-running-compactions",
    "is-write-stopped", "actual-delayed-write-rate",
)
"""Per-column-family RocksDB properties worth reporting (each takes the ``rocksdb.`` prefix)."""

ACTIVITY_COUNTERS = {
    "compaction_read_bytes": "rocksdb.compact.read.bytes",
    "compaction_write_bytes": "rocksdb.compact.write.bytes",
    "compaction_micros": "rocksdb.compaction.times.micros.sum",
    "compaction_cpu_micros": "rocksdb.compaction.times.cpu_micros.sum",
    "compactions": "rocksdb.compaction.times.micros.count",
    "flush_write_bytes": "rocksdb.flush.write.bytes",
    "wal_bytes": "rocksdb.wal.bytes",
    "memtable_bytes_written": "rocksdb.bytes.written",
    "stall_micros": "rocksdb.stall.micros",
    "write_stall_micros": "rocksdb.db.write.stall.sum",
}
"""Report name -> statistics name (histograms as ``<name>.sum`` / ``<name>.count``)."""

log = logging.getLogger(__name__)

_TICKER = re.compile(r"^(\S+) COUNT : (\d+)$")
_HISTO = re.compile(r"^(\S+) P50 .* COUNT : (\d+) SUM : (\d+)$")


def statistics_counters(text: str | None) -> dict[str, int]:
    """Parse RocksDB's statistics dump into ``{name: value}``.

    Tickers keep their name; histograms give ``<name>.count`` and ``<name>.sum``.
    """
    out: dict[str, int] = {}
    if not text:
        return out
    for line in text.splitlines():
        line = line.strip()
        m = _TICKER.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
            continue
        m = _HISTO.match(line)
        if m:
            out[m.group(1) + ".count"] = int(m.group(2))
            out[m.group(1) + ".sum"] = int(m.group(3))
    return out


_OPTIONS_FILE = re.compile(r"^OPTIONS-(\d+)$")
_READ_ATTEMPTS = 50
"""Listings tried when the newest options file vanishes before it is read.

Each vanished file means RocksDB published a newer one; with a millisecond's pause
between tries, fifty outlast a writer replacing its file in a loop on a busy machine."""


def _options_files(path: Path) -> list[tuple[int, Path]]:
    """RocksDB's finished options files in ``path``, by number (oldest first).

    Only ``OPTIONS-<number>``: RocksDB writes ``OPTIONS-<n>.dbtmp`` first and renames it
    when complete, and anything else with that prefix is not its file.
    """
    out = []
    for name in os.listdir(path):
        m = _OPTIONS_FILE.match(name)
        if m:
            out.append((int(m.group(1)), path / name))
    return sorted(out)


def auto_compaction_flags(path: str | Path) -> dict[str, bool]:
    """``{column family: auto-compaction disabled?}`` from RocksDB's latest OPTIONS file.

    A reading for reports, taken while RocksDB may be replacing its options file (it
    deletes older ones after writing a new one): a file that vanishes is looked up
    again.  If none can be read the answer is ``{}`` (unknown), logged; never an error
    that would fail the load being observed.
    """
    folder = Path(path)
    problem: OSError | None = None
    for _ in range(_READ_ATTEMPTS):
        try:
            files = _options_files(folder)
            if not files:
                return {}
            text = files[-1][1].read_text(errors="replace")
        except FileNotFoundError as exc:  # replaced meanwhile: list again
            if not folder.is_dir():
                return {}
            problem = exc
            time.sleep(0.001)
            continue
        except OSError as exc:
            problem = exc
            break
        return _parse_flags(text)
    log.warning("cannot read RocksDB's options file in %s (%s); auto-compaction flags "
                "unknown", folder, problem)
    return {}


def _parse_flags(text: str) -> dict[str, bool]:
    out: dict[str, bool] = {}
    cf: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[CFOptions ") and line.endswith('"]'):
            cf = line[len('[CFOptions "'):-2]
        elif line.startswith("["):
            cf = None
        elif cf is not None and line.startswith("disable_auto_compactions="):
            out[cf] = line.split("=", 1)[1] == "true"
    return out


def activity_counters(text: str | None) -> dict[str, int]:
    """The :data:`ACTIVITY_COUNTERS` read from a statistics dump (0 when absent)."""
    counters = statistics_counters(text)
    return {name: counters.get(stat, 0) for name, stat in ACTIVITY_COUNTERS.items()}


def counter_delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """The activity counters added between two :func:`statistics_counters` snapshots."""
    return {
        name: int(after.get(stat, 0)) - int(before.get(stat, 0))
        for name, stat in ACTIVITY_COUNTERS.items()
    }


class _Readings(Protocol):
    """What :func:`rocksdb_activity` reads from a store."""

    path: Path

    def column_families(self) -> list[str]: ...

    def property_int(self, cf: str, name: str) -> int | None: ...

    def statistics(self) -> str | None: ...


def rocksdb_activity(store: _Readings, cfs: Iterable[str] | None = None) -> dict[str, Any]:
    """What RocksDB has done in ``store`` so far (cumulative since it was opened).

    ``{"db": {activity counters}, "cf": {name: {properties, "auto_compaction_disabled"}}}``;
    ``cfs`` defaults to every column family.
    """
    flags = auto_compaction_flags(store.path)
    names = list(cfs) if cfs is not None else [c for c in store.column_families()
                                                 if c != "default"]
    per_cf: dict[str, Any] = {}
    for cf in names:
        props: dict[str, Any] = {p: store.property_int(cf, "rocksdb." + p) for p in CF_PROPERTIES}
        props["auto_compaction_disabled"] = flags.get(cf)
        per_cf[cf] = props
    return {"db": activity_counters(store.statistics()), "cf": per_cf}
