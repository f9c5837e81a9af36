"""Population errors: all derive from :class:`joinstate.JoinStateError`."""

from __future__ import annotations

from joinstate import BulkWriteRefused, JoinStateError

__all__ = ["BulkLoadRefused", "PopulationError", "PopulationInterruptedError"]


class PopulationError(JoinStateError, ValueError):
    """Population was asked for something it cannot do; the message names the argument."""


class PopulationInterruptedError(PopulationError):
    """The join holds a population that was interrupted (a crash or an exception).

    Raised by :func:`population.populate` without ``resume=True`` (the message gives each
    side's progress and both remedies), and with it when the inputs no longer match what
    was loaded.  ``progress`` maps each side to its durable marker, as a dict.
    """

    def __init__(self, message: str, progress: dict[str, dict[str, object]] | None = None
                 ) -> None:
        super().__init__(message)
        self.progress = progress or {}


BulkLoadRefused = BulkWriteRefused
"""A batch cannot be bulk-loaded (it reads state: deletes, possibly repeated unique keys);
the driver makes pending writes visible and falls back to a normal write.  The core's
:class:`joinstate.BulkWriteRefused`, under the name population has always used."""
