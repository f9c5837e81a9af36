"""compaction: policies that steer RocksDB compaction while a join's state is populated.

Population writes far more than it reads, and the two sides of a join are asymmetric:
the small side is probed, the big side is only written.  The policies here observe
population events (a side finished, a batch was written, a threshold was crossed,
population ended) and act through the state store on individual column families.  The
guard makes sure no column family is left with auto-compaction disabled, whatever
happens, and is the one place where deletes re-enable compaction.

    control = compaction.CompactionControl(store, {s: join.index(s) for s in ("left", "right")})
    policies = [compaction.AsymmetricPolicy(), compaction.Guard()]
    with compaction.guarded(control):
        for p in policies:
            p.observe(compaction.SideFinished("left", small=True), control)

What RocksDB did meanwhile (statistics counters, per-family properties, the live
compaction switches) is measured by :mod:`joinstate.activity`; its functions are
re-exported here for convenience.
"""

from compaction.asymmetric import AsymmetricPolicy
from compaction.bulkload import BulkLoadPolicy
from compaction.control import CompactionControl, guarded
from compaction.defaults import RocksDBDefaults
from compaction.guard import Guard
from compaction.policy import (
    BatchWritten,
    CompactionPolicy,
    Event,
    PopulationEnded,
    PopulationStarted,
    SideFinished,
    ThresholdCrossed,
)
from joinstate.activity import (
    CF_PROPERTIES,
    auto_compaction_flags,
    counter_delta,
    rocksdb_activity,
    statistics_counters,
)

__all__ = [
    "CF_PROPERTIES",
    "AsymmetricPolicy",
    "BatchWritten",
    "BulkLoadPolicy",
    "CompactionControl",
    "CompactionPolicy",
    "Event",
    "Guard",
    "PopulationEnded",
    "PopulationStarted",
    "RocksDBDefaults",
    "SideFinished",
    "ThresholdCrossed",
    "auto_compaction_flags",
    "counter_delta",
    "guarded",
    "rocksdb_activity",
    "statistics_counters",
]
