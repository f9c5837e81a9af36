"""The hash key of every source that is not copied: look-ahead, then tried against the rest.

A source's first candidate is what its nearest consumer needing a key wants, seen
through the filters, projections and copy-joins in between (:func:`planner.partitioning.desires`):
in TPC-DS q4, ``store_sales`` first meets ``date_dim`` (copied: no key needed) and then
``customer`` on ``ss_customer_sk``, so it is hashed by ``ss_customer_sk``.  Then each
source, biggest first, tries its other candidates (the wishes of its other consumers,
and a spread by its unique key or its whole row) and keeps the one that moves the
fewest rows between stages, until no change helps.  A source no output reads is spread
(its changes are still checked where it is delivered).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.partitioning import Partitioning, Replicated, Single, candidates, desires
from planner.placement import derive
from planner.rule import Decision
from planner.rules._text import rows as fmt
from planner.rules.partition_replicate import first_choices

if TYPE_CHECKING:
    from planner.distcontext import DistributionContext

__all__ = ["PartitionSources"]

MAX_ROUNDS = 3
"""Passes over the sources; each pass only lowers the rows moved, so it ends early."""


class PartitionSources:
    """Decide each source's partitioning (topic ``partitioning``, a JSON partitioning).

    >>> import pyarrow as pa, joinstate.graph as jg
    >>> from planner.distribute import plan_distribution
    >>> a = jg.source("a", pa.schema([("k", pa.int64()), ("x", pa.int64())]))
    >>> b = jg.source("b", pa.schema([("k2", pa.int32()), ("y", pa.string())]))
    >>> g = jg.Graph().output("j", a.join(b, on=("k", "k2")))
    >>> p = plan_distribution(g, shards=2)
    >>> p.sources["a"].describe(), p.sources["b"].describe()
    ('hash(k)', 'hash(k2)')
    """

    name = "partition_sources"

    def apply(self, ctx: DistributionContext) -> list[Decision]:
        """One decision per source."""
        facts = ctx.facts
        copied = ctx.replicated()
        want = desires(facts, copied)
        given = ctx.given.get("partitioning", {})
        current = first_choices(ctx, copied)
        why: dict[str, str] = {}
        cands: dict[str, list[tuple[Any, str]]] = {}
        free = []
        for s in facts.graph.sources:
            if s in copied:
                why[s] = "copied to every shard (" + (
                    d.reason if (d := ctx.decision("replicate", s)) is not None else "") + ")"
            elif s in given:
                why[s] = "given by the caller"
            elif ctx.shards == 1:
                current[s] = Single()
                why[s] = "one shard: every row is on it"
            else:
                cands[s] = candidates(facts, s, want)
                why[s] = cands[s][0][1]
                if len(cands[s]) > 1:
                    free.append(s)
        tried: dict[str, dict[str, int]] = {}

        def cost(parts: dict[str, Partitioning]) -> float:
            return derive(facts, parts, ctx.shards, want).cost

        if free:
            best = cost(current)
            free.sort(key=lambda x: -facts.source_rows(x))
            for _ in range(MAX_ROUNDS):
                changed = False
                for s in free:
                    for p, reason in cands[s]:
                        trial = {**current, s: p}
                        c = cost(trial)
                        tried.setdefault(s, {})[p.describe()] = round(c)
                        if c < best:
                            best, current, changed = c, trial, True
                            why[s] = reason
                if not changed:
                    break
        out = []
        for s in facts.graph.sources:
            p = current[s]
            figs: dict[str, Any] = {"rows": facts.known.get(s)}
            if s in tried and len(tried[s]) > 1:
                figs["moved_rows_by_choice"] = tried[s]
            text = why[s] if isinstance(p, Replicated) or s in given else (
                f"{p.describe()}: {why[s]}")
            if s in tried and len(tried[s]) > 1:
                m = min(tried[s].values())
                text += f" (moves {fmt(m)} rows between stages, the fewest of its choices)"
            out.append(Decision("partitioning", s, p.to_json(), text, figs, self.name))
        return out
