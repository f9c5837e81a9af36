"""SQL in, a ``joinstate.Graph`` (:func:`define`) or a maintained ``joinstate.Pipeline`` out.

::

    import planner
    p = planner.compile(
        "SELECT d_year, sum(ss_net_paid) AS paid FROM store_sales, date_dim "
        "WHERE ss_sold_date_sk = d_date_sk GROUP BY d_year ORDER BY paid DESC LIMIT 10",
        {"store_sales": sales_schema, "date_dim": planner.Source(dates_schema, "d_date_sk")},
        store=store, name="paid_per_year")
    outs = p.push("store_sales", delta)   # {"paid_per_year": the answer's change set}
    p.read("paid_per_year")               # the current answer, ordered, first 10 rows

How.  sqlglot parses DuckDB's dialect; its optimizer qualifies every column with its
table alias (``qualify``), rewrites conditions in conjunctive normal form
(``normalize``) and turns derived tables into CTEs, merging identical ones
(``eliminate_subqueries``).  ``pushdown_predicates`` is not used: it runs sqlglot's
``simplify``, which rewrites ``f + 0.1 > 0.3`` as ``f > 0.2`` (not the same for a
DOUBLE, nor for an integer that overflows); the FROM planner places every conjunct
itself.  :mod:`planner._sqlrel` then visits the normalised tree (one method per node
type) and builds the graph (store-less; :func:`compile` attaches it to a store),
:mod:`planner._sqlfrom` plans each FROM clause's joins (their order from the
``join_order`` rule), and :mod:`planner._sqlexpr` translates scalar expressions
with DuckDB's types (:mod:`planner._sqltypes`).  The answer is one
materialized output: its change sets come out of every ``push``, and the final
``ORDER BY ... LIMIT`` is applied when it is read.

The subset.  SELECT with projections and arithmetic; WHERE filters and equi-joins
(comma joins, ``JOIN ... ON``/``USING``, inner, left/right/full outer, DuckDB's SEMI and
ANTI joins); subqueries (EXISTS, IN, NOT IN, scalar; correlated by equalities or not)
in WHERE, ON, HAVING and SELECT lists, decorrelated into joins
(:mod:`planner._sqlsubquery`); GROUP BY with SUM, COUNT,
COUNT(*), MIN, MAX, AVG (also with ``FILTER (WHERE ...)``); HAVING; SELECT DISTINCT;
DISTINCT aggregates, STDDEV/VAR and ROLLUP/CUBE/GROUPING SETS with GROUPING()
(:mod:`planner._sqlgroup`); cross joins on a constant key (:mod:`planner._sqlcross`);
UNION ALL and UNION; INTERSECT and EXCEPT, also ALL (:mod:`planner._sqlsetop`); WITH
(each CTE one shared subgraph); IN lists, BETWEEN, CASE,
IS [NOT] NULL, [I]LIKE, CAST, COALESCE, NULLIF, a few functions; window functions
(ROW_NUMBER, RANK, DENSE_RANK, SUM/AVG/MIN/MAX/COUNT over a partition or from its start
to the current row; a WHERE bound on a ranking makes a maintained top-N:
:mod:`planner._sqlwindow`); a final ORDER BY (of output columns or any expression:
:mod:`planner._sqlorder`) and LIMIT.  Anything else raises
:class:`UnsupportedSQLError` quoting the construct and saying why.

Semantics are DuckDB's (the tests compare with DuckDB on random changes), with one
deliberate difference: ``SUM``/``AVG`` of ``x / c`` (``x`` an integer or decimal, ``c`` a
non-zero constant) sums ``x`` exactly and divides once, so deleting rows gives back the
value computed without them (a float sum maintained under deletes drifts); the result
differs from DuckDB's row-by-row float sum only in the last bits.  ``SUM`` of integers is
BIGINT (DuckDB: HUGEINT; equal values, and an overflow raises).  An aggregate without
GROUP BY has its one row (zero counts, NULL sums) when no row qualifies, from the start:
``read`` shows it before the first push, and the first push carrying a row returns it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, SqlglotError
from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
from sqlglot.optimizer.normalize import normalize
from sqlglot.optimizer.qualify import qualify
from sqlglot.schema import MappingSchema

import joinstate
from joinstate.errors import SchemaMismatchError
from joinstate.inspect import stored_names
from joinstate.names import pipeline_spec_key, view_sql_key
from joinstate.nodes import also_unique_keys
from planner._sqlerrors import (
    SQLError,
    UnsupportedSQLError,
    parse_error,
    plain,
    quoting,
    snippet,
)
from planner._sqlorder import hidden_order
from planner._sqlrel import OrderItem, QueryCompiler, SourceSpec, output_order
from planner._sqlscope import ambiguous_column
from planner._sqltypes import describe
from planner.rules.join_order import JOIN_RULE, JOIN_RULES, JoinOrder
from planner.views import ViewRecord, record_view, stored_view

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from planner.rule import Decision

__all__ = ["SQLError", "SQLPlan", "Source", "UnsupportedSQLError", "compile", "counts_only",
           "define", "plan", "reopen"]

DIALECT = "duckdb"


@dataclass(frozen=True)
class Source:
    """A source the SQL reads: its schema and, optionally, unique keys.

    ``unique_key`` (a column or columns, no two rows share its values) lets the source's
    indexes use a keyed layout and tells the join-order rule which joins cannot multiply
    rows (a dimension joined on its key).  ``also_unique``: further unique keys (each a
    column or columns), verified by the pipeline (a push breaking one, or putting a NULL
    in one, is refused; see ``joinstate.source``); on Spark they let the planner keep a
    group by such a key where its rows lie.
    """

    schema: pa.Schema
    unique_key: str | Sequence[str] | None = None
    also_unique: Sequence[str | Sequence[str]] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.schema, pa.Schema):
            raise SQLError(f"Source(schema=...) must be a pyarrow.Schema, got "
                           f"{type(self.schema).__name__}")
        uk = self.unique_key
        if uk is not None:
            cols = (uk,) if isinstance(uk, str) else tuple(uk)
            missing = [c for c in cols if c not in self.schema.names]
            if not cols or missing:
                raise SQLError(f"Source(unique_key={uk!r}): {missing or 'no'} column(s) not "
                               f"in the schema ({self.schema.names})")
            object.__setattr__(self, "unique_key", cols)
        try:
            also = also_unique_keys("Source", self.schema, self.key, self.also_unique)
        except SchemaMismatchError as exc:
            raise SQLError(str(exc)) from None
        object.__setattr__(self, "also_unique", also)

    @property
    def key(self) -> tuple[str, ...] | None:
        """The unique key as a tuple (or None)."""
        return cast("tuple[str, ...] | None", self.unique_key)


@dataclass(frozen=True)
class SQLPlan:
    """What :func:`define` built: the output, its columns and order, and the decisions.

    ``decisions`` are the planner's choices (join order, N-way joins), each with its
    reason; ``qualified_sql`` is the query after sqlglot's normalisation, the text the
    compiler read.
    """

    output: str
    columns: tuple[str, ...]
    order_by: tuple[OrderItem, ...]
    limit: int | None
    sources: tuple[str, ...]
    decisions: tuple[Decision, ...]
    qualified_sql: str
    materialized: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)
    join_orders: tuple[tuple[str, ...], ...] = ()
    peels: tuple[int, ...] = ()
    """Joins peeled off each GROUP BY over joins, in the order the compiler met them
    (eager aggregation, ``planner._sqleager``)."""

    def explain(self) -> str:
        """The plan in words: sources, output, and every decision with its reason."""
        order = ", ".join(f"{o.column} {'DESC' if o.descending else 'ASC'}"
                          f"{' NULLS FIRST' if o.nulls_first else ''}" for o in self.order_by)
        lines = [f"output {self.output!r}: columns {list(self.columns)}"
                 + (f", ORDER BY {order}" if order else "")
                 + (f", LIMIT {self.limit}" if self.limit is not None else "")
                 + (" (materialized)" if self.materialized else ""),
                 f"sources: {', '.join(self.sources)}"]
        for d in self.decisions:
            lines.append(f"  {d.topic} [{d.rule}] {d.subject}: {d.choice} -- {d.reason}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _specs(sources: Mapping[str, Any], stats: Mapping[str, Any] | None
           ) -> dict[str, SourceSpec]:
    """The sources as the compiler sees them (checked), without samples."""
    if not hasattr(sources, "items"):
        raise SQLError(f"sources must be a mapping of source name -> pyarrow.Schema or "
                       f"planner.Source, got {type(sources).__name__}")
    out: dict[str, SourceSpec] = {}
    for name, s in sources.items():
        if not isinstance(name, str):
            raise SQLError(f"source names must be strings, got {name!r}")
        src = s if isinstance(s, Source) else Source(s) if isinstance(s, pa.Schema) else None
        if src is None:
            raise SQLError(f"sources[{name!r}] must be a pyarrow.Schema or planner.Source, got "
                           f"{type(s).__name__}")
        low = {c.lower() for c in src.schema.names}
        if len(low) != len(src.schema.names):
            raise SQLError(f"source {name!r}: column names differ only in case "
                           f"({src.schema.names}); SQL names are case-insensitive")
        if name.lower() in out:
            raise SQLError(f"sources {out[name.lower()].name!r} and {name!r} differ only in "
                           "case; SQL table names are case-insensitive")
        rows = None
        if stats is not None and name in stats:
            rows = _rows(stats[name], name)
        out[name.lower()] = SourceSpec(name, src.schema, src.key, rows,
                                       cast("tuple[tuple[str, ...], ...]", src.also_unique))
    if stats is not None:
        unknown = set(stats) - {s.name for s in out.values()}
        if unknown:
            raise SQLError(f"stats for {sorted(unknown)}, which are not sources "
                           f"({sorted(s.name for s in out.values())})")
    return out


SAMPLE_ROWS = 20_000
"""Rows of a source's data the compiler keeps to estimate what its filters keep."""


