"""The filter operator: the rows of its input's change for which the predicate is true.

Filters that read the same stream (q4: the six legs cut from ``year_total``) are
evaluated together, in one Arrow plan, the first time one of them runs in a push: a
plan costs ~70 µs whatever the row count, which dominates small pushes.  The others
find their mask in the push's scratch space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate._expr import mask, masks
from joinstate.nodes import FilterNode
from joinstate.ops.base import Delta, OperatorBase, PushContext

if TYPE_CHECKING:
    from joinstate.physical import PhysicalPlan

__all__ = ["FilterOp"]


class FilterOp(OperatorBase):
    """Rows passing ``node.expr`` (a NULL result drops the row, as in SQL)."""

    node: FilterNode

    def __init__(self, node: FilterNode, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        self.siblings = [c for c in plan.consumers.get(node.inputs[0].id, ())
                         if isinstance(c, FilterNode) and c.id != node.id]
        """The other needed filters of the same input, evaluated with this one."""

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """The passing rows, with this node's columns."""
        assert ins[0] is not None
        table, w = ins[0]
        keep = self._mask(table, ctx)
        if not keep.any():
            return None
        if keep.all():
            return table.select(self.columns), w
        sel = np.flatnonzero(keep)
        return table.take(pa.array(sel)).select(self.columns), w[sel]

    def _mask(self, table: pa.Table, ctx: PushContext) -> np.ndarray:
        cached = ctx.scratch.pop(("mask", self.node.id), None)
        if isinstance(cached, tuple) and cached[0] is table:
            return cached[1]
        if not self.siblings or table.num_rows == 0:
            return mask(table, self.node.expr)
        try:
            got = masks(table, [self.node.expr, *(f.expr for f in self.siblings)])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return mask(table, self.node.expr)  # each on its own: errors name their operator
        for f, m in zip(self.siblings, got[1:], strict=True):
            ctx.scratch[("mask", f.id)] = (table, m)
        return got[0]
