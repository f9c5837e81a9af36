"""The stage of every operator: as early as its inputs allow, then as late as its consumers.

An operator's earliest stage is the largest of its inputs' (an exchanged input's plus
one; a chain's, computed from delivered sources, is 0).  Then, from the outputs up, an
operator moves to the latest stage its consumers allow (theirs, or one before for an
exchanged edge), so that a result read in a later stage is computed there rather than
carried there on its shard (a *forward*: a stage boundary without a reshuffle).  A stage
is every operator of one number: the operators with no exchange between them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.rule import Decision

if TYPE_CHECKING:
    from planner.distcontext import DistributionContext

__all__ = ["PartitionStages"]


class PartitionStages:
    """Decide each operator's stage (topic ``stage``) and the count (topic ``stages``).

    >>> import pyarrow as pa, joinstate.graph as jg
    >>> from planner.distribute import plan_distribution
    >>> t = jg.source("t", pa.schema([("a", pa.int64()), ("b", pa.int64())]))
    >>> per_a = t.group_by("a").aggregate(s=("sum", "b"))
    >>> g = jg.Graph().output("n", per_a.group_by("s").aggregate(n=("count", None)))
    >>> p = plan_distribution(g, shards=2)
    >>> p.decision("stages", "graph").choice, [len(s.nodes) for s in p.stages]
    (2, [2, 1])
    """

    name = "partition_stages"

    def apply(self, ctx: DistributionContext) -> list[Decision]:
        """One decision per operator, then the count."""
        facts = ctx.facts
        d = ctx.derivation
        ops = [i for i in facts.order if i not in facts.chain]
        early: dict[int, int] = {}
        why: dict[int, str] = {}
        for nid in ops:
            s, because = 0, "its inputs come from sources"
            for a in d.arrivals_of(nid):
                src = facts.nodes[a.producer].label
                if a.mode == "exchange":
                    k = (0 if a.producer in facts.chain else early[a.producer]) + 1
                    if k > s or because.startswith("its inputs come"):
                        s, because = max(s, k), f"{src} is exchanged to it"
                elif a.producer not in facts.chain and early[a.producer] >= s:
                    s, because = early[a.producer], f"where {src} runs"
            early[nid] = s
            why[nid] = because
        stage = dict(early)
        feeds: dict[int, list[tuple[int, str]]] = {}
        for a in d.arrivals:
            if a.producer in stage:
                feeds.setdefault(a.producer, []).append(
                    (a.consumer, a.mode if a.output is None else "output"))
        for nid in reversed(ops):
            uses = feeds.get(nid, [])
            if not uses or any(m == "output" for _, m in uses):
                continue
            latest = min(stage[c] - (1 if m == "exchange" else 0) for c, m in uses)
            if latest > stage[nid]:
                stage[nid] = latest
                why[nid] = "as late as its consumers allow"
        out = [Decision("stage", facts.nodes[nid].label, stage[nid], why[nid], {}, self.name)
               for nid in ops]
        read_at: list[int] = []
        for a in d.arrivals:
            if a.output is None:
                continue
            at = 0 if a.producer in facts.chain else stage[a.producer]
            if a.mode == "exchange":
                at += 1
            read_at.append(at)
            out.append(Decision("stage", f"output {a.output}", at,
                                "read once, from shard 0" if a.mode == "exchange" else
                                f"where {facts.nodes[a.producer].label} runs", {}, self.name))
        count = max([0, *stage.values(), *read_at]) + 1
        out.append(Decision("stages", ctx.name, count,
                            f"{count - 1} exchange(s) on the longest path from a source to "
                            "an output", {}, self.name))
        return out
