"""Rule ``join_order``: the order in which a FROM clause's inner joins are built.

A pipeline keeps one index per join input.  A left-deep chain ``((fact ⋈ d1) ⋈ d2) ⋈ d3``
stores the fact rows once per intermediate join, each intermediate indexed by the next
join's key, so a change to any dimension probes one index and writes no intermediate
state, and a change to the fact table flows down the chain.  What makes one order
cheaper than another is how many rows and columns the intermediate indexes hold:

1. **The root** is an input that is not a lookup (some join of it is not on a unique
   key of its own: joining it can multiply rows).  Among several, the one that refers
   to the most others by their unique key (a fact table's foreign keys: those joins
   never multiply its rows), then the one with the most rows when the row counts are
   known, then the first in FROM order.  Everything else is then joined to it.
2. **Next**, among the inputs connected to what is joined so far: lookups (every join on
   a unique key of their own, so no row multiplies) before the others; among lookups,
   the most selective first: a filtered lookup drops rows, so every later intermediate
   index holds fewer, and a change to an input joined later reaches fewer of them.
   ``selectivity`` is the share of rows the input's filters keep, weighted by how often
   the rows joined to it use each key (estimated on samples of the data when the
   compiler has them, see ``planner.compile``'s ``stats``); a filtered input without an
   estimate counts as keeping half, an unfiltered one all.  TPC-DS q3: ``item`` filtered
   on ``i_manufact_id`` keeps ~0.1% of the sales, ``date_dim`` on ``d_moy`` ~8%, so the
   sales are joined to ``item`` first and a date change reaches ~0.1% of a day's sales
   instead of all of them.  Then the one carrying the fewest columns into the
   intermediate index (TPC-DS q4: ``date_dim`` brings one column, ``d_year``,
   ``customer`` seven, so ``store_sales ⋈ date_dim`` is built first and indexed by
   customer); then the smaller by rows, then FROM order.  A lookup that a condition
   other than an equality ties to what is joined (``sc.revenue <= 0.1 * sb.ave``)
   counts as keeping at most half, since that condition filters its join.  Inputs
   that can multiply rows come last, smallest first, unless samples show the join
   drops rows: an input that is not a lookup but is estimated to find at most half a
   row per row joined to it (``fanouts``) ranks with the lookups, keeping that share.
   TPC-DS q50: ``store_returns`` joined to ``store_sales`` on ticket, item and customer
   finds a return for ~10% of the sales, so it is joined right after them and a change
   to ``store`` reaches the returned sales only, not every sale of the store.

>>> from planner.rules.join_order import JoinEdge, JoinInput, JoinOrder, JoinOrderContext
>>> ctx = JoinOrderContext(
...     inputs=(JoinInput("customer", unique_keys=(("c_customer_sk",),), width=7),
...             JoinInput("store_sales", width=4),
...             JoinInput("date_dim", unique_keys=(("d_date_sk",),), width=1)),
...     edges=(JoinEdge("customer", "store_sales", ("c_customer_sk",), ("ss_customer_sk",)),
...            JoinEdge("store_sales", "date_dim", ("ss_sold_date_sk",), ("d_date_sk",))),
...     subject="FROM customer, store_sales, date_dim")
>>> [d.choice for d in JoinOrder().apply(ctx)]
[['store_sales', 'date_dim', 'customer']]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["JOIN_RULE", "JOIN_RULES", "JoinEdge", "JoinInput", "JoinOrder", "JoinOrderContext"]


@dataclass(frozen=True)
class JoinInput:
    """One input of an inner join group.

    ``name``: its alias in the query; ``source``: the source it reads directly (None for
    a CTE, a subquery or an outer join's result); ``rows``: its row count when known;
    ``unique_keys``: column sets known to be unique (a source's declared unique key);
    ``filtered``: a filter applies to it before it is joined; ``selectivity``: the
    estimated share (0..1) of the rows joined to it that its filters keep, None when
    unknown; ``width``: columns it carries beyond its join keys into the rest of the
    query.
    """

    name: str
    source: str | None = None
    rows: int | None = None
    unique_keys: tuple[tuple[str, ...], ...] = ()
    filtered: bool = False
    width: int = 0
    selectivity: float | None = None

    @property
    def kept(self) -> float:
        """The share of rows kept, for ranking: the estimate, else 1/2 if filtered, else 1."""
        if self.selectivity is not None:
            return self.selectivity
        return 0.5 if self.filtered else 1.0


@dataclass(frozen=True)
class JoinEdge:
    """An equi-join predicate between two inputs: ``left.columns = right.columns``."""

    left: str
    right: str
    left_columns: tuple[str, ...]
    right_columns: tuple[str, ...]


@dataclass(frozen=True)
class JoinOrderContext:
    """The inner joins of one FROM clause (or of the part between two outer joins)."""

    inputs: tuple[JoinInput, ...]
    edges: tuple[JoinEdge, ...]
    subject: str
    ties: tuple[tuple[str, ...], ...] = ()
    """Inputs a condition other than an equality reads together (``sc.revenue <= 0.1 *
    sb.ave``): it filters their join as soon as they are all joined."""
    fanouts: tuple[tuple[str, str, float], ...] = ()
    """``(input, partner, rows)``: the estimated rows of ``input`` each row of
    ``partner`` finds when they are joined on every equality between them (from the
    distinct join keys on samples of both and their row counts).  Below 1 the join
    drops rows."""


DROPS_ROWS = 0.5
"""An input that is not a lookup, estimated to find at most this many rows per row
joined to it, ranks with the lookups: its join filters more than it can multiply."""


JOIN_RULES = ("rows", "references", "steps")
"""The rule as it was at each change, oldest first.  A state laid out by an earlier
rule, whose join orders were not recorded with it, re-attaches by planning its SQL with
that rule.

- ``rows``: a group is rooted at its largest input that is not a lookup (else the first
  in FROM order); no foreign keys, derived-table keys or conditions tying inputs.
- ``references``: rooted at the input referring to the most others by their unique key;
  an input is a lookup when all its joins are on a unique key of its own.
- ``steps``: an input is a lookup when its joins to what is joined so far are on a
  unique key of its own, and an input estimated on samples to drop rows ranks with the
  lookups (the module's rule 2).
"""
JOIN_RULE = JOIN_RULES[-1]
"""The rule new plans are made with."""


class JoinOrder:
    """Orders the inputs of an inner join group for a left-deep chain (see the module).

    ``rule`` is one of :data:`JOIN_RULES`: an earlier one plans a group as joinstate
    did then, the order states recorded without their join orders were built in.
    """

    name = "join_order"

    def __init__(self, *, rule: str = JOIN_RULE) -> None:
        if rule not in JOIN_RULES:
            msg = f"join-order rule {rule!r}: give one of {', '.join(JOIN_RULES)}"
            raise ValueError(msg)
        self.rule = rule
        self.by_references = rule != "rows"
        self.by_steps = rule == "steps"

    def apply(self, context: JoinOrderContext) -> Iterable[Decision]:
        """One ``join_order`` decision: ``choice`` is the input names in join order."""
        inputs = {i.name: i for i in context.inputs}
        if len(inputs) < 2:
            return []
        lookup = {n: self._is_lookup(i, context.edges) for n, i in inputs.items()}
        position = {i.name: k for k, i in enumerate(context.inputs)}
        root, why_root = self._root(context, lookup, position)
        order = [root]
        reasons = [why_root]
        while len(order) < len(inputs):
            joined = set(order)
            candidates = [n for n in inputs if n not in joined and any(
                (e.left in joined and e.right == n) or (e.right in joined and e.left == n)
                for e in context.edges)]
            if not candidates:  # disconnected: the compiler refuses cross joins before this
                candidates = [n for n in inputs if n not in joined]

            # A lookup at this step: joined to what is joined so far on a unique key of
            # its own (TPC-DS q24's customer is joined to the sales on its key and to an
            # address on a foreign key; reached from the sales, no row multiplies).
            step = {n: lookup[n] or (self.by_steps and self._finds_one(
                inputs[n], joined, context.edges)) for n in candidates}
            tied = {n for n in candidates if self.by_references and step[n] and any(
                n in t and set(t) - {n} <= joined for t in context.ties)}
            drops = {n: f for n in candidates if self.by_steps and not step[n]
                     and (f := self._fanout(n, joined, context)) is not None
                     and f <= DROPS_ROWS}

            def rank(n: str, tied: set[str] = tied, drops: dict[str, float] = drops,
                     step: dict[str, bool] = step) -> tuple[int, float, int, float, int]:
                i = inputs[n]
                kept = min(i.kept, 0.5) if n in tied else i.kept * drops.get(n, 1.0)
                return (0 if step[n] or n in drops else 1, kept, i.width,
                        float(i.rows) if i.rows is not None else float("inf"), position[n])

            nxt = min(candidates, key=rank)
            reasons.append(self._why_next(inputs[nxt], step[nxt], candidates, inputs,
                                          drops.get(nxt))
                           + (", and a condition ties it to what is joined (it filters "
                              "this join)" if nxt in tied else ""))
            order.append(nxt)
        figures = {"rows": {n: i.rows for n, i in inputs.items()},
                   "width": {n: i.width for n, i in inputs.items()},
                   "lookup": lookup,
                   "filtered": {n: i.filtered for n, i in inputs.items()},
                   "selectivity": {n: i.selectivity for n, i in inputs.items()}}
        if context.fanouts:
            figures["fanout"] = {f"{a} per {b}": round(f, 4) for a, b, f in context.fanouts}
        return [Decision(
            topic="join_order", subject=context.subject, choice=order,
            reason="; ".join(reasons), figures=figures, rule=self.name)]

    @staticmethod
    def _is_lookup(inp: JoinInput, edges: tuple[JoinEdge, ...]) -> bool:
        """Every join of ``inp`` is on a unique key of its own (no row can multiply)."""
        mine = [set(e.left_columns) if e.left == inp.name else set(e.right_columns)
                for e in edges if inp.name in (e.left, e.right)]
        return bool(mine) and all(any(set(k) <= cols for k in inp.unique_keys)
                                  for cols in mine)

    @staticmethod
    def _finds_one(inp: JoinInput, joined: set[str], edges: tuple[JoinEdge, ...]) -> bool:
        """Whether each row of ``joined`` finds at most one row of ``inp``.

        Joined on every equality between them, ``inp`` is joined on a unique key of its
        own.
        """
        cols: set[str] = set()
        for e in edges:
            if e.left == inp.name and e.right in joined:
                cols.update(e.left_columns)
            elif e.right == inp.name and e.left in joined:
                cols.update(e.right_columns)
        return bool(cols) and any(set(k) <= cols for k in inp.unique_keys)

    def _root(self, context: JoinOrderContext, lookup: dict[str, bool],
              position: dict[str, int]) -> tuple[str, str]:
        inputs = context.inputs
        facts = [i for i in inputs if not lookup[i.name]] or list(inputs)
        refs = {i.name: self._references(i, context) if self.by_references else 0
                for i in facts}
        known = all(i.rows is not None for i in facts)
        root = max(facts, key=lambda i: (refs[i.name], (i.rows or 0) if known else 0,
                                         -position[i.name]))
        kind = ("not joined on a unique key of its own" if not lookup[root.name]
                else "every input is joined on a unique key")
        n = refs[root.name]
        ref = (f", refers to {n} input{'s' if n != 1 else ''} by their unique key"
               if n else "")
        others = [f"{i.name} {refs[i.name]}" for i in facts if i is not root]
        if others and n:
            ref += f" (other candidates: {', '.join(others)})"
        size = f", {root.rows:,} rows" if root.rows is not None else ""
        return root.name, (f"{root.name} first ({kind}{ref}{size}): each later join probes "
                           "and writes one intermediate index keyed by its join key")

    @staticmethod
    def _references(inp: JoinInput, context: JoinOrderContext) -> int:
        """How many inputs ``inp`` joins on their unique key but not on its own.

        The foreign keys of a fact table: each such join finds at most one row per row
        of ``inp``, so a chain rooted at the input with the most of them grows only
        through its filters.  An input that is merely the largest may reach the others
        only through joins that multiply rows (TPC-DS q72: ``inventory`` meets the sales
        through ``date_dim`` by week, seven dates a week; q85: ``customer_demographics``
        meets another by marital and education status), and rooted there the first
        intermediate index holds billions of rows.
        """
        unique = {i.name: i.unique_keys for i in context.inputs}
        n = 0
        for e in context.edges:
            if inp.name not in (e.left, e.right):
                continue
            mine, other, theirs = ((e.left_columns, e.right, e.right_columns)
                                   if e.left == inp.name else
                                   (e.right_columns, e.left, e.left_columns))
            if other == inp.name:
                continue
            if (any(set(k) <= set(theirs) for k in unique.get(other, ()))
                    and not any(set(k) <= set(mine) for k in inp.unique_keys)):
                n += 1
        return n

    @staticmethod
    def _fanout(name: str, joined: set[str], context: JoinOrderContext) -> float | None:
        """The fewest rows of ``name`` estimated per row of an input already joined."""
        known = [f for n, p, f in context.fanouts if n == name and p in joined]
        return min(known) if known else None

    @staticmethod
    def _why_next(i: JoinInput, is_lookup: bool, candidates: list[str],
                  inputs: dict[str, JoinInput], drops: float | None = None) -> str:
        parts = []
        if is_lookup:
            parts.append("joined on its unique key, no row multiplies")
        elif drops is not None:
            parts.append(f"not joined on a unique key, but estimated to find "
                         f"~{drops:.2g} rows per row joined to it, so it drops rows and "
                         "comes with the lookups")
        else:
            parts.append("can multiply rows, so it comes after the lookups")
        if i.filtered:
            est = ("" if i.selectivity is None
                   else f" (keeps ~{_share(i.selectivity)} of the rows joined to it)")
            parts.append(f"filtered{est}, so later intermediate indexes hold fewer rows")
        others = [f"{n} {inputs[n].width}" for n in candidates if n != i.name]
        width = f"carries {i.width} column{'s' if i.width != 1 else ''}"
        parts.append(width + (f" (other candidates: {', '.join(others)})" if others else ""))
        if i.rows is not None:
            parts.append(f"{i.rows:,} rows")
        return f"then {i.name}: " + ", ".join(parts)


def _share(x: float) -> str:
    """``x`` (0..1) as a percentage with two significant digits."""
    pct = 100.0 * x
    return f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"
