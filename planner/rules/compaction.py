"""The compaction policy of each index while population writes it.

For a join, the strategy picks one :mod:`compaction` policy for both sides
(:data:`POLICY_OF`: ``symmetric`` -> ``rocksdb``, ``asymmetric`` -> ``epsio``,
``bulk`` -> ``bulk-load``), recorded on the join, and each index's decision says what
that policy does to it.  For a pipeline, each index gets its own schedule over the load
order when the strategy is ``asymmetric``: auto-compaction stops before a source loads
on every index it writes that neither it nor any later source reads (only written
from then on), and an index is compacted after a source writing it when the next
source to touch it only probes it (its probes then read one sorted run).  An index the
next source writes as well as probes is left to RocksDB: compacting it there would
merge the same bytes again after every writer (TPC-DS q4's ``year_total`` is written
and probed by every source).  The guard re-enables everything at the end either way.

A pipeline index's choice is a dict ``{"policy", "disable_before", "compact_after"}``
(source names), which the pipeline driver executes as it stands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.rule import Decision

if TYPE_CHECKING:
    from planner.context import IndexShape, PlanContext

__all__ = ["JOIN_SIDE_EFFECT", "POLICY_OF", "CompactionChoice"]

TOPIC = "compaction"

POLICY_OF = {"symmetric": "rocksdb", "asymmetric": "epsio", "bulk": "bulk-load"}
"""The compaction policy (a ``population.Strategy.compaction`` name) of each strategy."""

JOIN_SIDE_EFFECT = {
    ("rocksdb", "small"): ("auto", "RocksDB compacts as it likes"),
    ("rocksdb", "big"): ("auto", "RocksDB compacts as it likes"),
    ("epsio", "small"): ("compact-when-loaded", "compacted fully once loaded: every big-side "
                         "row probes it"),
    ("epsio", "big"): ("off-after-small-loaded", "no compaction once the small side is "
                       "loaded: only written from then on"),
    ("bulk-load", "small"): ("compact-when-loaded", "compacted fully once loaded: every "
                             "big-side row probes it"),
    ("bulk-load", "big"): ("off-while-loading", "ingested as sorted SST files, not "
                           "compacted while loading"),
}
"""What each policy does to a join's small and big index."""


class CompactionChoice:
    """Decide the compaction policy of each index (and of a join).

    >>> from planner.plan import plan_join
    >>> from planner.stats import given
    >>> p = plan_join(given("left", 10), given("right", 99), strategy="asymmetric")
    >>> p.get("compaction"), p.get("compaction", p.side_index("right"))
    ('epsio', 'off-after-small-loaded')
    """

    name = "compaction"

    def apply(self, context: PlanContext) -> list[Decision]:
        """Decisions about the join and its indexes, or about every pipeline index."""
        if context.kind == "pipeline":
            return self._pipeline(context)
        j = context.joins[0]
        strategy = context.choice("strategy", j.name)
        small = context.choice("small_side", j.name)
        fixed = context.given.get("compaction")
        if fixed is not None:
            policy = fixed
            out = [Decision(TOPIC, j.name, policy, f"policy {policy} given by the caller",
                            {"strategy": strategy}, self.name)]
        else:
            policy = POLICY_OF.get(strategy, "rocksdb")
            out = [Decision(TOPIC, j.name, policy, f"strategy {strategy} -> policy {policy}",
                            {"strategy": strategy}, self.name)]
        for side in ("left", "right"):
            role = "small" if side == small else "big"
            effect = JOIN_SIDE_EFFECT.get((policy, role))
            if small is None:
                effect = ("auto", "the small side is not known yet")
            choice, why = effect if effect else ("policy " + policy, "a policy given by name")
            out.append(Decision(TOPIC, j.index(side), choice, f"{side} ({role}) side: {why}",
                                {"policy": policy, "role": role}, self.name))
        return out

    def _pipeline(self, context: PlanContext) -> list[Decision]:
        strategy = context.choice("strategy")
        order = list(context.choice("order") or [])
        out = []
        for ix in context.indexes:
            choice, reason = self._schedule(ix, order, strategy)
            out.append(Decision(TOPIC, ix.name, choice, reason,
                                {"written_by": list(ix.written_by), "read_by": list(ix.read_by),
                                 "order": order}, self.name))
        return out

    @staticmethod
    def _schedule(ix: IndexShape, order: list[str], strategy: str | None
                  ) -> tuple[dict[str, Any], str]:
        auto = {"policy": "auto", "disable_before": [], "compact_after": []}
        if strategy != "asymmetric":
            return auto, f"strategy {strategy}: RocksDB compacts as it likes"
        disable: list[str] = []
        compact: list[str] = []
        touching = [s for s in order if s in ix.written_by or s in ix.read_by]
        for i, source in enumerate(touching):
            if source not in ix.written_by:
                continue
            if not set(ix.read_by) & set(touching[i:]):
                # Nothing reads it from here on; once off it stays off (no later reader
                # can want it compacted).
                disable.append(source)
                break
            nxt = touching[i + 1] if i + 1 < len(touching) else None
            if nxt is not None and nxt not in ix.written_by:
                compact.append(source)  # the next source only probes it
        readers = [s for s in order if s in ix.read_by]
        parts = []
        if compact:
            parts.append(f"probed by {', '.join(readers)}: compacted once "
                         f"{', '.join(compact)} is loaded")
        if disable:
            parts.append(f"no source loaded from {disable[0]} on probes it: no compaction "
                         "from then on")
        if parts:
            policy = ("compact-then-off" if compact and disable else
                      "off-while-loading" if disable else "compact-when-loaded")
            return ({"policy": policy, "disable_before": disable, "compact_after": compact},
                    f"written by {', '.join(ix.written_by)}; " + "; ".join(parts))
        return auto, "read while it is written (or never written): RocksDB compacts as it likes"
