"""The planner's errors: one class under the package-wide root.

A planner error means the planner was asked something it cannot answer as asked (an
unreadable statistics input, an invalid setting, a choice fixed by the caller that is
not one of the choices); the message names the argument and what to pass instead.
"""

from __future__ import annotations

from joinstate.errors import JoinStateError

__all__ = ["PlannerError"]


class PlannerError(JoinStateError, ValueError):
    """A planner input or setting is invalid; the message names it and the remedy."""
