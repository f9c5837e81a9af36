"""A graph cut into stages for N shards: where each source goes, what runs where, what moves.

::

    plan = planner.distribute.plan_distribution(graph, stats, shards=2)
    print(plan.explain())              # every choice, its reason and figures, by stage
    plan.stages[0].graph_for(shard)    # the sub-graph one (stage, shard) task maintains

Store-less: a :class:`joinstate.Graph`, statistics per source (rows, declared unique
keys) and a shard count in; a :class:`DistributedPlan` out, which an executor (Spark's,
or the in-process simulator of the tests) runs as one job per operation: each stage is
one task per shard over its own store, stages chained by exchanges.

The choices are four rules (``planner/rules/partition_*.py``, :data:`RULES`) over a
:class:`DistributionContext`, each recording :class:`~planner.rule.Decision` objects:

==========================  ===================================================================
rule                        decides
==========================  ===================================================================
``partition_replicate``     which small sources are copied to every shard (only where every
                            consumer takes a copy, and only when a copy moves fewer rows than
                            it saves)
``partition_sources``       the hash key of every other source (look-ahead: the key its
                            first consumer needing one wants, tried against the others)
``partition_exchange``      per operator: runs where its inputs lie, or which input is
                            re-delivered or exchanged, by which key (:mod:`planner.partitioning`)
``partition_stages``        the stage of every operator: the fewest exchanges on any path
==========================  ===================================================================

Before them, as a rewrite of the graph: an exact aggregate (counts, sums of integers or
decimals) whose input would be exchanged is split into a partial aggregate where its
input lies and a final one over the partial sums (:mod:`planner.rules.partition_partial`,
decisions of topic ``partial``, replayed by :func:`from_decisions`); the graph so
rewritten is planned afresh, and its node labels are what the plan shows.

A *stage* is a set of operators with no exchange between them; it runs as one task per
shard.  Its inputs are source deliveries (rows routed from the change itself) and
exchanges (rows an earlier stage sent), its outputs exchanges to later stages and the
graph's outputs.  Every stage's sub-graph is a :class:`joinstate.Graph` rebuilt from the
graph's own nodes with the public builder (so the runtime maintains it as it would the
whole graph): a delivered source keeps its name (a second delivery of one source to one
stage gets ``<source>-2``), an exchange is an output of the sending stage and a source of
the receiving one, both named by the exchange's id.  An exchange sends only the columns
the graph needs downstream; the receiving stage puts typed NULLs where the others were,
so every rebuilt operator sees its original input schema (the runtime drops those
columns again, as nothing reads them).

Operators that lie :class:`~planner.partitioning.Single` (a global aggregate and what
follows it) exist only in shard 0's sub-graph: elsewhere they would hold a row of their
own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from joinstate.nodes import AggNode, JoinAllNode, JoinNode
from planner.distcontext import DistributionContext, DistributionSettings
from planner.errors import PlannerError
from planner.partitioning import (
    GraphFacts,
    Partitioning,
    Replicated,
    from_json,
    route,
)
from planner.rules._text import rows as fmt_rows
from planner.rules.partition_partial import TOPIC as PARTIAL
from planner.rules.partition_partial import candidates, split_graph, splits_of
from planner.stagegraph import Delivery, Exchange, Stage, build_stages

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import pyarrow as pa

    from joinstate.graph import Graph
    from joinstate.nodes import Node
    from planner.rule import Decision, Rule
    from planner.stats import SourceStats

__all__ = [
    "RULES",
    "Delivery",
    "DistributedPlan",
    "DistributionContext",
    "DistributionSettings",
    "Exchange",
    "Stage",
    "from_decisions",
    "plan_distribution",
]


def _rules() -> tuple[Rule, ...]:
    from planner.rules.partition_exchange import PartitionExchange
    from planner.rules.partition_replicate import PartitionReplicate
    from planner.rules.partition_sources import PartitionSources
    from planner.rules.partition_stages import PartitionStages

    return (PartitionReplicate(), PartitionSources(), PartitionExchange(), PartitionStages())


RULES: tuple[Rule, ...] = _rules()
"""The partitioning rules in the order they run."""


# ---- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistributedPlan:
    """A graph cut into stages for ``shards`` shards, with every decision that made it.

    ``sources``: each source's partitioning (where its changes go; a consumer may have
    some delivered otherwise too: :meth:`deliveries_of`); ``outputs``: the stage each
    output is computed in; ``order``: the order a population pushes sources in (small
    ones first: every bigger row then meets them as it arrives).
    """

    name: str
    graph: Graph
    shards: int
    sources: Mapping[str, Partitioning]
    stages: tuple[Stage, ...]
    exchanges: Mapping[str, Exchange]
    outputs: Mapping[str, int]
    order: tuple[str, ...]
    decisions: tuple[Decision, ...]
    moved_rows: float = 0.0

    def deliveries_of(self, source: str) -> list[Delivery]:
        """Where a change to ``source`` goes: one delivery per (stage, routing)."""
        return [d for st in self.stages for d in st.deliveries if d.source == source]

    def route(self, partitioning: Partitioning, table: pa.Table | pa.RecordBatch) -> Any:
        """The shard of every row under ``partitioning`` (None: every shard)."""
        return route(partitioning, table, self.shards)

    def decision(self, topic: str, subject: str) -> Decision | None:
        """The decision on ``topic`` about ``subject``."""
        for d in reversed(self.decisions):
            if d.topic == topic and d.subject == subject:
                return d
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description: stages, exchanges, sources, decisions."""
        label = {n.id: n.label for n in self.graph.nodes}
        return {
            "name": self.name, "shards": self.shards,
            "sources": {s: p.to_json() for s, p in self.sources.items()},
            "order": list(self.order),
            "stages": [{
                "index": st.index,
                "deliveries": [{"source": d.source, "name": d.name,
                                "partitioning": d.partitioning.to_json()}
                               for d in st.deliveries],
                "receives": list(st.receives), "sends": list(st.sends),
                "outputs": list(st.outputs), "nodes": [label[i] for i in st.nodes],
                "shard0_only": st.others is None,
            } for st in self.stages],
            "exchanges": {k: {"producer": label[e.producer], "from": e.from_stage,
                              "to": e.to_stage, "partitioning": None if e.partitioning is None
                              else e.partitioning.to_json(),
                              "columns": list(e.columns), "rows": round(e.rows),
                              "copies": e.copies}
                          for k, e in self.exchanges.items()},
            "decisions": [d.to_dict() for d in self.decisions],
        }

    def explain(self) -> str:
        """The sources, then each stage: what it receives, runs and sends, and why."""
        g = self.graph
        copied = sum(float(d.figures.get("rows") or 0) * (self.shards - 1)
                     for s, p in self.sources.items() if isinstance(p, Replicated)
                     and (d := self.decision("replicate", s)) is not None)
        plural = lambda n, w: f"{n} {w}{'' if n == 1 else 's'}"  # noqa: E731
        lines = [f"distributed plan of {self.name!r}: {plural(len(self.stages), 'stage')} on "
                 f"{plural(self.shards, 'shard')}; {plural(len(self.exchanges), 'exchange')} "
                 f"(~{fmt_rows(round(self.moved_rows))} rows sent)"
                 + (f"; {fmt_rows(round(copied))} rows copied" if copied else ""),
                 f"sources (population order: {', '.join(self.order)})"]
        names = list(self.sources)
        for i, s in enumerate(names):
            part = self.decision("partitioning", s)
            rep = self.decision("replicate", s)
            known = None if part is None else part.figures.get("rows")
            head = f"{s} ({fmt_rows(known)} rows): {self.sources[s].describe()}"
            sub = []
            if isinstance(self.sources[s], Replicated) and rep is not None:
                sub.append(rep.reason + " " + _figs(rep.figures))
            else:
                if part is not None:
                    sub.append(part.reason.split(": ", 1)[-1])
                if rep is not None and self.shards > 1:
                    sub.append(f"not copied: {rep.reason}")
            lines += _tree([(head, sub)], last=i == len(names) - 1)
        partial = [d for d in self.decisions if d.topic == PARTIAL]
        if partial:
            lines.append("aggregates summed where their input lies before it moves "
                         "(labels below are of the rewritten graph)")
            for i, split in enumerate(partial):
                lines += _tree([(f"{split.subject} of the definition: by its group key and "
                                 f"{', '.join(split.choice)}, then the partial sums",
                                 [split.reason])], last=i == len(partial) - 1)
        for st in self.stages:
            items: list[tuple[str, list[str]]] = []
            for dl in st.deliveries:
                again = "" if dl.partitioning == self.sources[dl.source] else ", re-routed"
                items.append((f"receives {dl.name}: source {dl.source}, "
                              f"{dl.partitioning.describe()}{again}", []))
            for x in st.receives:
                e = self.exchanges[x]
                items.append((f"receives {x}: {g.nodes[e.producer].label} from stage "
                              f"{e.from_stage}", []))
            quiet = []
            for nid in st.nodes:
                n = g.nodes[nid]
                dec = self.decision("placement", n.label)
                if dec is None:
                    continue
                if not n.stateful and dec.reason == "runs where its input lies":
                    quiet.append(n.label)
                    continue
                sub = [dec.reason]
                sub += [f"input {a.subject[len(n.label):]}: {a.reason}" for a in self.decisions
                        if a.topic in ("exchange", "delivery")
                        and a.subject.startswith(n.label + "[")]
                items.append((f"{_short(n)}: {from_json(dec.choice).describe()}", sub))
            if quiet:
                items.append((f"where their input lies: {', '.join(quiet)}", []))
            for x in st.sends:
                e = self.exchanges[x]
                items.append((f"sends {x}: {g.nodes[e.producer].label}, "
                              f"{plural(len(e.columns), 'column')}, {e.describe()} "
                              f"(~{fmt_rows(round(e.rows))} rows)"
                              + ("; each shard sends its share of a copy" if e.copies else ""),
                              []))
            for o in st.outputs:
                items.append((f"output {o}", []))
            lines.append(f"stage {st.index}" + (" (shard 0 only)" if st.others is None else ""))
            for k, item in enumerate(items):
                lines += _tree([item], last=k == len(items) - 1)
        return "\n".join(lines)


