"""In what order population loads its inputs.

A join loads its small side whole first (``small-first``), so that every big-side batch
probes a complete, compacted small index and the small side's pushes probe an empty big
one.  A pipeline loads its dimensions first (sources with a declared unique key: what
the facts' pushes probe), then the other sources, each group smallest first, across the
whole pipeline (TPC-DS q4: customer and date_dim before any sales, and web_sales, though
smaller than date_dim, after it), for the same reason; sources of unknown size go last
in their group, since they are usually the streams; ties keep the definition order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.rule import Decision
from planner.rules._text import rows

if TYPE_CHECKING:
    from planner.context import PlanContext

__all__ = ["JOIN_ORDERS", "PopulationOrder"]

TOPIC = "order"
JOIN_ORDERS = ("small-first", "interleaved", "as-given")


class PopulationOrder:
    """Decide the load order (subject: the join or the pipeline).

    >>> from planner.plan import join_context
    >>> from planner.stats import given
    >>> PopulationOrder().apply(join_context(given("left", 10), given("right", 99)))[0].choice
    'small-first'
    """

    name = "order"

    def apply(self, context: PlanContext) -> list[Decision]:
        """One decision about the root subject."""
        fixed = context.given.get("order")
        if context.kind == "join":
            if fixed is not None:
                return [Decision(TOPIC, context.name, fixed, f"order {fixed} given by the caller",
                                 {}, self.name)]
            small = context.choice("small_side", context.joins[0].name if context.joins
                                   else None)
            reason = ("the small side is loaded whole first, so that every big-side batch "
                      "probes a complete small index" + ("" if small else
                                                         " (the small side is counted first)"))
            return [Decision(TOPIC, context.name, "small-first", reason, {"small_side": small},
                             self.name)]
        names = list(context.sources)
        counts = {s: context.sources[s].rows for s in names}
        if fixed is not None:
            return [Decision(TOPIC, context.name, list(fixed), "order given by the caller",
                             {"rows": counts}, self.name)]
        dims = {s for s in names if context.sources[s].unique_key is not None}
        order = sorted(names, key=lambda s: (s not in dims, counts[s] is None,
                                             counts[s] or 0, names.index(s)))
        unknown = [s for s in order if counts[s] is None]
        reason = ("dimensions (a declared unique key) first, then the rest, smallest first: "
                  if dims and len(dims) < len(names) else "smallest source first: ") + ", ".join(
            f"{s} ({rows(counts[s])})" for s in order)
        if unknown:
            reason += "; sources of unknown size last"
        return [Decision(TOPIC, context.name, order, reason,
                         {"rows": counts, "dimensions": sorted(dims)}, self.name)]
