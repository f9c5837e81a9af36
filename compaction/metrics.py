"""What RocksDB did: statistics counters, per-family properties and compaction switches.

Statistics are DB-wide and cumulative (rocksdict exposes no per-CF statistics), so a
caller that wants the work of one phase takes two snapshots and subtracts
(:func:`counter_delta`).  Properties are per column family.  Whether auto-compaction is
currently disabled is read from RocksDB's own latest ``OPTIONS-*`` file, which RocksDB
rewrites on every ``SetOptions``: that is the ground truth a test can check, not our
bookkeeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from joinstate.activity import ACTIVITY_COUNTERS, statistics_counters
from joinstate.activity import auto_compaction_flags as _flags_at

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from joinstate import StateStore

__all__ = [
    "ACTIVITY_COUNTERS",
    "CF_PROPERTIES",
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

def counter_delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Return the activity counters (:data:`ACTIVITY_COUNTERS`) added between snapshots."""
    return {
        name: int(after.get(stat, 0)) - int(before.get(stat, 0))
        for name, stat in ACTIVITY_COUNTERS.items()
    }


def auto_compaction_flags(store: StateStore) -> dict[str, bool]:
    """``{column family: auto-compaction disabled?}`` as RocksDB itself last wrote them."""
    return _flags_at(store.path)


def rocksdb_activity(store: StateStore, cfs: Iterable[str] | None = None) -> dict[str, Any]:
    """Summarise what RocksDB has done in ``store`` so far (cumulative since the store was opened).

    ``{"db": {activity counters}, "cf": {name: {properties, "auto_compaction_disabled"}}}``;
    ``cfs`` defaults to every column family.  Meant for ``join.stats()`` and reports.
    """
    counters = statistics_counters(store.statistics())
    flags = auto_compaction_flags(store)
    names = list(cfs) if cfs is not None else [c for c in store.column_families()
                                                 if c != "default"]
    per_cf: dict[str, Any] = {}
    for cf in names:
        props: dict[str, Any] = {p: store.property_int(cf, "rocksdb." + p) for p in CF_PROPERTIES}
        props["auto_compaction_disabled"] = flags.get(cf)
        per_cf[cf] = props
    return {
        "db": {name: counters.get(stat, 0) for name, stat in ACTIVITY_COUNTERS.items()},
        "cf": per_cf,
    }
