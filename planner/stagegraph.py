"""The sub-graph each stage of a distributed plan maintains, rebuilt from the graph's nodes.

A stage's sub-graph is a :class:`joinstate.Graph` built with the public builder
(``source``, ``Stream.join`` ...) from the operators placed in that stage, so the runtime
maintains it exactly as it would the whole graph:

* a **delivered source** keeps its name and declaration (a second delivery of one
  source to one stage, routed otherwise, is ``<source>-2``), except its further unique
  keys: each is verified by the check the plan placed (a root of the stage graph, over
  the delivery routed by that key), not by every delivery;
* a **chain** (filters, projections, unions over sources) is rebuilt in every stage that
  reads it, over the deliveries of its sources there; readers of one chain with the
  same deliveries share one copy (and so, in the runtime, its indexes);
* an **exchange** is an output of the sending stage (the producer's columns the graph
  needs downstream, and the partition columns) and a source of the receiving one, both
  named by the exchange's id; the receiving side puts typed NULLs where the unsent
  columns were, so every rebuilt operator sees its original input schema (and the
  runtime, which carries only the columns something reads, drops them again);
* the graph's **outputs** are outputs of the stage their node runs in (materialized ones
  materialized there: a count per row adds up over shards, so reading one is reading
  every shard's rows, then ordering and limiting them).

A stream that lies :class:`~planner.partitioning.Single` (a global aggregate, what follows
it, a copy read once) exists only in shard 0's sub-graph: on the other shards a global
aggregate would hold a row of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from joinstate.graph import (
    AggNode,
    CheckNode,
    FilterNode,
    Graph,
    JoinAllNode,
    JoinNode,
    ProjectNode,
    RepeatNode,
    SourceNode,
    Stream,
    UnionNode,
    UniqueNode,
    WindowNode,
    join_all,
    source,
)
from planner.errors import PlannerError
from planner.partitioning import Hash, Partitioning, Replicated, Single
from planner.placement import chain_partitioning

if TYPE_CHECKING:
    from collections.abc import Mapping

    from joinstate.graph import Node
    from planner.partitioning import GraphFacts
    from planner.placement import Arrival, Derivation

__all__ = ["Delivery", "Exchange", "Stage", "build_stages", "rebuild", "source_stream"]


@dataclass(frozen=True)
class Delivery:
    """Source ``source`` routed as ``partitioning`` into stage ``stage`` (named ``name`` there)."""

    source: str
    partitioning: Partitioning
    stage: int
    name: str


@dataclass(frozen=True)
class Exchange:
    """Rows of node ``producer`` sent from stage ``from_stage`` to ``to_stage``.

    ``partitioning``: how they are routed (None: each row stays on its shard, a stage
    boundary only).  ``columns``: the columns sent.  ``copies``: the producer lies
    replicated, so each shard sends only the rows routed to itself (the other shards
    hold the same rows and send the rest).
    """

    id: str
    producer: int
    from_stage: int
    to_stage: int
    partitioning: Hash | Single | None
    columns: tuple[str, ...]
    rows: float = 0.0
    copies: bool = False

    def describe(self) -> str:
        """``hash(c) -> stage 1`` or ``kept on its shard -> stage 1``."""
        how = "kept on its shard" if self.partitioning is None else self.partitioning.describe()
        return f"{how} -> stage {self.to_stage}"


@dataclass(frozen=True)
class Stage:
    """One stage: one task per shard, each maintaining :meth:`graph_for` its shard.

    ``nodes``: ids (in the whole graph) of the operators it computes, chains included.
    """

    index: int
    deliveries: tuple[Delivery, ...]
    receives: tuple[str, ...]
    sends: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[int, ...]
    graph: Graph | None
    others: Graph | None

    def graph_for(self, shard: int) -> Graph | None:
        """The sub-graph shard ``shard`` maintains (None: nothing runs there)."""
        return self.graph if shard == 0 else self.others

    def inputs(self) -> tuple[str, ...]:
        """The names of the stage graph's sources, deliveries first."""
        return (*(d.name for d in self.deliveries), *self.receives)

    def reads(self, shard: int, name: str) -> bool:
        """Whether shard ``shard``'s sub-graph reads input ``name``.

        A copy read only by operators on shard 0 (a join of a copy with a stream lying on
        shard 0) is not read elsewhere: its rows for the other shards are dropped there.
        """
        g = self.graph_for(shard)
        return g is not None and name in g.sources


