"""The planner's decision for one change batch, and the measured costs it learns from.

:func:`decide_batch` gathers what :class:`planner.rules.recompute.RecomputeRule` needs —
the batch's rows, the rows stored on each side (O(1) counters), and the costs recorded
for earlier batches of the same join side — and returns the rule's
:class:`~planner.rule.Decision`.  Nothing is read from the data: deciding costs a few
metadata reads.

:func:`record_batch` is called by the executor (``population.apply``) after every apply:
it appends ``(batch rows, scanned rows, ms)`` to the side's record for that strategy in
the store's ``__meta__`` family (:func:`joinstate.names.batch_cost_key`), keeping the
last :data:`KEEP` runs, so later decisions use measured costs instead of the defaults.
A record is a hint: a missing, unreadable or read-only one means the defaults.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import joinstate
from joinstate.names import batch_cost_key, pipeline_owner
from planner.errors import PlannerError
from planner.rules.recompute import BatchContext, Observation, RecomputeRule

if TYPE_CHECKING:
    import pyarrow as pa

    from planner.rule import Decision

__all__ = ["KEEP", "STRATEGIES", "batch_context", "decide_batch", "partners_per_row",
           "record_batch", "recorded", "scanned_rows"]

log = logging.getLogger(__name__)

STRATEGIES = ("incremental", "recompute")
KEEP = 16
"""Recorded runs kept per (join side or pipeline source, strategy)."""
_VERSION = 1

Target = joinstate.Join | joinstate.Pipeline


def _owner(target: Target) -> tuple[str, joinstate.Database]:
    """Owner name of the target's records, and its open store."""
    store = target.store
    if store is None or store.closed:
        raise joinstate.StateClosedError(f"{target.name!r} is bound to a closed state store")
    if isinstance(target, joinstate.Join):
        return target.name, store
    return pipeline_owner(target.name), store


def scanned_rows(join: joinstate.Join, side: joinstate.SideName) -> int:
    """Rows a recompute of a batch to ``side`` reads (``population.recompute`` scans these).

    The other side, and ``side`` itself when the join keeps its degrees.
    """
    other: joinstate.SideName = "right" if side == "left" else "left"
    n = join.rows(other)
    return n + join.rows(side) if join.index(side).tracks_degree else n


def partners_per_row(join: joinstate.Join, side: joinstate.SideName) -> float:
    """Rows of the other side a batch row to ``side`` is expected to meet.

    Known from the counters when ``side`` holds one row per join key (its entries are
    its keys): the other side's rows per key of this side.  Otherwise 1, a guess that
    the first measured runs replace.
    """
    info = join.index(side)
    if info.layout != "key" or info.entries <= 0:
        return 1.0
    other: joinstate.SideName = "right" if side == "left" else "left"
    return max(1.0, join.rows(other) / info.entries)


def recorded(target: Target, side_or_source: str, strategy: str) -> tuple[Observation, ...]:
    """The runs recorded for one side (or source) and strategy, oldest first."""
    owner, store = _owner(target)
    raw = store.meta_get(batch_cost_key(owner, side_or_source, strategy))
    if raw is None:
        return ()
    try:
        doc = json.loads(raw)
        if doc.get("v") != _VERSION:
            return ()
        return tuple(Observation(int(r[0]), int(r[1]), float(r[2]),
                                 float(r[3]) if len(r) > 3 else 0.0) for r in doc["runs"])
    except (ValueError, KeyError, TypeError) as exc:  # a hint only: fall back to defaults
        log.warning("ignoring the unreadable batch-cost record of %s/%s/%s: %s", owner,
                    side_or_source, strategy, exc)
        return ()


def record_batch(target: Target, side_or_source: str, strategy: str, batch_rows: int,
                 scanned: int, ms: float, scan_ms: float = 0.0) -> None:
    """Append one measured apply to the record (keeps the last :data:`KEEP`).

    ``scanned``: rows a recompute read (0 for incremental); ``scan_ms``: the part of
    ``ms`` it spent reading them.  One metadata read and one write; skipped on a
    read-only store.
    """
    if strategy not in STRATEGIES:
        raise PlannerError(f"strategy={strategy!r} must be one of {STRATEGIES}")
    owner, store = _owner(target)
    if store.read_only:
        return
    runs = [*recorded(target, side_or_source, strategy),
            Observation(batch_rows, scanned, ms, scan_ms)][-KEEP:]
    doc: dict[str, Any] = {"v": _VERSION, "runs": [
        [o.batch_rows, o.scanned_rows, round(o.ms, 3), round(o.scan_ms, 3)] for o in runs]}
    store.meta_put(batch_cost_key(owner, side_or_source, strategy),
                   json.dumps(doc, separators=(",", ":")).encode())


def batch_context(target: Target, side_or_source: str, delta: pa.Table | pa.RecordBatch
                  ) -> BatchContext:
    """The rule's input for applying ``delta`` to one side of a join or source of a pipeline.

    ``batch_rows`` counts the delta's rows as given (before consolidation: deciding must
    not read it).
    """
    n = delta.num_rows
    inc = recorded(target, side_or_source, "incremental")
    if isinstance(target, joinstate.Join):
        if side_or_source not in ("left", "right"):
            raise PlannerError(f"side={side_or_source!r} must be 'left' or 'right' for join "
                               f"{target.name!r}")
        side: joinstate.SideName = "left" if side_or_source == "left" else "right"
        return BatchContext(
            f"join {target.name!r}, {side} side", batch_rows=n,
            scanned_rows=scanned_rows(target, side), state_rows=target.rows(side),
            partners_per_row=partners_per_row(target, side), incremental=inc,
            recompute=recorded(target, side, "recompute"))
    if side_or_source not in target.sources:
        raise PlannerError(f"source={side_or_source!r} is not a source of pipeline "
                           f"{target.name!r}; its sources: {list(target.sources)}")
    return BatchContext(
        f"pipeline {target.name!r}, source {side_or_source!r}", batch_rows=n,
        scanned_rows=0, state_rows=0, incremental=inc, recompute_available=False,
        unavailable="pipelines have no recompute path (each operator's state would have "
                    "to be rebuilt from its inputs' snapshots)")


def decide_batch(target: Target, side_or_source: str, delta: pa.Table | pa.RecordBatch
                 ) -> Decision:
    """``incremental`` or ``recompute`` for ``delta``; the Decision carries the figures.

    ``figures``: ``batch_rows``, ``state_rows``, ``scanned_rows``, ``incremental_ms``
    and ``recompute_ms`` (the estimates), the per-row costs used and where they come
    from (recorded runs or defaults).  ``reason`` is one printable sentence.
    """
    return RecomputeRule().apply(batch_context(target, side_or_source, delta))[0]
