"""Finding subqueries in an expression and cutting them at their correlation.

What :mod:`planner._sqlsubquery` compiles, read off sqlglot's qualified tree: the
subquery expressions of a condition (:func:`find_subqueries`, with the path to each,
which says whether its NULL can matter), the enclosing aliases they read
(:func:`correlated_aliases`, from sqlglot's scope analysis), the subquery without its
correlated conjuncts and the key they equate (:func:`split_at_correlation`), and what a
scalar aggregate is over no rows (:func:`empty_value`).  No stream is built here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.scope import build_scope

from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqlexpr import ExprCompiler, constant
from planner._sqlscope import conjuncts, find_aggs
from planner._sqltypes import Typed

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "Split",
    "correlated_aliases",
    "decorrelates",
    "empty_value",
    "external_columns",
    "find_subqueries",
    "fusable",
    "key_text",
    "projected",
    "query_of",
    "rejects_null",
    "single_item",
    "split_at_correlation",
    "sql_text",
    "strip",
    "with_filter",
]

_COMPARISONS: dict[type[exp.Binary], type[exp.Binary]] = {
    exp.NEQ: exp.NEQ, exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}
"""A correlated comparison's operator -> the operator with its operands swapped."""
_NULL_PROPAGATING = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Paren)
_NULL_REJECTING = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between)


# ---- finding subqueries -----------------------------------------------------------------


def strip(node: exp.Expr) -> exp.Expr:
    """``node`` without enclosing parentheses."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def query_of(node: exp.Expr) -> exp.Expr:
    """The query of a subquery expression (EXISTS, IN, scalar)."""
    q = node.args.get("query") if isinstance(node, exp.In) else node.this
    out = q.this if isinstance(q, exp.Subquery) else q
    assert isinstance(out, exp.Expr)
    return out


def find_subqueries(node: exp.Expr) -> list[tuple[exp.Expr, tuple[exp.Expr, ...]]]:
    """The subquery expressions in ``node`` (not inside them), each with its ancestors.

    ``EXISTS``, ``IN (SELECT ...)`` and scalar subqueries; ancestors run from ``node``
    down to the subquery's parent.  ANY/ALL are refused here.
    """
    out: list[tuple[exp.Expr, tuple[exp.Expr, ...]]] = []

    def walk(n: exp.Expr, path: tuple[exp.Expr, ...]) -> None:
        if isinstance(n, exp.Any | exp.All):
            raise UnsupportedSQLError(f"{type(n).__name__.upper()} subquery {snippet(n)}",
                                      "comparisons with ANY/ALL of a subquery are not "
                                      "compiled; write EXISTS or IN")
        if isinstance(n, exp.Exists | exp.Subquery) or (
                isinstance(n, exp.In) and n.args.get("query") is not None):
            out.append((n, path))
            if isinstance(n, exp.In):
                walk(n.this, (*path, n))
            return
        if isinstance(n, exp.Select | exp.Union | exp.Intersect | exp.Except):
            return
        for child in n.iter_expressions():
            walk(child, (*path, n))

    walk(node, ())
    return out


def external_columns(query: exp.Expr) -> list[exp.Column]:
    """Columns of ``query`` (nested queries included) that read an enclosing query."""
    try:
        scope = build_scope(query)
    except SqlglotError:
        # Treated as uncorrelated: compiling it then refuses any column of an
        # enclosing query it reads (planner._sqlscope.BoundScope), so nothing is wrong.
        return []
    return list(scope.external_columns) if scope is not None else []


def correlated_aliases(node: exp.Expr) -> frozenset[str]:
    """The enclosing queries' aliases the subqueries in ``node`` read."""
    out: set[str] = set()
    for q, _ in find_subqueries(node):
        out |= {c.table for c in external_columns(query_of(q))}
    return frozenset(out)


def decorrelates(node: exp.Expr) -> bool:
    """Whether ``node`` holds a subquery :mod:`planner._sqlsubquery` compiles.

    Not a plain uncorrelated ``x IN (SELECT ...)`` conjunct: the FROM planner's semi
    join takes it.
    """
    found = find_subqueries(node)
    if not found:
        return False
    node = strip(node)
    plain = (isinstance(node, exp.In) and node.args.get("query") is not None
             and not node.args.get("negate") and len(found) == 1
             and not external_columns(query_of(node)))
    return not plain


# ---- the cut at the correlation ---------------------------------------------------------


