"""The plan's per-index compaction schedule, executed as a compaction policy.

A plan that loads inputs in a sequence (a pipeline's sources) decides a schedule for
every index (:class:`planner.rules.compaction.CompactionChoice`): the input before
whose load auto-compaction stops on it (``disable_before``: from then on it is only
written) and the inputs after whose load it is compacted once (``compact_after``: the
next inputs only probe it).  :class:`PlannedCompaction` carries that schedule out on the
population events, like any :class:`compaction.CompactionPolicy`, so the driver runs it
beside the guard exactly as it runs a join's named policy: the schedule acts when an
input finishes (compactions first, then the next input's switches) and at the start
(the first input's switches); the end of population restores every family.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compaction import PopulationEnded, PopulationStarted, SideFinished

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from compaction import CompactionControl, Event
    from joinstate import IndexInfo

__all__ = ["PlannedCompaction", "schedules"]


def schedules(decisions: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The per-index schedules among a plan's compaction decisions (by index name).

    A join's plan names one policy and says in words what it does to each side's index;
    only a sequenced plan's decisions are schedules (dicts).
    """
    out: dict[str, dict[str, Any]] = {}
    for d in decisions:
        if isinstance(d.choice, dict):
            out[d.subject] = dict(d.choice)
            figures: Mapping[str, Any] = getattr(d, "figures", None) or {}
            writers = figures.get("written_by")
            if writers is not None:
                out[d.subject]["written_by"] = list(writers)
    return out


class PlannedCompaction:
    """Executes ``schedule`` (index -> ``{"disable_before", "compact_after"}``) over ``order``.

    ``infos`` gives each index's data column families (degree families are left alone:
    an index's own writes read them).
    """

    name = "planned"

    def __init__(self, schedule: Mapping[str, Mapping[str, Any]], order: Sequence[str],
                 infos: Mapping[str, IndexInfo]) -> None:
        self.schedule = schedule
        self.order = list(order)
        self.infos = infos

    def observe(self, event: Event, control: CompactionControl) -> None:
        """Switch off before an input loads, compact after one, restore at the end."""
        if isinstance(event, PopulationStarted):
            if self.order:
                self._disable_before(self.order[0], control)
            self._disable_unwritten(control)
        elif isinstance(event, SideFinished):
            for cf, plan in self.schedule.items():
                if event.side in plan.get("compact_after", ()):
                    for data_cf in self.infos[cf].data_column_families:
                        control.compact(data_cf, f"{event.side} is loaded; later inputs "
                                                 f"probe {cf}")
            if event.side in self.order:
                at = self.order.index(event.side)
                if at + 1 < len(self.order):
                    self._disable_before(self.order[at + 1], control)
        elif isinstance(event, PopulationEnded):
            control.restore("population ended" + (" by failure" if event.failed else ""))

    def _disable_unwritten(self, control: CompactionControl) -> None:
        """Switch off now every index whose switch-off point is the first input writing it.

        Until that input loads, nothing writes the index, so RocksDB has nothing to
        compact in it: off now is the same as off then.  Said at the start, a store that
        has not created the family yet creates it with auto-compaction off
        (:meth:`joinstate.StateStore.families_together`) instead of switching it later,
        which costs a rewrite of RocksDB's OPTIONS file (~10 ms per family).
        """
        for cf, plan in self.schedule.items():
            before = plan.get("disable_before", ())
            writers = set(plan.get("written_by") or ())
            first = next((s for s in self.order if s in writers), None)
            if before and first == before[0]:
                for data_cf in self.infos[cf].data_column_families:
                    control.disable(data_cf, f"nothing writes {cf} before {first}, which "
                                             "loads it with no reader after: off from the start")

    def _disable_before(self, name: str, control: CompactionControl) -> None:
        for cf, plan in self.schedule.items():
            if name in plan.get("disable_before", ()):
                for data_cf in self.infos[cf].data_column_families:
                    control.disable(data_cf, f"{name} loads; nothing reads {cf} during "
                                             "the rest of population")
