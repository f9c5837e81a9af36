"""compaction: policies that steer RocksDB compaction while a join's state is populated.

Population (DESIGN.md §3) writes far more than it reads, and the two sides of a join are
asymmetric: the small side is probed, the big side is only written.  The policies here
observe population events (a side finished, a batch was written, a threshold was crossed,
population ended) and act through rocksdict on individual column families.  The guard
makes sure no column family is left with auto-compaction disabled, whatever happens.

    control = compaction.CompactionControl(store, {"left": [...], "right": [...]})
    policy = compaction.EpsioPolicy()
    with compaction.guarded(control):
        policy.observe(compaction.SideFinished("left", small=True), control)
"""

from compaction.bulkload import BulkLoadPolicy
from compaction.control import CompactionControl, guarded
from compaction.defaults import RocksDBDefaults
from compaction.epsio import EpsioPolicy
from compaction.guard import Guard
from compaction.metrics import (
    auto_compaction_flags,
    rocksdb_activity,
    statistics_counters,
)
from compaction.policy import (
    BatchWritten,
    CompactionPolicy,
    Event,
    PopulationEnded,
    PopulationStarted,
    SideFinished,
    ThresholdCrossed,
)

__all__ = [
    "BatchWritten",
    "BulkLoadPolicy",
    "CompactionControl",
    "CompactionPolicy",
    "EpsioPolicy",
    "Event",
    "Guard",
    "PopulationEnded",
    "PopulationStarted",
    "RocksDBDefaults",
    "SideFinished",
    "ThresholdCrossed",
    "auto_compaction_flags",
    "guarded",
    "rocksdb_activity",
    "statistics_counters",
]
