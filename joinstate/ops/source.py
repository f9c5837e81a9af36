"""The source operator: where a pushed change set enters, checked before anything runs.

A source must refuse the retraction of a row it does not hold, before any operator
computes from it.  Where an index of the source holds every column of every row (the
physical plan's ``covering`` index: no filter, no nulled column), that index decides,
and its refusal names the source.  Every other checked source keeps a row record
(:mod:`joinstate._source_rows`); an ``unchecked`` source keeps nothing.  The source's
own indexes are staged here, first, so a change the source cannot take (a retraction of
a row it lacks, a second row for a unique key) is refused in the source's name.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from joinstate._source_rows import SourceRows
from joinstate.errors import OverRetractionError, StateCorruptedError
from joinstate.names import source_rows_cf
from joinstate.ops.base import Delta, OperatorBase, PushContext

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa

    from joinstate._index import Index
    from joinstate.db import Database
    from joinstate.nodes import SourceNode
    from joinstate.physical import IndexPlan, PhysicalPlan

__all__ = ["SourceOp"]


class SourceOp(OperatorBase):
    """A source: stages its row record and its own indexes; passes the change on."""

    node: SourceNode

    def __init__(self, node: SourceNode, plan: PhysicalPlan) -> None:
        self.node = node
        self.plan = plan
        self.needed = node.id in plan.columns
        self.columns = plan.columns.get(node.id, list(node.schema.names))
        self.schema = plan.schemas.get(node.id, node.schema)
        self._codec = None
        self.covering: IndexPlan | None = plan.covering.get(node.id)
        self.own = sorted((ip for ip in plan.indexes if ip.base is node),
                          key=lambda ip: ip is not self.covering)
        """The source's indexes, the covering one first."""
        self.record: SourceRows | None = None

    def open(self, store: Database, pipeline: str) -> None:
        """The row record, where the source is checked and no index covers it."""
        if self.node.retractions == "checked" and self.covering is None:
            self.record = SourceRows(store, source_rows_cf(pipeline, self.node.name),
                                     pipeline, self.node.name, self.node.schema)

    def column_families(self) -> tuple[str, ...]:
        """The row record's family, if it keeps one."""
        return (self.record.cf,) if self.record is not None else ()

    def warm(self) -> int:
        """Build what a first retraction would build (the row record's multiset); rows."""
        return self.record.warm() if self.record is not None else 0

    def reset(self) -> None:
        """Forget what the row record derived in memory (rebuilt when next needed)."""
        if self.record is not None:
            self.record.reset()

    def verify(self, indexes: Mapping[int, Index], pipeline: str) -> dict[str, int] | None:
        """Check the row record against its counters and the source's unfiltered indexes.

        ``indexes``: id of an :class:`IndexPlan` -> its opened index.  Returns the
        record's counts (None without a record); raises
        :class:`~joinstate.errors.StateCorruptedError` at the first disagreement.
        """
        if self.record is None:
            return None
        facts = self.record.verify()
        for ip in self.own:
            idx = indexes[id(ip)]
            if ip.predicate is None and idx.rows != facts["rows"]:
                raise StateCorruptedError(
                    f"pipeline {pipeline!r}: source {self.node.label!r} holds "
                    f"{facts['rows']} rows by its row record {self.record.cf} but "
                    f"{idx.rows} by its index {idx.cf}; the state is inconsistent: "
                    "restore it from a copy or repopulate")
        return facts

    def checked_by(self, pipeline: str) -> str:
        """What checks the source's retractions, in words (``explain``)."""
        if self.covering is not None:
            return f"checked by its index {self.covering.cf(pipeline)} (every column)"
        if self.record is not None:
            return f"checked by its row record {self.record.cf} (128-bit row hashes)"
        return "not checked (retractions='unchecked')"

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """Check and stage the change (every column of the source); return its needed part."""
        table, w = ins[0] if ins[0] is not None else (None, None)
        if table is None or w is None:
            return None
        if self.record is not None:
            self.record.stage(table, w, ctx.txn, functools.partial(_row_text, table))
        if not self.needed or not len(w):
            return None
        delta = (table.select(self.columns), w)
        for ip in self.own:
            cf = ctx.index(ip).cf
            with ctx.expression_errors(f"the filter of index {cf}"):
                if ip is not self.covering:
                    ctx.stage(ip, delta)
                    continue
                try:
                    ctx.stage(ip, delta)
                except OverRetractionError as exc:
                    raise OverRetractionError(
                        f"pipeline {ctx.pipeline!r}, source {self.node.name!r} (checked by "
                        f"its index {cf}, which holds every column of "
                        f"every row): {exc}") from exc
        return delta


def _row_text(table: pa.Table, i: int) -> str:
    """Row ``i`` of ``table`` as ``(column=value, ...)``, for messages."""
    row = table.slice(i, 1).to_pylist()[0]
    return "(" + ", ".join(f"{k}={v!r}" for k, v in row.items()) + ")"
