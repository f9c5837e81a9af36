"""Population errors: all derive from :class:`joinstate.JoinStateError`."""

from __future__ import annotations

from joinstate import JoinStateError

__all__ = ["BulkLoadRefused", "PopulationError"]


class PopulationError(JoinStateError, ValueError):
    """Population was asked for something it cannot do; the message names the argument."""


class BulkLoadRefused(JoinStateError, RuntimeError):
    """A batch cannot be bulk-loaded (it deletes); the driver falls back to a normal write."""