def _short(n: Node) -> str:
    """One line for an operator: its label and what it does, without expressions."""
    if isinstance(n, JoinNode):
        on = " and ".join(f"{a} = {b}" for a, b in zip(n.left_key, n.right_key, strict=True))
        return f"{n.label} {n.how} join on {on}"
    if isinstance(n, AggNode):
        return f"{n.label} by {', '.join(n.keys)}" if n.keys else f"{n.label} over all rows"
    if isinstance(n, JoinAllNode):
        return f"{n.label} delta join of {len(n.legs)} legs on {', '.join(dict.fromkeys(n.keys))}"
    return n.label


def _tree(items: list[tuple[str, list[str]]], *, last: bool) -> list[str]:
    out = []
    for text, sub in items:
        out.append(("└─ " if last else "├─ ") + text)
        pad = "   " if last else "│  "
        out += [f"{pad}   {t}".rstrip() for t in sub if t]
    return out


def _figs(figures: Mapping[str, Any]) -> str:
    parts = []
    for k, v in figures.items():
        if v is None or v == [] or v == {} or k == "limit":
            continue
        parts.append(f"{k}={v:,}" if isinstance(v, int) and not isinstance(v, bool)
                     else f"{k}={v}")
    return f"[{', '.join(parts)}]" if parts else ""


