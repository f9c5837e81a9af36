"""Population errors: all derive from :class:`joinstate.JoinStateError`."""

from __future__ import annotations

from joinstate import BulkWriteRefused, JoinStateError

__all__ = ["BulkLoadRefused", "PopulationError"]


class PopulationError(JoinStateError, ValueError):
    """Population was asked for something it cannot do; the message names the argument."""


BulkLoadRefused = BulkWriteRefused
"""A batch cannot be bulk-loaded (it reads state: deletes, possibly repeated unique keys);
the driver makes pending writes visible and falls back to a normal write.  The core's
:class:`joinstate.BulkWriteRefused`, under the name population has always used."""
