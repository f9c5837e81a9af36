"""Pipeline operators: one module per operator, behind one contract (:mod:`.base`).

:data:`OPERATORS` maps each node class of :mod:`joinstate.nodes` to the class that
computes it; the runtime (:mod:`joinstate.pipeline`) builds one operator per needed node
with :func:`operator_for`.  Adding an operator is a node class, a module here and a line
in the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from joinstate.errors import SchemaMismatchError
from joinstate.nodes import (
    AggNode,
    CheckNode,
    FilterNode,
    JoinAllNode,
    JoinNode,
    Node,
    ProjectNode,
    RepeatNode,
    SourceNode,
    UnionNode,
    UniqueNode,
    WindowNode,
)
from joinstate.ops.aggregate import AggregateOp
from joinstate.ops.base import (
    STRATEGIES,
    Delta,
    Operator,
    OperatorBase,
    OperatorRun,
    PushContext,
    Strategies,
)
from joinstate.ops.check import CheckOp
from joinstate.ops.filter import FilterOp
from joinstate.ops.join import JoinOp
from joinstate.ops.join_all import JoinAllOp
from joinstate.ops.project import ProjectOp
from joinstate.ops.repeat import RepeatOp
from joinstate.ops.source import SourceOp
from joinstate.ops.union import UnionOp
from joinstate.ops.unique import UniqueOp
from joinstate.ops.window import WindowOp

if TYPE_CHECKING:
    from joinstate.physical import PhysicalPlan

__all__ = ["OPERATORS", "STRATEGIES", "Delta", "Operator", "OperatorBase", "OperatorRun",
           "PushContext", "Strategies", "operator_for"]

OPERATORS: dict[type[Node], type[OperatorBase]] = {
    SourceNode: SourceOp,
    FilterNode: FilterOp,
    CheckNode: CheckOp,
    ProjectNode: ProjectOp,
    UnionNode: UnionOp,
    RepeatNode: RepeatOp,
    JoinNode: JoinOp,
    JoinAllNode: JoinAllOp,
    AggNode: AggregateOp,
    WindowNode: WindowOp,
    UniqueNode: UniqueOp,
}
"""Node class -> operator class."""


def operator_for(node: Node, plan: PhysicalPlan) -> OperatorBase:
    """The operator computing ``node`` under ``plan``."""
    cls = OPERATORS.get(type(node))
    if cls is None:
        msg = f"internal: no operator computes {type(node).__name__} ({node.label})"
        raise SchemaMismatchError(msg)
    return cls(node, plan)
