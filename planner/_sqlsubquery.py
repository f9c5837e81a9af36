"""Subqueries in WHERE, HAVING and SELECT lists, decorrelated into joins.

A subquery reads the row of the query it sits in (it is *correlated*) through its WHERE
conjuncts: ``inner = outer`` equalities (the correlation key) and, in ``EXISTS``, one
comparison.  Decorrelating cuts them out (:mod:`planner._sqlcorrelation`): the subquery
without them is an ordinary query whose rows carry the inner sides as key columns,
joined back to the enclosing rows on the key, through the one join operator.  A
conjunct that names an enclosing expression already equated to an inner one (q41
repeats ``i_manufact = i1.i_manufact`` inside an OR) reads the inner one instead, when
the two have one type.  An uncorrelated subquery has an empty key: it is joined on a
constant key column added to both sides (a cross join; its right side is a single row
for a scalar).

The rules, with SQL's NULLs (DuckDB's answers):

* ``EXISTS (S)`` as a WHERE conjunct: a ``left_semi`` join on the key; ``NOT EXISTS``:
  ``left_anti``.  A NULL key never equals anything, so its row has no partner: EXISTS is
  false (the semi join drops it), NOT EXISTS true (the anti join keeps it).  One
  correlated comparison ``inner op outer`` (q16, q94: ``ws1.wh <> ws2.wh``) is decided by
  the key's extreme inner values: some ``w <> o`` iff ``min(w) <> o or max(w) <> o``,
  some ``w < o`` iff ``min(w) < o`` (and so on), over non-NULL ``w``, false when ``o`` is
  NULL: a group-by on the key with MIN and MAX, left-joined.
* ``x IN (S)`` as a conjunct: a semi join on the key and ``x = y``.  ``x NOT IN (S)``:
  the anti join, then SQL's NULL rule: a row stays iff S has no row for its key, or
  ``x`` is not NULL and S has no NULL ``y`` for the key (any NULL ``y`` makes NOT IN
  unknown for every row of its key; an empty S makes it true, for a NULL ``x`` too).
* Elsewhere (under OR, NOT, CASE, in a SELECT list or HAVING) EXISTS and IN are *marks*:
  a mark join, made of the one join rule's semi join (rows with a partner, marked
  TRUE) unioned with its anti join on the same keys (the others, FALSE).  Both read
  S's per-key degree, so a change to S moves rows only where a key's degree crosses
  zero.  An IN mark is three-valued where its NULL can matter (under NOT, in a value):
  NULL when unmatched, S has rows for the key and ``x`` is NULL or S has a NULL ``y``
  (two more marks say so); under AND/OR only, NULL and FALSE both drop the row, so the
  two-valued mark is used.  The same marks give NOT IN's rule above.
* A scalar subquery is one value per enclosing row.  Uncorrelated: its query, which must
  give at most one row; a global aggregate (``SELECT avg(...) FROM ...``) always has its
  one row, anything else is counted (a global group-by keeping ``count(*)`` and
  ``min(value)``) and a *check* (:meth:`joinstate.Stream.check`) refuses a push that
  would give it two rows: DuckDB raises "more than one row returned by a subquery", the
  pipeline raises :class:`joinstate.CheckViolationError` and applies nothing of that
  push.  No row: the value is NULL.  ``outer = (S)`` as a conjunct joins on the value
  itself (no constant key: a changed value touches only the rows equal to it).
  Correlated, an aggregate ``SELECT f(...) FROM ... WHERE inner = outer``: a group-by on
  the key; an enclosing row whose key has no group gets the aggregate over no rows
  (``count`` 0, the others NULL), so the join is a left join with that value filled in,
  or an inner join when the value over no rows is NULL and the conjunct drops a NULL
  (``x > (S)``).  Correlated without an aggregate: per key at most one row, counted and
  checked as above.  Uncorrelated aggregates over one table (q9 has fifteen) are
  computed by one global aggregate, each WHERE becoming its aggregates' FILTER
  (:meth:`Subqueries.fuse`), and joined once.

How the correlated key columns are found is sqlglot's scope analysis
(``build_scope(...).external_columns``, which knows which alias a column resolves to).
Its own ``unnest_subqueries`` rewrite is not used: it turns EXISTS into a LEFT JOIN
filtered on NOT NULL and non-equality correlations into ARRAY_AGG/ARRAY_ANY, which
have no incremental counterpart here; the rules above keep to semi/anti joins and
group-bys the join rule and the aggregate state maintain.

Subqueries correlated with a query further out than the one they sit in, correlated set
operations, correlated HAVING or GROUP BY in the subquery, ANY/ALL, and correlations
other than the above are refused with :class:`UnsupportedSQLError` naming them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from planner._sqlcorrelation import (
    Split,
    correlated_aliases,
    decorrelates,
    empty_value,
    external_columns,
    find_subqueries,
    fusable,
    key_text,
    projected,
    query_of,
    rejects_null,
    single_item,
    split_at_correlation,
    sql_text,
    strip,
    with_filter,
)
from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqlexpr import ExprCompiler
from planner._sqlfrom import join_bounds
from planner._sqlscope import AggScope, Bound, BoundScope, find_aggs, unique_name
from planner._sqltypes import Typed, is_float
from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from joinstate import Stream
    from planner._sqlexpr import Scope
    from planner._sqlscope import Rel

__all__ = ["Subqueries", "attach_select", "correlated_aliases", "decorrelates"]

_SQ = "__subquery"
"""The table alias of the columns a decorrelation adds, in the expressions it compiles."""

class QueryCompiling(Protocol):
    """What decorrelation needs of the query compiler (``planner._sqlrel.QueryCompiler``)."""

    def query(self, node: exp.Expr, names: Sequence[str] | None = None) -> Rel: ...

    def outer_aliases(self) -> frozenset[str]: ...

    def record(self, decision: Decision) -> None: ...


def _one_row(stream: Stream) -> bool:
    """Whether ``stream`` always holds exactly one row (a global aggregate, projected)."""
    node: Any = stream.node
    while node.kind in ("project", "check"):
        node = node.inputs[0]
    return bool(node.kind == "agg" and not node.keys)


# ---- scopes over the added columns -------------------------------------------------------


class _Mapped:
    """A scope whose subquery expressions (by identity) and added columns are known."""

    def __init__(self, base: Scope, values: dict[int, Typed],
                 columns: dict[str, Typed] | None = None) -> None:
        self.base = base
        self.values = values
        self.columns = columns or {}

    def column(self, node: exp.Column) -> Typed:
        """An added column (table alias ``__subquery``), else the base scope's."""
        if node.table == _SQ and node.name in self.columns:
            return self.columns[node.name]
        return self.base.column(node)

    def lookup(self, node: exp.Expr) -> Typed | None:
        """A subquery's value or mark, else what the base scope knows."""
        hit = self.values.get(id(node))
        return hit if hit is not None else self.base.lookup(node)


