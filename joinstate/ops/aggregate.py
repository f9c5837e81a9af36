"""The group-by operator: per-group aggregates kept in the group state's column families.

The operator evaluates the group keys and the aggregate arguments on its input's change
(one Arrow plan) and hands them to :class:`~joinstate.aggregate.GroupState`, which reads
the touched groups, folds the change in and stages the writes; the output is, per group
whose row changed, the old row retracted and the new one inserted.  A group disappears
when its row count reaches zero.  An aggregate without group keys has its row from the
pipeline's creation on (:meth:`AggregateOp.initial`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate._expr import evaluate, output_types
from joinstate.aggregate import AggSpec, GroupState
from joinstate.errors import SchemaMismatchError
from joinstate.ops.base import Delta, OperatorBase, PushContext, as_schema

if TYPE_CHECKING:
    from joinstate.db import Database
    from joinstate.nodes import AggNode
    from joinstate.physical import PhysicalPlan

__all__ = ["AggregateOp"]


class AggregateOp(OperatorBase):
    """``group_by(keys).aggregate(...)`` over its input's changes."""

    node: AggNode

    def __init__(self, node: AggNode, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        self.exprs = [pc.field(k) for k in node.keys]
        self.names = list(node.keys)
        for i, (_, _, expr) in enumerate(node.aggs):
            if expr is not None:
                self.exprs.append(expr)
                self.names.append(f"__arg{i}")
        self.group: GroupState | None = None

    def open(self, store: Database, pipeline: str) -> None:
        """The group state, in ``agg[<pipeline>~<label>]`` (and ``.minmax``)."""
        node = self.node
        src = node.inputs[0].schema
        fields = [src.field(k) for k in node.keys]
        specs = []
        for i, (name, func, expr) in enumerate(node.aggs):
            if expr is None:
                specs.append(AggSpec(name, cast("Any", func), None))
                continue
            (t,) = output_types(src, [expr], [name], f"aggregate {name!r}")
            fields.append(pa.field(f"__arg{i}", t))
            specs.append(AggSpec(name, cast("Any", func), f"__arg{i}"))
        g = GroupState(store, f"{pipeline}~{node.label}", pa.schema(fields), list(node.keys),
                       specs)
        got = [(f.name, f.type) for f in g.output_schema]
        want = [(f.name, f.type) for f in node.schema]
        if got != want:
            msg = f"internal: aggregate {node.label} state schema {got} != {want}"
            raise SchemaMismatchError(msg)
        self.group = g

    def state(self) -> GroupState:
        """The opened group state."""
        assert self.group is not None, "open() the operator first"
        return self.group

    def column_families(self) -> tuple[str, ...]:
        """The group state's families."""
        return self.group.column_families() if self.group is not None else ()

    def initial(self) -> Delta | None:
        """A global aggregate's row over no input (count 0, the others NULL)."""
        if self.node.keys:
            return None
        row = self.state().empty_row().select(self.columns)
        return as_schema(row, self.schema), np.ones(1, np.int64)

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """Fold the change into the touched groups; their rows' changes."""
        assert ins[0] is not None
        table, w = ins[0]
        # count(*) alone without group keys reads no column: the rows still count (a
        # table of no columns would have none).
        args = evaluate(table, self.exprs, self.names) if self.exprs else table
        out, wo = self.state().stage(args, w, ctx.txn)
        if not len(wo):
            return None
        return as_schema(out.select(self.columns), self.schema), wo
