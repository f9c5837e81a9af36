"""Read-only views of the core's state for drivers (population, Spark, the planner).

Drivers need facts about an index (its column families, its layout, whether its inserts
are blind appends) and about a prepared batch (how many rows it deletes); they get them
as frozen snapshots, never as the core's own objects, so the core can change how it
stores things without breaking them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from joinstate.side import Layout

__all__ = ["IndexInfo"]


@dataclass(frozen=True)
class IndexInfo:
    """What a driver may know about one index (a join side's rows by join key).

    ``appends_blindly``: inserts never read state (bag layout, no degree family).
    ``bulk_loadable``: batches may be offered to a bulk (SST) sink (no degree family);
    a batch whose staging has to read (retractions, unique keys that may be stored) is
    refused with :class:`~joinstate.errors.BulkWriteRefused`.  ``rows`` and ``entries``
    are the counters at the time the view was taken.
    """

    name: str
    column_family: str
    column_families: tuple[str, ...]
    data_column_families: tuple[str, ...]
    layout: Layout
    tracks_degree: bool
    appends_blindly: bool
    bulk_loadable: bool
    rows: int
    entries: int
    cached: bool = False
    """The index was held in memory as a probe cache: a probe reads no stored state."""
