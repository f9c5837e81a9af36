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

A pipeline is decided per operator (:func:`decide_operators`): each operator a push
reaches that has a recompute path (a join, a ``join_all``, a window) gets its own
decision from the rows expected to reach it, the rows its recompute path would scan and
its own measured runs, which :func:`record_operators` keeps per (source, operator,
strategy) together with the fan-out (rows reaching the operator per source row) they
were measured at.
"""

from __future__ import annotations

import json
import logging
import statistics
from typing import TYPE_CHECKING, Any

import joinstate
from joinstate.names import batch_cost_key
from joinstate.nodes import JoinAllNode, JoinNode, WindowNode
from planner.errors import PlannerError
from planner.rule import Decision
from planner.rules._text import rows
from planner.rules.recompute import (
    OPERATOR_BATCH_US,
    OPERATOR_INCREMENTAL_US,
    OPERATOR_SCAN_US,
    OPERATOR_WINDOW_BATCH_US,
    TOPIC,
    BatchContext,
    Observation,
    RecomputeRule,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa

    from joinstate.maintained import Maintained
    from joinstate.ops.base import OperatorRun
    from joinstate.views import IndexInfo

__all__ = ["KEEP", "STRATEGIES", "batch_context", "decide_batch", "decide_operators",
           "estimated_fanouts", "operator_input", "operator_runs", "partners_per_row",
           "record_batch", "record_operators", "recorded", "scanned_rows"]

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


# ---- pipelines: one decision per operator ----------------------------------------------


def operator_input(source: str, label: str) -> str:
    """The record name of operator ``label``'s runs in pushes to ``source``."""
    return f"{source}>{label}"


def operator_runs(pipeline: joinstate.Pipeline, source: str, label: str, strategy: str
                  ) -> tuple[tuple[Observation, ...], tuple[float, ...]]:
    """One operator's recorded runs for ``source`` and ``strategy``, and their fan-outs.

    A fan-out is the rows that reached the operator per row of the source batch.
    """
    owner, store = _owner(pipeline)
    raw = store.meta_get(batch_cost_key(owner, operator_input(source, label), strategy))
    if raw is None:
        return (), ()
    try:
        doc = json.loads(raw)
        if doc.get("v") != _VERSION:
            return (), ()
        runs = tuple(Observation(int(r[0]), int(r[1]), float(r[2]), float(r[3]))
                     for r in doc["runs"])
        fan = tuple(float(r[0]) / float(r[4]) for r in doc["runs"] if float(r[4]) > 0)
    except (ValueError, KeyError, TypeError, IndexError) as exc:  # a hint: use defaults
        log.warning("ignoring the unreadable batch-cost record of %s/%s/%s: %s", owner,
                    operator_input(source, label), strategy, exc)
        return (), ()
    return runs, fan


def record_operators(pipeline: joinstate.Pipeline, source: str, batch_rows: int,
                     runs: Mapping[str, OperatorRun]) -> None:
    """Append each operator's measured run of one push to its record (last :data:`KEEP`).

    ``runs``: by operator label (:attr:`joinstate.ops.base.Strategies.runs`); only the
    operators with a recompute path are recorded (the others have no choice to make).
    Skipped on a read-only store.  One metadata write for all of them.
    """
    owner, store = _owner(pipeline)
    if store.read_only or batch_rows <= 0:
        return
    candidates = pipeline.recompute_candidates(source)
    txn = joinstate.Transaction(store)
    for label, run in runs.items():
        if label not in candidates or run.strategy not in STRATEGIES:
            continue
        key = batch_cost_key(owner, operator_input(source, label), run.strategy)
        old: list[list[float]] = []
        raw = store.meta_get(key)
        if raw is not None:
            try:
                doc = json.loads(raw)
                old = list(doc["runs"]) if doc.get("v") == _VERSION else []
            except (ValueError, KeyError, TypeError):
                old = []
        new = [run.rows_in, run.scanned_rows, round(run.ms, 3), round(run.scan_ms, 3),
               batch_rows]
        doc = {"v": _VERSION, "runs": [*old, new][-KEEP:]}
        txn.record(key, json.dumps(doc, separators=(",", ":")).encode())
    txn.commit()


def _partners(info: IndexInfo | None) -> float:
    """Rows a key meets in an index: rows per entry where an entry is a key, else 1."""
    if info is None or info.layout != "key" or info.entries <= 0:
        return 1.0
    return max(1.0, info.rows / info.entries)


