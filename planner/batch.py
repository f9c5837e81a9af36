"""The planner's decision for one change batch, and the measured costs it learns from.

:func:`decide_batch` gathers what :class:`planner.rules.recompute.RecomputeRule` needs —
the batch's rows, the rows stored in the indexes a push to the input writes and probes
(O(1) counters, through the :class:`~joinstate.maintained.Maintained` protocol: a join
side's own index and the other side's), and the costs recorded for earlier batches to
the same input — and returns the rule's :class:`~planner.rule.Decision`.  Nothing is
read from the data: deciding costs a few metadata reads.  Whether a recompute path
exists for the target is the executor's to say (``recompute_unavailable``).

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
from joinstate.names import batch_cost_key
from planner.errors import PlannerError
from planner.rules.recompute import BatchContext, Observation, RecomputeRule

if TYPE_CHECKING:
    import pyarrow as pa

    from joinstate.maintained import Maintained
    from planner.rule import Decision

__all__ = ["KEEP", "STRATEGIES", "batch_context", "decide_batch", "partners_per_row",
           "record_batch", "recorded", "scanned_rows"]

log = logging.getLogger(__name__)

STRATEGIES = ("incremental", "recompute")
KEEP = 16
"""Recorded runs kept per (join side or pipeline source, strategy)."""
_VERSION = 1



def _owner(target: Maintained) -> tuple[str, joinstate.Database]:
    """Owner name of the target's records, and its open store."""
    store = target.store
    if store is None or store.closed:
        raise joinstate.StateClosedError(f"{target.name!r} is bound to a closed state store")
    return target.owner, store


def scanned_rows(target: Maintained, input_name: str) -> int:
    """Rows a recompute of a batch to ``input_name`` reads.

    The indexes a push to it probes, and those it writes that keep degrees (a join:
    the other side, and its own side when the join keeps its degrees; what
    ``population.recompute`` scans).
    """
    n = sum(ix.rows for ix in target.probed_indexes(input_name))
    return n + sum(ix.rows for ix in target.written_indexes(input_name) if ix.tracks_degree)


def partners_per_row(target: Maintained, input_name: str) -> float:
    """Rows a batch row to ``input_name`` is expected to meet in the index it probes.

    Known from the counters when the input writes one index holding one row per key
    (its entries are its keys) and probes one: that index's rows per key of this one
    (a join: the other side's rows per key of this side).  Otherwise 1, a guess that
    the first measured runs replace.
    """
    written = target.written_indexes(input_name)
    probed = target.probed_indexes(input_name)
    if len(written) != 1 or len(probed) != 1:
        return 1.0
    info = written[0]
    if info.layout != "key" or info.entries <= 0:
        return 1.0
    return max(1.0, probed[0].rows / info.entries)


def recorded(target: Maintained, side_or_source: str, strategy: str
             ) -> tuple[Observation, ...]:
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


def record_batch(target: Maintained, side_or_source: str, strategy: str, batch_rows: int,
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


def batch_context(target: Maintained, input_name: str, delta: pa.Table | pa.RecordBatch,
                  *, recompute_unavailable: str | None = None) -> BatchContext:
    """The rule's input for applying ``delta`` to one input of ``target``.

    ``batch_rows`` counts the delta's rows as given (before consolidation: deciding must
    not read it).  ``recompute_unavailable``: why the executor has no recompute path for
    this target (None: it has one).
    """
    if input_name not in target.inputs:
        raise PlannerError(f"{input_name!r} is not an input of {target.kind} {target.name!r}; "
                           f"its inputs: {list(target.inputs)}")
    n = delta.num_rows
    label = target.input_label(input_name).removeprefix("the ")
    subject = f"{target.kind} {target.name!r}, {label}"
    inc = recorded(target, input_name, "incremental")
    if recompute_unavailable is not None:
        return BatchContext(subject, batch_rows=n, scanned_rows=0, state_rows=0,
                            incremental=inc, recompute_available=False,
                            unavailable=recompute_unavailable)
    return BatchContext(
        subject, batch_rows=n, scanned_rows=scanned_rows(target, input_name),
        state_rows=sum(ix.rows for ix in target.written_indexes(input_name)),
        partners_per_row=partners_per_row(target, input_name), incremental=inc,
        recompute=recorded(target, input_name, "recompute"))


def decide_batch(target: Maintained, input_name: str, delta: pa.Table | pa.RecordBatch,
                 *, recompute_unavailable: str | None = None) -> Decision:
    """``incremental`` or ``recompute`` for ``delta``; the Decision carries the figures.

    ``figures``: ``batch_rows``, ``state_rows``, ``scanned_rows``, ``incremental_ms``
    and ``recompute_ms`` (the estimates), the per-row costs used and where they come
    from (recorded runs or defaults).  ``reason`` is one printable sentence.
    ``recompute_unavailable`` as in :func:`batch_context`.
    """
    return RecomputeRule().apply(batch_context(
        target, input_name, delta, recompute_unavailable=recompute_unavailable))[0]
