"""The repeat operator: each row of its input's change, its count column times.

A row of weight ``w`` and count ``n`` stands for ``w * n`` copies of the row without the
count: the weights are multiplied (checked: an overflow raises before anything is
written) and rows counted zero times leave the change.  Linear in its input, so it
keeps no state: a row whose count changes arrives as the old row retracted and the new
one inserted, and their products are the difference.  A NULL or negative count is
refused with :class:`~joinstate.errors.ExpressionError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate.errors import ExpressionError
from joinstate.ops.base import Delta, OperatorBase, PushContext
from joinstate.zset import checked_mul

if TYPE_CHECKING:
    from joinstate.nodes import RepeatNode

__all__ = ["RepeatOp"]


class RepeatOp(OperatorBase):
    """``w * count`` copies of each row (the count column dropped)."""

    node: RepeatNode

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """The input's rows with their weights multiplied by their counts."""
        assert ins[0] is not None
        table, w = ins[0]
        col = table.column(self.node.count)
        bad = col.null_count > 0 or (len(col) > 0 and pc.min(col).as_py() < 0)
        if bad:
            at = pc.index(pc.fill_null(pc.less(col, 0), True), True).as_py()
            raise ExpressionError(
                f"pipeline {ctx.pipeline!r}, {self.node.label}: the count column "
                f"{self.node.count!r} is {col[at].as_py()!r} in the row "
                f"{table.slice(at, 1).to_pylist()[0]}; a row is repeated a number of times "
                f">= 0; nothing of {ctx.blame} was applied")
        n = np.asarray(col.cast(pa.int64()).to_numpy(), dtype=np.int64)
        wn = checked_mul(w, n, f"{self.node.label}: a row's weight times its count "
                                f"{self.node.count!r}")
        keep = np.flatnonzero(wn)
        if not len(keep):
            return None
        if len(keep) < len(wn):
            table, wn = table.take(pa.array(keep)), wn[keep]
        return table.select(self.columns), wn
