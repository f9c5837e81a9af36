"""The physical planner's rules, one decision kind per module, applied in :data:`RULES` order.

Each rule implements :class:`planner.rule.Rule` over a :class:`planner.context.PlanContext`
and reads the decisions of the rules before it (the strategy needs the small side and
the order; the memtables and compaction policies need the strategy; the probe path
needs the order), as an optimizer's passes do.

=================  ======================================================================
rule (topic)       decides
=================  ======================================================================
``small_side``     the small input of each join
``order``          the load order (a join's sides, a pipeline's sources)
``strategy``       symmetric / asymmetric / bulk, per join and per pipeline
``layout``         key / unique / bag per index (from declared or sampled uniqueness)
``memtable``       the memtable of each index while it loads
``compaction``     the compaction policy of each index (and of a join)
``probe``          point probes or an up-front probe cache per index; the store default
``sharing``        a shared index or one per reader, per shareable pipeline input
``spark``          the Spark shard count; which inputs to copy to every shard
=================  ======================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.rules.compaction import CompactionChoice
from planner.rules.layout import LayoutChoice
from planner.rules.memtable import MemtableChoice
from planner.rules.order import PopulationOrder
from planner.rules.probe import ProbePath
from planner.rules.sharing import IndexSharing
from planner.rules.small_side import SmallSide
from planner.rules.spark import SparkDistribution
from planner.rules.strategy import PopulationStrategy

if TYPE_CHECKING:
    from planner.rule import Rule

__all__ = [
    "RULES",
    "CompactionChoice",
    "IndexSharing",
    "LayoutChoice",
    "MemtableChoice",
    "PopulationOrder",
    "PopulationStrategy",
    "ProbePath",
    "SmallSide",
    "SparkDistribution",
]

RULES: tuple[Rule, ...] = (
    SmallSide(),
    PopulationOrder(),
    PopulationStrategy(),
    LayoutChoice(),
    MemtableChoice(),
    CompactionChoice(),
    ProbePath(),
    IndexSharing(),
    SparkDistribution(),
)
"""The physical rules in the order they run."""
