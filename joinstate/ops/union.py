"""The bag-union operator (SQL ``UNION ALL``): its changed inputs' changes, concatenated."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from joinstate.ops.base import Delta, OperatorBase, PushContext, as_schema

__all__ = ["UnionOp"]


class UnionOp(OperatorBase):
    """Every changed input's rows, in this node's columns and types."""

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """The concatenation (weights kept; nothing consolidated)."""
        parts = [d for d in ins if d is not None]
        tables = [as_schema(t.select(self.columns), self.schema) for t, _ in parts]
        return pa.concat_tables(tables), np.concatenate([w for _, w in parts])
