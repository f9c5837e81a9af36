"""Asymmetric compaction: compact the small side once it is complete, stop compacting the big one.

Why it works: after the small side is loaded it is only *read* (every big-side row
probes it), so it should be one sorted run; the big side is from then on only *written*
during population, so compacting it is work nobody benefits from until the live phase.
Compaction comes back on when population ends, and earlier if the guard trips
(deletes, L0 growth): see :class:`compaction.Guard`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compaction.policy import PopulationEnded, SideFinished

if TYPE_CHECKING:
    from compaction.control import CompactionControl
    from compaction.policy import Event

__all__ = ["AsymmetricPolicy"]


class AsymmetricPolicy:
    """On the small side's *finished* event: compact it fully, then disable the big side(s).

    A pipeline has any number of sources: every source but the small one counts as big
    (a one-source pipeline has none, and only the compaction of the small one remains).

    If ``control.small`` is unset when a side finishes, the first side to finish is taken
    as the small one: under interleaved delivery that is what "small" means.  Population
    ending re-enables everything.

    Its ``name``, ``"epsio"`` after the team that published the policy, is the identifier
    plans, reports and population progress markers record (``Strategy.compaction``); an
    interrupted population resumes from its marker, so the recorded identifier stays.
    """

    name = "epsio"

    def __init__(self) -> None:
        self.small_finished = False

    def observe(self, event: Event, control: CompactionControl) -> None:
        """Act on side-finished and population end."""
        if isinstance(event, SideFinished):
            if self.small_finished:
                return
            if not event.small and control.small is not None:
                return
            self.small_finished = True
            small = event.side
            for cf in control.cfs(small):
                control.compact(cf, f"small side {small} finished")
            for big in control.others(small):
                for cf in control.data_cfs(big):
                    control.disable(cf, f"big side {big} is write-only from now on")
        elif isinstance(event, PopulationEnded):
            control.restore("population ended" + (" by failure" if event.failed else ""))
