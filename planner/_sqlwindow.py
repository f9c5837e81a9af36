"""Window functions in the SQL compiler: ``f(...) OVER (PARTITION BY ... ORDER BY ...)``.

A SELECT list's window functions are compiled after its FROM, WHERE, GROUP BY and
HAVING, over the rows they produce (:func:`compile_windows`): the expressions they
partition, order and aggregate by become columns, the functions with one PARTITION BY
and ORDER BY become one ``joinstate`` window operator (several specifications: operators
one after the other, each adding its columns), and a :class:`WindowScope` resolves each
window call in the projection to its column.  ``SUM(SUM(x)) OVER (PARTITION BY c)`` is
thus an aggregate followed by a window over its groups.

A WHERE conjunct bounding a ranking from the FROM item below (``rk <= 100``, ``rnk <
11``, ``a <= 10 OR b <= 10``) turns that window operator into a maintained top-N
(:func:`top_n`): it then emits only rows within the bound, so a change deep in a
partition costs its recomputation but emits nothing; the filter stays on top.

Compiled: ``ROW_NUMBER``, ``RANK``, ``DENSE_RANK``, ``SUM``, ``AVG``, ``MIN``, ``MAX``,
``COUNT`` (``*`` or a value) with the frames RANGE/ROWS BETWEEN UNBOUNDED PRECEDING AND
CURRENT ROW (the default with ORDER BY is the RANGE one) or the whole partition.
Anything else (LAG/LEAD, NTILE, frames with offsets, named windows, FILTER, DISTINCT) is
refused naming the construct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from joinstate import Stream
from joinstate.nodes import FilterNode, ProjectNode, WindowNode
from planner._sqlerrors import UnsupportedSQLError, snippet
from planner._sqlexpr import ExprCompiler, Scope
from planner._sqlscope import Bound, is_query, unique_name
from planner._sqltypes import Typed
from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from joinstate.nodes import Node

__all__ = ["WindowScope", "compile_windows", "find_windows", "top_n"]

_RANKING: dict[type, str] = {exp.RowNumber: "row_number", exp.Rank: "rank",
                             exp.DenseRank: "dense_rank"}
_AGGREGATES: dict[type, str] = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min",
                                exp.Max: "max", exp.Count: "count"}
_WHY = ("only ROW_NUMBER, RANK, DENSE_RANK and SUM/AVG/MIN/MAX/COUNT over the partition or "
        "from its start to the current row are maintained")


def find_windows(node: exp.Expr) -> list[exp.Window]:
    """The window calls in ``node`` (nested queries excluded)."""
    out: list[exp.Window] = []
    stack: list[exp.Expr] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, exp.Window):
            out.append(n)
            continue
        if n is not node and is_query(n):
            continue
        stack.extend(n.iter_expressions())
    return out[::-1]


class WindowScope:
    """A scope where each compiled window call is a column of the window operators' output."""

    def __init__(self, inner: Scope, windows: dict[str, Typed]) -> None:
        self.inner = inner
        self.windows = windows

    def column(self, node: exp.Column) -> Typed:
        """Columns mean what they meant below the windows."""
        return self.inner.column(node)

    def lookup(self, node: exp.Expr) -> Typed | None:
        """A window call's column, else whatever the inner scope knows."""
        if isinstance(node, exp.Window):
            return self.windows.get(node.sql(dialect="duckdb"))
        return self.inner.lookup(node)


@dataclass
class _Call:
    """One window call: its SQL, output column, function, argument column and frame."""

    sql: str
    name: str
    func: str
    arg: str | None
    frame: str


