"""How pushes read each index: point probes, or a scan into the in-memory probe cache.

``auto`` (the store's ski rental) probes by points until their cost reaches the price
of one scan, then scans the index into the probe cache: at most twice the cost of the
better choice in hindsight.  When the statistics already say how many rows will probe
an index during population, the planner can do better:

* ``scan`` when the point probes would cost at least twice the scan's price and the
  index fits the cache (``probe_cache_max_rows``): caching from the first probe saves
  the rent the ski rental pays before buying;
* ``point`` when the index is too big for the cache and a scan costs more than the
  probes: nothing would be kept;
* ``auto`` otherwise, and when sizes are unknown or nothing probes the index while it
  holds rows (the small side's pushes probe an empty big side).

Costs are the core's measured cost model (µs per point get and per scanned row).  The
store applies one mode to every index (``StoreOptions.probe``); the root decision is
that default: ``scan`` only if every index of the plan fits the cache (a scan mode on a
bigger index would rescan it on every probe), else ``auto``.  The per-index decisions
are what a per-index override would apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from joinstate.options import COST_GET_US, COST_SCAN_US
from planner.rule import Decision
from planner.rules._text import rows, times

if TYPE_CHECKING:
    from planner.context import IndexShape, PlanContext

__all__ = ["ProbePath"]

TOPIC = "probe"


class ProbePath:
    """Decide the probe path per index and the store's default.

    >>> from planner.plan import plan_join
    >>> from planner.stats import given
    >>> p = plan_join(given("left", 10_000), given("right", 3_000_000))
    >>> p.get("probe", p.side_index("left")), p.get("probe", p.side_index("right"))
    ('scan', 'auto')
    """

    name = "probe"

    def apply(self, context: PlanContext) -> list[Decision]:
        """One decision per index, then the store default (subject: the root)."""
        fixed = context.given.get("probe")
        order = self._order(context)
        out = [self._one(context, ix, order, fixed) for ix in context.indexes]
        limit = context.settings.probe_cache_max_rows
        sizes = {ix.name: context.rows(ix.stream) for ix in context.indexes}
        if fixed is not None:
            out.append(Decision(TOPIC, context.name, fixed, f"probe={fixed} set in the store's "
                                "options", {"cache_max_rows": limit}, self.name))
            return out
        fits = all(n is not None and n <= limit for n in sizes.values())
        scans = [d for d in out if d.choice == "scan"]
        if scans and fits:
            choice, reason = "scan", (f"every index fits the probe cache ({rows(limit)} rows) "
                                      "and the probed ones pay for a scan up front")
        else:
            choice, reason = "auto", ("ski rental per index" + (
                "; an index beyond the cache limit or of unknown size rules out scan mode "
                "for the whole store" if scans else ""))
        out.append(Decision(TOPIC, context.name, choice, reason,
                            {"cache_max_rows": limit, "index_rows": sizes}, self.name))
        return out

    @staticmethod
    def _order(context: PlanContext) -> list[str]:
        got = context.choice("order")
        if context.kind == "pipeline":
            return list(got or context.sources)
        small = context.choice("small_side", context.joins[0].name)
        if got == "small-first" and small is not None:
            return [small, "right" if small == "left" else "left"]
        if got == "as-given":
            return ["left", "right"]
        return []  # interleaved (or unknown): every side is probed while it holds rows

    def _one(self, context: PlanContext, ix: IndexShape, order: list[str], fixed: str | None
             ) -> Decision:
        n = context.rows(ix.stream)
        limit = context.settings.probe_cache_max_rows
        if order:
            first = min((order.index(s) for s in ix.written_by if s in order), default=None)
            probing = [s for s in ix.read_by if s in order and first is not None
                       and order.index(s) > first]
        else:
            probing = list(ix.read_by)
        counts = [context.rows(s) for s in probing]
        p = None if any(c is None for c in counts) else sum(c or 0 for c in counts)
        figures: dict[str, Any] = {"rows": n, "probing_rows": p, "probed_by": probing,
                                   "cache_max_rows": limit}
        if fixed is not None:
            return Decision(TOPIC, ix.name, fixed, f"probe={fixed} set in the store's options",
                            figures, self.name)
        if n is None or p is None:
            return Decision(TOPIC, ix.name, "auto", "sizes unknown: ski rental", figures,
                            self.name)
        if p == 0:
            return Decision(TOPIC, ix.name, "auto", "not probed while it holds rows during "
                            "population: ski rental", figures, self.name)
        point_us = p * COST_GET_US
        price_us = n * COST_SCAN_US
        figures.update(point_us=round(point_us), scan_us=round(price_us))
        ratio = point_us / max(price_us, 1e-9)
        if n > limit:
            if price_us > point_us:
                return Decision(TOPIC, ix.name, "point", f"{rows(n)} rows exceed the probe "
                                f"cache ({rows(limit)}) and a scan costs {times(1 / ratio)} "
                                f"the point probes of {rows(p)} rows", figures, self.name)
            return Decision(TOPIC, ix.name, "auto", f"{rows(n)} rows exceed the probe cache "
                            f"({rows(limit)}): scans are not kept; ski rental", figures,
                            self.name)
        if ratio >= 2:
            return Decision(TOPIC, ix.name, "scan", f"{rows(p)} probing rows would cost "
                            f"{times(ratio)} a scan of its {rows(n)} rows: cache it from the "
                            "first probe", figures, self.name)
        return Decision(TOPIC, ix.name, "auto", f"{rows(p)} probing rows cost {times(ratio)} "
                        f"a scan of its {rows(n)} rows: ski rental", figures, self.name)
