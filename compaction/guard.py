"""Guard rails that hold whatever the strategy: deletes and L0 growth re-enable compaction.

The driver runs the guard beside every main policy, so these rules live here and only
here.  Why deletes: a tombstone is only dropped by compaction, and a side receiving
deletes is no longer the append-only load the other policies assume.  Why an L0 limit:
every L0 file is one more seek for each prefix probe (prefix probes into an uncompacted
side run several times slower, even with bloom filters), and file handles and memory for
table readers grow with the count.  Re-enabling is irreversible for the rest of
population.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compaction.policy import BatchWritten, ThresholdCrossed

if TYPE_CHECKING:
    from compaction.control import CompactionControl
    from compaction.policy import Event

__all__ = ["Guard"]


class Guard:
    """Re-enables a disabled family on deletes or when a threshold is crossed.

    ``l0_limit`` and ``pending_bytes_limit`` are what the driver checks to emit
    :class:`ThresholdCrossed`; this guard reacts to those events for families that some
    policy disabled, and *pins* them (:meth:`CompactionControl.pin`): no policy can disable
    them again during this population.  The final re-enable on every exit path is
    :func:`guarded`'s job.
    """

    name = "guard"

    def __init__(self, l0_limit: int = 100, pending_bytes_limit: int | None = None) -> None:
        if l0_limit < 1:
            raise ValueError(f"Guard.l0_limit={l0_limit} must be >= 1")
        if pending_bytes_limit is not None and pending_bytes_limit < 1:
            raise ValueError(f"Guard.pending_bytes_limit={pending_bytes_limit} must be >= 1")
        self.l0_limit = l0_limit
        self.pending_bytes_limit = pending_bytes_limit

    def observe(self, event: Event, control: CompactionControl) -> None:
        """Re-enable on deletes to a disabled side or on a crossed threshold."""
        if isinstance(event, BatchWritten) and event.deletes:
            for cf in control.data_cfs(event.side):
                if cf in control.disabled:
                    control.pin(cf, f"guard: {event.deletes} deletes reached {event.side}")
        elif isinstance(event, ThresholdCrossed) and event.cf in control.disabled:
            control.pin(event.cf, f"guard: {event.metric}={event.value} > {event.limit}")