def estimated_fanouts(pipeline: joinstate.Pipeline, source: str) -> dict[str, float]:
    """Rows reaching each operator per row pushed to ``source``, from the counters.

    Each inner join or ``join_all`` on the way multiplies by the rows a key meets in
    the indexes of its unchanged inputs (known where an index holds one entry per key,
    else 1); other operators pass their inputs' rows on.  A guess: the fan-out measured
    on earlier pushes replaces it (:func:`decide_operators`).
    """
    graph, phys = pipeline.graph, pipeline.physical
    start = graph.source(source)
    reach = phys.reachable(start)
    infos = {i.name: i for i in pipeline.indexes()}
    est: dict[int, float] = {start.id: 1.0}
    out: dict[str, float] = {}
    for node in sorted((graph.nodes[i] for i in reach), key=lambda n: n.id):
        if node.id == start.id:
            continue
        changed = [i.id in est for i in node.inputs]
        arriving = sum(est[i.id] for i in node.inputs if i.id in est)
        out[node.label] = arriving
        if isinstance(node, JoinNode | JoinAllNode):
            meets = 1.0
            for pos, hit in enumerate(changed):
                if not hit:
                    plan = phys.readers[(node.id, pos)].plan
                    meets *= _partners(infos.get(plan.cf(pipeline.name)))
            est[node.id] = arriving * meets
        else:
            est[node.id] = arriving
    return out


def decide_operators(pipeline: joinstate.Pipeline, source: str,
                     delta: pa.Table | pa.RecordBatch) -> list[Decision]:
    """``incremental`` or ``recompute`` for each operator a push of ``delta`` reaches.

    One :class:`~planner.rule.Decision` per operator with a recompute path (label in
    ``figures["operator"]``), decided by :class:`RecomputeRule` from: the rows expected
    to reach it (the batch's rows times its fan-out, the median measured on earlier
    pushes, else :func:`estimated_fanouts`), the rows of the indexes its recompute path
    scans (counters; an index held in a probe cache is probed in memory on either
    path, so it is not scanned), and its own recorded runs of both paths.  An operator
    whose every index is cached stays incremental: both paths would read the same way.
    Reads only metadata.
    """
    _owner(pipeline)  # a closed store raises here
    if source not in pipeline.sources:
        raise PlannerError(f"{source!r} is not an input of pipeline {pipeline.name!r}; its "
                           f"sources: {list(pipeline.sources)}")
    n = delta.num_rows
    candidates = pipeline.recompute_candidates(source)
    nodes = {node.label: node for node in pipeline.graph.nodes}
    guessed: dict[str, float] | None = None
    out: list[Decision] = []
    for label, indexes in candidates.items():
        scanned = [i for i in indexes if not i.cached]
        if indexes and not scanned:
            out.append(_held_in_memory(pipeline, source, label, n, indexes))
            continue
        inc, fan_i = operator_runs(pipeline, source, label, "incremental")
        rc, fan_r = operator_runs(pipeline, source, label, "recompute")
        fans = [*fan_i, *fan_r][-KEEP:]
        if fans:
            fanout = float(statistics.median(fans))  # numpy's costs ~20 us on 16 floats
            fan_from = f"measured on {len(fans)} push(es)"
        else:
            if guessed is None:
                guessed = estimated_fanouts(pipeline, source)
            fanout, fan_from = guessed.get(label, 1.0), "estimated from the counters"
        reaching = round(n * fanout)
        rows_scanned = sum(i.rows for i in scanned)
        window = isinstance(nodes.get(label), WindowNode)
        context = BatchContext(
            f"pipeline {pipeline.name!r}, operator {label} (push to {source!r})",
            batch_rows=reaching, scanned_rows=rows_scanned, state_rows=rows_scanned,
            incremental=inc, recompute=rc,
            default_incremental_us=OPERATOR_INCREMENTAL_US, default_scan_us=OPERATOR_SCAN_US,
            default_batch_us=OPERATOR_WINDOW_BATCH_US if window else OPERATOR_BATCH_US)
        d = RecomputeRule().apply(context)[0]
        figures = {**d.figures, "operator": label, "source_batch_rows": n,
                   "fanout": round(fanout, 4), "fanout_from": fan_from,
                   "scanned_indexes": [i.name for i in scanned]}
        reason = (f"{d.reason}; {rows(reaching)} rows expected to reach it "
                  f"({fanout:.3g} per source row, {fan_from})")
        out.append(Decision(d.topic, d.subject, d.choice, reason, figures, d.rule))
    return out


def _held_in_memory(pipeline: joinstate.Pipeline, source: str, label: str, n: int,
                    indexes: list[IndexInfo]) -> Decision:
    """``incremental`` for an operator whose every index is held in a probe cache.

    Its recompute path probes a cached index in memory rather than scanning it, so both
    paths read the same way and cost the same: choosing recompute would change nothing
    but the label (and measured runs would be booked to a path that did not scan).
    """
    names = ", ".join(i.name for i in indexes)
    return Decision(
        TOPIC, f"pipeline {pipeline.name!r}, operator {label} (push to {source!r})",
        "incremental",
        f"incremental: every index it reads ({names}) is held in memory as a probe cache, "
        "which both paths probe the same way; a recompute would scan nothing",
        {"operator": label, "source_batch_rows": n, "batch_rows": n, "scanned_rows": 0,
         "state_rows": sum(i.rows for i in indexes), "incremental_ms": 0.0,
         "recompute_ms": 0.0, "held_in_memory": True,
         "scanned_indexes": [i.name for i in indexes]},
        "recompute")