@dataclass
class Split:
    """A subquery cut at its correlation.

    ``select``: the subquery without its correlated conjuncts (a copy; its SELECT list
    still the original's); ``inner``/``outer``: the correlation key, the subquery's and
    the enclosing query's side of each equality; ``compare``: one correlated comparison
    ``inner op outer`` (EXISTS only) as (operator class, inner, outer); ``check``: the key
    positions whose enclosing expression was substituted elsewhere, whose types must
    be equal.
    """

    select: exp.Expr
    inner: list[exp.Expr] = field(default_factory=list)
    outer: list[exp.Expr] = field(default_factory=list)
    compare: tuple[type[exp.Binary], exp.Expr, exp.Expr] | None = None
    check: set[int] = field(default_factory=set)

    @property
    def correlated(self) -> bool:
        """Whether the subquery reads the enclosing query at all."""
        return bool(self.inner) or self.compare is not None


def side_of(node: exp.Expr, outside: set[str]) -> str:
    """``inner``, ``outer``, ``mixed`` or ``const``: whose columns ``node`` reads."""
    if find_subqueries(node):
        return "mixed"
    tables = [c.table in outside for c in node.find_all(exp.Column)]
    if not tables:
        return "const"
    if all(tables):
        return "outer"
    return "mixed" if any(tables) else "inner"


def split_at_correlation(query: exp.Expr, aliases: Sequence[str], allow_compare: bool) -> Split:
    """``query`` cut at its correlation with the enclosing query's ``aliases``."""
    ext = external_columns(query)
    if not ext:
        return Split(query.copy())
    what = f"correlated subquery {snippet(query)}"
    if not isinstance(query, exp.Select):
        raise UnsupportedSQLError(what, "a UNION, INTERSECT or EXCEPT that reads the "
                                  "enclosing query is not decorrelated")
    outside = {c.table for c in ext}
    unknown = sorted(outside - set(aliases))
    if unknown:
        raise UnsupportedSQLError(
            what, f"it reads {unknown}, which belong to a query further out than the one "
            "it sits in (or to a part of it not joined here); only a subquery correlated "
            "with the FROM clause of its own query is decorrelated")
    where = query.args.get("where")
    for c in ext:
        if c.find_ancestor(exp.Select) is not query:
            raise UnsupportedSQLError(what, f"{snippet(c)} is read by a query nested in "
                                      "the subquery; only the subquery's own WHERE may "
                                      "read the enclosing query")
        if where is None or c.find_ancestor(exp.Where) is not where:
            raise UnsupportedSQLError(what, f"{snippet(c)} is read outside the subquery's "
                                      "WHERE (its SELECT list, GROUP BY, HAVING or a "
                                      "join's ON); only WHERE conditions decorrelate")
    out = Split(query.copy())
    keep: list[exp.Expr] = []
    deferred: list[exp.Expr] = []
    for cj in conjuncts(where):
        if not any(c.table in outside for c in cj.find_all(exp.Column)):
            keep.append(cj)
            continue
        if isinstance(cj, exp.EQ):
            sides = (side_of(cj.left, outside), side_of(cj.right, outside))
            if sides == ("inner", "outer"):
                out.inner.append(cj.left)
                out.outer.append(cj.right)
                continue
            if sides == ("outer", "inner"):
                out.inner.append(cj.right)
                out.outer.append(cj.left)
                continue
        deferred.append(cj)
    subst: dict[str, int] = {}
    for k, o in enumerate(out.outer):
        subst.setdefault(o.sql(), k)
    for cj in deferred:
        used: set[int] = set()

        def swap(n: exp.Expr, used: set[int] = used) -> exp.Expr:
            k = subst.get(n.sql()) if not isinstance(n, exp.Literal) else None
            if k is None:
                return n
            used.add(k)
            return out.inner[k].copy()

        new = cj.transform(swap)
        if not any(c.table in outside for c in new.find_all(exp.Column)):
            out.check |= used
            keep.append(new)
            continue
        cls = type(new)
        if allow_compare and out.compare is None and isinstance(new, exp.Binary) and \
                cls in _COMPARISONS:
            sides = (side_of(new.left, outside), side_of(new.right, outside))
            if sides in (("inner", "outer"), ("outer", "inner")):
                out.check |= used
                out.compare = ((cls, new.left, new.right) if sides[0] == "inner"
                               else (_COMPARISONS[cls], new.right, new.left))
                continue
        raise UnsupportedSQLError(
            f"correlated condition {snippet(cj)} in {snippet(query)}",
            "only equalities between the subquery's columns and the enclosing query's "
            "decorrelate (and, in EXISTS, one comparison <>, <, <=, >, >=); a condition "
            "mixing both otherwise would need the subquery evaluated per row")
    out.select.set("where", exp.Where(this=exp.and_(*(c.copy() for c in keep)))
                   if keep else None)
    return out


def projected(split: Split, items: Sequence[tuple[exp.Expr, str]]) -> exp.Select:
    """The cut subquery with ``items`` (expression, alias) as its SELECT list."""
    sel = split.select.copy()
    assert isinstance(sel, exp.Select)
    sel.set("expressions", [exp.alias_(e.copy(), a, quoted=True) for e, a in items])
    return sel


