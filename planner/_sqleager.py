"""Eager aggregation: a GROUP BY over a chain of joins, aggregated before its last joins.

TPC-DS q99 groups catalog sales by the names of their warehouse, ship mode and call
center.  Joined first and aggregated after, a change to a call center rewrites every
joined sale of it: at SF1, four of the six call centers updated in one batch are
211,000 rows through two joins and the aggregate, 0.6 s of a 0.7 s push.  Aggregated
first by the sales' foreign keys (``cs_warehouse_sk, cs_ship_mode_sk,
cs_call_center_sk``: at most 5 x 20 x 6 partial groups), the dimensions are joined to
those few partial groups and a second GROUP BY adds them up; a change to a call center
then reaches its partial groups, not its sales.

Exact for the aggregates the compiler reduces everything plain to (SUM, COUNT, MIN and
MAX; AVG is SUM / COUNT): a partial group holds the rows of one combination of foreign
keys (and of the group keys read before the peeled joins); each of its rows would have
joined the same peeled rows, so the join copies the partial to every group those rows
would have reached, and sums of sums, sums of counts, minima of minima and maxima of
maxima are the totals.  A sum of floats is not split: summed in two steps it rounds
differently.  Grouping sets, DISTINCT aggregates, GROUPING() and moments take their own
path and are not split.

What is peeled is the longest run of last joins in the chain that

- are plain equi-joins (no other condition applied at the join),
- join on columns of the inputs before them (not on another peeled input's),
- bring inputs that only group keys read (no aggregate argument), each group key
  reading either only peeled inputs or none of them,
- and can have few partial groups: the rows of the peeled inputs, multiplied, at most
  a share :data:`PEEL_SHARE` of the rows estimated before them (so only with row
  counts or samples).

The number of joins peeled is recorded with a view (like its join orders): compiling
the same SQL into its store again keeps the plan its state is laid out in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from planner._sqlexpr import ExprCompiler
from planner._sqlfrom import join_bounds
from planner._sqlgroup import AggregatePlan, key_column
from planner._sqlscope import Bound, BoundScope, agg_key, aliases_of
from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sqlglot import exp

    from joinstate import Stream
    from planner._sqlgroup import Specs
    from planner._sqlscope import JoinStep
    from planner._sqltypes import Typed

__all__ = ["PEEL_SHARE", "Peeled", "eager_aggregate"]

PEEL_SHARE = 0.1
"""Peel when the partial groups can be at most this share of the rows before the joins
peeled: below it the partial aggregate shrinks what the peeled joins and a change to
their inputs touch at least tenfold, which pays for the second aggregate."""

_COMBINE = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}
"""How the final GROUP BY combines each partial aggregate."""


@dataclass(frozen=True)
class Peeled:
    """An aggregate computed in two steps: its output, group-key columns, joins peeled."""

    stream: Stream
    keys: list[tuple[exp.Expr, str]]
    joins: int


def eager_aggregate(bound: Bound, exprs: Sequence[exp.Expr], agg_nodes: Sequence[exp.Expr],
                    specs: Specs, *, outer: frozenset[str],
                    fallback: Callable[[exp.Expr, ExprCompiler, Specs, set[str]], Typed | str],
                    record: Callable[[Decision], None], recorded: int | None
                    ) -> Peeled | None:
    """``GROUP BY exprs`` of ``specs`` over ``bound``, with its last joins peeled; or None.

    ``specs`` are the aggregate's specs as planned over ``bound`` (names included): the
    peeled plan has the same output columns.  ``recorded``: the joins a view was
    compiled with peeled (0: none), kept whatever the estimates say now; None decides.
    """
    steps = bound.steps
    if recorded == 0 or not steps or bound.stream is not steps[-1].after:
        return None
    ks = [recorded] if recorded is not None else range(len(steps), 0, -1)
    for k in ks:
        if not 0 < k <= len(steps):
            continue
        peel = steps[-k:]
        why = _peelable(peel, exprs, agg_nodes, estimate=recorded is None)
        if why is None:
            continue
        built = _build(peel, exprs, agg_nodes, specs, outer, fallback)
        if built is None:
            continue
        names = [n for s in peel for n in s.member.aliases]
        record(Decision(
            topic="eager_aggregate", subject=f"GROUP BY over {bound.label}",
            choice=names,
            reason=(("kept as recorded when the view was compiled: " if recorded else "")
                    + f"aggregated by {', '.join(c for c, _ in _fks(peel))} before "
                    f"joining {', '.join(names)}, which only group keys read: {why}"),
            figures={"joins": k, "member_rows": [s.member_rows for s in peel],
                     "rows_before": peel[0].rows_before},
            rule="eager_aggregate"))
        return Peeled(built[0], built[1], k)
    return None


def _fks(peel: Sequence[JoinStep]) -> list[tuple[str, str]]:
    return [p for s in peel for p in s.pairs]


def _peelable(peel: Sequence[JoinStep], exprs: Sequence[exp.Expr],
              agg_nodes: Sequence[exp.Expr], *, estimate: bool) -> str | None:
    """Why these joins can be peeled (for ``explain``), or None if they cannot."""
    prefix = peel[0].before
    if not all(s.plain for s in peel):
        return None
    if any(left not in prefix.stream.columns for left, _ in _fks(peel)):
        return None  # joined on a column of another peeled input (a snowflake)
    peeled = {a for s in peel for a in s.member.aliases}
    for e in exprs:
        reads = aliases_of(e)
        if reads & peeled and reads - peeled:
            return None
    if any(aliases_of(a) & peeled for a in agg_nodes):
        return None
    if not any(aliases_of(e) & peeled for e in exprs):
        return None  # the peeled inputs only filter: nothing to gain from the keys
    rows = [s.member_rows for s in peel]
    if not estimate:
        return "as recorded"
    before = peel[0].rows_before
    if before is None or any(r is None for r in rows):
        return None
    groups = math.prod(r for r in rows if r is not None)
    if groups > PEEL_SHARE * before:
        return None
    return (f"at most {groups:,} partial groups ({' x '.join(f'{r:,}' for r in rows if r)} "
            f"rows) against ~{before:,.0f} rows estimated before those joins")


def _build(peel: Sequence[JoinStep], exprs: Sequence[exp.Expr], agg_nodes: Sequence[exp.Expr],
           specs: Specs, outer: frozenset[str],
           fallback: Callable[[exp.Expr, ExprCompiler, Specs, set[str]], Typed | str]
           ) -> tuple[Stream, list[tuple[exp.Expr, str]]] | None:
    """The two aggregates and the joins between them.

    None when the plan would differ from the one-step aggregate in its columns or
    exactness.
    """
    prefix = peel[0].before
    peeled = {a for s in peel for a in s.member.aliases}
    pre = ExprCompiler(BoundScope(prefix, outer))
    stream = prefix.stream
    taken = set(stream.columns)
    computed: dict[str, Any] = {}
    early: dict[int, str] = {}  # position in exprs -> partial column
    for i, e in enumerate(exprs):
        if not aliases_of(e) & peeled:
            early[i] = key_column(pre, stream, e, i, taken, computed)
    if computed:
        stream = stream.with_columns(computed)
    partial_specs: Specs = {}
    plan = AggregatePlan(pre, partial_specs, set(stream.columns), list(exprs), fallback,
                         lambda _: None)
    seen: set[str] = set()
    for a in agg_nodes:
        key = agg_key(a)
        if key not in seen:
            seen.add(key)
            plan.value(a)
    if plan.special:
        return None
    if not partial_specs and len(specs) == 1:
        partial_specs[next(iter(specs))] = ("count", None)  # the hidden row count
    if list(partial_specs) != list(specs) or any(
            partial_specs[n][0] != f or f not in _COMBINE for n, (f, _) in specs.items()):
        return None
    group = list(dict.fromkeys([left for left, _ in _fks(peel)] + list(early.values())))
    if set(group) & set(partial_specs):
        return None
    partial = stream.group_by(group).aggregate(**partial_specs)
    for n, (f, _) in partial_specs.items():
        t = partial.schema.field(n).type
        if f == "sum" and not (pa.types.is_integer(t) or pa.types.is_decimal(t)):
            return None  # a float sum: two steps would round differently
    refs = {k: v for k, v in prefix.refs.items() if v in partial.columns}
    cur = Bound(partial, refs, prefix.aliases, f"partial({prefix.label})")
    for s in peel:
        cur, _, _ = join_bounds(cur, s.member, s.pairs, "inner")
    post = ExprCompiler(BoundScope(cur, outer))
    final = cur.stream
    taken = set(final.columns)
    computed = {}
    keys: list[tuple[exp.Expr, str]] = []
    for i, e in enumerate(exprs):
        keys.append((e, early[i] if i in early else
                     key_column(post, final, e, i, taken, computed)))
    if computed:
        final = final.with_columns(computed)
    combine = {n: (_COMBINE[f], pc.field(n)) for n, (f, _) in partial_specs.items()}
    cols = list(dict.fromkeys(c for _, c in keys))
    return final.group_by(cols).aggregate(**combine), keys