def _lies_single(a: Arrival) -> bool:
    return isinstance(a.partitioning, Single)


def build_stages(facts: GraphFacts, d: Derivation, stage_of: Mapping[int, int],
                 out_stage: Mapping[str, int]
                 ) -> tuple[tuple[Stage, ...], dict[str, Exchange]]:
    """Every stage (with its sub-graphs) and every exchange of a placed graph."""
    return _Builder(facts, d, stage_of, out_stage).build()


class _Builder:
    def __init__(self, facts: GraphFacts, d: Derivation, stage_of: Mapping[int, int],
                 out_stage: Mapping[str, int]) -> None:
        self.facts = facts
        self.d = d
        self.stage_of = dict(stage_of)
        self.out_stage = dict(out_stage)
        self.needed = facts.graph.needed
        taken = set(facts.graph.outputs) | set(facts.graph.sources)
        prefix = "_x"
        while any(t.startswith(prefix) for t in taken):
            prefix = "_" + prefix
        self.prefix = prefix
        self.exchanges: dict[tuple[Any, ...], Exchange] = {}
        self.sent_from: dict[str, tuple[tuple[str, Partitioning], ...]] = {}
        self.names: dict[tuple[int, str, Partitioning], str] = {}
        # consumer (node id or output name) -> [(input position, how it arrives)]
        self.inputs: dict[Any, list[tuple[int, tuple[str, Any]]]] = {}
        self.single: set[Any] = {nid for nid, p in d.placements.items()
                                 if isinstance(p.partitioning, Single)}

    def _exchange(self, producer: int, partitioning: Hash | Single | None, to: int,
                  dl: tuple[tuple[str, Partitioning], ...] = ()) -> Exchange:
        key = (producer, partitioning, to, dl)
        e = self.exchanges.get(key)
        if e is None:
            facts = self.facts
            node = facts.nodes[producer]
            need = set(self.needed.get(producer, node.schema.names))
            if isinstance(partitioning, Hash):
                need |= set(partitioning.columns)
            cols = tuple(c for c in node.schema.names if c in need)
            lies = (chain_partitioning(facts, producer, dict(dl)) if dl
                    else self.d.natural(producer))
            e = Exchange(f"{self.prefix}{len(self.exchanges)}", producer,
                         0 if producer in facts.chain else self.stage_of[producer], to,
                         partitioning, cols, facts.rows[producer], isinstance(lies, Replicated))
            self.exchanges[key] = e
            self.sent_from[e.id] = dl
        return e

    def _how(self, a: Arrival, at: int) -> tuple[str, Any]:
        facts = self.facts
        if a.mode == "exchange":
            p = a.partitioning
            if not isinstance(p, Hash | Single):
                raise PlannerError(f"internal: an exchange to {p.describe()}")
            return ("exchange", self._exchange(a.producer, p, at, a.deliveries))
        if a.producer in facts.chain:
            return ("chain", (a.producer, a.deliveries))
        if self.stage_of[a.producer] < at:
            return ("exchange", self._exchange(a.producer, None, at))
        return ("local", a.producer)

    def _on_shard0(self, how: tuple[str, Any]) -> bool:
        """Whether an input arriving ``how`` lies on shard 0 only."""
        kind, what = how
        if kind == "local":
            return what in self.single
        if kind == "chain":
            return isinstance(chain_partitioning(self.facts, what[0], dict(what[1])), Single)
        return isinstance(what.partitioning, Single)

    def build(self) -> tuple[tuple[Stage, ...], dict[str, Exchange]]:
        for a in self.d.arrivals:
            if a.output is not None:
                at = self.out_stage[a.output]
                who: Any = a.output
                if _lies_single(a):
                    self.single.add(a.output)
            else:
                at = self.stage_of[a.consumer]
                who = a.consumer
            self.inputs.setdefault(who, []).append((a.pos, self._how(a, at)))
        count = max([0, *self.stage_of.values(), *self.out_stage.values()]) + 1
        stages = tuple(self._stage(k) for k in range(count))
        return stages, {e.id: e for e in self.exchanges.values()}

    def _stage(self, k: int) -> Stage:
        g0, info = self._graph(k, shard0=True)
        g1, _ = self._graph(k, shard0=False)
        return Stage(k, tuple(info["deliveries"]), tuple(info["receives"]),
                     tuple(info["sends"]), tuple(info["outputs"]), tuple(info["nodes"]), g0, g1)

    def _graph(self, k: int, *, shard0: bool) -> tuple[Graph | None, dict[str, list[Any]]]:
        facts, d = self.facts, self.d
        streams: dict[Any, Stream] = {}
        deliveries: dict[tuple[str, Partitioning], Delivery] = {}
        receives: list[str] = []
        nodes: list[int] = []
        checks: list[Stream] = []

        def delivered(source: str, p: Partitioning) -> Stream:
            key = (source, p)
            if key not in deliveries:
                name = self.names.get((k, source, p))
                if name is None:  # named in shard 0's graph, which has every delivery
                    n = sum(1 for (st, src, _) in self.names if st == k and src == source)
                    name = source if n == 0 else f"{source}-{n + 1}"
                    self.names[(k, source, p)] = name
                deliveries[key] = Delivery(source, p, k, name)
                streams[("src", key)] = _source(name, facts.graph.sources[source],
                                                checks=False)
            return streams[("src", key)]

        def chain(nid: int, dl: tuple[tuple[str, Partitioning], ...]) -> Stream:
            key = ("chain", nid, dl)
            if key not in streams:
                n = facts.nodes[nid]
                if isinstance(n, SourceNode):
                    streams[key] = delivered(n.name, dict(dl)[n.name])
                else:
                    streams[key] = rebuild(n, [chain(i.id, dl) for i in n.inputs])
                if nid not in nodes:
                    nodes.append(nid)
            return streams[key]

        def received(e: Exchange) -> Stream:
            key = ("x", e.id)
            if key not in streams:
                node = facts.nodes[e.producer]
                fields = [node.schema.field(c) for c in e.columns]
                s = source(e.id, pa.schema(fields), retractions="unchecked")
                if list(e.columns) != node.schema.names:
                    s = s.select({f.name: pc.field(f.name) if f.name in e.columns else
                                  pc.scalar(pa.scalar(None, f.type)) for f in node.schema})
                streams[key] = s
                receives.append(e.id)
            return streams[key]

        def arrive(how: tuple[str, Any]) -> Stream:
            kind, what = how
            if kind == "exchange":
                return received(what)
            if kind == "chain":
                return chain(what[0], what[1])
            return streams[("node", what)]

        def kept(who: Any) -> bool:
            return shard0 or who not in self.single

        for nid in facts.order:
            if nid in facts.chain or self.stage_of.get(nid) != k or not kept(nid):
                continue
            ins = [h for _, h in sorted(self.inputs[nid], key=lambda x: x[0])]
            if not shard0 and facts.nodes[nid].kind == "union":
                # A union of shard-0-only rows with others: elsewhere, just the others.
                ins = [h for h in ins if not self._on_shard0(h)]
            streams[("node", nid)] = rebuild(facts.nodes[nid], [arrive(h) for h in ins])
            nodes.append(nid)
            if isinstance(facts.nodes[nid], UniqueNode):
                checks.append(streams[("node", nid)])
        outs: list[tuple[str, Stream, bool]] = []
        for name in facts.outputs:
            if self.out_stage[name] != k or not kept(name):
                continue
            ((_, how),) = self.inputs[name]
            outs.append((name, arrive(how), name in facts.graph.materialized))
        sends: list[str] = []
        for e in self.exchanges.values():
            if e.from_stage != k or not kept(e.producer):
                continue
            if e.producer in facts.chain:
                s = chain(e.producer, self.sent_from[e.id])
            else:
                s = streams[("node", e.producer)]
            outs.append((e.id, s.select(list(e.columns)), False))
            sends.append(e.id)
        if k == 0:
            for src in facts.extra_sources:
                delivered(src, d.defaults[src])
        info: dict[str, list[Any]] = {
            "deliveries": list(deliveries.values()), "receives": receives, "sends": sends,
            "outputs": [o for o, _, _ in outs if o not in sends], "nodes": nodes}
        extra = [s for key, s in streams.items() if key[0] == "src"]
        if not outs and not extra and not checks:
            return None, info
        g = Graph(sources=extra, checks=checks)
        for name, s, mat in outs:
            m = facts.graph.materialized.get(name) if mat else None
            if m is None:
                g = g.output(name, s, materialize=mat)
                continue
            kept_rows = s
            if m.hidden:
                # The output is a select dropping the hidden ordering columns; what the
                # stage keeps is the stream under it, with them, as the graph declares.
                under = s.node.inputs[0] if isinstance(s.node, ProjectNode) else None
                if under is None or not set(m.hidden) <= set(under.schema.names):
                    raise PlannerError(
                        f"output {name!r} is ordered by columns it does not return "
                        f"({list(m.hidden)}), which do not reach the stage that keeps it; "
                        "return them as columns of the output")
                kept_rows = Stream(under)
            g = g.output(name, kept_rows, materialize=True, order_by=m.order_by,
                         limit=m.limit, hide=m.hidden)
        return g, info


