"""Aggregation state of a pipeline's group-by, kept in RocksDB.

:class:`GroupState` (:mod:`joinstate.aggregate.state`) keeps one row per group and folds
a batch into the groups it touches; each aggregate function is one class in
:mod:`joinstate.aggregate.functions`; min/max keep every value's multiplicity in a
family of their own (:mod:`joinstate.aggregate.minmax`), encoded so that byte order is
value order (:mod:`joinstate.aggregate.values`).  The pipeline's group-by operator
evaluates the key and argument expressions and calls :meth:`GroupState.stage`.
"""

from joinstate.aggregate.functions import AggFunc, AggSpec
from joinstate.aggregate.state import GroupState

__all__ = ["AggFunc", "AggSpec", "GroupState"]