# ---- the compiler ----------------------------------------------------------------------


Target = Bound
"""What subqueries are joined to: a FROM clause's rows, or an aggregate's groups."""


@dataclass
class Subqueries:
    """Compiles the subqueries of one condition or SELECT list (see the module docstring)."""

    qc: QueryCompiling
    scope_of: Callable[[Bound], Scope] | None = None

    def _scope(self, bound: Bound) -> Scope:
        if self.scope_of is not None:
            return self.scope_of(bound)
        return BoundScope(bound, self.qc.outer_aliases())

    # ---- entry points ------------------------------------------------------------------

    def where(self, bound: Bound, node: exp.Expr) -> Bound:
        """``bound`` filtered by the WHERE (or ON) conjunct ``node``."""
        node = strip(node)
        neg = isinstance(node, exp.Not)
        inner = strip(node.this) if neg else node
        if isinstance(inner, exp.Exists):
            return self._semi(bound, node, inner.this, anti=neg)
        if isinstance(inner, exp.In) and inner.args.get("query") is not None and \
                not find_subqueries(inner.this):
            if neg != bool(inner.args.get("negate")):
                return self._not_in(bound, node, inner)
            return self._semi(bound, node, query_of(inner), anti=False, value=inner.this)
        if isinstance(node, exp.EQ):
            for sub, other in ((node.left, node.right), (node.right, node.left)):
                if isinstance(strip(sub), exp.Subquery) and not find_subqueries(other):
                    joined = self._equal(bound, node, strip(sub), other)
                    if joined is not None:
                        return joined
        target, fused = self.fuse(bound, [node])
        target, values = self.attach(target, node, condition=True, done=fused)
        pred = ExprCompiler(_Mapped(self._scope(target), values)).predicate(node)
        return self._filtered(bound, target, target.stream.filter(pred.expr))

    def attach(self, target: Target, root: exp.Expr, *, condition: bool,
               done: dict[int, Typed] | None = None) -> tuple[Target, dict[int, Typed]]:
        """Every subquery of ``root`` joined to ``target``; their values by node identity.

        ``condition``: ``root`` is a WHERE/HAVING condition (a NULL drops the row), not a
        value.  ``done``: values already joined (:meth:`fuse`), kept as they are.
        """
        values: dict[int, Typed] = dict(done or {})
        for q, path in find_subqueries(root):
            if id(q) in values:
                continue
            plain = condition and all(isinstance(p, exp.And | exp.Or | exp.Paren)
                                      for p in path)
            if isinstance(q, exp.Exists):
                target, values[id(q)] = self._mark(target, q, q.this)
            elif isinstance(q, exp.In):
                if plain and not q.args.get("negate"):
                    target, values[id(q)] = self._mark(target, q, query_of(q), value=q.this)
                else:
                    target, mark = self._mark3(target, q)
                    if q.args.get("negate"):
                        mark = Typed(pc.invert(mark.expr), pa.bool_())
                    values[id(q)] = mark
                    parent = q.parent
                    while isinstance(parent, exp.Paren):
                        parent = parent.parent
                    if isinstance(parent, exp.Not):  # NOT IN: the compiler refuses it
                        values[id(parent)] = Typed(pc.invert(mark.expr), pa.bool_())
            else:
                rejects = condition and rejects_null(path, q)
                target, values[id(q)] = self._scalar(target, q, rejects=rejects)
        return target, values

    def fuse(self, target: Target, roots: Sequence[exp.Expr]
             ) -> tuple[Target, dict[int, Typed]]:
        """Uncorrelated scalar aggregates over one table, computed by one aggregate.

        ``(SELECT avg(x) FROM t WHERE p)`` and ``(SELECT count(*) FROM t WHERE q)`` (q9
        has fifteen) are the one row of ``SELECT avg(x) FILTER (WHERE p), count(*) FILTER
        (WHERE q) FROM t``: one global aggregate and one constant-key join instead of one
        of each per subquery, the same values (a FILTER skips the rows as the WHERE did).
        """
        groups: dict[str, list[tuple[exp.Expr, exp.Select, exp.Expr]]] = {}
        for root in roots:
            for q, _ in find_subqueries(root):
                sel = query_of(q) if isinstance(q, exp.Subquery) else None
                if not isinstance(sel, exp.Select):
                    continue
                value = fusable(sel)
                if value is not None:
                    groups.setdefault(sel.args["from_"].sql(), []).append((q, sel, value))
        values: dict[int, Typed] = {}
        for group in groups.values():
            if len(group) < 2:
                continue
            items = []
            for i, (_, sel, value) in enumerate(group):
                where = sel.args.get("where")
                cond = where.this if where is not None else None
                items.append(exp.alias_(with_filter(value, cond), f"__f{i}",
                                        quoted=True))
            first = group[0][1]
            fused = exp.select(*items).from_(first.args["from_"].copy())
            rel = self.qc.query(fused)
            target, rmap = self._join(target, rel.stream, [], "inner", "scalar subqueries")
            for (q, _, _), (_, col) in zip(group, rel.columns, strict=True):
                values[id(q)] = Typed(pc.field(rmap[col]), rel.stream.schema.field(col).type)
                self._decide(q, "fused one-row relation", f"uncorrelated scalar subquery "
                             f"over {first.args['from_'].this.name}, with {len(group) - 1} "
                             "more over it: one global aggregate computes them all (each "
                             "WHERE as its aggregates' FILTER), joined on a constant key")
        return target, values

    # ---- helpers ---------------------------------------------------------------------

    @staticmethod
    def _filtered(bound: Bound, target: Bound, stream: Stream) -> Bound:
        """``stream`` with ``bound``'s SQL names (joins here keep the left rows' count)."""
        return Bound(stream, target.refs, bound.aliases, bound.label, bound.source,
                     bound.unique, True)

    def _compile(self, target: Target, node: exp.Expr,
                 columns: dict[str, Typed] | None = None) -> Typed:
        return ExprCompiler(_Mapped(self._scope(target), {}, columns)).compile(node)

    def _keyed(self, target: Target, right: Stream,
               pairs: Sequence[tuple[exp.Expr | Typed, str]]
               ) -> tuple[Bound, Stream, list[tuple[str, str]]]:
        """Both sides with their key columns: (enclosing expression, right column) pairs.

        No pair: a constant key column on both sides (a cross join).
        """
        left = target
        cols: list[tuple[str, str]] = []
        for e, rc in pairs:
            v = e if isinstance(e, Typed) else self._compile(left, e)
            left, lc = _column(left, v, "__sqk")
            cols.append((lc, rc))
        if not cols:
            one = pc.scalar(pa.scalar(1, pa.int32()))
            lc = unique_name("__sqc", set(left.stream.columns))
            rc = unique_name("__sqc", set(right.columns))
            left = Bound(left.stream.with_columns({lc: one}), left.refs, left.aliases,
                         left.label, left.source, left.unique, left.filtered)
            right = right.with_columns({rc: one})
            cols.append((lc, rc))
        return left, right, cols

    @staticmethod
    def _joined(target: Target, left: Bound, right: Stream, cols: list[tuple[str, str]],
                how: str, label: str) -> tuple[Target, dict[str, str]]:
        out, _, rmap = join_bounds(left, Bound(right, {}, (_SQ,), label), cols, how)
        return Bound(out.stream, out.refs, target.aliases, target.label, target.source,
                     target.unique, True), rmap

    def _join(self, target: Target, right: Stream,
              pairs: Sequence[tuple[exp.Expr | Typed, str]], how: str, label: str
              ) -> tuple[Target, dict[str, str]]:
        """``target`` joined with ``right`` on (enclosing expression, right column) pairs.

        Returns the target's rows with the right columns added (none for semi and anti
        joins) and the right columns' names in it.
        """
        left, right, cols = self._keyed(target, right, pairs)
        return self._joined(target, left, right, cols, how, label)

    def _presence(self, target: Target, right: Stream,
                  pairs: Sequence[tuple[exp.Expr | Typed, str]], label: str
                  ) -> tuple[Target, Typed]:
        """Whether each row of ``target`` has a partner in ``right``: a mark join.

        A semi join (the rows with a partner, marked TRUE) and an anti join on the same
        keys (the others, FALSE), unioned: every row once.  Both read ``right``'s per-key
        degree, so a change to ``right`` moves rows only where a key's degree crosses
        zero; the two share both inputs' indexes.
        """
        left, right, cols = self._keyed(target, right, pairs)
        yes, _ = self._joined(target, left, right, cols, "left_semi", label)
        no, _ = self._joined(target, left, right, cols, "left_anti", label)
        m = unique_name("__mark", set(left.stream.columns))
        stream = yes.stream.with_columns({m: pc.scalar(True)}).union_all(
            no.stream.with_columns({m: pc.scalar(False)}))
        return Bound(stream, yes.refs, target.aliases, target.label, target.source,
                     target.unique, True), Typed(pc.field(m), pa.bool_())

    def _decide(self, node: exp.Expr, choice: str, reason: str) -> None:
        self.qc.record(Decision(topic="subquery", subject=snippet(node), choice=choice,
                                reason=reason, rule="sql"))

    def _keys(self, split: Split, rel: Rel, target: Target, first: int = 0
              ) -> list[tuple[Typed, str]]:
        """(enclosing key, subquery key column) pairs; substituted keys must share a type."""
        pairs = []
        for k, o in enumerate(split.outer):
            col = rel.columns[first + k][1]
            v = self._compile(target, o)
            t = rel.stream.schema.field(col).type
            if k in split.check and not v.type.equals(t):
                raise UnsupportedSQLError(
                    f"correlated condition {sql_text(split.inner[k])} = {sql_text(o)}",
                    f"the two sides have different types ({t} and {v.type}) and the "
                    f"subquery reads {sql_text(o)} elsewhere too; cast one side so both "
                    "have one type")
            pairs.append((v, col))
        return pairs

    # ---- EXISTS, IN, NOT IN as conjuncts ---------------------------------------------

    def _exists_select(self, query: exp.Expr, split: Split, node: exp.Expr
                       ) -> exp.Expr | None:
        """The query whose rows say EXISTS, keyed; None if it always has a row."""
        sel = split.select
        if isinstance(sel, exp.Select):
            having = sel.args.get("having") is not None
            grouped = sel.args.get("group") is not None
            aggregates = any(find_aggs(p) for p in sel.expressions)
            if aggregates and not grouped and not having:
                self._decide(node, "true", "an aggregate without GROUP BY has its row "
                             "even over no rows: EXISTS holds for every row")
                return None
            if not having:
                items = [(e, f"__k{k}") for k, e in enumerate(split.inner)] or [
                    (exp.Literal.number(1), "__k0")]
                out = projected(split, items)
                out.set("distinct", None)
                out.set("group", None)
                return out
        if split.correlated:
            raise UnsupportedSQLError(f"correlated subquery {snippet(query)}", "a HAVING "
                                      "in a correlated EXISTS subquery is not decorrelated")
        return exp.select(exp.alias_(exp.Literal.number(1), "__k0", quoted=True)).from_(
            exp.Subquery(this=query.copy(), alias=exp.TableAlias(
                this=exp.to_identifier("__exists", quoted=True))))

    def _semi(self, bound: Bound, node: exp.Expr, query: exp.Expr, *, anti: bool,
              value: exp.Expr | None = None) -> Bound:
        """EXISTS / NOT EXISTS / IN as a conjunct: a semi or anti join on the key."""
        split = split_at_correlation(query, bound.aliases, allow_compare=value is None)
        if split.compare is not None:
            target, mark = self._exists_compare(bound, node, split)
            pred = mark.expr if not anti else pc.invert(mark.expr)
            return self._filtered(bound, target, target.stream.filter(pred))
        how = "left_anti" if anti else "left_semi"
        if value is not None:
            if split.correlated:
                y = single_item(split.select, node)
                if isinstance(split.select, exp.Select) and (
                        split.select.args.get("group") is not None
                        or split.select.args.get("having") is not None
                        or find_aggs(y)):
                    raise UnsupportedSQLError(f"correlated IN subquery {snippet(node)}",
                                              "a correlated IN over an aggregate is not "
                                              "decorrelated")
                sel = projected(split, [(e, f"__k{k}") for k, e in enumerate(split.inner)]
                                 + [(y, "__y")])
                rel = self.qc.query(sel)
                pairs: list[tuple[exp.Expr | Typed, str]] = [
                    *self._keys(split, rel, bound), (value, rel.columns[-1][1])]
            else:
                rel = self.qc.query(query)
                _one_column(rel, node)
                pairs = [(value, rel.columns[0][1])]
            target, _ = self._join(bound, rel.stream, pairs, how, "IN subquery")
            self._decide(node, how, f"IN: a semi join on {key_text(split, value)}; a NULL "
                         "on either side has no partner (IN is not true)")
            return self._filtered(bound, target, target.stream)
        exists = self._exists_select(query, split, node)
        if exists is None:
            if not anti:
                return bound
            return self._filtered(bound, bound, bound.stream.filter(pc.scalar(False)))
        rel = self.qc.query(exists)
        pairs = list(self._keys(split, rel, bound))
        target, _ = self._join(bound, rel.stream, pairs, how, "EXISTS subquery")
        kind = "NOT EXISTS" if anti else "EXISTS"
        self._decide(node, how, f"{kind}: a{'n anti' if anti else ' semi'} join on "
                     f"{key_text(split, None)}; a row whose key is NULL has no partner "
                     f"({kind} is {'true' if anti else 'false'})")
        return self._filtered(bound, target, target.stream)

    def _not_in(self, bound: Bound, node: exp.Expr, in_: exp.In) -> Bound:
        """``x NOT IN (S)``: an anti join, then SQL's NULL rule from S's rows per key."""
        query = query_of(in_)
        split = split_at_correlation(query, bound.aliases, allow_compare=False)
        rel, pairs = self._in_rel(bound, node, query, split)
        x = self._compile(bound, in_.this)
        y = rel.columns[-1][1]
        target, _ = self._join(bound, rel.stream, [*pairs, (x, y)], "left_anti",
                               "NOT IN subquery")
        target, rows = self._presence(target, rel.stream, pairs, "NOT IN: S has rows")
        nulls = rel.stream.filter(pc.is_null(pc.field(y)))
        target, null = self._presence(target, nulls, pairs, "NOT IN: S has a NULL")
        keep = pc.or_kleene(pc.invert(rows.expr),
                            pc.and_kleene(pc.is_valid(x.expr), pc.invert(null.expr)))
        self._decide(node, "left_anti + marks", "NOT IN: an anti join on "
                     f"{key_text(split, in_.this)}, then mark joins saying whether S has rows, "
                     "and a NULL y, for the key: a row stays iff S has none, or x is not "
                     "NULL and S has no NULL y")
        return self._filtered(bound, target, target.stream.filter(keep))

    def _in_rel(self, target: Target, node: exp.Expr, query: exp.Expr, split: Split
                ) -> tuple[Rel, list[tuple[Typed, str]]]:
        """S's rows as (key columns..., y), and the key pairs; for NOT IN and IN marks."""
        if not split.correlated:
            rel = self.qc.query(query)
            _one_column(rel, node)
            return rel, []
        y = single_item(split.select, node)
        sel = split.select
        if isinstance(sel, exp.Select) and (sel.args.get("group") is not None
                                            or sel.args.get("having") is not None
                                            or find_aggs(y)):
            raise UnsupportedSQLError(f"correlated IN subquery {snippet(node)}",
                                      "a correlated IN over an aggregate is not "
                                      "decorrelated")
        rel = self.qc.query(projected(split, [(e, f"__k{k}") for k, e in enumerate(
            split.inner)] + [(y, "__y")]))
        return rel, self._keys(split, rel, target)

    # ---- marks -------------------------------------------------------------------------

    def _mark(self, target: Target, node: exp.Expr, query: exp.Expr,
              value: exp.Expr | None = None) -> tuple[Target, Typed]:
        """EXISTS or IN (two-valued) as a boolean: a mark join on the key."""
        split = split_at_correlation(query, target.aliases, allow_compare=value is None)
        if split.compare is not None:
            return self._exists_compare(target, node, split)
        if value is not None:
            rel, pairs = self._in_rel(target, node, query, split)
            x = self._compile(target, value)
            keys = [*pairs, (x, rel.columns[-1][1])]
        else:
            sel = self._exists_select(query, split, node)
            if sel is None:
                return target, Typed(pc.scalar(True), pa.bool_())
            rel = self.qc.query(sel)
            keys = list(self._keys(split, rel, target))
        kind = "IN" if value is not None else "EXISTS"
        self._decide(node, "mark", f"{kind} inside an expression: a mark join on "
                     f"{key_text(split, value)} (a semi join marking TRUE unioned with an anti "
                     "join marking FALSE; rows move only when a key's degree in S crosses "
                     "zero)")
        return self._presence(target, rel.stream, keys, f"{kind} mark")

    def _mark3(self, target: Target, node: exp.In) -> tuple[Target, Typed]:
        """``x IN (S)`` with SQL's three values: TRUE, FALSE, or NULL (unknown)."""
        query = query_of(node)
        split = split_at_correlation(query, target.aliases, allow_compare=False)
        rel, pairs = self._in_rel(target, node, query, split)
        x = self._compile(target, node.this)
        y = rel.columns[-1][1]
        target, hit = self._presence(target, rel.stream, [*pairs, (x, y)], "IN mark")
        target, rows = self._presence(target, rel.stream, pairs, "IN: S has rows")
        nulls = rel.stream.filter(pc.is_null(pc.field(y)))
        target, null = self._presence(target, nulls, pairs, "IN: S has a NULL")
        unknown = pc.or_kleene(pc.is_null(x.expr), null.expr)
        none = pc.scalar(pa.scalar(None, pa.bool_()))
        yes, no = pc.scalar(True), pc.scalar(False)
        mark = pc.if_else(hit.expr, yes,
                          pc.if_else(rows.expr, pc.if_else(unknown, none, no), no))
        self._decide(node, "mark (three-valued)", "IN whose NULL matters: mark joins on "
                     f"{key_text(split, node.this)} (TRUE), else NULL if S has rows for the key "
                     "and x is NULL or S has a NULL y, else FALSE")
        return target, Typed(mark, pa.bool_())

    def _exists_compare(self, target: Target, node: exp.Expr, split: Split
                        ) -> tuple[Target, Typed]:
        """EXISTS with one correlated comparison, from the key's MIN and MAX inner value."""
        assert split.compare is not None
        op, inner, outer = split.compare
        sel = projected(split, [(e, f"__k{k}") for k, e in enumerate(split.inner)]
                         + [(inner, "__w")])
        sel.set("distinct", None)
        sel.set("group", None)
        rel = self.qc.query(sel)
        pairs = self._keys(split, rel, target)
        w = rel.columns[-1][1]
        taken = set(rel.stream.columns)
        lo, hi = unique_name("__lo", taken), unique_name("__hi", taken)
        ext = rel.stream.group_by([c for _, c in pairs]).aggregate(
            **{lo: ("min", pc.field(w)), hi: ("max", pc.field(w))})
        how = "left" if pairs else "inner"
        target, rmap = self._join(target, ext, pairs, how, "EXISTS extremes")
        schema = target.stream.schema
        cols = {name: Typed(pc.field(rmap[c]), schema.field(rmap[c]).type)
                for name, c in (("lo", lo), ("hi", hi))}

        def cmp(which: str) -> exp.Expr:
            return op(this=exp.column(which, table=_SQ), expression=outer.copy())

        test = {exp.NEQ: exp.or_(cmp("lo"), cmp("hi")), exp.LT: cmp("lo"),
                exp.LTE: cmp("lo"), exp.GT: cmp("hi"), exp.GTE: cmp("hi")}[op]
        v = ExprCompiler(_Mapped(self._scope(target), {}, cols)).predicate(test)
        sym = {exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}[op]
        self._decide(node, "extremes", f"EXISTS with {sql_text(inner)} {sym} "
                     f"{sql_text(outer)}: per key of {key_text(split, None)} the MIN and MAX of "
                     f"{sql_text(inner)}, left-joined; a partner exists iff an extreme "
                     "passes the comparison (NULLs never do)")
        return target, Typed(pc.coalesce(v.expr, pc.scalar(False)), pa.bool_())

    # ---- scalar subqueries ---------------------------------------------------------------

    def _scalar(self, target: Target, node: exp.Expr, *, rejects: bool,
                equal: exp.Expr | None = None) -> tuple[Target, Typed]:
        """A scalar subquery's value per row of ``target``."""
        query = query_of(node)
        split = split_at_correlation(query, target.aliases, allow_compare=False)
        if not split.correlated:
            rel = self.qc.query(query)
            _one_column(rel, node)
            stream, col = rel.stream, rel.columns[0][1]
            checked = not _one_row(stream)
            if checked:
                stream, col = _at_most_one(stream, col, [], node)
            pairs: list[tuple[exp.Expr | Typed, str]] = [] if equal is None else [
                (equal, col)]
            target, rmap = self._join(target, stream, pairs, "inner", "scalar subquery")
            on = (f"joined on {sql_text(equal)} = its value" if equal is not None
                  else "joined on a constant key (a cross join with one row)")
            how = ("counted and checked to hold at most one row (a second raises)"
                   if checked else "a global aggregate (always one row)")
            self._decide(node, "one-row relation", f"uncorrelated scalar subquery: {how}, "
                         f"{on}")
            t = stream.schema.field(col).type
            return target, Typed(pc.field(rmap[col]), t)
        if not isinstance(split.select, exp.Select):
            raise UnsupportedSQLError(f"correlated subquery {snippet(query)}",
                                      "not decorrelated")
        sel = split.select
        value = single_item(sel, node)
        if sel.args.get("group") is not None or sel.args.get("having") is not None:
            raise UnsupportedSQLError(f"correlated scalar subquery {snippet(query)}",
                                      "a GROUP BY or HAVING in a correlated scalar subquery "
                                      "is not decorrelated")
        keys = [(e, f"__k{k}") for k, e in enumerate(split.inner)]
        if find_aggs(value):
            empty = empty_value(value)
            proj = projected(split, [(value, "__v"), *keys,
                                      (exp.true(), "__m")])
            proj.set("group", exp.Group(expressions=[e.copy() for e in split.inner]))
            rel = self.qc.query(proj)
            vcol, mcol = rel.columns[0][1], rel.columns[-1][1]
            stream = rel.stream
            kpairs = self._keys(split, rel, target, first=1)
            checked = False
        else:
            empty = None
            rel = self.qc.query(projected(split, [(value, "__v"), *keys]))
            stream, vcol = _at_most_one(rel.stream, rel.columns[0][1],
                                        [c for _, c in rel.columns[1:]], node)
            kpairs = self._keys(split, rel, target, first=1)
            mcol = None
            checked = True
        null_empty = empty is None or not empty.is_valid
        if equal is not None and not null_empty:
            msg = "internal: a join on the value of a subquery that has one over no rows"
            raise AssertionError(msg)
        inner_join = null_empty and (rejects or equal is not None)
        pairs2: list[tuple[exp.Expr | Typed, str]] = list(kpairs)
        if equal is not None:
            pairs2.append((equal, vcol))
        target, rmap = self._join(target, stream, pairs2,
                                  "inner" if inner_join else "left", "scalar subquery")
        t = stream.schema.field(vcol).type
        out: Any = pc.field(rmap[vcol])
        if empty is not None and empty.is_valid and mcol is not None and not inner_join:
            fill = pc.scalar(pa.scalar(empty.as_py(), t))
            out = pc.if_else(pc.is_null(pc.field(rmap[mcol])), fill, out)
        what = "an aggregate" if empty is not None or not checked else "a value"
        fill_txt = ("" if empty is None or not empty.is_valid else
                    f", {empty.as_py()} where the key has no rows")
        self._decide(node, f"group-by on the key, {'inner' if inner_join else 'left'} join",
                     f"correlated scalar subquery ({what}): grouped by "
                     f"{', '.join(sql_text(e) for e in split.inner)} and joined on "
                     f"{key_text(split, equal)}"
                     + (" (a missing key's NULL drops the row anyway)" if inner_join
                        else fill_txt)
                     + ("; at most one row per key, checked" if checked else ""))
        return target, Typed(out, t)

    def _equal(self, bound: Bound, node: exp.Expr, sub: exp.Expr, other: exp.Expr
               ) -> Bound | None:
        """``other = (S)`` as a conjunct: a join on the value, when keys can be compared."""
        v = self._compile(bound, other)
        if is_float(v.type):
            return None
        query = query_of(sub)
        sel = query if isinstance(query, exp.Select) else None
        if sel is not None and len(sel.expressions) == 1 and find_aggs(
                sel.expressions[0]) and external_columns(query) and empty_value(
                sel.expressions[0].unalias()).is_valid:
            return None  # the value over no rows is not NULL: a left join and a filter
        target, _ = self._scalar(bound, sub, rejects=True, equal=other)
        return self._filtered(bound, target, target.stream)


