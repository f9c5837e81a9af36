"""Partial aggregation: an aggregate whose input must move is first summed where it lies.

A grouped aggregate needs each group on one shard; when its input lies hashed by other
columns (q4: the sales joined to customers lie by ``c_customer_sk``, the aggregate
groups by ``c_customer_id`` and seven more columns), every input row would cross an
exchange.  When every aggregate is a ``sum`` of integers or decimals or a ``count``
(exact and decomposable, retractions included: a sum of partial sums is the sum), the
graph is rewritten as

    partial = input.group_by(keys + lying_by).aggregate(a=(f, arg), ...)   # where it lies
    final   = partial.group_by(keys).aggregate(a=("sum", a), ...)          # after the move

so the exchange carries one row per (group, shard key) instead of one per input row
(q4 at SF0.1: 24,585 rows for 275,573).  Not when the partial group key holds a unique
key of the input (one row per partial group: nothing saved, a state more).
``lying_by`` (one column per slot of the input's hash key) only lets the planner run
the partial aggregate where its input lies; the answer does not depend on it, since
the final aggregate adds the partials of a group whichever shards they come from.
Floating-point sums (whose value depends on the order of additions), ``min``/``max``
(not decomposable under retractions) and the rest are left alone.

The rewrite is recorded as one decision per aggregate (topic ``partial``, subject the
aggregate's label in the given graph, choice the added columns), so that
:func:`planner.distribute.from_decisions` rebuilds the same graph; a plan recorded
without them is rebuilt without the rewrite.  Node labels of the rewritten graph (what
``explain()`` shows and stores are named by) follow its own numbering.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from joinstate.graph import AggNode, Graph, SourceNode, Stream, UniqueNode
from planner.errors import PlannerError
from planner.partitioning import Hash
from planner.rule import Decision
from planner.stagegraph import rebuild, source_stream

if TYPE_CHECKING:
    from collections.abc import Mapping

    from planner.placement import Derivation

__all__ = ["TOPIC", "candidates", "split_graph", "splits_of"]

TOPIC = "partial"
RULE = "partition_partial"
_EXACT = ("sum", "count")


def _exact(node: AggNode) -> bool:
    """Every aggregate is a count, or a sum whose result is an integer or a decimal."""
    if not node.aggs:
        return False
    for name, func, _ in node.aggs:
        if func not in _EXACT:
            return False
        t = node.schema.field(name).type
        if func == "sum" and not (pa.types.is_integer(t) or pa.types.is_decimal(t)):
            return False
    return True


def _lying_by(node: AggNode, d: Derivation) -> tuple[str, ...] | None:
    """Columns of the input's hash key (one per slot) to add to the partial's group key."""
    inp = node.inputs[0]
    p = d.natural(inp.id)
    if not isinstance(p, Hash):
        return None
    names = inp.schema.names
    cols = []
    for slot in p.slots:
        present = [c for c in slot if c in names]
        if not present:
            return None
        if not any(c in node.keys for c in present):
            cols.append(present[0])
    return tuple(cols) or None


def candidates(d: Derivation) -> list[Decision]:
    """A decision per grouped aggregate whose input is exchanged and whose sums are exact."""
    out = []
    graph = d.facts.graph
    for n in graph.nodes:
        if not isinstance(n, AggNode) or not n.keys or not _exact(n):
            continue
        moved = [a for a in d.arrivals_of(n.id) if a.mode == "exchange"]
        if not moved:
            continue
        extra = _lying_by(n, d)
        if extra is None:
            continue
        grouped = {*n.keys, *extra}
        if any(u <= grouped for u in d.facts.uniques.get(n.inputs[0].id, ())):
            continue  # one input row per partial group: nothing would be saved
        try:
            _split(n, Stream(n.inputs[0]), extra)
        except PlannerError:
            continue
        rows = round(moved[0].rows)
        out.append(Decision(
            TOPIC, n.label, list(extra),
            f"its input ({rows:,} rows) would move to {moved[0].partitioning.describe()}; "
            f"summed first where it lies, by its group key and {', '.join(extra)} (sums "
            "of partial sums and counts are exact), one row per group and shard key moves",
            {"input_rows": rows}, RULE))
    return out


def splits_of(decisions: Any) -> dict[str, tuple[str, ...]]:
    """``{aggregate label: added columns}`` of the ``partial`` decisions among these."""
    out: dict[str, tuple[str, ...]] = {}
    for dec in decisions:
        topic = dec["topic"] if isinstance(dec, dict) else dec.topic
        if topic != TOPIC:
            continue
        subject = dec["subject"] if isinstance(dec, dict) else dec.subject
        choice = dec["choice"] if isinstance(dec, dict) else dec.choice
        out[str(subject)] = tuple(str(c) for c in choice)
    return out


def _split(n: AggNode, inp: Stream, extra: tuple[str, ...]) -> Stream:
    """``n`` over ``inp`` as a partial aggregate by ``keys + extra``, then the final one."""
    aggs = {name: (func, arg) for name, func, arg in n.aggs}
    partial = inp.group_by([*n.keys, *extra]).aggregate(**aggs)
    final = partial.group_by(list(n.keys)).aggregate(
        **{name: ("sum", pc.field(name)) for name, _, _ in n.aggs})
    got = [(f.name, f.type) for f in final.schema]
    want = [(f.name, f.type) for f in n.schema]
    if got != want:
        raise PlannerError(f"internal: {n.label} split gives columns {got}, not {want}")
    return final


def split_graph(graph: Graph, splits: Mapping[str, tuple[str, ...]]) -> Graph:
    """``graph`` with each aggregate named in ``splits`` rewritten (module docstring)."""
    if not splits:
        return graph
    by_label = {n.label: n for n in graph.nodes}
    unknown = sorted(set(splits) - set(by_label))
    if unknown:
        raise PlannerError(f"the plan pre-aggregates {unknown}, which the graph does not "
                           "have: the definition differs from the one planned")
    skip = {m.node.id for m in graph.materialized.values()}
    hidden_select = {name: graph.outputs[name].id for name, m in graph.materialized.items()
                     if m.hidden}
    skip |= set(hidden_select.values())
    streams: dict[int, Stream] = {}
    for n in graph.nodes:
        if n.id in skip:
            continue
        if isinstance(n, UniqueNode):
            continue  # made again by the new graph from its sources' declarations
        if isinstance(n, SourceNode):
            streams[n.id] = source_stream(n.name, n)
        elif n.label in splits:
            assert isinstance(n, AggNode)
            streams[n.id] = _split(n, streams[n.inputs[0].id], splits[n.label])
        else:
            streams[n.id] = rebuild(n, [streams[i.id] for i in n.inputs])
    g = Graph(sources=[streams[s.id] for s in graph.sources.values()])
    for name, node in graph.outputs.items():
        m = graph.materialized.get(name)
        if m is None:
            g = g.output(name, streams[node.id])
        elif m.hidden:
            under = node.inputs[0]
            g = g.output(name, streams[under.id], materialize=True, order_by=m.order_by,
                         limit=m.limit, hide=m.hidden)
        else:
            g = g.output(name, streams[node.id], materialize=True, order_by=m.order_by,
                         limit=m.limit)
    return g
