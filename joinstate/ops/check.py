"""The check operator: its input's change passed on unchanged, once its new rows pass.

Every row the change inserts (positive weight) must satisfy the node's predicate; the
first that does not raises :class:`~joinstate.errors.CheckViolationError` before the
push commits, so nothing of it is applied.  Retractions are not checked: a row leaving
cannot break what the stream holds.  No state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from joinstate._expr import mask
from joinstate.errors import CheckViolationError
from joinstate.ops.base import Delta, OperatorBase, PushContext

if TYPE_CHECKING:
    from joinstate.nodes import CheckNode

__all__ = ["CheckOp"]


class CheckOp(OperatorBase):
    """Raises on an inserted row failing ``node.expr``; otherwise the identity."""

    node: CheckNode

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """The input's change (its node's columns), after checking its inserted rows."""
        assert ins[0] is not None
        table, w = ins[0]
        added = np.flatnonzero(w > 0)
        if len(added):
            with ctx.expression_errors(lambda: f"{self.node.label} ({self.node.expr})"):
                ok = mask(table.take(added), self.node.expr)
            if not ok.all():
                bad = table.slice(int(added[np.flatnonzero(~ok)[0]]), 1).to_pylist()[0]
                raise CheckViolationError(
                    f"pipeline {ctx.pipeline!r}, {self.node.label}: {self.node.message} "
                    f"(the row {bad} fails {self.node.expr}); nothing of {ctx.blame} was "
                    "applied")
        return table.select(self.columns), w
