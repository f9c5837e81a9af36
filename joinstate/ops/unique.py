"""The verification of a source's further unique key (:class:`~joinstate.nodes.UniqueNode`).

A source may declare unique keys beyond its primary one (``also_unique``); the planner
relies on them (a value of such a key determines every other column of its row), so
they are verified, not trusted.  This operator keeps, per key value, the one row that
holds it, and refuses a push that would leave two holders, before anything is written.

What it keeps: an index (the ``key`` layout: one RocksDB entry per key value) whose rows
are the key's columns and a 128-bit hash (:func:`joinstate._source_rows.row_hashes`) of
the holding row's identity: the key and the source's primary unique key when it declares
one (a row is the row its primary key names), else the whole row.  A holder costs one
small entry, not a copy of the row, and an update that keeps both keys (a new name for
customer 7) changes nothing here.  The index's own rules are the check: a value already
held by another row, two rows of one push with one value, a row inserted twice, all raise
:class:`~joinstate.errors.UniqueKeyViolationError`; the retraction of a row that is not
the value's holder raises :class:`~joinstate.errors.OverRetractionError`.  An update
retracts its old row and inserts the new one in one push (or the retraction first).
Each is re-raised naming the pipeline, the source and the key.  A push of only new
values into an index whose key-hash set is built (population: from the start) is written
without reading RocksDB, as the unique layout does for joins.

A NULL in the key is refused as well (:class:`~joinstate.errors.UniqueKeyViolationError`):
such a key is a key as a primary key is (``NOT NULL UNIQUE``), not SQL's ``UNIQUE``
constraint, which lets any number of rows hold a NULL.  The planner relies on the key
determining the row's other columns; two rows with a NULL there would break that (an
aggregate grouping by the key would find its NULL group on several shards).

No output: nothing reads a check; on N shards it runs where its input is hashed by the
key (the source delivered a second time, routed by that key), so that rows equal on the
key meet on one shard.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate._index import Index
from joinstate._source_rows import row_hashes
from joinstate.errors import OverRetractionError, UniqueKeyViolationError
from joinstate.keys import KeyCodec, key_plan
from joinstate.names import index_cf
from joinstate.ops.base import Delta, IndexedOperator, PushContext
from joinstate.schema import WEIGHT
from joinstate.side import Side

if TYPE_CHECKING:
    from joinstate.db import Database
    from joinstate.nodes import UniqueNode
    from joinstate.physical import PhysicalPlan

__all__ = ["UniqueOp", "unique_cf"]

_HOLDER = ("__holder_lo", "__holder_hi")
"""The two 64-bit halves of the holding row's hash (stored as int64)."""


def unique_cf(pipeline: str, node: UniqueNode) -> str:
    """The index family of check ``node`` of ``pipeline`` (an index of the pipeline's)."""
    return index_cf(f"{pipeline}~{node.label}~{node.source}", list(node.key))


class UniqueOp(IndexedOperator):
    """Keeps each key value's holder; refuses a second one (module docstring)."""

    node: UniqueNode

    def __init__(self, node: UniqueNode, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        inp = node.inputs[0]
        self.in_columns: list[str] = list(plan.columns[inp.id])
        self.identity = list(dict.fromkeys([*node.key, *node.identity]))
        in_schema = plan.schemas[inp.id]
        holder = list(_HOLDER)
        while any(h in self.in_columns for h in holder):
            holder = ["_" + h for h in holder]
        self.holder = holder
        self.stored = pa.schema([in_schema.field(c) for c in node.key]
                                + [pa.field(h, pa.int64(), nullable=False) for h in holder])
        self.pipeline = ""

    def open(self, store: Database, pipeline: str) -> None:
        """The index of holders by key value (created if new)."""
        node = self.node
        key = list(node.key)
        side = Side(self.stored, key, key)
        plan = key_plan(self.stored, key, self.stored, key)
        idx = Index(store, unique_cf(pipeline, node), node.label, side,  # type: ignore[arg-type]
                    KeyCodec(key, plan, node.label), track_degree=False)
        for name in idx.column_families():
            store.cf(name)
        idx.restore_cache()
        self.index = idx
        self.pipeline = pipeline

    def explain_state(self) -> list[str]:
        """What it keeps and what a push costs."""
        idx = self.state()
        return [f"check {self.node.label}: {', '.join(self.node.key)} unique in source "
                f"{self.node.source}, one holder per value in {idx.cf} ({idx.rows:,} "
                "values held); a push writes one entry per changed row (read first only "
                "for retractions and values already seen)"]

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """Check the change and stage its holders; no output."""
        if ins[0] is None:
            return None
        table, w = ins[0]
        rows = table.select(self.in_columns)
        keys = list(self.node.key)
        what = (f"pipeline {ctx.pipeline!r}, source {self.node.source!r}: its declared unique "
                f"key ({', '.join(keys)})")
        for c in keys:
            col = rows.column(c)
            if col.null_count:
                r = int(np.flatnonzero(np.asarray(
                    pc.is_null(col).to_numpy(zero_copy_only=False), bool))[0])
                row = rows.slice(r, 1).to_pylist()[0]
                err = UniqueKeyViolationError if w[r] > 0 else OverRetractionError
                raise err(
                    f"{what} has a NULL in column {c!r} in row {row} ({ctx.blame}); a "
                    "declared unique key holds no NULL (it locates its row), so nothing was "
                    "applied; declare only columns that are never NULL")
        lo, hi = row_hashes(rows.select(self.identity))
        held = rows.select(keys)
        held = held.append_column(self.holder[0], pa.array(lo.view(np.int64)))
        held = held.append_column(self.holder[1], pa.array(hi.view(np.int64)))
        idx = self.state()
        batch = idx.prepare(held.append_column(pa.field(WEIGHT, pa.int64()),
                                               pa.array(w, pa.int64())))
        if not batch.rows:
            return None
        try:
            idx.stage(batch, ctx.txn)
        except UniqueKeyViolationError as exc:
            raise UniqueKeyViolationError(
                f"{what} would be held by more than one row ({ctx.blame}; checked by "
                f"{self.node.label}): {exc}") from None
        except OverRetractionError as exc:
            raise OverRetractionError(
                f"{what}: a retracted row is not the row holding its value ({ctx.blame}; "
                f"checked by {self.node.label}): {exc}") from None
        ctx.txn.after_commit(functools.partial(idx.after_write, batch))
        return None