# ---- planning ---------------------------------------------------------------------------------


def plan_distribution(graph: Graph, stats: Mapping[str, SourceStats] | None = None, *,
                      shards: int, name: str = "graph",
                      settings: DistributionSettings | None = None,
                      given: Mapping[str, Any] | None = None,
                      rules: Iterable[Rule] | None = None) -> DistributedPlan:
    """Cut ``graph`` into stages for ``shards`` shards (see the module docstring).

    ``stats``: per source (absent: size unknown, never copied); ``given``: choices fixed
    by the caller (see :class:`DistributionContext`).
    """
    settings = settings or DistributionSettings(shards)
    if settings.shards != shards:
        settings = dataclasses.replace(settings, shards=shards)
    stats = dict(stats or {})
    unknown = sorted(set(stats) - set(graph.sources))
    if unknown:
        raise PlannerError(f"statistics name source(s) {unknown} the graph does not have "
                           f"(sources: {list(graph.sources)})")

    def decide(g: Graph) -> DistributionContext:
        ctx = DistributionContext(name, GraphFacts.of(g, stats), settings, dict(given or {}))
        for rule in RULES if rules is None else rules:
            ctx = ctx.with_decisions(rule.apply(ctx))
        return ctx

    ctx = decide(graph)
    split = settings.partial_aggregates and shards > 1 and rules is None
    partial = candidates(ctx.derivation) if split else []
    if partial:
        # The graph with those aggregates split, planned afresh; the splits are recorded
        # first, so that from_decisions rewrites the graph the same way.
        ctx = decide(split_graph(graph, splits_of(partial)))
        ctx = DistributionContext(ctx.name, ctx.facts, ctx.settings, ctx.given,
                                  (*partial, *ctx.decisions))
    return build(ctx)