class _EmptyAggregates:
    """Every aggregate over no rows: COUNT 0, the others NULL."""

    def column(self, node: exp.Column) -> Typed:
        """A column outside an aggregate has no value over no rows."""
        raise UnsupportedSQLError(f"column {snippet(node)} outside an aggregate",
                                  "a correlated scalar subquery's value must be an "
                                  "expression of aggregates")

    def lookup(self, node: exp.Expr) -> Typed | None:
        """Aggregates' values over no rows."""
        agg = node.this if isinstance(node, exp.Filter) else node
        if isinstance(agg, exp.Count):
            return Typed(pc.scalar(pa.scalar(0, pa.int64())), pa.int64(), const=True,
                         value=0)
        if isinstance(agg, exp.AggFunc):
            return Typed(pc.scalar(None), pa.null(), const=True, value=None, literal="null")
        return None


def single_item(sel: exp.Expr, node: exp.Expr) -> exp.Expr:
    """The one item of a subquery's SELECT list, unaliased."""
    items = sel.expressions if isinstance(sel, exp.Select) else []
    if len(items) != 1:
        raise SQLError(f"{snippet(node)}: the subquery returns {len(items)} columns, it "
                       "must return one")
    return items[0].unalias()


def fusable(sel: exp.Select) -> exp.Expr | None:
    """The value of a scalar subquery :meth:`Subqueries.fuse` may merge, or None.

    An uncorrelated aggregate over one table (no join, GROUP BY, HAVING, DISTINCT or
    nested subquery), every column of its value inside an aggregate.
    """
    if external_columns(sel) or len(sel.expressions) != 1 or sel.args.get("from_") is None:
        return None
    if not isinstance(sel.args["from_"].this, exp.Table):
        return None
    if any(sel.args.get(a) for a in ("joins", "group", "having", "distinct", "with_",
                                       "qualify", "windows", "laterals")):
        return None
    where = sel.args.get("where")
    if where is not None and find_subqueries(where):
        return None
    value = sel.expressions[0].unalias()
    aggs = find_aggs(value)
    if not aggs or find_subqueries(value) or any(isinstance(a, exp.AggFunc) and isinstance(
            a.this, exp.Distinct) for a in aggs):
        return None
    inside = {id(c) for a in aggs for c in a.find_all(exp.Column)}
    if any(id(c) not in inside for c in value.find_all(exp.Column)):
        return None
    return value


def with_filter(value: exp.Expr, cond: exp.Expr | None) -> exp.Expr:
    """``value`` with ``FILTER (WHERE cond)`` on each of its aggregates."""
    if cond is None:
        return value.copy()

    def add(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Filter):
            inner = n.expression.this if isinstance(n.expression, exp.Where) else n.expression
            return exp.Filter(this=n.this.copy(), expression=exp.Where(
                this=exp.and_(cond.copy(), inner.copy())))
        if isinstance(n, exp.AggFunc):
            return exp.Filter(this=n.copy(), expression=exp.Where(this=cond.copy()))
        return n

    return value.transform(add)


def empty_value(value: exp.Expr) -> pa.Scalar:
    """The value of an expression of aggregates over no rows (COUNT 0, the others NULL)."""
    v = ExprCompiler(_EmptyAggregates()).compile(value)
    if v.literal == "null" or pa.types.is_null(v.type):
        return pa.scalar(None, pa.null())
    return constant(v)


def rejects_null(path: tuple[exp.Expr, ...], node: exp.Expr) -> bool:
    """Whether a NULL value of ``node`` makes the condition (path's root) not true.

    NULL goes through arithmetic into a comparison, and above it only ANDs.
    """
    chain = [*path, node]
    i = len(chain) - 2
    while i >= 0 and isinstance(chain[i], _NULL_PROPAGATING):
        i -= 1
    if i < 0 or not isinstance(chain[i], _NULL_REJECTING):
        return False
    return all(isinstance(p, exp.And | exp.Paren) for p in chain[:i])


def sql_text(node: exp.Expr) -> str:
    """``node`` as SQL with every qualifier (a key's two sides often share column names)."""
    return re.sub(r'"([A-Za-z_][A-Za-z0-9_]*)"', r"\1", node.sql(dialect="duckdb"))


def key_text(split: Split, value: exp.Expr | None) -> str:
    pairs = [f"{sql_text(o)} = {sql_text(i)}" for i, o in zip(split.inner, split.outer,
                                                        strict=True)]
    if value is not None:
        pairs.append(f"{sql_text(value)} = the subquery's value")
    return " and ".join(pairs) if pairs else "a constant key (uncorrelated)"