def source_stream(name: str, node: SourceNode, *, checks: bool = True) -> Stream:
    """Source ``node`` as a stream named ``name``, declared as in its graph.

    ``checks=False`` leaves its further unique keys out (a stage's delivery: the plan
    places their checks).
    """
    return source(name, node.schema, unique_key=node.unique_key, retractions=node.retractions,
                  also_unique=node.also_unique if checks else ())


_source = source_stream


def rebuild(n: Node, ins: list[Stream]) -> Stream:
    """Node ``n`` over ``ins`` with the public builder (checked to give ``n``'s columns)."""
    if isinstance(n, FilterNode):
        s = ins[0].filter(n.expr)
    elif isinstance(n, ProjectNode):
        s = ins[0].select(dict(zip(n.schema.names, n.exprs, strict=True)))
    elif isinstance(n, UnionNode):
        s = ins[0].union_all(*ins[1:])
    elif isinstance(n, JoinNode):
        s = ins[0].join(ins[1], on=list(zip(n.left_key, n.right_key, strict=True)), how=n.how,
                        suffixes=n.suffixes)
    elif isinstance(n, AggNode):
        aggs = {name: (func, arg) for name, func, arg in n.aggs}
        s = (ins[0].group_by(list(n.keys)).aggregate(**aggs) if n.keys
             else ins[0].aggregate(**aggs))
    elif isinstance(n, JoinAllNode):
        s = join_all(dict(zip(n.legs, ins, strict=True)),
                     on=dict(zip(n.legs, n.keys, strict=True)))
    elif isinstance(n, CheckNode):
        s = ins[0].check(n.expr, n.message)
    elif isinstance(n, RepeatNode):
        s = ins[0].repeat(n.count)
    elif isinstance(n, UniqueNode):  # a root: the caller hands it to Graph(checks=...)
        s = Stream(UniqueNode((ins[0].node,), ins[0].node.schema, key=n.key, source=n.source,
                              identity=n.identity))
    elif isinstance(n, WindowNode):
        ranking = ("row_number", "rank", "dense_rank")
        funcs: dict[str, tuple[Any, ...]] = {
            name: (func,) if func in ranking else (func, arg, frame)
            for name, func, arg, frame in n.funcs}
        s = ins[0].window(list(n.partition_by), [tuple(o) for o in n.order_by],
                          top=dict(n.top) or None, **funcs)
    else:
        raise PlannerError(f"internal: cannot rebuild a {n.kind} node ({n.label}) in a stage")
    got = [(f.name, f.type) for f in s.schema]
    want = [(f.name, f.type) for f in n.schema]
    if got != want:
        raise PlannerError(f"internal: {n.label} rebuilt in a stage has columns {got}, not "
                           f"{want}")
    return s
