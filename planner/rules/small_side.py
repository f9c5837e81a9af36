"""Which input of each join is the small one (loaded first, probed by the other).

The small side is the one with fewer rows; a tie goes to the left side, so that the
choice never depends on anything but the counts.  When a count is unknown, a lower
bound may still decide (a side counted to at least 5,000 rows is not smaller than one
known to hold 3,000); when nothing decides, the choice is ``None``: the driver then
reads both inputs in lockstep until one runs out (``population.sources.count_small``)
and plans again with what it counted.  The small side is never inferred from a name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.rule import Decision
from planner.rules._text import rows, times

if TYPE_CHECKING:
    from collections.abc import Mapping

    from joinstate import SideName
    from planner.context import PlanContext

__all__ = ["SmallSide", "small_side_of", "smaller"]

TOPIC = "small_side"


def smaller(left: int | None, right: int | None, *, left_at_least: int = 0,
            right_at_least: int = 0) -> SideName | None:
    """The side with fewer rows (``"left"`` on a tie), or None if the counts cannot tell.

    >>> smaller(3, 4), smaller(4, 4), smaller(5, 4)
    ('left', 'left', 'right')
    >>> smaller(3000, None, right_at_least=5000), smaller(3000, None, right_at_least=100)
    ('left', None)
    >>> smaller(None, 3000, left_at_least=3000)     # a tie would go left: undecided
    >>> smaller(None, 3000, left_at_least=3001)
    'right'

    """
    if left is not None and right is not None:
        return "left" if left <= right else "right"
    if left is not None and right_at_least >= left:
        return "left"  # right holds at least as many: left is smaller or ties
    if right is not None and left_at_least > right:
        return "right"
    return None


def small_side_of(sizes: Mapping[str, int]) -> SideName:
    """The small side of ``{"left": n, "right": m}`` (a tie goes to the left side)."""
    side = smaller(sizes["left"], sizes["right"])
    assert side is not None
    return side


class SmallSide:
    """Decide the small input of every join from its inputs' row counts.

    >>> from planner.plan import join_context
    >>> from planner.stats import given
    >>> ctx = join_context(given("left", 100_000), given("right", 3_000_000))
    >>> d = SmallSide().apply(ctx)[0]
    >>> d.choice, d.reason
    ('left', 'left has 100,000 rows, right 3,000,000 (30x): left is the small side')
    """

    name = "small_side"

    def apply(self, context: PlanContext) -> list[Decision]:
        """One decision per join (subject: the join)."""
        out = []
        for j in context.joins:
            fixed = context.given.get("small_side") if context.kind == "join" else None
            lrows, rrows = context.rows(j.left), context.rows(j.right)
            llow, rlow = context.lower_bound(j.left), context.lower_bound(j.right)
            figures: dict[str, Any] = {"left_rows": lrows, "right_rows": rrows,
                       "left_at_least": llow, "right_at_least": rlow}
            if fixed is not None:
                out.append(Decision(TOPIC, j.name, fixed, f"{fixed} side given by the caller",
                                    figures, self.name))
                continue
            side = smaller(lrows, rrows, left_at_least=llow, right_at_least=rlow)
            if side is None:
                reason = (f"row counts unknown (left {rows(lrows)}, right {rows(rrows)}): the "
                          "driver counts both inputs in lockstep until one runs out")
            else:
                small, big = (lrows, rrows) if side == "left" else (rrows, lrows)
                small_low = llow if side == "left" else rlow
                big_low = rlow if side == "left" else llow
                other = "right" if side == "left" else "left"
                if small is not None and big is not None:
                    ratio = big / max(small, 1)
                    tie = " (a tie goes to the left side)" if small == big else ""
                    figures["ratio"] = round(ratio, 2)
                    reason = (f"{j.left} has {rows(lrows)} rows, {j.right} {rows(rrows)} "
                              f"({times(ratio)}): {side} is the small side{tie}")
                else:
                    reason = (f"{side} has {rows(small if small is not None else small_low)} "
                              f"rows, {other} at least {rows(big_low)}: {side} is the small "
                              "side")
            out.append(Decision(TOPIC, j.name, side, reason, figures, self.name))
        return out
