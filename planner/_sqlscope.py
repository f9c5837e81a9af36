"""What the SQL compiler's passes share: relations, their SQL names, scopes, AST helpers.

A :class:`Rel` is a compiled query (a stream and its SQL-visible columns); a
:class:`Bound` is a FROM item, or several joined, with every ``(alias, column)`` of the
SQL scope mapped to its stream column, so the SQL never depends on how the streams name
things (a join suffixes colliding right-hand names).  :class:`BoundScope` and
:class:`AggScope` tell :mod:`planner._sqlexpr` what names mean before and after a
GROUP BY.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqltypes import Typed, is_decimal, is_float, is_integer, is_string

if TYPE_CHECKING:
    from sqlglot.schema import Schema

    from joinstate import Stream

__all__ = [
    "AggScope",
    "Bound",
    "BoundScope",
    "JoinStep",
    "OrderItem",
    "Rel",
    "SourceSpec",
    "agg_key",
    "aliases_of",
    "ambiguous_column",
    "columns_of",
    "conjuncts",
    "find_aggs",
    "key_family",
    "unique_name",
]


@dataclass(frozen=True)
class SourceSpec:
    """A source the SQL may read: its pipeline name, schema, unique keys and row count.

    ``sample``: some of its rows, when the caller gave data (estimates only: the share
    of rows a filter keeps, for the join order; never part of the definition).
    ``sampled_from``: how many rows the sample was drawn from (the row count when known,
    else the rows of the data given), which scales the distinct keys seen in the sample
    to the whole source.
    """

    name: str
    schema: pa.Schema
    unique_key: tuple[str, ...] | None = None
    rows: int | None = None
    also_unique: tuple[tuple[str, ...], ...] = ()
    sample: pa.Table | None = field(default=None, compare=False, repr=False)
    sampled_from: int | None = field(default=None, compare=False, repr=False)


@dataclass
class Rel:
    """A compiled query: its stream and its SQL-visible columns ``(name, stream column)``."""

    stream: Stream
    columns: list[tuple[str, str]]
    nulls: frozenset[str] = frozenset()
    """Stream columns that are a bare NULL (typed INTEGER until a UNION gives them a type)."""
    unique: tuple[tuple[str, ...], ...] = ()
    """Stream columns known unique together by the query's shape (its GROUP BY keys, or
    every column after DISTINCT): a derived table joined on them is a lookup."""


@dataclass
class Bound:
    """A FROM item (or a join of several) with its SQL names.

    ``refs`` maps ``(alias, column)`` (lower case, as qualified) to the stream column;
    ``source`` is the source it reads directly, ``unique`` the stream columns known
    unique together, ``filtered`` whether a filter was applied to it.  ``sample`` (a
    source read directly, when the compiler has a sample of it): the sampled rows its
    filters keep, in stream column names; ``unfiltered``: the sampled rows before any
    filter (``sample.num_rows / unfiltered.num_rows`` is the share its filters keep).
    """

    stream: Stream
    refs: dict[tuple[str, str], str]
    aliases: tuple[str, ...]
    label: str
    source: str | None = None
    unique: tuple[tuple[str, ...], ...] = ()
    filtered: bool = False
    sample: pa.Table | None = field(default=None, repr=False)
    unfiltered: pa.Table | None = field(default=None, repr=False)
    steps: tuple[JoinStep, ...] = field(default=(), repr=False)
    """When ``stream`` is a left-deep chain of inner joins: how it was built, one step
    per join (what an aggregate over it may rebuild, :mod:`planner._sqleager`)."""


@dataclass(frozen=True)
class JoinStep:
    """One inner join of a left-deep chain.

    ``before`` was joined with ``member`` on the stream column ``pairs`` (``before``'s
    column, ``member``'s column); ``after`` is the chain's stream once this step is done.
    ``plain``: the step is the equi-join alone (no condition it brought into reach, no
    second equality on a joined key, filtered it).  ``member_rows``: the rows ``member``
    reads (its source's, when it is a source or a projection or filter of one);
    ``rows_before``: the estimated rows of ``before`` (None when unknown).
    """

    before: Bound
    member: Bound
    pairs: tuple[tuple[str, str], ...]
    after: Stream
    plain: bool
    member_rows: int | None
    rows_before: float | None


@dataclass(frozen=True)
class OrderItem:
    """One final ORDER BY key: output column, direction, NULLs first."""

    column: str
    descending: bool
    nulls_first: bool


# ---- scopes ----------------------------------------------------------------------------


class BoundScope:
    """Column references of a FROM clause, resolved through a :class:`Bound`."""

    def __init__(self, bound: Bound, outer: frozenset[str] = frozenset()) -> None:
        self.bound = bound
        self.outer = outer

    def column(self, node: exp.Column) -> Typed:
        """The stream column of ``alias.column``."""
        key = (node.table, node.name)
        col = self.bound.refs.get(key)
        if col is None:
            if node.table and node.table not in self.bound.aliases and (
                    node.table in self.outer or not any(
                        a == node.table for a, _ in self.bound.refs)):
                raise UnsupportedSQLError(
                    f"correlated subquery (it reads {snippet(node)} of an enclosing query)",
                    "a subquery that depends on the row of another query is not "
                    "compiled; rewrite it as a join")
            raise SQLError(f"column {snippet(node)} is not available here")
        return Typed(pc.field(col), self.bound.stream.schema.field(col).type)

    def lookup(self, node: exp.Expr) -> Typed | None:
        """Nothing is pre-computed before an aggregate."""
        del node
        return None


class AggScope:
    """After GROUP BY: group keys and aggregates are columns of the aggregate's output."""

    def __init__(self, stream: Stream, keys: list[tuple[exp.Expr, str]],
                 aggs: dict[str, Typed]) -> None:
        self.stream = stream
        self.keys = keys
        self.aggs = aggs

    def column(self, node: exp.Column) -> Typed:
        """A column that is neither a group key nor inside an aggregate: an error."""
        raise SQLError(f"column {snippet(node)} must appear in the GROUP BY clause or be "
                       "used in an aggregate function")

    def lookup(self, node: exp.Expr) -> Typed | None:
        """Group key expressions and aggregate calls."""
        for expr, col in self.keys:
            if node == expr:
                return Typed(pc.field(col), self.stream.schema.field(col).type)
        if isinstance(node, exp.AggFunc | exp.Filter):
            return self.aggs.get(agg_key(node))
        return None


def ambiguous_column(tree: exp.Expr, schema: Schema, dialect: str) -> str | None:
    """Say which tables an unqualified column could belong to, if more than one.

    sqlglot reports a column it cannot qualify as "could not be resolved", whether no
    table of its FROM clause has it or several do.  This names the second case: the
    column, where it is, and every table (alias and source) that has it, so the person
    knows which qualifier to add.  ``tree`` is the query as parsed; None if no column is
    ambiguous (then the column is simply unknown).
    """
    from sqlglot.errors import SqlglotError
    from sqlglot.optimizer.qualify import qualify
    from sqlglot.optimizer.resolver import Resolver
    from sqlglot.optimizer.scope import traverse_scope

    try:
        q = qualify(tree.copy(), dialect=dialect, schema=schema,
                    validate_qualify_columns=False, quote_identifiers=False)
        scopes = traverse_scope(q)
    except SqlglotError:
        return None
    for scope in scopes:
        resolver = Resolver(scope, schema)
        for col in scope.unqualified_columns:
            having = []
            for alias, (_, source) in scope.selected_sources.items():
                try:
                    names = resolver.get_source_columns(alias)
                except SqlglotError:
                    continue
                if col.name in names:
                    table = source.name if isinstance(source, exp.Table) else None
                    having.append(alias if table in (None, alias) else f"{alias} ({table})")
            if len(having) > 1:
                where = col.this.meta if isinstance(col.this, exp.Expr) else {}
                at = (f" (line {where['line']}, column {where['col']})"
                      if where.get("line") and where.get("col") else "")
                options = " or ".join(f"{h.split(' ')[0]}.{col.name}" for h in having)
                verb = "both have" if len(having) == 2 else "all have"
                return (f"column {snippet(col)}{at} is ambiguous: {', '.join(having[:-1])} and "
                        f"{having[-1]} {verb} a column {col.name!r}; qualify it ({options})")
    return None


# ---- helpers ---------------------------------------------------------------------------


def agg_key(node: exp.Expr) -> str:
    return node.sql(dialect="duckdb")


def is_query(node: exp.Expr) -> bool:
    return isinstance(node, exp.Select | exp.Union | exp.Intersect | exp.Except
                      | exp.Subquery)


def columns_of(node: exp.Expr) -> list[exp.Column]:
    """Column references in ``node``, not descending into nested queries."""
    out: list[exp.Column] = []
    stack: list[exp.Expr] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, exp.Column):
            out.append(n)
            continue
        if n is not node and is_query(n):
            continue
        stack.extend(n.iter_expressions())
    return out


def aliases_of(node: exp.Expr) -> set[str]:
    """The table aliases ``node`` reads (nested queries excluded)."""
    return {c.table for c in columns_of(node)}


def find_aggs(node: exp.Expr) -> list[exp.Expr]:
    """Outermost aggregate calls in ``node`` (nested queries excluded)."""
    out: list[exp.Expr] = []
    stack: list[exp.Expr] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, exp.Window):
            # The window's own function is not an aggregate of this query, what it reads
            # may be: SUM(SUM(x)) OVER (PARTITION BY c) sums the aggregate SUM(x).
            stack.extend(n.this.iter_expressions())
            stack.extend(n.args.get("partition_by") or [])
            if n.args.get("order") is not None:
                stack.extend(n.args["order"].expressions)
            continue
        if isinstance(n, exp.AggFunc | exp.Filter):
            out.append(n)
            continue
        if n is not node and is_query(n):
            continue
        stack.extend(n.iter_expressions())
    return out


def conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The AND-ed parts of a condition, constant TRUEs dropped."""
    if node is None:
        return []
    if isinstance(node, exp.Where | exp.Having):
        node = node.this
    parts = list(node.flatten()) if isinstance(node, exp.And) else [node]
    out = []
    for p in parts:
        while isinstance(p, exp.Paren):
            p = p.this
        if isinstance(p, exp.And):
            out += conjuncts(p)
        elif not (isinstance(p, exp.Boolean) and p.this is True):
            out.append(p)
    return out


def unique_name(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    taken.add(name)
    return name


def key_family(t: pa.DataType) -> str:
    if is_integer(t):
        return "int"
    if is_string(t):
        return "string"
    if is_decimal(t):
        return f"decimal{t.scale}"
    if is_float(t):
        return "float"
    return str(t)
