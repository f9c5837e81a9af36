"""The N-way join on one key (``join_all``): a delta join with no state of its own.

For the keys a push changed, the product of every leg's rows after the push minus the
product before it, all read from the legs' indexes (legs that are filters of one stream
read one index, probed once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate.ops.keyed import KeyedOperator
from joinstate.zset import checked_mul, expand

if TYPE_CHECKING:
    from joinstate._probe import Entries
    from joinstate.nodes import JoinAllNode
    from joinstate.ops.base import Delta, PushContext

__all__ = ["JoinAllOp"]


class JoinAllOp(KeyedOperator):
    """Π legs(new) - Π legs(old) over the changed keys."""

    node: JoinAllNode

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """The delta join of this push's changed keys (a change that cancels out, none)."""
        both = self.old_and_new(self.keyed(self.cancelled(ins)), ctx)
        if both is None:
            return None
        olds, news, g = both
        products = [self.product(news, g, 1), self.product(olds, g, -1)]
        return self.consolidated([p for p in products if p is not None])

    def product(self, legs: list[Entries], g: int, sign: int) -> Delta | None:
        """Every combination of the legs' rows of one key group, weights multiplied."""
        node = self.node
        first = legs[0]
        picks = [np.arange(len(first.w), dtype=np.int64)]
        w = first.w * sign
        q = first.q
        for leg in legs[1:]:
            a, b = expand(q, leg.q, g)
            picks = [p[a] for p in picks] + [b]
            w = checked_mul(w[a], leg.w[b], f"{node.label}: the weight of a joined row")
            q = q[a]
            if not len(w):
                return None
        arrays = []
        wanted = set(self.schema.names)
        for leg_name, leg, pick in zip(node.legs, legs, picks, strict=True):
            taken = None
            for c in leg.rows.column_names:
                if node.out_name(leg_name, c) in wanted:
                    if taken is None:
                        taken = leg.rows.take(pa.array(pick))
                    arrays.append((node.out_name(leg_name, c), taken.column(c)))
        by_name = dict(arrays)
        return pa.Table.from_arrays([by_name[f.name] for f in self.schema],
                                    schema=self.schema), w
