"""The relational half of the SQL compiler: a visitor over sqlglot's qualified AST.

One method per node type (:class:`QueryCompiler`): a ``SELECT`` becomes its FROM
clause's joins and WHERE filters (:mod:`planner._sqlfrom`), then its GROUP BY aggregate,
HAVING filter and projection, as streams of a ``joinstate.Graph``; ``UNION [ALL]`` one
``union_all`` of every branch; a ``WITH`` entry one stream, built the first time it is
referenced, so that every consumer reads (and shares the indexes of) the same subgraph.
Aggregates are DuckDB's: ``AVG`` is ``SUM / COUNT`` after the group-by, ``SUM``/``AVG``
of ``x / c`` sum ``x`` exactly, and an aggregate without GROUP BY has its one row even
when nothing qualifies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

import joinstate
from planner._sqleager import eager_aggregate
from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqlexpr import ExprCompiler, cast_to, constant, null_of
from planner._sqlfrom import FromPlanner
from planner._sqlgroup import AggregatePlan, expand_grouping, key_column
from planner._sqlscope import (
    AggScope,
    Bound,
    BoundScope,
    OrderItem,
    Rel,
    SourceSpec,
    agg_key,
    find_aggs,
    unique_name,
)
from planner._sqlsetop import set_operation
from planner._sqlsubquery import Subqueries, attach_select, correlated_aliases, decorrelates
from planner._sqltypes import (
    Typed,
    TypeRuleError,
    common_type,
    describe,
    is_decimal,
    is_float,
    is_integer,
)
from planner._sqlwindow import compile_windows, find_windows
from planner.rules.join_order import JoinOrder, JoinOrderContext

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from joinstate import Stream
    from planner.rule import Decision

__all__ = ["Bound", "OrderItem", "QueryCompiler", "Rel", "SourceSpec", "output_order"]


# ---- the compiler --------------------------------------------------------------------


@dataclass
class _Cte:
    """A WITH entry: its body, the scopes it sees, and its stream once built."""

    node: exp.Expr
    scopes: list[dict[str, _Cte]] = field(default_factory=list)
    rel: Rel | None = None
    busy: bool = False


@dataclass
class QueryCompiler:
    """Compiles qualified queries into streams of a graph; records planner decisions."""

    sources: Mapping[str, SourceSpec]  # by lower-case name
    decisions: list[Decision] = field(default_factory=list)
    streams: dict[str, Stream] = field(default_factory=dict)
    _ctes: list[dict[str, _Cte]] = field(default_factory=list)
    outer_scopes: list[frozenset[str]] = field(default_factory=list)
    _rule: JoinOrder = field(default_factory=JoinOrder)
    recorded_orders: tuple[tuple[str, ...], ...] = ()
    """Join orders a view was compiled with, in the order the groups are met: kept."""
    join_orders: list[tuple[str, ...]] = field(default_factory=list)
    """The join order of every inner join group, in the order they were met."""
    recorded_peels: tuple[int, ...] | None = None
    """Joins a view was compiled with peeled off each GROUP BY (:mod:`planner._sqleager`),
    in the order they are met: kept (missing ones: none).  None: decided afresh."""
    peels: list[int] = field(default_factory=list)
    """The joins peeled off every GROUP BY over joins, in the order they were met."""

    # ---- queries ----------------------------------------------------------------------

    def query(self, node: exp.Expr, names: Sequence[str] | None = None) -> Rel:
        """Any query node; ``names`` renames the output columns (the final query's)."""
        if isinstance(node, exp.Subquery):
            self._no_modifiers(node, "a parenthesised query")
            return self.query(node.this, names)
        with_ = node.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise UnsupportedSQLError(f"WITH RECURSIVE {snippet(with_)}",
                                          "recursive queries are not compiled")
            scope: dict[str, _Cte] = {}
            self._ctes.append(scope)
            for cte in with_.expressions:
                scope[cte.alias_or_name] = _Cte(cte.this, list(self._ctes))
        try:
            if isinstance(node, exp.Select):
                return self.select(node, names)
            if isinstance(node, exp.Union):
                return self.union(node, names)
            if isinstance(node, exp.Intersect | exp.Except):
                return set_operation(self, node, names)
            raise UnsupportedSQLError(f"{type(node).__name__} {snippet(node)}",
                                      "only SELECT queries are compiled")
        finally:
            if with_ is not None:
                self._ctes.pop()

    def _no_modifiers(self, node: exp.Expr, where: str) -> None:
        for arg, what in (("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET")):
            if node.args.get(arg) is not None:
                raise UnsupportedSQLError(
                    f"{what} in {where} {snippet(node)}",
                    f"{what} is only compiled at the end of the whole query (it is applied "
                    "when the materialized result is read); inside a query it would make "
                    "the rows kept depend on rows outside them")

    def union(self, node: exp.Union, names: Sequence[str] | None) -> Rel:
        """``UNION ALL`` (one ``union_all`` of every branch) and ``UNION`` (then distinct)."""
        self._no_modifiers(node, "a UNION branch")
        distinct = bool(node.args.get("distinct"))
        branches: list[exp.Expr] = []

        def flatten(n: exp.Expr) -> None:
            if (isinstance(n, exp.Union) and bool(n.args.get("distinct")) == distinct
                    and n.args.get("with_") is None):
                self._no_modifiers(n, "a UNION branch")
                flatten(n.this)
                flatten(n.expression)
            else:
                branches.append(n)

        flatten(node.this)
        flatten(node.expression)
        rels = [self.query(b) for b in branches]
        width = len(rels[0].columns)
        for b, r in zip(branches, rels, strict=True):
            if len(r.columns) != width:
                raise SQLError(f"UNION branch {snippet(b)} has {len(r.columns)} columns, the "
                               f"first has {width}")
        types = []
        for i in range(width):
            t: Typed | None = None
            for r in rels:
                f = r.stream.schema.field(r.columns[i][1])
                nxt = Typed(None, pa.null() if f.name in r.nulls else f.type)
                try:
                    t = nxt if t is None else Typed(None, common_type(t, nxt))
                except TypeRuleError as exc:
                    raise SQLError(f"UNION column {i + 1} ({rels[0].columns[i][0]}): {exc}"
                                   ) from exc
            assert t is not None
            types.append(t.type if not pa.types.is_null(t.type) else pa.int32())
        out_names = list(names) if names is not None else self._names(
            [c for c, _ in rels[0].columns])
        streams = []
        for r in rels:
            cols = {}
            for (_, col), name, t in zip(r.columns, out_names, types, strict=True):
                cols[name] = cast_to(Typed(pc.field(col), r.stream.schema.field(col).type), t)
            streams.append(r.stream.select(cols))
        stream = streams[0].union_all(*streams[1:]) if len(streams) > 1 else streams[0]
        sql_names = [c for c, _ in rels[0].columns]
        rel = Rel(stream, list(zip(sql_names, out_names, strict=True)))
        return self._distinct(rel) if distinct else rel

    def _names(self, names: Sequence[str]) -> list[str]:
        taken: set[str] = set()
        return [unique_name(n, taken) for n in names]

    def _distinct(self, rel: Rel) -> Rel:
        """Distinct rows: a group-by on every column with a hidden row count."""
        cols = [c for _, c in rel.columns]
        count = unique_name("__rows", set(cols))
        grouped = rel.stream.group_by(cols).aggregate(**{count: ("count", None)})
        unique = ((tuple(cols),) if self._rule.by_references else ())
        return Rel(grouped.select(cols), rel.columns, unique=unique)

    # ---- SELECT -----------------------------------------------------------------------

    _SELECT_ARGS = frozenset({"expressions", "from_", "joins", "where", "group", "having",
                              "with_", "distinct", "kind", "hint", "operation_modifiers"})

    def select(self, node: exp.Select, names: Sequence[str] | None) -> Rel:
        """FROM, WHERE, GROUP BY, HAVING, projection, DISTINCT."""
        self._no_modifiers(node, "a subquery, CTE or UNION branch")
        for arg, value in node.args.items():
            if value is None or value == [] or value is False or arg in self._SELECT_ARGS:
                continue
            raise UnsupportedSQLError(f"{arg.upper()} in {snippet(node)}",
                                      f"the {arg.upper()} clause is not compiled")
        distinct = node.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise UnsupportedSQLError(f"DISTINCT ON in {snippet(node)}", "DISTINCT ON keeps "
                                      "one row per key chosen by order; not compiled")
        if node.args.get("from_") is None:
            raise UnsupportedSQLError(f"SELECT without FROM {snippet(node)}",
                                      "a query must read at least one source (a constant "
                                      "row has no changes to maintain)")
        bound = FromPlanner(self, node).plan()
        projections = list(node.expressions)
        group = node.args.get("group")
        having = node.args.get("having")
        aggs = [a for p in projections for a in find_aggs(p)]
        if having is not None:
            aggs += find_aggs(having)
        scope: BoundScope | AggScope
        if group is not None or aggs:
            stream, scope = self._aggregate(bound, node, projections)
        else:
            stream, scope = bound.stream, BoundScope(bound, self.outer_aliases())
        stream, expr_scope = attach_select(self, stream, scope, bound.aliases,
                                           having.this if having is not None else None,
                                           projections)
        compiler = ExprCompiler(expr_scope)
        if having is not None:
            if not isinstance(scope, AggScope):
                raise SQLError(f"HAVING without GROUP BY or aggregates: {snippet(having)}")
            pred = compiler.predicate(having.this)
            stream = stream.filter(pred.expr)
        if any(find_windows(p) for p in projections):
            stream, wscope = compile_windows(stream, scope, projections, self.record)
            compiler = ExprCompiler(wscope)
        sql_names = [p.alias_or_name for p in projections]
        out_names = list(names) if names is not None else self._names(sql_names)
        cols: dict[str, Any] = {}
        nulls = set()
        for p, name in zip(projections, out_names, strict=True):
            v = compiler.compile(p.this if isinstance(p, exp.Alias) else p)
            if pa.types.is_null(v.type):
                v = null_of(pa.int32())  # DuckDB gives a bare NULL the type INTEGER
                nulls.add(name)
            cols[name] = v.expr
        rel = Rel(stream.select(cols), list(zip(sql_names, out_names, strict=True)),
                  frozenset(nulls), self._group_unique(group, projections, out_names))
        return self._distinct(rel) if distinct is not None else rel

    def _group_unique(self, group: exp.Group | None, projections: list[exp.Expr],
                      out_names: Sequence[str]) -> tuple[tuple[str, ...], ...]:
        """The output columns a plain GROUP BY makes unique together (all its keys shown).

        Only for the join-order rule that counts foreign keys: views planned by the
        earlier rule keep their plans.
        """
        if group is None or not self._rule.by_references or not group.expressions or any(
                group.args.get(a) for a in ("rollup", "cube", "grouping_sets", "all")):
            return ()
        if any(isinstance(g, exp.Rollup | exp.Cube | exp.GroupingSets)
               for g in group.expressions):
            return ()
        shown = {p.this if isinstance(p, exp.Alias) else p: name
                 for p, name in zip(projections, out_names, strict=True)}
        cols = [shown.get(g) for g in group.expressions]
        if any(c is None for c in cols):
            return ()
        return (tuple(dict.fromkeys(c for c in cols if c is not None)),)

    def outer_aliases(self) -> frozenset[str]:
        return frozenset().union(*self.outer_scopes) if self.outer_scopes else frozenset()

    def _aggregate(self, bound: Bound, node: exp.Select, projections: list[exp.Expr]
                   ) -> tuple[Stream, AggScope]:
        group = node.args.get("group")
        exprs: list[exp.Expr] = []
        if group is not None:
            for arg in ("rollup", "cube", "grouping_sets"):
                if group.args.get(arg):
                    raise UnsupportedSQLError(f"GROUP BY {arg.upper()} in {snippet(group)}",
                                              "grouping sets are not compiled")
            if group.args.get("all"):
                exprs = [p.this if isinstance(p, exp.Alias) else p for p in projections
                         if not find_aggs(p)]
            else:
                exprs = list(group.expressions)
        exprs, sets = expand_grouping(exprs)
        pre = ExprCompiler(BoundScope(bound, self.outer_aliases()))
        stream = bound.stream
        keys: list[tuple[exp.Expr, str]] = []
        computed: dict[str, Any] = {}
        taken = set(stream.columns)
        for i, e in enumerate(exprs):
            keys.append((e, key_column(pre, stream, e, i, taken, computed)))
        if computed:
            stream = stream.with_columns(computed)
        specs: dict[str, tuple[str, Any]] = {}
        post: dict[str, Typed | str] = {}
        names = set(stream.columns)
        agg_nodes = [a for p in projections for a in find_aggs(p)]
        having = node.args.get("having")
        if having is not None:
            agg_nodes += find_aggs(having)
        aggs = AggregatePlan(pre, specs, names, exprs, self._agg, self.record)
        for a in agg_nodes:
            key = agg_key(a)
            if key not in post:
                post[key] = aggs.value(a)
        if sets is not None or aggs.special:
            return aggs.build(stream, keys, sets, post, grouped=group is not None)
        if not specs:  # GROUP BY without aggregates: a hidden row count keeps the groups
            specs[unique_name("__rows", names)] = ("count", None)
        if group is None:
            return self._global(stream, specs, post)
        k = len(self.peels)
        recorded = None if self.recorded_peels is None else (
            self.recorded_peels[k] if k < len(self.recorded_peels) else 0)
        peeled = eager_aggregate(bound, exprs, agg_nodes, specs, outer=self.outer_aliases(),
                                 fallback=self._agg, record=self.record,
                                 recorded=recorded) if self._rule.by_steps else None
        self.peels.append(peeled.joins if peeled is not None else 0)
        if peeled is not None:
            out, keys = peeled.stream, peeled.keys
        else:
            out = stream.group_by([c for _, c in self._dedup_keys(keys)]).aggregate(**specs)
        resolved = {k: v if isinstance(v, Typed) else Typed(pc.field(v), out.schema.field(
            v).type) for k, v in post.items()}
        return out, AggScope(out, keys, resolved)

    def _global(self, stream: Stream, specs: dict[str, tuple[str, Any]],
                post: dict[str, Typed | str]) -> tuple[Stream, AggScope]:
        """An aggregate without GROUP BY: an aggregate without group keys.

        Its one row exists from the start, as in SQL: ``SELECT count(*), sum(x) FROM t
        WHERE ...`` reads (0, NULL) while no row qualifies, before the first push too
        (see :meth:`joinstate.GroupedStream.aggregate`).
        """
        grouped = stream.group_by([]).aggregate(**specs)
        resolved = {k: v if isinstance(v, Typed) else Typed(pc.field(v), grouped.schema.field(
            v).type) for k, v in post.items()}
        return grouped, AggScope(grouped, [], resolved)

    @staticmethod
    def _dedup_keys(keys: list[tuple[exp.Expr, str]]) -> list[tuple[exp.Expr, str]]:
        seen: set[str] = set()
        out = []
        for e, c in keys:
            if c not in seen:
                seen.add(c)
                out.append((e, c))
        return out

    def _agg(self, node: exp.Expr, pre: ExprCompiler, specs: dict[str, tuple[str, Any]],
             names: set[str]) -> Typed | str:
        """Register the aggregate specs ``node`` needs; return its value after the group-by.

        The value is an expression over the aggregate's output, or the name of one of its
        columns.

        ``AVG`` is ``SUM / COUNT`` after the aggregate.  ``SUM``/``AVG`` of ``x / c`` (``x``
        an integer or decimal, ``c`` a non-zero constant) sum ``x`` exactly and divide
        after: a float sum kept under deletes would drift (deleting a row does not give
        back the value computed without it), an exact sum does not.
        """
        if isinstance(node, exp.Filter):
            node = self._unfilter(node)
        if not isinstance(node, exp.Sum | exp.Count | exp.Min | exp.Max | exp.Avg):
            raise UnsupportedSQLError(f"aggregate {snippet(node)}", "only SUM, COUNT, MIN, "
                                      "MAX and AVG are maintained incrementally")
        arg = node.this
        if isinstance(arg, exp.Distinct):
            raise UnsupportedSQLError(f"DISTINCT aggregate {snippet(node)}", "an aggregate "
                                      "of distinct values needs every value's count per group; "
                                      "not compiled")
        if node.args.get("ignore_nulls") or node.args.get("respect_nulls"):
            raise UnsupportedSQLError(f"aggregate {snippet(node)}", "IGNORE/RESPECT NULLS is "
                                      "not compiled")

        def spec(func: str, expr: Any) -> str:
            for n, (f, e) in specs.items():
                if f == func and ((e is None and expr is None) or (
                        e is not None and expr is not None and e.equals(expr))):
                    return n
            n = unique_name(f"__a{len(specs)}", names)
            specs[n] = (func, expr)
            return n

        if isinstance(node, exp.Count):
            if arg is None or isinstance(arg, exp.Star):
                return spec("count", None)
            v = pre.compile(arg)
            if v.const and constant(v).is_valid:
                return spec("count", None)
            return spec("count", v.expr)
        v = pre.compile(arg)
        if isinstance(node, exp.Min | exp.Max):
            return spec("min" if isinstance(node, exp.Min) else "max", v.expr)
        exact = self._exact_quotient(arg, pre)
        if exact is not None:
            numerator, divisor = exact
            s = spec("sum", numerator.expr)
            total: Any = pc.field(s).cast(pa.float64())
            if isinstance(node, exp.Avg):
                total = pc.divide(total, pc.field(spec("count", numerator.expr)).cast(
                    pa.float64()))
            return Typed(pc.divide(total, pc.scalar(float(divisor))), pa.float64())
        if not (is_integer(v.type) or is_decimal(v.type) or is_float(v.type)
                or pa.types.is_boolean(v.type)):
            raise SQLError(f"{snippet(node)}: cannot sum {describe(v.type)}")
        s = spec("sum", v.expr)
        if isinstance(node, exp.Avg):
            n = spec("count", v.expr)
            return Typed(pc.divide(pc.field(s).cast(pa.float64()),
                                   pc.field(n).cast(pa.float64())), pa.float64())
        return s

    @staticmethod
    def _unfilter(node: exp.Filter) -> exp.Expr:
        """``agg(x) FILTER (WHERE c)`` as ``agg(CASE WHEN c THEN x END)``.

        The same value: rows failing ``c`` contribute a NULL, which every aggregate here
        skips (``COUNT(*)`` counts the constant 1 where ``c`` holds).
        """
        agg = node.this
        cond = node.expression.this if isinstance(node.expression, exp.Where) else \
            node.expression
        if not isinstance(agg, exp.Sum | exp.Count | exp.Min | exp.Max | exp.Avg) or \
                isinstance(agg.this, exp.Distinct):
            raise UnsupportedSQLError(f"aggregate {snippet(node)}", "only SUM, COUNT, MIN, "
                                      "MAX and AVG (not DISTINCT) are maintained "
                                      "incrementally, with or without FILTER")
        arg = agg.this
        if arg is None or isinstance(arg, exp.Star):
            arg = exp.Literal.number(1)
        out = agg.copy()
        out.set("this", exp.Case(ifs=[exp.If(this=cond.copy(), true=arg.copy())]))
        return out

    @staticmethod
    def _exact_quotient(arg: exp.Expr, pre: ExprCompiler) -> tuple[Typed, float] | None:
        """``(x, c)`` if ``arg`` is ``x / c``: x integer or decimal, c a non-zero constant."""
        divisor = 1.0
        node = arg
        while True:
            while isinstance(node, exp.Paren):
                node = node.this
            if not isinstance(node, exp.Div):
                break
            c = pre.compile(node.expression)
            if not c.const or not (is_integer(c.type) or is_decimal(c.type)
                                   or is_float(c.type)):
                return None
            value = constant(c).as_py()
            if value is None or float(value) == 0.0:
                return None
            divisor *= float(value)
            node = node.this
        if node is arg:
            return None
        v = pre.compile(node)
        if not (is_integer(v.type) or is_decimal(v.type)):
            return None
        return v, divisor

    # ---- FROM items -------------------------------------------------------------------

    def source_stream(self, spec: SourceSpec) -> Stream:
        """The graph's source stream for ``spec``, created on first use."""
        s = self.streams.get(spec.name)
        if s is None:
            s = self.streams[spec.name] = joinstate.source(
                spec.name, spec.schema, unique_key=spec.unique_key,
                also_unique=spec.also_unique)
        return s

    def bind_table(self, node: exp.Table) -> Bound:
        """A table name: a CTE in scope, else a source."""
        if node.args.get("db") is not None or node.args.get("catalog") is not None:
            raise SQLError(f"table {snippet(node)}: sources have plain names (no schema or "
                           "catalog)")
        for arg in ("joins", "pivots", "laterals", "sample"):
            if node.args.get(arg):
                raise UnsupportedSQLError(f"{arg.upper()} on {snippet(node)}",
                                          "not compiled")
        name = node.name
        alias = node.alias_or_name
        for scope in reversed(self._ctes):
            cte = scope.get(name)
            if cte is not None:
                return self._bound(self._cte(name, cte), alias)
        spec = self.sources.get(name.lower())
        if spec is None:
            known = sorted(s.name for s in self.sources.values())
            raise SQLError(f"table {snippet(node)} is neither a CTE nor a source (sources: "
                           f"{known}); pass it in `sources`")
        stream = self.source_stream(spec)
        by_lower = {c.lower(): c for c in spec.schema.names}
        refs = {(alias, low): real for low, real in by_lower.items()}
        unique = ((tuple(spec.unique_key),) if spec.unique_key else ()) + spec.also_unique
        return Bound(stream, refs, (alias,), alias, source=spec.name, unique=unique,
                     sample=spec.sample, unfiltered=spec.sample)

    def _cte(self, name: str, cte: _Cte) -> Rel:
        if cte.rel is None:
            if cte.busy:
                raise UnsupportedSQLError(f"CTE {name}", "a CTE that reads itself is "
                                          "recursive; not compiled")
            cte.busy = True
            # The body sees the scopes of its WITH, not those of the query that first
            # reads it (which may define CTEs of the same name).
            saved, self._ctes = self._ctes, cte.scopes
            try:
                cte.rel = self.query(cte.node)
            finally:
                self._ctes = saved
                cte.busy = False
        return cte.rel

    def _bound(self, rel: Rel, alias: str) -> Bound:
        refs: dict[tuple[str, str], str] = {}
        for name, col in rel.columns:
            refs.setdefault((alias, name.lower()), col)
        return Bound(rel.stream, refs, (alias,), alias, unique=rel.unique)

    def bind_subquery(self, node: exp.Subquery) -> Bound:
        """A derived table ``(SELECT ...) AS alias``."""
        alias = node.alias_or_name
        if node.args.get("lateral"):
            raise UnsupportedSQLError(f"LATERAL {snippet(node)}", "not compiled")
        return self._bound(self.query(node.this), alias)

    def bind(self, node: exp.Expr) -> Bound:
        """Any FROM item."""
        if isinstance(node, exp.Table):
            return self.bind_table(node)
        if isinstance(node, exp.Subquery):
            return self.bind_subquery(node)
        raise UnsupportedSQLError(f"FROM item {snippet(node)}", "only tables, CTEs and "
                                  "subqueries are compiled (VALUES, UNNEST, table functions "
                                  "and LATERAL have no source to maintain)")

    def join_order(self, context: JoinOrderContext) -> list[str]:
        """Ask the join-order rule; record its decision."""
        decisions = list(self._rule.apply(context))
        order = next((list(d.choice) for d in decisions if d.topic == "join_order"),
                     [i.name for i in context.inputs])
        k = len(self.join_orders)
        kept = self.recorded_orders[k] if k < len(self.recorded_orders) else None
        if kept is not None and sorted(kept) != sorted(order):
            kept = None  # another group than the recorded one: plan it afresh
        if kept is not None and list(kept) != order:
            # the state was laid out in the recorded order, from the data of that time
            decisions = [d if d.topic != "join_order" else dataclasses.replace(
                d, choice=list(kept),
                reason=(f"kept as recorded when the view was compiled ({', '.join(kept)}): "
                        f"its stored state is laid out in that order; from the estimates "
                        f"given now the rule would choose {', '.join(order)} ({d.reason})"))
                for d in decisions]
            order = list(kept)
        self.decisions.extend(decisions)
        self.join_orders.append(tuple(order))
        return order

    def record(self, decision: Decision) -> None:
        """Record a decision taken by the compiler itself."""
        self.decisions.append(decision)

    # ---- subqueries in conditions (planner._sqlsubquery) -------------------------------

    def decorrelates(self, node: exp.Expr) -> bool:
        """Whether ``node`` holds a subquery decorrelation compiles (see ``subquery_filter``)."""
        return decorrelates(node)

    def correlated_aliases(self, node: exp.Expr) -> frozenset[str]:
        """The enclosing queries' aliases the subqueries in ``node`` read."""
        return correlated_aliases(node)

    def subquery_filter(self, bound: Bound, node: exp.Expr) -> Bound:
        """``bound`` filtered by a condition holding subqueries, decorrelated into joins."""
        return Subqueries(self).where(bound, node)


def output_order(order: exp.Order | None, projections: Sequence[exp.Expr] | None,
                 columns: Sequence[tuple[str, str]]) -> list[OrderItem]:
    """The final ORDER BY as output columns; anything else is refused."""
    if order is None:
        return []
    by_sql = {name.lower(): col for name, col in columns}
    out = []
    for o in order.expressions:
        e = o.this
        col = None
        if isinstance(e, exp.Column) and not e.table and e.name.lower() in by_sql:
            col = by_sql[e.name.lower()]
        elif projections is not None:
            for p, (_, c) in zip(projections, columns, strict=True):
                inner = p.this if isinstance(p, exp.Alias) else p
                while isinstance(inner, exp.Paren):  # SELECT DISTINCT (x): x
                    inner = inner.this
                if inner == e:
                    col = c
                    break
        if col is None:
            raise UnsupportedSQLError(
                f"ORDER BY {snippet(e)}", "the final ORDER BY must name output columns (the "
                "materialized result is sorted when read); add the expression to the SELECT "
                "list")
        out.append(OrderItem(col, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
    return out
