"""Per operator: run where its inputs lie, or bring them there (re-delivered or exchanged).

The work is :func:`planner.partitioning.derive`; this rule records what it chose: one
``placement`` decision per operator that is not a chain (the partitioning of its output
and why it runs there: co-partitioned inputs, a copy on its non-preserved side, groups
within a hash, key lineage), and one ``delivery`` or ``exchange`` decision per input
that does not arrive as it lies, with the rows it costs.  A chain (filters, projections
and unions over sources) is no operator of its own here: it is computed in each stage
that reads it, from its sources delivered there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.rule import Decision
from planner.rules._text import rows as fmt

if TYPE_CHECKING:
    from planner.distcontext import DistributionContext

__all__ = ["PartitionExchange"]


class PartitionExchange:
    """Record placements and arrivals (topics ``placement``, ``delivery``, ``exchange``).

    >>> import pyarrow as pa, joinstate.graph as jg
    >>> from planner.distribute import plan_distribution
    >>> t = jg.source("t", pa.schema([("a", pa.int64()), ("b", pa.int64())]))
    >>> g = jg.Graph().output("n", t.group_by("b").aggregate(n=("count", None)))
    >>> p = plan_distribution(g, shards=2)
    >>> p.sources["t"].describe()
    'hash(b)'
    >>> p.decision("placement", "agg1").reason
    'its input is hashed by b, within its group key: each group lies on one shard'
    """

    name = "partition_exchange"

    def apply(self, ctx: DistributionContext) -> list[Decision]:
        """Placements in topological order, each followed by its inputs' arrivals."""
        facts = ctx.facts
        d = ctx.derivation
        out = []
        for nid in facts.order:
            if nid in facts.chain:
                continue
            n = facts.nodes[nid]
            pl = d.placements[nid]
            out.append(Decision("placement", n.label, pl.partitioning.to_json(), pl.reason,
                                dict(pl.figures), self.name))
            for a in d.arrivals_of(nid):
                if a.mode == "local":
                    continue
                src = facts.nodes[a.producer].label
                what = (f"{src} is sent as {a.partitioning.describe()}"
                        if a.mode == "exchange" else
                        "its sources are routed " + ", ".join(
                            f"{s} by {p.describe()}" for s, p in a.deliveries))
                out.append(Decision(a.mode, f"{n.label}[{a.pos}]", a.partitioning.to_json(),
                                    f"{what}: {a.reason}" + (
                                        f" (~{fmt(round(a.rows))} rows)" if a.rows else ""),
                                    {"rows": round(a.rows), "from": src}, self.name))
        for a in d.arrivals:
            if a.output is not None and a.mode != "local":
                out.append(Decision(a.mode, f"output {a.output}", a.partitioning.to_json(),
                                    a.reason, {"rows": round(a.rows)}, self.name))
        out.append(Decision("moved_rows", ctx.name, round(d.cost),
                            f"~{fmt(round(d.cost))} rows sent between stages or re-delivered",
                            {}, self.name))
        return out