def compile_windows(stream: Stream, scope: Scope, projections: Sequence[exp.Expr],
                    record: Callable[[Decision], None]) -> tuple[Stream, WindowScope]:
    """The window operators ``projections`` need over ``stream``, and the scope reading them.

    ``scope`` resolves the columns (and aggregates) of ``stream``; the windows'
    partition, order and argument expressions are compiled in it.
    """
    windows = [w for p in projections for w in find_windows(p)]
    compiler = ExprCompiler(scope)
    taken = set(stream.columns)
    computed: dict[str, Any] = {}
    by_text: dict[str, str] = {}

    def column(node: exp.Expr) -> str:
        v = compiler.compile(node)
        found = next((c for c in stream.columns if v.expr.equals(pc.field(c))), None)
        if found is not None:
            return found
        text = str(v.expr)
        if text not in by_text:
            name = unique_name(f"__wx{len(computed)}", taken)
            computed[name] = v.expr
            by_text[text] = name
        return by_text[text]

    specs: dict[tuple[Any, ...], list[_Call]] = {}
    seen: set[str] = set()
    for w in windows:
        sql = w.sql(dialect="duckdb")
        if sql in seen:
            continue
        seen.add(sql)
        func, arg_node = _function(w)
        part = tuple(column(e) for e in w.args.get("partition_by") or [])
        order_node = w.args.get("order")
        order = tuple(
            (column(o.this), "descending" if o.args.get("desc") else "ascending",
             "at_start" if o.args.get("nulls_first") else "at_end")
            for o in (order_node.expressions if order_node is not None else []))
        frame = _frame(w, bool(order))
        arg = column(arg_node) if arg_node is not None else None
        name = unique_name(f"__win{len(seen) - 1}", taken)
        specs.setdefault((part, order), []).append(_Call(sql, name, func, arg, frame))
    if computed:
        stream = stream.with_columns(computed)
    resolved: dict[str, Typed] = {}
    # Rankings last: a WHERE bound on a ranking above this SELECT can only make the
    # topmost window operator a top-N (one above it reads every row of its partitions).
    ranked = sorted(specs.items(), key=lambda kv: any(c.func in _RANKING.values()
                                                     for c in kv[1]))
    for (part, order), calls in ranked:
        funcs: dict[str, Any] = {}
        for c in calls:
            funcs[c.name] = (c.func,) if c.func in _RANKING.values() else (c.func, c.arg, c.frame)
        stream = stream.window(list(part), list(order), **funcs)
        for c in calls:
            resolved[c.sql] = Typed(pc.field(c.name), stream.schema.field(c.name).type)
        record(Decision(
            topic="window", subject=", ".join(c.sql for c in calls),
            choice={"partition_by": list(part), "order_by": [list(o) for o in order],
                    "functions": [c.func for c in calls]},
            reason=("window functions kept by an operator storing its input's rows by "
                    "partition: a change recomputes only the partitions it touches"
                    + ("" if part else "; without PARTITION BY all rows are one partition, "
                       "so every change recomputes it (O(rows log rows))")),
            rule="sql"))
    return stream, WindowScope(scope, resolved)


def _function(w: exp.Window) -> tuple[str, exp.Expr | None]:
    """The function's name as the window operator calls it, and its argument."""
    for arg in ("alias",):
        if w.args.get(arg) is not None and not w.args.get("partition_by") and \
                w.args.get("order") is None:
            raise UnsupportedSQLError(f"named window {snippet(w)}", "write the window's "
                                      "PARTITION BY/ORDER BY in the OVER clause")
    f = w.this
    if type(f) in _RANKING:
        return _RANKING[type(f)], None
    if type(f) not in _AGGREGATES:
        raise UnsupportedSQLError(f"window function {snippet(w)}", _WHY)
    if f.args.get("ignore_nulls") or f.args.get("respect_nulls"):
        raise UnsupportedSQLError(f"window function {snippet(w)}", "IGNORE/RESPECT NULLS "
                                  "is not compiled")
    arg = f.this
    if isinstance(arg, exp.Distinct):
        raise UnsupportedSQLError(f"window function {snippet(w)}", "DISTINCT inside a "
                                  "window function is not compiled")
    if isinstance(f, exp.Count) and (arg is None or isinstance(arg, exp.Star)):
        return "count", None
    if arg is None:
        raise UnsupportedSQLError(f"window function {snippet(w)}", "it needs an argument")
    return _AGGREGATES[type(f)], arg


def _frame(w: exp.Window, ordered: bool) -> str:
    """``partition``, ``range`` or ``rows`` (refusing frames with offsets)."""
    spec = w.args.get("spec")
    if spec is None:
        return "range" if ordered else "partition"
    kind = str(spec.args.get("kind") or "").lower()
    start = str(spec.args.get("start") or "").upper()
    start_side = str(spec.args.get("start_side") or "").lower()
    end = spec.args.get("end")
    end_text = str(end or "").upper()
    end_side = str(spec.args.get("end_side") or "").lower()
    if spec.args.get("exclude"):
        raise UnsupportedSQLError(f"window frame {snippet(spec)}", "EXCLUDE is not compiled")
    if start == "UNBOUNDED" and start_side == "preceding":
        if end_text == "CURRENT ROW" or end is None:
            if not ordered:  # without ORDER BY every row is the current row's peer
                if kind == "rows":
                    raise UnsupportedSQLError(
                        f"window frame {snippet(spec)}", "a ROWS frame without ORDER BY "
                        "depends on an arbitrary row order; add an ORDER BY")
                return "partition"
            return "rows" if kind == "rows" else "range"
        if end_text == "UNBOUNDED" and end_side == "following":
            return "partition"
    raise UnsupportedSQLError(f"window frame {snippet(spec)}", "only frames from UNBOUNDED "
                              "PRECEDING to CURRENT ROW or UNBOUNDED FOLLOWING are "
                              "maintained (a frame with offsets is not compiled)")