# ---- small pieces -----------------------------------------------------------------------


def _column(bound: Bound, v: Typed, base: str) -> tuple[Bound, str]:
    """A stream column holding ``v`` (an existing one if ``v`` is one)."""
    col = next((c for c in bound.stream.columns if v.expr.equals(pc.field(c))), None)
    if col is not None:
        return bound, col
    col = unique_name(base, set(bound.stream.columns))
    return Bound(bound.stream.with_columns({col: v.expr}), bound.refs, bound.aliases,
                 bound.label, bound.source, bound.unique, bound.filtered), col


def _one_column(rel: Rel, node: exp.Expr) -> None:
    if len(rel.columns) != 1:
        raise SQLError(f"{snippet(node)}: the subquery returns {len(rel.columns)} columns, "
                       "it must return one")


def _at_most_one(stream: Stream, col: str, keys: list[str], node: exp.Expr
                 ) -> tuple[Stream, str]:
    """Per key (or overall), the row count and the one value; a second row raises."""
    taken = set(stream.columns)
    n, v = unique_name("__n", taken), unique_name("__v", taken)
    agg = stream.group_by(keys).aggregate(**{n: ("count", None), v: ("min", pc.field(col))})
    where = " for one key of the enclosing row" if keys else ""
    checked = agg.check(pc.less_equal(pc.field(n), pc.scalar(pa.scalar(1, pa.int64()))),
                        f"the scalar subquery {snippet(node)} would return more than one "
                        f"row{where} (SQL raises: more than one row returned by a subquery "
                        "used as an expression); change the data or make the subquery "
                        "return one row (an aggregate, a LIMIT-free unique filter)")
    return checked, v


