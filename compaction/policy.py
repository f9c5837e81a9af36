"""The one Protocol every compaction policy implements, and the events it observes.

Why events and not hooks per strategy: the population driver knows *when* things happen
(a side finished, a batch was written), a policy knows *what* to do about it.  Keeping
the two apart lets the planner combine policies per index later, and lets each policy be
tested by feeding it events against a real store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from compaction.control import CompactionControl
    from joinstate import SideName

__all__ = [
    "BatchWritten",
    "CompactionPolicy",
    "Event",
    "PopulationEnded",
    "PopulationStarted",
    "SideFinished",
    "ThresholdCrossed",
]

@dataclass(frozen=True)
class PopulationStarted:
    """Population is about to write the first batch; ``small`` is the small side if known."""

    small: SideName | None


@dataclass(frozen=True)
class BatchWritten:
    """A batch of ``rows`` consolidated rows (``deletes`` of them retractions) was applied."""

    side: SideName
    rows: int
    deletes: int


@dataclass(frozen=True)
class SideFinished:
    """Every row of ``side`` has been applied (and ingested, for bulk loads)."""

    side: SideName
    small: bool


@dataclass(frozen=True)
class ThresholdCrossed:
    """A column family's L0 file count or pending compaction bytes passed a limit."""

    cf: str
    metric: Literal["l0_files", "pending_compaction_bytes"]
    value: int
    limit: int


@dataclass(frozen=True)
class PopulationEnded:
    """Population is over; ``failed`` says whether it ended by an exception."""

    failed: bool


Event = PopulationStarted | BatchWritten | SideFinished | ThresholdCrossed | PopulationEnded


@runtime_checkable
class CompactionPolicy(Protocol):
    """Observes population events and acts on RocksDB through a :class:`CompactionControl`.

    Policies must be cheap on :class:`BatchWritten` (it fires once per batch) and must not
    assume any event order beyond: one ``PopulationStarted`` first, one ``PopulationEnded``
    last (also after a failure), at most one ``SideFinished`` per side.
    """

    name: str

    def observe(self, event: Event, control: CompactionControl) -> None:
        """React to ``event``; raise only for programming errors."""