def from_decisions(graph: Graph, decisions: Iterable[Mapping[str, Any]], *, shards: int,
                   name: str = "graph", stats: Mapping[str, SourceStats] | None = None
                   ) -> DistributedPlan:
    """The plan whose decisions were recorded (``plan.to_dict()["decisions"]``).

    What a state directory stores: the same plan (same stages, same routing) is rebuilt
    without deciding anything again, whatever statistics say now.
    """
    from planner.rule import Decision

    recorded = tuple(Decision(d["topic"], d["subject"], d["choice"], d["reason"],
                              dict(d.get("figures") or {}), d.get("rule", ""))
                     for d in decisions)
    graph = split_graph(graph, splits_of(recorded))
    ctx = DistributionContext(name, GraphFacts.of(graph, dict(stats or {})),
                              DistributionSettings(shards), {}, recorded)
    return build(ctx)


def build(ctx: DistributionContext) -> DistributedPlan:
    """The plan the decisions of ``ctx`` describe, with every stage's sub-graph."""
    facts = ctx.facts
    d = ctx.derivation
    stage_of: dict[int, int] = {}
    for nid in facts.order:
        if nid not in facts.chain:
            dec = ctx.decision("stage", facts.nodes[nid].label)
            if dec is None:
                raise PlannerError(f"internal: no stage decided for {facts.nodes[nid].label}")
            stage_of[nid] = int(dec.choice)
    out_stage = {}
    for o in facts.outputs:
        dec = ctx.decision("stage", f"output {o}")
        if dec is None:
            raise PlannerError(f"internal: no stage decided for output {o}")
        out_stage[o] = int(dec.choice)
    stages, exchanges = build_stages(facts, d, stage_of, out_stage)
    known = facts.known
    names = list(facts.graph.sources)
    order = tuple(sorted(names, key=lambda s: (known[s] is None, known[s] or 0,
                                               names.index(s))))
    return DistributedPlan(ctx.name, facts.graph, ctx.shards, dict(d.defaults), stages,
                           exchanges, out_stage, order, ctx.decisions,
                           sum(e.rows for e in exchanges.values()))
