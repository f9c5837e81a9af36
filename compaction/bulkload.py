"""The bulk-load policy: no compaction anywhere while sorted SST files are ingested.

Ingested files go to the lowest level where they do not overlap; runs of random keys do
overlap, so they pile up in L0.  Compacting them while loading would merge the same bytes
again and again; instead the small side is compacted once when it is complete (it is
probed from then on), and the big side is left to RocksDB after population.  Deletes
and L0 growth re-enable compaction earlier: that is :class:`compaction.Guard`'s job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compaction.policy import PopulationEnded, PopulationStarted, SideFinished

if TYPE_CHECKING:
    from compaction.control import CompactionControl
    from compaction.policy import Event

__all__ = ["BulkLoadPolicy"]


class BulkLoadPolicy:
    """Disable auto-compaction on both sides' data at start; compact the small side at finish."""

    name = "bulk-load"

    def __init__(self) -> None:
        self.small_finished = False

    def observe(self, event: Event, control: CompactionControl) -> None:
        """Act on start, side-finished and population end."""
        if isinstance(event, PopulationStarted):
            for side in ("left", "right"):
                for cf in control.data_cfs(side):
                    control.disable(cf, "bulk load: no compaction while ingesting")
        elif isinstance(event, SideFinished):
            if self.small_finished or (not event.small and control.small is not None):
                return
            self.small_finished = True
            for cf in control.cfs(event.side):
                if cf in control.disabled:
                    control.enable(cf, f"small side {event.side} finished")
                control.compact(cf, f"small side {event.side} finished")
        elif isinstance(event, PopulationEnded):
            control.restore("population ended" + (" by failure" if event.failed else ""))
