"""The row layout of each index: ``key``, ``unique`` or ``bag``, from key uniqueness.

The layout follows the declaration, because a layout that assumes uniqueness must be
able to refuse a duplicate: ``unique_key`` within the join key gives one row per key
(``key``: multi-get probes), another ``unique_key`` gives rows keyed by join key plus
unique key (``unique``: prefix iteration), nothing gives a bag of counted rows
(``bag``: blind appends).  When the sample shows no repeated key on an index without a
declaration, the reason says so: declaring it would make probes single gets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.rule import Decision
from planner.rules._text import rows

if TYPE_CHECKING:
    from planner.context import IndexShape, PlanContext

__all__ = ["LayoutChoice"]

TOPIC = "layout"

_WHY = {
    "key": "one row per join key: inserts blind while the key set says new, probes by "
           "multi-get",
    "unique": "rows keyed by join key + unique key: probes by prefix iteration",
    "bag": "a bag of counted rows: blind appends, probes by prefix iteration",
}


class LayoutChoice:
    """Decide (record) the layout of every index, with what the statistics say about it.

    The layouts themselves are :mod:`joinstate.layouts` (``KeyLayout``, ``UniqueLayout``,
    ``BagLayout``); this rule records which one each index gets, and why.

    >>> from planner.plan import join_context
    >>> from planner.stats import given
    >>> ctx = join_context(given("left", 10, unique_key=["k"]), given("right", 99),
    ...                    left_key=["k"], right_key=["k"])
    >>> [d.choice for d in LayoutChoice().apply(ctx)]
    ['key', 'bag']
    """

    name = "layout"

    def apply(self, context: PlanContext) -> list[Decision]:
        """One decision per index."""
        return [self._one(context, ix) for ix in context.indexes]

    def _one(self, context: PlanContext, ix: IndexShape) -> Decision:
        src = context.sources.get(ix.stream)
        n = context.rows(ix.stream)
        figures: dict[str, object] = {"rows": n, "key": list(ix.key),
                                      "unique_key": None if ix.unique_key is None
                                      else list(ix.unique_key)}
        reason = _WHY[ix.layout]
        if ix.unique_key is not None:
            reason = f"unique_key {list(ix.unique_key)} declared: {reason}"
        if src is not None:
            ks = src.key(ix.key)
            figures.update(distinct_keys=ks.distinct, key_unique=ks.unique,
                           key_stats_from=ks.source)
            if ks.distinct and n:
                figures["rows_per_key"] = round(n / ks.distinct, 2)
                reason += f"; ~{rows(ks.distinct)} distinct keys ({n / ks.distinct:,.1f} " \
                          "rows per key)"
            if ix.layout != "key" and ks.unique and ks.source in ("sample", "exact"):
                seen = "in all" if ks.source == "exact" else "in a sample of"
                reason += (f"; no key repeats {seen} {rows(src.sample_rows)} rows: declaring "
                           f"unique_key={list(ix.key)} would give the key layout")
        return Decision(TOPIC, ix.name, ix.layout, reason, figures, self.name)