def _sample(value: object) -> pa.Table | None:
    """Up to :data:`SAMPLE_ROWS` rows of ``value``'s data, the same ones every time.

    ``value`` is a table (or record batch) of the source's rows, or an object with a
    ``sample`` table (``planner.stats.SourceStats``); anything else has no sample.
    The rows are drawn uniformly with a fixed seed, so compiling twice from the same
    data plans the same joins.
    """
    data = value if isinstance(value, pa.Table | pa.RecordBatch) else getattr(
        value, "sample", None)
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        return None
    if data.num_rows <= SAMPLE_ROWS:
        return data
    picks = np.sort(np.random.default_rng(0).choice(data.num_rows, SAMPLE_ROWS,
                                                    replace=False))
    return data.take(pa.array(picks))


def _sampled_from(value: object, rows: int | None) -> int | None:
    """How many rows ``value``'s sample stands for.

    The row count when known, else the rows of the data given (a table given as stats
    is the source's data itself).
    """
    if rows is not None:
        return rows
    data = value if isinstance(value, pa.Table | pa.RecordBatch) else getattr(
        value, "sample", None)
    return data.num_rows if isinstance(data, pa.Table | pa.RecordBatch) else None


def counts_only(stats: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``stats`` with each source's data or sample replaced by its row count.

    What plans the same joins whatever the data has become: for a state whose join
    orders are not recorded with it.
    """
    if stats is None:
        return None
    return {n: _rows(v, n) for n, v in stats.items()}


def _rows(value: object, name: str) -> int | None:
    if isinstance(value, pa.Table | pa.RecordBatch):
        return value.num_rows
    rows = getattr(value, "rows", value)
    if rows is None:
        return None
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise SQLError(f"stats[{name!r}] must be a row count (int >= 0), the source's data "
                       f"(a pyarrow.Table) or an object with a `rows` attribute, got "
                       f"{type(value).__name__} {value!r:.80}")
    return rows


def _sql_type(t: pa.DataType) -> str:
    name = describe(t)
    return name if name.replace("(", "").replace(")", "").replace(",", "").isalnum() or \
        name.startswith("DECIMAL") else "UNKNOWN"


# ---- checks on the text as written ----------------------------------------------------


def _precheck(tree: exp.Expr) -> None:
    """Refuse what the optimizer passes would choke on, quoting the user's own text."""
    if not isinstance(tree, exp.Select | exp.Union | exp.Intersect | exp.Except):
        raise UnsupportedSQLError(f"statement {snippet(tree)}", "only a SELECT query is "
                                  "compiled")
    for n in tree.walk():
        if isinstance(n, exp.Values):
            raise UnsupportedSQLError(f"VALUES {snippet(n)}", "a constant relation has no "
                                      "source to maintain; pass it as a source")
        if isinstance(n, exp.Lateral):
            raise UnsupportedSQLError(f"LATERAL {snippet(n)}", "not compiled")
        if isinstance(n, exp.With) and n.args.get("recursive"):
            raise UnsupportedSQLError(f"WITH RECURSIVE {snippet(n)}",
                                      "recursive queries are not compiled")
        if n is not tree and isinstance(n, exp.Select | exp.SetOperation):
            for arg, what in (("order", "ORDER BY"), ("limit", "LIMIT"),
                              ("offset", "OFFSET")):
                if n.args.get(arg) is not None:
                    raise UnsupportedSQLError(
                        f"{what} inside a subquery or CTE {snippet(n)}",
                        f"{what} is only compiled at the end of the whole query (it is "
                        "applied when the materialized result is read); inside a query it "
                        "would make the rows kept depend on rows outside them")
    for arg in ("offset",):
        if tree.args.get(arg) is not None:
            raise UnsupportedSQLError(f"OFFSET {snippet(tree.args[arg])}",
                                      "OFFSET is not compiled (only a final LIMIT)")


def _known_tables(tree: exp.Expr, specs: Mapping[str, SourceSpec]) -> None:
    """Every table read is a source or a CTE (else qualify would blame a column)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for t in tree.find_all(exp.Table):
        if t.name.lower() not in specs and t.name.lower() not in ctes:
            raise SQLError(f"table {snippet(t)} is neither a CTE nor a source (sources: "
                           f"{sorted(s.name for s in specs.values())}); pass it in `sources`")


def _correlated(tree: exp.Expr) -> None:
    """Refuse derived tables and set-operation branches that read an enclosing query.

    (After qualify.)  A subquery in an expression that does is decorrelated when it is
    compiled (:mod:`planner._sqlsubquery`), which refuses what it cannot decorrelate.
    """
    from sqlglot.optimizer.scope import traverse_scope

    for scope in traverse_scope(tree):
        if scope.external_columns and not scope.is_subquery:  # those are decorrelated
            cols = sorted({snippet(c) for c in scope.external_columns})
            raise UnsupportedSQLError(
                f"correlated subquery {snippet(scope.expression)} (it reads {', '.join(cols)} "
                "of the enclosing query)",
                "a subquery that depends on the row of another query is not maintained "
                "incrementally; rewrite it as a join")


# ---- names of the answer's columns ----------------------------------------------------


def _first_select(node: exp.Expr) -> exp.Select | None:
    while isinstance(node, exp.SetOperation | exp.Subquery):
        node = node.this
    return node if isinstance(node, exp.Select) else None


def _display_names(raw: exp.Expr, qualified: exp.Expr, specs: Mapping[str, SourceSpec]
                   ) -> list[str]:
    """The answer's column names as DuckDB shows them.

    Aliases as written, source columns in their schema's case, other expressions as
    their SQL text.
    """
    qsel = _first_select(qualified)
    rsel = _first_select(raw)
    assert qsel is not None
    real = {c.lower(): c for s in specs.values() for c in s.schema.names}
    names = []
    raw_items = list(rsel.expressions) if rsel is not None else []
    aligned = len(raw_items) == len(qsel.expressions) and not any(
        isinstance(r, exp.Star) or (isinstance(r, exp.Column) and isinstance(r.this, exp.Star))
        for r in raw_items)
    for i, q in enumerate(qsel.expressions):
        r = raw_items[i] if aligned else None
        if isinstance(r, exp.Alias):
            names.append(r.alias)
        elif isinstance(r, exp.Column) or (r is None and isinstance(q, exp.Alias)
                                           and isinstance(q.this, exp.Column)):
            name = r.name if r is not None else q.alias_or_name
            names.append(real.get(name.lower(), name))
        elif r is not None:
            if isinstance(r, exp.Count) and isinstance(r.this, exp.Star):
                names.append("count_star()")
            else:
                names.append(r.sql(dialect=DIALECT, normalize_functions="lower"))
        else:
            names.append(q.alias_or_name)
    taken: set[str] = set()
    out = []
    for n in names:
        base, k, name = n, 1, n
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        out.append(name)
    return out


# ---- entry points ---------------------------------------------------------------------


def _parse(sql: str) -> exp.Expr:
    if not isinstance(sql, str):
        raise SQLError(f"sql must be a string, got {type(sql).__name__}")
    try:
        trees = sqlglot.parse(sql, read=DIALECT)
    except SqlglotError as exc:  # a ParseError, or a TokenError (an unclosed quote)
        raise SQLError(f"the SQL does not parse as DuckDB's dialect: {parse_error(exc)}"
                       ) from exc
    # Comments after the last semicolon parse as a statement of their own that holds
    # nothing but them (exp.Semicolon): not a second query.
    found = [t for t in trees if t is not None and not isinstance(t, exp.Semicolon)]
    if len(found) != 1:
        raise SQLError(f"expected one SQL statement, got {len(found)}")
    return found[0]


def _normalise(raw: exp.Expr, specs: Mapping[str, SourceSpec]) -> exp.Expr:
    schema = MappingSchema(
        {s.name: {f.name: _sql_type(f.type) for f in s.schema} for s in specs.values()},
        dialect=DIALECT)
    try:
        q = qualify(raw.copy(), dialect=DIALECT, schema=schema,
                    validate_qualify_columns=True, quote_identifiers=True)
    except OptimizeError as exc:
        ambiguous = ambiguous_column(raw, schema, DIALECT)
        raise SQLError(ambiguous or f"{plain(str(exc))} (sources: "
                       f"{sorted(s.name for s in specs.values())})") from exc
    _correlated(q)
    try:
        q = normalize(q)
        _factor_disjunctions(q)
        q = eliminate_subqueries(q)
    except SqlglotError as exc:
        raise SQLError(f"sqlglot could not normalise the query: {exc}") from exc
    return q


def _factor_disjunctions(tree: exp.Expr) -> None:
    """Add the conjuncts every branch of a WHERE disjunction shares as conjuncts of their own.

    ``(a AND b) OR (a AND c)`` implies ``a``: adding ``a`` beside the disjunction changes no
    answer, and an equality ``a`` becomes a join key instead of leaving the join a cross
    product filtered afterwards (TPC-DS q13 and q48 repeat their join predicates in every
    branch).  sqlglot's ``normalize`` finds the same factors, but gives up on large
    conditions (its distance limit), which is where they matter.
    """
    for where in list(tree.find_all(exp.Where)):
        parts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
        extra: list[exp.Expr] = []
        have = {p.sql() for p in parts}
        for part in parts:
            inner = part.unnest() if isinstance(part, exp.Paren) else part
            if not isinstance(inner, exp.Or):
                continue
            branches = [b.unnest() for b in inner.flatten()]
            sets = []
            for b in branches:
                conj = list(b.flatten()) if isinstance(b, exp.And) else [b]
                sets.append({c.unnest().sql(): c.unnest() for c in conj})
            common = set(sets[0]).intersection(*sets[1:])
            for key in sorted(common - have):
                extra.append(sets[0][key].copy())
                have.add(key)
        if extra:
            where.set("this", exp.and_(where.this, *extra))


def define(sql: str, sources: Mapping[str, Any], *, name: str = "result",
           materialize: bool = True, stats: Mapping[str, Any] | None = None,
           join_orders: Sequence[Sequence[str]] = (), join_rule: str = JOIN_RULE,
           peels: Sequence[int] | None = None) -> tuple[joinstate.Graph, SQLPlan]:
    """``sql`` as a graph: one source per table read, one output ``name``; and its plan.

    ``materialize=True`` declares the output materialized with the final ORDER BY and
    LIMIT, so a pipeline's ``read(name)`` returns the current answer; with ``False`` (a
    stream of changes, as Spark ships it) a final ORDER BY or LIMIT is refused.
    ``stats`` maps a source name to its row count, to an object with a ``rows``
    attribute (``planner.stats.SourceStats``), or to its data (a ``pyarrow.Table``:
    its row count, and a sample on which the join-order rule estimates the share of
    rows each filter keeps, so the most selective dimension is joined first).
    ``join_orders``: orders to keep for the inner join groups, in the order the
    compiler meets them (:attr:`SQLPlan.join_orders` of an earlier plan); a group whose
    inputs differ from the one recorded is planned afresh.  ``join_rule``: the
    join-order rule the groups are planned with
    (:data:`planner.rules.join_order.JOIN_RULES`: today's, or an earlier one, as states
    recorded without their join orders were built).  ``peels``: the joins peeled off
    each GROUP BY over joins (:attr:`SQLPlan.peels` of an earlier plan, kept; ``()``
    peels none, as states made before eager aggregation); None decides from the
    estimates.  Needs no store: :func:`compile` attaches the graph to one.
    """
    if join_rule not in JOIN_RULES:
        raise SQLError(f"join_rule={join_rule!r}: give one of {', '.join(JOIN_RULES)}")
    specs = _specs(sources, stats)
    raw = _parse(sql)
    if stats is not None:  # samples of the sources the SQL reads, for the join order
        read = {t.name.lower() for t in raw.find_all(exp.Table)}
        specs = {k: dataclasses.replace(v, sample=_sample(stats[v.name]),
                                        sampled_from=_sampled_from(stats[v.name], v.rows))
                 if k in read and v.name in stats else v for k, v in specs.items()}
    explicit = frozenset(a.name.lower() for a in raw.find_all(exp.TableAlias) if a.name)
    with quoting(explicit):
        return _define(raw, specs, name=name, materialize=materialize,
                       join_orders=tuple(tuple(o) for o in join_orders),
                       join_rule=join_rule,
                       peels=None if peels is None else tuple(int(k) for k in peels))


def _define(raw: exp.Expr, specs: Mapping[str, SourceSpec], *,
            name: str, materialize: bool, join_orders: tuple[tuple[str, ...], ...] = (),
            join_rule: str = JOIN_RULE, peels: tuple[int, ...] | None = None
            ) -> tuple[joinstate.Graph, SQLPlan]:
    _precheck(raw)
    _known_tables(raw, specs)
    root = _normalise(raw, specs)
    order = root.args.get("order")
    limit_node = root.args.get("limit")
    limit = _limit(limit_node)
    if not materialize and (order is not None or limit is not None):
        what = snippet(cast("exp.Expr", order if order is not None else limit_node))
        raise UnsupportedSQLError(
            f"final ORDER BY/LIMIT {what}", "an output that is not materialized is a stream "
            "of change sets, which have no order and no first rows; drop them or "
            "materialize the output")
    body = root.copy()
    body.set("order", None)
    body.set("limit", None)
    display = _display_names(raw, root, specs)
    order, hidden = hidden_order(order, body, display) if materialize else (order, [])
    qc = QueryCompiler(specs, recorded_orders=join_orders,
                       _rule=JoinOrder(rule=join_rule), recorded_peels=peels)
    rel = qc.query(body, names=[*display, *hidden])
    sel = _first_select(body) if isinstance(root, exp.Select) else None
    items = output_order(order, list(sel.expressions) if sel is not None else None,
                         rel.columns)
    order_by: list[Any] = []
    for o in items:
        direction = "descending" if o.descending else "ascending"
        order_by.append((o.column, direction, "at_start") if o.nulls_first
                        else (o.column, direction))
    try:
        if materialize:
            graph = joinstate.Graph().output(name, rel.stream, materialize=True,
                                             order_by=order_by or None, limit=limit,
                                             hide=hidden)
        else:
            graph = joinstate.Graph().output(name, rel.stream)
    except SchemaMismatchError as exc:
        if any(len(o) == 3 for o in order_by):
            raise UnsupportedSQLError(
                f"ORDER BY ... NULLS FIRST {snippet(cast('exp.Expr', order))}",
                "this joinstate version sorts a materialized output with NULLs last only "
                f"({exc})") from exc
        raise SQLError(f"output {name!r}: {exc}") from exc
    return graph, SQLPlan(
        output=name, columns=tuple(c for _, c in rel.columns if c not in hidden),
        order_by=tuple(items),
        limit=limit, sources=tuple(qc.streams), decisions=tuple(qc.decisions),
        qualified_sql=root.sql(dialect=DIALECT, pretty=True), materialized=materialize,
        join_orders=tuple(qc.join_orders), peels=tuple(qc.peels))


def _limit(node: exp.Expr | None) -> int | None:
    if node is None:
        return None
    count = node.args.get("count") if isinstance(node, exp.Fetch) else node.expression
    if isinstance(count, exp.Literal) and not count.is_string and count.this.isdigit():
        return int(count.this)
    raise UnsupportedSQLError(f"LIMIT {snippet(node)}", "only a constant row count is "
                              "compiled")


def compile(sql: str, sources: Mapping[str, Any], *, store: joinstate.StateStore,
            name: str = "result", share_indexes: bool = True,
            stats: Mapping[str, Any] | None = None,
            metadata: Mapping[str, Any] | None = None) -> joinstate.Pipeline:
    """A pipeline named ``name`` in ``store`` that maintains ``sql``'s answer.

    ``sources``: source name -> ``pyarrow.Schema`` or :class:`Source` (schema and unique
    key); only the sources the SQL reads become pipeline sources.  The pipeline has one
    materialized output, ``name``: ``push`` returns its change set and ``read(name)``
    the current answer with the final ORDER BY and LIMIT applied.  Raises
    :class:`UnsupportedSQLError` (quoting the construct) for SQL outside the incremental
    subset and :class:`SQLError` for SQL that is wrong (unknown table or column, a type
    error).  See :func:`plan` for the decisions taken.

    The definition is fixed in ``store`` here, not at the first push: if the store holds
    another pipeline under ``name``, :class:`joinstate.JoinSpecMismatchError` quotes the
    SQL it was compiled from (kept in the store beside its definition) and nothing is
    written; the same SQL (or SQL compiling to the same pipeline) re-attaches.

    The SQL, the sources' schemas and unique keys, ``stats``' row counts, the join
    orders chosen and ``metadata`` (JSON-able, the caller's) are kept with the view, so
    :func:`planner.reopen` can attach it again from the store alone.  ``stats`` may give
    a source's data (see :func:`define`): the join order then follows what its filters
    keep, and compiling the same SQL into the store later keeps that order, whatever
    ``stats`` are given then (the stored state is laid out in it).
    """
    before = stored_view(store, name)
    same = before is not None and before.sql == sql
    kept = before.join_orders if before is not None and same else ()
    old = same and not kept
    if old:  # recorded before join orders were: planned as then, from counts, by rows
        stats = counts_only(stats)
    graph, sql_plan = define(sql, sources, name=name, stats=stats, join_orders=kept,
                             join_rule="rows" if old else JOIN_RULE,
                             peels=before.peels if before is not None and same else None)
    p = joinstate.Pipeline(store, name, graph, share_indexes=share_indexes)
    specs = _specs(sources, stats)
    record = ViewRecord(
        sql, {s.name: (s.schema, s.unique_key) for s in specs.values()},
        {s.name: s.rows for s in specs.values() if s.rows is not None}, dict(metadata or {}),
        {s.name: s.also_unique for s in specs.values() if s.also_unique},
        sql_plan.join_orders, sql_plan.peels)
    _attach(p, record, store)
    return p


def _attach(p: joinstate.Pipeline, record: ViewRecord, store: joinstate.StateStore) -> None:
    """Fix ``p``'s definition in ``store`` now, and keep the SQL it was compiled from.

    A store that already holds another pipeline under the name is refused here, not at
    the first push, and in the terms the person wrote: the view the store maintains, as
    SQL.  The SQL is kept beside the definition with a digest of the stored definition,
    so a record left by a pipeline that was dropped and built again another way is
    never quoted for it.
    """
    key = pipeline_spec_key(p.name)
    try:
        p.compile()
    except joinstate.JoinSpecMismatchError as exc:
        stored = store.meta_get(key)
        if stored is None:  # not a conflict: e.g. a read-only store without the pipeline
            raise
        view = _stored_sql(store, p.name, stored)
        remedy = (f"drop it with store.drop_pipeline({p.name!r}) or compile this SQL under "
                  "another name")
        if view is None:
            msg = (f"{exc}; it was not compiled from SQL (or was compiled by an earlier "
                   f"version): {remedy}")
        else:
            msg = (f"pipeline {p.name!r} in {store.path} maintains a different view: "
                   f"{snippet(view)}; this SQL compiles to another pipeline; {remedy}")
        raise joinstate.JoinSpecMismatchError(msg) from exc
    if store.read_only:
        return
    if store.meta_get(key) is not None and stored_view(store, p.name) is None:
        record_view(store, p.name, record)


def _stored_sql(store: joinstate.StateStore, name: str, definition: bytes) -> str | None:
    """The SQL recorded for pipeline ``name``'s stored ``definition``, if any."""
    raw = store.meta_get(view_sql_key(name))
    record = None if raw is None else ViewRecord.from_json(raw, definition)
    return None if record is None else record.sql


def plan(sql: str, sources: Mapping[str, Any], *, name: str = "result",
         stats: Mapping[str, Any] | None = None) -> SQLPlan:
    """What :func:`compile` would build, without a store (for ``explain``)."""
    return define(sql, sources, name=name, stats=stats)[1]


def reopen(store: joinstate.StateStore, name: str, *,
           share_indexes: bool = True) -> joinstate.Pipeline:
    """The SQL view ``name`` of ``store``, compiled again from its record.

    Raises :class:`joinstate.JoinSpecMismatchError` when the store holds no such view,
    when it was built in Python (no record), or when the record no longer compiles to
    the stored definition.
    """
    record = stored_view(store, name)
    if record is None or not record.sources:
        known = stored_names(store)
        if name not in known:
            what = f"no pipeline {name!r} (pipelines: {', '.join(known) or 'none'})"
        else:
            what = (f"pipeline {name!r} was not compiled from SQL by this joinstate version "
                    "(no record of its sources)")
        raise joinstate.JoinSpecMismatchError(
            f"{store.path} holds {what}; compile the SQL with planner.compile(sql, sources, "
            "store=...) to create it")
    sources = {n: Source(s, unique_key=uk, also_unique=record.also_unique.get(n, ()))
               for n, (s, uk) in record.sources.items()}
    return compile(record.sql, sources, store=store, name=name,
                   stats=dict(record.rows) or None, share_indexes=share_indexes)
