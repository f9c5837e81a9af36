"""``INTERSECT`` and ``EXCEPT`` (and their ``ALL`` forms) through per-row counts.

Whether a row is in ``a INTERSECT b`` depends only on how many copies of it each side
holds, so the compiler keeps those counts: every branch's rows get one count column per
branch (1 in its own, 0 in the others), the branches are unioned, and one group-by on
every column sums the counts per distinct row.  Then

* ``INTERSECT``: rows whose every count is positive; ``EXCEPT``: rows the first branch
  holds and no other does (a chain ``a EXCEPT b EXCEPT c`` is one such group-by);
* ``INTERSECT ALL``: ``least(counts)`` copies; ``EXCEPT ALL``: ``greatest(first - others,
  0)`` copies, made by a repeat operator (weights times the count column).

The group-by treats NULLs as equal, as set operations do (a join on the columns would
not), and a change to a branch touches only the rows it changes.  Set semantics ignore
duplicates, so a branch's own ``SELECT DISTINCT`` is dropped there (its group-by would
only hold the same rows again).  Column types are the branches' common types, as for
``UNION``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqlexpr import cast_to
from planner._sqlscope import Rel, unique_name
from planner._sqltypes import Typed, TypeRuleError, common_type
from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["set_operation"]


class _Compiler(Protocol):
    def query(self, node: exp.Expr, names: Sequence[str] | None = None) -> Rel: ...

    def record(self, decision: Decision) -> None: ...


def _kind(node: exp.Expr) -> str:
    return "INTERSECT" if isinstance(node, exp.Intersect) else "EXCEPT"


def set_operation(qc: _Compiler, node: exp.Intersect | exp.Except,
                  names: Sequence[str] | None) -> Rel:
    """``node`` (an INTERSECT or EXCEPT, maybe chained) as one counting group-by."""
    kind = _kind(node)
    distinct = bool(node.args.get("distinct", True))
    for arg, what in (("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET")):
        if node.args.get(arg) is not None:
            raise UnsupportedSQLError(f"{what} in an {kind} branch {snippet(node)}",
                                      f"{what} is only compiled at the end of the whole query")
    branches: list[exp.Expr] = []

    def flatten(n: exp.Expr, first: bool) -> None:
        # a INTERSECT b INTERSECT c is one n-way intersection; a EXCEPT b EXCEPT c removes
        # b and c from a (only the left operand of an EXCEPT chain continues it)
        if (type(n) is type(node) and bool(n.args.get("distinct", True)) == distinct
                and n.args.get("with_") is None and (first or kind == "INTERSECT")
                and not any(n.args.get(a) is not None for a in ("order", "limit"))):
            flatten(n.this, first)
            flatten(n.expression, False)
        else:
            branches.append(n)

    flatten(node.this, True)
    flatten(node.expression, False)
    rels = [qc.query(_without_distinct(b) if distinct else b) for b in branches]
    width = len(rels[0].columns)
    for b, r in zip(branches, rels, strict=True):
        if len(r.columns) != width:
            raise SQLError(f"{kind} branch {snippet(b)} has {len(r.columns)} columns, the "
                           f"first has {width}")
    types = _common_types(rels, kind)
    out_names = list(names) if names is not None else _names([c for c, _ in rels[0].columns])
    taken = set(out_names)
    tags = [unique_name(f"__in{i}", taken) for i in range(len(rels))]
    parts = []
    for i, r in enumerate(rels):
        cols: dict[str, Any] = {}
        for (_, col), name, t in zip(r.columns, out_names, types, strict=True):
            cols[name] = cast_to(Typed(pc.field(col), r.stream.schema.field(col).type), t)
        for j, tag in enumerate(tags):
            cols[tag] = pc.scalar(pa.scalar(1 if i == j else 0, pa.int64()))
        parts.append(r.stream.select(cols))
    union = parts[0].union_all(*parts[1:])
    counted = union.group_by(out_names).aggregate(
        **{tag: ("sum", pc.field(tag)) for tag in tags})
    zero = pc.scalar(pa.scalar(0, pa.int64()))
    first, others = pc.field(tags[0]), [pc.field(t) for t in tags[1:]]
    if distinct:
        if kind == "INTERSECT":
            pred = pc.greater(first, zero)
            for o in others:
                pred = pc.and_kleene(pred, pc.greater(o, zero))
        else:
            pred = pc.greater(first, zero)
            for o in others:
                pred = pc.and_kleene(pred, pc.equal(o, zero))
        stream = counted.filter(pred).select(out_names)
    else:
        if kind == "INTERSECT":
            copies = pc.min_element_wise(first, *others)
        else:
            rest = others[0]
            for o in others[1:]:
                rest = pc.add_checked(rest, o)
            copies = pc.max_element_wise(pc.subtract_checked(first, rest), zero)
        n = unique_name("__copies", set(out_names) | set(tags))
        stream = counted.select({**{c: pc.field(c) for c in out_names}, n: copies})
        stream = stream.filter(pc.greater(pc.field(n), zero)).repeat(n)
    qc.record(Decision(
        topic="set_operation", subject=f"{kind}{'' if distinct else ' ALL'} of "
        f"{len(rels)} queries",
        choice="group-by on every column with a count per query",
        reason=("each row's copies per query are counted in one group-by on all columns "
                "(NULLs equal, as set operations compare them); "
                + ("a row is kept while " + ("every count is positive" if kind == "INTERSECT"
                                              else "only the first query's count is")
                   if distinct else "each row is repeated " + (
                       "least(counts)" if kind == "INTERSECT"
                       else "greatest(first - others, 0)") + " times")),
        figures={"queries": len(rels)}, rule="sql"))
    sql_names = [c for c, _ in rels[0].columns]
    return Rel(stream, list(zip(sql_names, out_names, strict=True)))


def _without_distinct(node: exp.Expr) -> exp.Expr:
    """A branch of a set operation without its own DISTINCT (set semantics ignore copies)."""
    inner = node
    while isinstance(inner, exp.Subquery) and not any(
            v is not None for k, v in inner.args.items() if k != "this"):
        inner = inner.this
    if isinstance(inner, exp.Select):
        d = inner.args.get("distinct")
        if d is not None and d.args.get("on") is None:
            copy = inner.copy()
            copy.set("distinct", None)
            return copy
    return node


def _common_types(rels: list[Rel], kind: str) -> list[pa.DataType]:
    types = []
    for i in range(len(rels[0].columns)):
        t: Typed | None = None
        for r in rels:
            f = r.stream.schema.field(r.columns[i][1])
            nxt = Typed(None, pa.null() if f.name in r.nulls else f.type)
            try:
                t = nxt if t is None else Typed(None, common_type(t, nxt))
            except TypeRuleError as exc:
                raise SQLError(f"{kind} column {i + 1} ({rels[0].columns[i][0]}): {exc}"
                               ) from exc
        assert t is not None
        types.append(t.type if not pa.types.is_null(t.type) else pa.int32())
    return types


def _names(names: Sequence[str]) -> list[str]:
    taken: set[str] = set()
    return [unique_name(n, taken) for n in names]
