"""The memtable of each index while population writes it.

A join populated asymmetrically (``asymmetric``, ``bulk``) gives its small, probed
side a hash skip list (point lookups by key prefix twice as fast as a skip list's
while the side is still in the memtable) and its big, write-only side a skip list
(the cheapest to insert into).  ``symmetric`` keeps the store's memtable: it is the
baseline the other strategies are measured against.  Pipelines keep the store's
memtable for every index: their probed indexes are small dimensions read through the
in-memory probe cache, where the memtable's lookup speed does not show.
``None`` means the store's memtable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.rule import Decision
from planner.rules._text import rows

if TYPE_CHECKING:
    from joinstate.options import Memtable
    from planner.context import PlanContext

__all__ = ["MemtableChoice"]

TOPIC = "memtable"
SMALL_MEMTABLE: Memtable = "hash_skip_list"
BIG_MEMTABLE: Memtable = "skiplist"


class MemtableChoice:
    """Decide each index's memtable (``None``: the store's).

    >>> from planner.plan import plan_join
    >>> from planner.stats import given
    >>> p = plan_join(given("left", 10), given("right", 99), strategy="asymmetric")
    >>> p.get("memtable", p.side_index("left")), p.get("memtable", p.side_index("right"))
    ('hash_skip_list', 'skiplist')
    """

    name = "memtable"

    def apply(self, context: PlanContext) -> list[Decision]:
        """One decision per index."""
        if context.kind == "pipeline":
            return [Decision(TOPIC, ix.name, None, "the store's memtable: pipeline population "
                             "keeps it for every index (probed indexes are read through the "
                             "probe cache)", {"rows": context.rows(ix.stream)}, self.name)
                    for ix in context.indexes]
        j = context.joins[0]
        small = context.choice("small_side", j.name)
        strategy = context.choice("strategy", j.name)
        fixed = context.given.get("memtables")
        out = []
        for side in ("left", "right"):
            ix = j.index(side)
            role = "small" if side == small else "big"
            n = context.rows(j.stream(side))
            figures = {"role": role, "rows": n, "strategy": strategy}
            if fixed is not None:
                m = fixed.get(role)
                out.append(Decision(TOPIC, ix, m, f"{m or 'store default'} given by the caller "
                                    f"for the {role} side", figures, self.name))
            elif strategy in ("asymmetric", "bulk") and small is not None:
                m = SMALL_MEMTABLE if role == "small" else BIG_MEMTABLE
                why = ("the small side is probed by every big-side row: hash lookups by key "
                       "prefix" if role == "small" else
                       "the big side is only written while it loads: the cheapest inserts")
                out.append(Decision(TOPIC, ix, m, f"{m}: {why} ({side}, {rows(n)} rows)",
                                    figures, self.name))
            else:
                out.append(Decision(TOPIC, ix, None, f"the store's memtable: strategy "
                                    f"{strategy} keeps RocksDB's defaults", figures, self.name))
        return out
