"""The context the distributed planner's rules read, and its settings.

:mod:`planner.distribute` builds a :class:`DistributionContext` from a graph's facts and
runs the partitioning rules (:mod:`planner.rules`) over it; the rules read it and return
decisions.  It lives in a module of its own so that the rules depend on it, not on the
module that runs them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.errors import PlannerError
from planner.partitioning import GraphFacts, Partitioning, desires, from_json
from planner.placement import Derivation, derive
from planner.rule import latest_decision

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from planner.rule import Decision

__all__ = ["DistributionContext", "DistributionSettings"]


@dataclass(frozen=True)
class DistributionSettings:
    """Thresholds of the partitioning rules.

    ``replicate_rows`` / ``replicate_share``: a source may be copied to every shard when it
    has at most ``max(replicate_rows, replicate_share * the largest source's rows)`` rows
    (a million rows of a dimension cost well under a second to load on each shard, and
    5% of the largest input is small beside what it keeps from moving).
    ``partial_aggregates``: an exact aggregate whose input must move is summed where
    its input lies first (:mod:`planner.rules.partition_partial`).
    """

    shards: int
    replicate_rows: int = 1_000_000
    replicate_share: float = 0.05
    partial_aggregates: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise PlannerError(f"shards={self.shards!r} must be an int >= 1")
        if isinstance(self.replicate_rows, bool) or not isinstance(self.replicate_rows, int) \
                or self.replicate_rows < 0:
            raise PlannerError(f"replicate_rows={self.replicate_rows!r} must be an int >= 0")
        if not 0 <= self.replicate_share <= 1:
            raise PlannerError(f"replicate_share={self.replicate_share!r} must be in [0, 1]")


@dataclass(frozen=True)
class DistributionContext:
    """What the partitioning rules read; rules return decisions, never mutate this.

    ``given`` fixes choices instead of deciding them: ``{"replicate": {source: bool},
    "partitioning": {source: Partitioning}}``.
    """

    name: str
    facts: GraphFacts
    settings: DistributionSettings
    given: Mapping[str, Any] = field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()

    @property
    def shards(self) -> int:
        """The shard count."""
        return self.settings.shards

    def decision(self, topic: str, subject: str | None = None) -> Decision | None:
        """The latest decision on ``topic`` about ``subject`` (default: the root)."""
        return latest_decision(self.decisions, topic, self.name if subject is None else subject)

    def with_decisions(self, more: Iterable[Decision]) -> DistributionContext:
        """A copy with ``more`` decisions appended."""
        return DistributionContext(self.name, self.facts, self.settings, self.given,
                                   (*self.decisions, *more))

    def replicated(self) -> frozenset[str]:
        """The sources the replication rule copied."""
        return frozenset(s for s in self.facts.graph.sources
                         if (d := self.decision("replicate", s)) is not None
                         and d.choice == "replicate")

    def partitionings(self) -> dict[str, Partitioning]:
        """Each source's partitioning as the source rule decided it."""
        out = {}
        for s in self.facts.graph.sources:
            d = self.decision("partitioning", s)
            if d is None:
                raise PlannerError(f"internal: no partitioning decided for source {s!r}")
            out[s] = from_json(d.choice)
        return out

    @functools.cached_property
    def derivation(self) -> Derivation:
        """Placements and arrivals under the decided source partitionings."""
        return derive(self.facts, self.partitionings(), self.shards,
                      desires(self.facts, self.replicated()))
