"""joinstate: symmetric hash join state in RocksDB, with Z-set change sets in and out.

The public face is small on purpose::

    import joinstate
    with joinstate.StateStore(path) as store:
        join = store.join("j", left=joinstate.Side(...), right=joinstate.Side(...))
        out = join.push("left", delta)   # a pyarrow Table with a ``_weight`` column

Importing this package never imports pyspark (DESIGN.md §6).
"""

from joinstate.errors import (
    JoinSpecMismatchError,
    JoinStateError,
    OptionsError,
    OverRetractionError,
    SchemaMismatchError,
    StateClosedError,
    StateCorruptedError,
    StateLockedError,
    StateReadOnlyError,
    UniqueKeyViolationError,
)
from joinstate.join import How, Join, output_schema
from joinstate.options import IndexOptions, StoreOptions
from joinstate.schema import WEIGHT
from joinstate.side import Side
from joinstate.store import StateStore

__all__ = [
    "WEIGHT",
    "How",
    "IndexOptions",
    "Join",
    "JoinSpecMismatchError",
    "JoinStateError",
    "OptionsError",
    "OverRetractionError",
    "SchemaMismatchError",
    "Side",
    "StateClosedError",
    "StateCorruptedError",
    "StateLockedError",
    "StateReadOnlyError",
    "StateStore",
    "StoreOptions",
    "UniqueKeyViolationError",
    "output_schema",
]

__version__ = "0.1.0"
