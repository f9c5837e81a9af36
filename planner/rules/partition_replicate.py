"""Which small sources are copied to every shard, so that joins with them move nothing.

A copy pays when it keeps a bigger input from moving: every shard then joins its own
rows of the big input with the whole small one.  Three conditions, each in the reason:

* **small**: at most ``max(replicate_rows, replicate_share * the largest source)`` rows
  (:class:`planner.distribute.DistributionSettings`); a source of unknown size is never
  copied;
* **every consumer takes a copy**: the copy reaches only joins where it is the
  non-preserved side (an inner join either side; a left, semi or anti join its right
  side) or other copies.  An outer join would emit its unmatched rows once per shard, an
  aggregate would count them once per shard; a copy such a consumer would have to be
  re-routed for is refused;
* **it saves more than it costs**: with the copy, the rows sent between stages (or
  re-delivered) drop by more than the copy's extra rows (its rows times ``shards - 1``).

Copies are chosen greedily: the one that lowers the rows moved (copies included) the
most first, until no further copy lowers them.  In TPC-DS q4, ``date_dim`` is copied (it keeps the
three sales tables from moving between their date join and their customer join);
``customer`` is not, though small: each sales table is hashed by its customer key
anyway, so a copy would save nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.partitioning import Partitioning, Replicated, candidates, desires
from planner.placement import derive
from planner.rule import Decision
from planner.rules._text import rows as fmt

if TYPE_CHECKING:
    from planner.distcontext import DistributionContext
    from planner.placement import Arrival

__all__ = ["PartitionReplicate", "first_choices"]


def first_choices(ctx: DistributionContext, copied: frozenset[str]) -> dict[str, Partitioning]:
    """Every source's partitioning before any search: copied, given, or its first wish."""
    facts = ctx.facts
    want = desires(facts, copied)
    given = ctx.given.get("partitioning", {})
    out: dict[str, Partitioning] = {}
    for s in facts.graph.sources:
        if s in copied:
            out[s] = Replicated()
        elif s in given:
            out[s] = given[s]
        else:
            out[s] = candidates(facts, s, want)[0][0]
    return out


class PartitionReplicate:
    """Decide, per source, ``replicate`` or ``partition`` (topic ``replicate``).

    >>> import pyarrow as pa, joinstate.graph as jg
    >>> from planner.distribute import plan_distribution
    >>> from planner.stats import given
    >>> fact = jg.source("fact", pa.schema([("d", pa.int64()), ("c", pa.int64())]))
    >>> dim = jg.source("dim", pa.schema([("d_id", pa.int64())]), unique_key="d_id")
    >>> cust = jg.source("cust", pa.schema([("c_id", pa.int64()), ("g", pa.string())]))
    >>> q = (fact.join(dim, on=("d", "d_id")).join(cust, on=("c", "c_id"))
    ...          .group_by("g").aggregate(n=("count", None)))
    >>> g = jg.Graph().output("q", q)
    >>> stats = {"fact": given("fact", 10_000_000), "dim": given("dim", 1_000),
    ...          "cust": given("cust", 5_000_000)}
    >>> p = plan_distribution(g, stats, shards=4)
    >>> p.decision("replicate", "dim").choice, p.decision("replicate", "cust").choice
    ('replicate', 'partition')
    """

    name = "partition_replicate"

    def apply(self, ctx: DistributionContext) -> list[Decision]:
        """One decision per source."""
        facts = ctx.facts
        n = ctx.shards
        s = ctx.settings
        largest = facts.largest_source()
        limit = max(s.replicate_rows, round(s.replicate_share * largest))
        forced = {k: bool(v) for k, v in ctx.given.get("replicate", {}).items()}
        fixed = set(ctx.given.get("partitioning", {}))
        out: dict[str, Decision] = {}

        def decide(src: str, choice: str, why: str, **figs: Any) -> None:
            rows = facts.known.get(src)
            out[src] = Decision("replicate", src, choice, why,
                                {"rows": rows, "limit": limit, **figs}, self.name)

        copied = frozenset(k for k, v in forced.items() if v)
        eligible = []
        for src in facts.graph.sources:
            rows = facts.known.get(src)
            if src in forced:
                decide(src, "replicate" if forced[src] else "partition", "given by the caller")
            elif src in fixed:
                decide(src, "partition", "its partitioning is given by the caller")
            elif n == 1:
                decide(src, "partition", "one shard: nothing to copy")
            elif src in facts.extra_sources:
                decide(src, "partition", "no output reads it")
            elif rows is None:
                decide(src, "partition", "its size is unknown")
            elif rows > limit:
                decide(src, "partition", f"{fmt(rows)} rows is more than {fmt(limit)} (the "
                       f"larger of {fmt(s.replicate_rows)} and {s.replicate_share:.0%} of the "
                       f"largest source, {fmt(largest)})")
            else:
                eligible.append(src)
        if not eligible:
            return [out[k] for k in facts.graph.sources]

        def evaluate(chosen: frozenset[str]) -> tuple[float, float, list[Arrival]]:
            d = derive(facts, first_choices(ctx, chosen), n, desires(facts, chosen))
            extra = sum(facts.source_rows(c) * (n - 1) for c in chosen - copied)
            return d.cost + extra, d.cost, d.refused_copies()

        total, moved, _ = evaluate(copied)
        pending = sorted(eligible, key=lambda x: facts.source_rows(x))
        notes: dict[str, tuple[str, dict[str, Any]]] = {}
        while pending:
            best: tuple[float, str, float] | None = None
            for src in pending:
                t, m, refused = evaluate(copied | {src})
                extra = facts.source_rows(src) * (n - 1)
                mine = [a for a in refused if src in facts.sources_of(a.producer)]
                if mine:
                    a = mine[0]
                    who = (f"output {a.output}" if a.output is not None
                           else facts.nodes[a.consumer].describe())
                    notes[src] = (f"a copy cannot feed {who}: it would emit or count the "
                                  "copied rows once per shard", {})
                    continue
                figs = {"moved_rows": round(moved), "moved_rows_with_copy": round(m),
                        "extra_rows": round(extra)}
                if t >= total:
                    notes[src] = (f"a copy saves nothing: {fmt(round(moved - m))} fewer rows "
                                  f"moved for {fmt(round(extra))} copied", figs)
                    continue
                if best is None or t < best[0]:
                    best = (t, src, m)
            if best is None:
                break
            t, src, m = best
            extra = facts.source_rows(src) * (n - 1)
            decide(src, "replicate", f"copied to {n} shards ({fmt(round(extra))} extra rows) "
                   f"so that {fmt(round(moved - m))} rows need not move",
                   moved_rows=round(moved), moved_rows_with_copy=round(m),
                   extra_rows=round(extra))
            copied = copied | {src}
            total, moved = t, m
            pending.remove(src)
        for src in pending:
            why, figs = notes.get(src, ("a copy saves nothing", {}))
            decide(src, "partition", why, **figs)
        return [out[k] for k in facts.graph.sources]