# ---- the maintained top-N ------------------------------------------------------------


def rank_bound(node: exp.Expr) -> list[tuple[exp.Column, int]] | None:
    """``[(column, n)]`` if ``node`` says ``column <= n`` (or ``<``, or an OR of such)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Or):
        out: list[tuple[exp.Column, int]] = []
        for part in node.flatten():
            got = rank_bound(part)
            if got is None:
                return None
            out += got
        return out
    if not isinstance(node, exp.LTE | exp.LT | exp.GTE | exp.GT):
        return None
    left, right = node.this, node.expression
    if isinstance(node, exp.GTE | exp.GT):  # n >= col
        left, right = right, left
    strict = isinstance(node, exp.LT | exp.GT)
    if not isinstance(left, exp.Column) or not isinstance(right, exp.Literal) or \
            right.is_string or not right.this.isdigit():
        return None
    n = int(right.this) - (1 if strict else 0)
    return [(left, n)] if n >= 0 else None


def top_n(bound: Bound, conjuncts: Sequence[exp.Expr],
          record: Callable[[Decision], None]) -> Bound:
    """``bound`` with its window operator made a top-N if a conjunct bounds its ranking.

    The stream below ``bound`` may pass through filters and column picks down to a
    window operator; a conjunct ``col <= n`` (``<``, ``>=``, ``>``, or an OR of them)
    whose columns are integer columns of that operator's output, one at least a ranking
    it computes (the others may be rankings computed below it: q49 bounds two ranks of
    two stacked window operators with an OR), makes a copy of it that emits only rows
    within the bound, and the filters and picks are built again on the
    copy.  The conjunct is still applied by the caller: the result is the same, the
    window's changes are smaller.
    """
    for conj in conjuncts:
        found = rank_bound(conj)
        if not found:
            continue
        cols = []
        for ref, n in found:
            col = bound.refs.get((ref.table, ref.name))
            if col is None:
                break
            cols.append((col, n))
        else:
            chain, window, names = _down_to_window(bound.stream.node)
            if window is None or window.top:
                continue
            tops: dict[str, int] = {}
            for col, n in cols:
                src = names.get(col)
                if src is None or src not in window.schema.names or \
                        not pa.types.is_integer(window.schema.field(src).type):
                    break
                tops[src] = max(n, tops.get(src, n))
            else:
                ranked = {f[0] for f in window.funcs if f[1] in _RANKING.values()}
                if not ranked & set(tops):
                    continue  # a bound on columns computed elsewhere: not this one's top-N
                funcs: dict[str, Any] = {
                    n: (f,) if f in _RANKING.values() else (f, a, fr)
                    for n, f, a, fr in window.funcs}
                stream = Stream(window.inputs[0]).window(
                    list(window.partition_by), list(window.order_by), top=tops, **funcs)
                for node in reversed(chain):
                    stream = _again(node, stream)
                record(Decision(
                    topic="top_n", subject=snippet(conj),
                    choice={c: n for c, n in tops.items()},
                    reason=("a filter keeps rows within a ranking's bound: the window "
                            "operator emits only those (a maintained top-N); a retraction "
                            "pulls the next rows in, from the partition's stored rows"),
                    rule="sql"))
                return Bound(stream, bound.refs, bound.aliases, bound.label, bound.source,
                             bound.unique, bound.filtered)
    return bound


def _down_to_window(node: Node) -> tuple[list[Node], WindowNode | None, dict[str, str]]:
    """Filters and column picks from ``node`` down to a window operator, if one is there.

    Returns them (top first), the window node, and each column of ``node`` as the
    window's column it is.
    """
    chain: list[Node] = []
    names = {c: c for c in node.schema.names}
    while True:
        if isinstance(node, WindowNode):
            return chain, node, names
        if isinstance(node, FilterNode):
            chain.append(node)
            node = node.inputs[0]
            continue
        if isinstance(node, ProjectNode):
            picks = node.column_picks()
            if picks is None:
                return chain, None, names
            m = dict(picks)
            names = {out: m[mid] for out, mid in names.items() if mid in m}
            chain.append(node)
            node = node.inputs[0]
            continue
        return chain, None, names


def _again(node: Node, stream: Stream) -> Stream:
    """``node``'s operation (a filter or a column pick) applied to ``stream``."""
    if isinstance(node, FilterNode):
        return stream.filter(node.expr)
    assert isinstance(node, ProjectNode)
    return stream.select({f.name: e for f, e in zip(node.schema, node.exprs, strict=True)})
