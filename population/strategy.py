"""Population strategies: which memtable, which compaction policy, which write path per side.

A strategy is data (a frozen, validated dataclass) so that a report can say exactly what
ran.  The planner decides (:mod:`planner.rules`: small side, strategy, memtable and
compaction policy per index) and :func:`from_plan` turns its decisions into the
``Strategy`` the driver executes; the three presets (``symmetric``, ``asymmetric``,
``bulk``) are built from the same planner tables, so a preset and the planner's choice of
it are the same strategy.  ``auto`` means "ask the planner".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from joinstate.options import Memtable
from planner.rules.compaction import POLICY_OF
from planner.rules.memtable import BIG_MEMTABLE, SMALL_MEMTABLE
from population.errors import PopulationError

if TYPE_CHECKING:
    from collections.abc import Callable

    from joinstate import SideName
    from planner.plan import Plan

__all__ = ["PRESETS", "CompactionName", "Strategy", "fixed_choices", "from_plan", "preset"]

CompactionName = Literal["rocksdb", "epsio", "bulk-load"]

_MIB = 1 << 20


@dataclass(frozen=True)
class Strategy:
    """How one population runs.

    ``small_side`` pins the small side (else the driver finds it from sizes or by
    counting).  Memtables apply to each side's index column family and need an empty
    family (RocksDB cannot change a memtable at run time).  ``bulk`` writes append-only
    batches as sorted SST files that are ingested, in runs of up to ``bulk_run_rows``
    rows.  Population always writes through the WAL: with it, the data, counters and
    progress markers of every batch are durable together, which is what lets an
    interrupted population resume (the bulk-written big side skips the WAL anyway).
    ``big_write_buffer_size`` shrinks the big side's memtable at run time (small memtables
    are cheaper to insert into when nothing reads them).  ``l0_limit`` and
    ``pending_bytes_limit`` are the guard's thresholds.
    """

    name: str
    compaction: CompactionName = "rocksdb"
    small_side: SideName | None = None
    small_memtable: Memtable | None = None
    big_memtable: Memtable | None = None
    bulk: bool = False
    bulk_run_rows: int = 2_000_000
    big_write_buffer_size: int | None = None
    l0_limit: int = 100
    pending_bytes_limit: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not isinstance(self.name, str) or not self.name:
            problems.append(f"name={self.name!r} must be a non-empty string")
        if self.compaction not in get_args(CompactionName):
            problems.append(
                f"compaction={self.compaction!r} must be one of {get_args(CompactionName)}"
            )
        if self.small_side not in (None, "left", "right"):
            problems.append(f"small_side={self.small_side!r} must be 'left', 'right' or None")
        for f in ("small_memtable", "big_memtable"):
            v = getattr(self, f)
            if v is not None and v not in get_args(Memtable):
                problems.append(f"{f}={v!r} must be one of {get_args(Memtable)} or None")
        if not isinstance(self.bulk_run_rows, int) or self.bulk_run_rows < 1:
            problems.append(f"bulk_run_rows={self.bulk_run_rows!r} must be an int >= 1")
        if self.big_write_buffer_size is not None and not (
            _MIB <= self.big_write_buffer_size <= 4096 * _MIB
        ):
            problems.append(
                f"big_write_buffer_size={self.big_write_buffer_size} must be 1 MiB..4 GiB"
            )
        if not isinstance(self.l0_limit, int) or self.l0_limit < 1:
            problems.append(f"l0_limit={self.l0_limit!r} must be an int >= 1")
        if self.pending_bytes_limit is not None and self.pending_bytes_limit < 1:
            problems.append(f"pending_bytes_limit={self.pending_bytes_limit!r} must be >= 1")
        if problems:
            raise PopulationError("invalid Strategy: " + "; ".join(problems))

    def replace(self, **changes: Any) -> Strategy:
        """Return a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description for reports."""
        return dataclasses.asdict(self)

    @classmethod
    def symmetric(cls) -> Strategy:
        """Baseline: RocksDB defaults on both sides, auto-compaction on, one memtable type."""
        return cls("symmetric", compaction=_policy("symmetric"))

    @classmethod
    def asymmetric(cls) -> Strategy:
        """Epsio: compact the finished small side, stop compacting the big one.

        Hash skip list for the small (probed) side's index, skip list for the big one.
        """
        return cls(
            "asymmetric", compaction=_policy("asymmetric"), small_memtable=SMALL_MEMTABLE,
            big_memtable=BIG_MEMTABLE,
        )

    @classmethod
    def bulk_load(cls) -> Strategy:
        """Beyond Epsio: sorted SST files ingested, no compaction during load."""
        return cls(
            "bulk", compaction=_policy("bulk"), small_memtable=SMALL_MEMTABLE,
            big_memtable=BIG_MEMTABLE, bulk=True,
        )


def _policy(strategy: str) -> CompactionName:
    """The compaction policy the planner pairs with ``strategy`` (one table for both)."""
    return cast("CompactionName", POLICY_OF[strategy])


_PRESETS: dict[str, Callable[[], Strategy]] = {
    "symmetric": Strategy.symmetric,
    "asymmetric": Strategy.asymmetric,
    "bulk": Strategy.bulk_load,
}
PRESETS = tuple(_PRESETS)


def preset(name: str) -> Strategy:
    """The preset strategy called ``name`` (``symmetric`` / ``asymmetric`` / ``bulk``)."""
    make = _PRESETS.get(name)
    if make is None:
        raise PopulationError(
            f"strategy={name!r} must be one of {(*PRESETS, 'auto')} or a population.Strategy"
        )
    return make()


def fixed_choices(strategy: Strategy) -> dict[str, Any]:
    """What a given ``Strategy`` fixes, as the planner's ``given`` choices.

    The plan then records these as given instead of deciding them, so that it explains
    what runs.
    """
    return {"strategy": strategy.name, "small_side": strategy.small_side,
            "compaction": strategy.compaction,
            "memtables": {"small": strategy.small_memtable, "big": strategy.big_memtable}}


def from_plan(plan: Plan, subject: str) -> Strategy:
    """The strategy the planner decided for ``subject`` (a join's or a pipeline's name).

    Its name, and for a join its small and big memtables and compaction policy (a
    pipeline's plan has no small side, and a schedule per index instead of one policy:
    the Strategy then names the strategy's policy).  The reason is the strategy
    decision's, so a report says why it was chosen.
    """
    name = plan.get("strategy", subject)
    small = plan.get("small_side", subject, None)
    memtables: dict[str, Memtable | None] = {"small": None, "big": None}
    if small is not None:
        big = "right" if small == "left" else "left"
        memtables = {"small": plan.get("memtable", plan.side_index(small), None),
                     "big": plan.get("memtable", plan.side_index(big), None)}
    decision = plan.decision("strategy", subject)
    return Strategy(
        name, compaction=plan.get("compaction", subject, POLICY_OF.get(name, "rocksdb")),
        small_memtable=memtables["small"], big_memtable=memtables["big"], bulk=name == "bulk",
        reason=decision.reason if decision is not None else "",
    )
