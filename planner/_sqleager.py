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
- bring inputs that only group keys read, each group key reading either only peeled
  inputs or none of them, or that an aggregate reads only as a guard: ``SUM``,
  ``COUNT``, ``MIN`` or ``MAX`` of ``CASE WHEN <condition> THEN <value> END`` whose
  condition reads only peeled inputs and whose value reads none (``ELSE NULL``, or
  ``ELSE 0`` under ``SUM``),
- and can have few partial groups: the rows of the peeled inputs, multiplied, at most
  a share :data:`PEEL_SHARE` of the rows estimated before them (so only with row
  counts or samples).

A guarded aggregate is split like the others: the partial aggregate takes the value
unguarded (``SUM(ss_sales_price)`` per date and store for TPC-DS q59's seven
``SUM(CASE WHEN d_day_name = 'Sunday' THEN ss_sales_price END)``), and the final one
combines the partials whose joined peeled row passes the condition, a NULL condition
counting as false as in ``CASE``: every row of a partial group joined the same peeled
rows, so the condition was the same for all of them.  A change to a date then reaches
its partial groups, not its sales.

The number of joins peeled is recorded with a view (like its join orders): compiling
the same SQL into its store again keeps the plan its state is laid out in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from planner._sqlexpr import ExprCompiler
from planner._sqlfrom import join_bounds
from planner._sqlgroup import AggregatePlan, key_column
from planner._sqlscope import Bound, BoundScope, agg_key, aliases_of, unique_name
from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

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

_FUNCS = {"Sum": "sum", "Count": "count", "Min": "min", "Max": "max"}


@dataclass(frozen=True)
class _Guard:
    """An aggregate over ``CASE WHEN cond THEN value [ELSE NULL | ELSE 0] END``.

    ``cond`` reads only peeled inputs, ``value`` none of them; ``zero``: the ELSE is 0
    (under SUM only), else NULL.
    """

    func: str
    case: exp.Expr
    cond: exp.Expr
    value: exp.Expr
    zero: bool


def _guard(node: exp.Expr, peeled: set[str]) -> _Guard | None:
    """``node`` as a :class:`_Guard` over the ``peeled`` aliases, or None if it is not one."""
    func = _FUNCS.get(type(node).__name__)
    case = node.this
    if func is None or not isinstance(case, exp.Case) or case.this is not None:
        return None
    ifs = case.args.get("ifs") or []
    if len(ifs) != 1 or not isinstance(ifs[0], exp.If):
        return None
    cond, value = ifs[0].this, ifs[0].args.get("true")
    default = case.args.get("default")
    zero = (func == "sum" and isinstance(default, exp.Literal) and not default.is_string
            and default.this in ("0", 0))
    if value is None or not (default is None or isinstance(default, exp.Null) or zero):
        return None
    reads = aliases_of(cond)
    if not reads or reads - peeled or aliases_of(value) & peeled:
        return None
    if isinstance(value, exp.Div):
        return None  # SUM(x / c) is summed exactly and divided after: not split
    return _Guard(func, case, cond, value, zero)


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
        built = _build(bound, peel, exprs, agg_nodes, specs, outer, fallback)
        if built is None:
            continue
        names = [n for s in peel for n in s.member.aliases]
        peeled = {a for s in peel for a in s.member.aliases}
        read = ("only group keys and CASE conditions in aggregates read"
                if any(aliases_of(a) & peeled for a in agg_nodes) else "only group keys read")
        record(Decision(
            topic="eager_aggregate", subject=f"GROUP BY over {bound.label}",
            choice=names,
            reason=(("kept as recorded when the view was compiled: " if recorded else "")
                    + f"aggregated by {', '.join(c for c, _ in _fks(peel))} before "
                    f"joining {', '.join(names)}, which {read}: {why}"),
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
    guarded = False
    for a in agg_nodes:
        if aliases_of(a) & peeled:
            if _guard(a, peeled) is None:
                return None
            guarded = True
    if not guarded and not any(aliases_of(e) & peeled for e in exprs):
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


def _build(bound: Bound, peel: Sequence[JoinStep], exprs: Sequence[exp.Expr],
           agg_nodes: Sequence[exp.Expr], specs: Specs, outer: frozenset[str],
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
    names = set(stream.columns)
    plan = AggregatePlan(pre, partial_specs, names, list(exprs), fallback, lambda _: None)
    guards: dict[str, _Guard] = {}
    seen: set[str] = set()
    for a in agg_nodes:
        key = agg_key(a)
        if key in seen:
            continue
        seen.add(key)
        g = _guard(a, peeled) if aliases_of(a) & peeled else None
        if g is None:
            plan.value(a)
            continue
        # The partial of the value alone (compiled as the compiler compiles that
        # aggregate), under a name of its own: the one-step plan registered the guarded
        # aggregate as a spec of its own too (its CASE differs from every other), so the
        # names stay in step with ``specs``.  A float sum is refused below.
        own: Specs = {}
        fallback(type(a)(this=g.value.copy()), pre, own, set(names))
        if len(own) != 1:
            return None
        name = unique_name(f"__a{len(partial_specs)}", names)
        partial_specs[name] = next(iter(own.values()))
        guards[name] = g
    if plan.special:
        return None
    if not partial_specs and len(specs) == 1:
        partial_specs[next(iter(specs))] = ("count", None)  # the hidden row count
    if list(partial_specs) != list(specs) or any(
            partial_specs[n][0] != f or f not in _COMBINE for n, (f, _) in specs.items()):
        return None
    if guards:  # each guarded partial stands where the one-step plan has its CASE
        one = ExprCompiler(BoundScope(bound, outer))
        for n, g in guards.items():
            case = one.compile(g.case).expr
            if specs[n][1] is None or not specs[n][1].equals(case):
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
    combine: Specs = {}
    for n, (f, _) in partial_specs.items():
        g = guards.get(n)
        if g is None:
            combine[n] = (_COMBINE[f], pc.field(n))
            continue
        t = final.schema.field(n).type
        cond = pc.coalesce(post.predicate(g.cond).expr, pc.scalar(False))
        other = pc.scalar(pa.scalar(0 if g.zero or f == "count" else None, t))
        combine[n] = (_COMBINE[f], pc.if_else(cond, pc.field(n), other))
    cols = list(dict.fromkeys(c for _, c in keys))
    return final.group_by(cols).aggregate(**combine), keys
