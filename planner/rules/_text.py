"""Number formatting shared by the rules' reasons (one style across every explanation)."""

from __future__ import annotations

__all__ = ["rows", "times"]


def rows(n: int | None) -> str:
    """``1,234,567`` for a count, ``?`` for an unknown one."""
    return "?" if n is None else f"{n:,}"


def times(x: float) -> str:
    """A ratio for people: ``30x``, ``1.5x``."""
    return f"{x:,.0f}x" if x >= 10 else f"{x:.1f}x"