def attach_select(qc: QueryCompiling, stream: Stream, scope: BoundScope | AggScope,
                  aliases: Sequence[str], having: exp.Expr | None,
                  projections: Sequence[exp.Expr]) -> tuple[Stream, Scope]:
    """The subqueries of a HAVING condition and a SELECT list joined to ``stream``.

    ``scope`` is what names mean there (a FROM clause's rows, or the groups of an
    aggregate); returns the stream with the subqueries' columns and a scope in which
    each subquery is its value (the same ``scope`` when there is none).
    """
    roots = ([(having, True)] if having is not None else []) + [(p, False)
                                                                for p in projections]
    roots = [(r, c) for r, c in roots if find_subqueries(r)]
    if not roots:
        return stream, scope
    scope_of: Callable[[Bound], Scope]
    if isinstance(scope, AggScope):
        keys, aggs = scope.keys, scope.aggs
        target = Bound(stream, {}, tuple(aliases), "the groups")

        def scope_of(b: Bound) -> Scope:
            return AggScope(b.stream, keys, aggs)
    else:
        outer = scope.outer
        target = scope.bound

        def scope_of(b: Bound) -> Scope:
            return BoundScope(b, outer)
    sub = Subqueries(qc, scope_of)
    target, values = sub.fuse(target, [r for r, _ in roots])
    for root, condition in roots:
        target, found = sub.attach(target, root, condition=condition, done=values)
        values.update(found)
    return target.stream, _Mapped(scope_of(target), values)
