"""The projection operator: one expression per output column.

Only the needed output columns are computed.  A projection that only picks (and
renames) columns is a column selection, with no Acero plan (:func:`joinstate._expr.
evaluate`); the result is cast to the node's schema only when it differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from joinstate._expr import evaluate
from joinstate.ops.base import Delta, OperatorBase, PushContext, as_schema

if TYPE_CHECKING:
    from joinstate.nodes import ProjectNode
    from joinstate.physical import PhysicalPlan

__all__ = ["ProjectOp"]


class ProjectOp(OperatorBase):
    """Each needed output column's expression over the input's change."""

    node: ProjectNode

    def __init__(self, node: ProjectNode, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        pos = {f.name: i for i, f in enumerate(node.schema)}
        self.exprs = [node.exprs[pos[c]] for c in self.columns]

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """The projected rows, same weights."""
        assert ins[0] is not None
        table, w = ins[0]
        return as_schema(evaluate(table, self.exprs, self.columns), self.schema), w
