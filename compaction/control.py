"""The actuator policies act through: per-column-family compaction switches and probes.

It tracks which column families it disabled, so that :func:`guarded` can re-enable every
one of them on every exit path (Kafka Streams' bulk-load bugs came from forgetting this).
It never polls ``rocksdb.compaction-pending`` in a loop: that property never clears while
auto-compaction is off.  Every RocksDB call goes through the :class:`joinstate.StateStore`
methods, so failures surface as :class:`joinstate.JoinStateError`.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from joinstate import IndexInfo, JoinStateError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from joinstate import Database, SideName

__all__ = ["Action", "CompactionControl", "guarded"]

log = logging.getLogger(__name__)

ActionName = Literal["disable", "enable", "compact"]


@dataclass(frozen=True)
class Action:
    """One thing a policy did to RocksDB, for the report: when, what, where, why."""

    t: float
    action: ActionName
    cf: str
    reason: str
    seconds: float = 0.0


class CompactionControl:
    """Compaction switches and probes over the column families population writes.

    ``indexes`` maps each input to the index it writes (a join's side to
    ``join.index(side)``) or to the several a pipeline source writes, as
    :class:`joinstate.IndexInfo`.  Policies act on inputs (``cfs(side)``: the families
    of the indexes that input writes) or on single column families; every action is
    recorded in :attr:`actions`.
    """

    def __init__(self, store: Database,
                 indexes: Mapping[str, IndexInfo | Sequence[IndexInfo]]) -> None:
        self.store = store
        self.side_cfs: dict[str, list[str]] = {}
        self.side_data_cfs: dict[str, list[str]] = {}
        for s, given in indexes.items():
            infos = [given] if isinstance(given, IndexInfo) else list(given)
            self.side_cfs[s] = [cf for i in infos for cf in i.column_families]
            self.side_data_cfs[s] = [cf for i in infos for cf in i.data_column_families]
        self.disabled: set[str] = set()
        self.pinned: set[str] = set()
        self.actions: list[Action] = []
        self.small: SideName | None = None
        self._t0 = time.perf_counter()

    # ---- naming -----------------------------------------------------------------------

    def cfs(self, side: str) -> list[str]:
        """Return every column family of ``side`` (index, nulls, degrees)."""
        try:
            return self.side_cfs[side]
        except KeyError:
            raise JoinStateError(
                f"side {side!r} is not controlled here (sides: {sorted(self.side_cfs)})"
            ) from None

    def data_cfs(self, side: str) -> list[str]:
        """Return the column families holding ``side``'s rows (not its degree counters).

        Degree families are read by the side's *own* writes (outer joins), so a policy
        that stops compacting a write-only side leaves them alone.
        """
        self.cfs(side)  # names the side if it is not controlled here
        return self.side_data_cfs[side]

    def other(self, side: str) -> SideName:
        """Return the opposite side (of a join's two)."""
        return "right" if side == "left" else "left"

    def others(self, side: str) -> list[str]:
        """Every other input controlled here.

        A join's other side, or a pipeline's other sources (none for a one-source one).
        """
        self.cfs(side)  # names the input if it is not controlled here
        return [s for s in self.side_cfs if s != side]

    # ---- actions ----------------------------------------------------------------------

    def _record(self, action: ActionName, cf: str, reason: str, seconds: float = 0.0) -> None:
        self.actions.append(Action(round(time.perf_counter() - self._t0, 4), action, cf, reason,
                                   round(seconds, 4)))
        log.debug("%s %s (%s) %.3fs", action, cf, reason, seconds)

    def disable(self, cf: str, reason: str) -> None:
        """Turn auto-compaction off for ``cf`` (remembered for :meth:`restore`).

        A family the guard re-enabled is *pinned* and stays enabled: a guard trip is
        irreversible for the rest of population.
        """
        if cf in self.disabled or cf in self.pinned:
            return
        self.store.set_cf_options(cf, {"disable_auto_compactions": "true"})
        self.disabled.add(cf)
        self._record("disable", cf, reason)

    def enable(self, cf: str, reason: str) -> None:
        """Turn auto-compaction back on for ``cf``."""
        self.store.set_cf_options(cf, {"disable_auto_compactions": "false"})
        self.disabled.discard(cf)
        self._record("enable", cf, reason)

    def pin(self, cf: str, reason: str) -> None:
        """Re-enable ``cf`` if needed and keep it enabled until population ends."""
        self.pinned.add(cf)
        if cf in self.disabled:
            self.enable(cf, reason)

    def compact(self, cf: str, reason: str) -> float:
        """Flush ``cf`` and compact its whole key range; returns the seconds it took.

        RocksDB's manual compaction reports no result of its own; whether it worked shows
        afterwards in the family's L0 file count (:meth:`l0_files`).
        """
        t = time.perf_counter()
        self.store.compact(cf)
        dt = time.perf_counter() - t
        self._record("compact", cf, reason, dt)
        return dt

    def restore(self, reason: str) -> list[str]:
        """Re-enable auto-compaction on every column family this control disabled.

        Tries every family even if one fails, then raises the first failure: leaving one
        family disabled must not leave the others disabled too.
        """
        first: BaseException | None = None
        done = []
        for cf in sorted(self.disabled):
            try:
                self.enable(cf, reason)
                done.append(cf)
            except JoinStateError as exc:
                log.error("could not re-enable auto-compaction on %s: %s", cf, exc)
                first = first or exc
        if first is not None:
            raise JoinStateError(
                f"could not re-enable auto-compaction on {sorted(self.disabled)} in "
                f"{self.store.path}: {first}; re-open the store to reset it"
            ) from first
        return done

    # ---- probes -----------------------------------------------------------------------

    def l0_files(self, cf: str) -> int:
        """Count the L0 files of ``cf`` (0 if unavailable)."""
        return self.store.property_int(cf, "rocksdb.num-files-at-level0") or 0

    def pending_bytes(self, cf: str) -> int:
        """Return RocksDB's estimate of bytes compaction would still have to rewrite in ``cf``."""
        return self.store.property_int(cf, "rocksdb.estimate-pending-compaction-bytes") or 0


@contextmanager
def guarded(control: CompactionControl) -> Iterator[CompactionControl]:
    """Run a block with the guarantee that every disabled family is re-enabled on exit.

    The re-enable runs in a ``finally``: on a clean exit, on an exception from the block
    (which then propagates unchanged), and on ``KeyboardInterrupt``.
    """
    failed = False
    try:
        yield control
    except BaseException:
        failed = True
        raise
    finally:
        if control.disabled:
            try:
                control.restore("population over (guard)")
            except JoinStateError:
                # Already logged; never mask the block's own exception with ours.
                if not failed:
                    raise
