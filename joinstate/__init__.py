"""joinstate: symmetric hash join state in RocksDB, with Z-set change sets in and out.

The public face is small on purpose::

    import joinstate
    with joinstate.StateStore(path) as store:
        join = store.join("j", left=joinstate.Side(...), right=joinstate.Side(...))
        out = join.push("left", delta)   # a pyarrow Table with a ``_weight`` column

Importing this package never imports pyspark.  Tests of pipelines built on it compare
change sets as Z-sets with :mod:`joinstate.testing`.
"""

from joinstate.batch import PreparedBatch
from joinstate.changes import from_changes, to_changes
from joinstate.checkpoint import CheckpointInfo
from joinstate.db import Database
from joinstate.errors import (
    BulkWriteRefused,
    CheckpointCorruptedError,
    CheckpointIOError,
    CheckpointNotFoundError,
    CheckViolationError,
    CommitConflictError,
    ExpressionError,
    JoinSpecMismatchError,
    JoinStateError,
    NotAStateStoreError,
    OptionsError,
    OverRetractionError,
    SchemaMismatchError,
    StateClosedError,
    StateCorruptedError,
    StateIOError,
    StateLockedError,
    StateReadOnlyError,
    UniqueKeyViolationError,
    WeightOverflowError,
)
from joinstate.graph import Graph, GroupedStream, Stream, join_all, source
from joinstate.join import How, Join, output_schema
from joinstate.options import IndexOptions, Memtable, StoreOptions
from joinstate.pipeline import Pipeline
from joinstate.schema import WEIGHT
from joinstate.side import Side, SideName
from joinstate.store import StateStore
from joinstate.summary import stats_summary
from joinstate.transaction import BulkSink, Transaction, WriteBlock
from joinstate.version import __version__ as __version__
from joinstate.views import IndexInfo

__all__ = [
    "WEIGHT",
    "BulkSink",
    "BulkWriteRefused",
    "CheckpointCorruptedError",
    "CheckpointIOError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CheckViolationError",
    "CommitConflictError",
    "ExpressionError",
    "Database",
    "Graph",
    "How",
    "IndexInfo",
    "IndexOptions",
    "Join",
    "JoinSpecMismatchError",
    "JoinStateError",
    "Memtable",
    "Pipeline",
    "GroupedStream",
    "NotAStateStoreError",
    "OptionsError",
    "OverRetractionError",
    "PreparedBatch",
    "SchemaMismatchError",
    "Side",
    "SideName",
    "StateClosedError",
    "StateCorruptedError",
    "StateIOError",
    "StateLockedError",
    "StateReadOnlyError",
    "StateStore",
    "StoreOptions",
    "Stream",
    "Transaction",
    "UniqueKeyViolationError",
    "WeightOverflowError",
    "WriteBlock",
    "from_changes",
    "join_all",
    "output_schema",
    "source",
    "stats_summary",
    "to_changes",
]
