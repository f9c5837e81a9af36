"""Cross joins: FROM items no equality connects, joined on a constant key.

A cross product is an equi-join whose key is the same constant on both sides: every row
of one side meets every row of the other.  The FROM planner (:mod:`planner._sqlfrom`)
finds the groups of items its equalities connect; when there are several, one item of
each group gets a constant column and the groups are joined on it, with the usual join
operator and its indexes.

What it costs.  A change to one side pairs with every row of the other side, so a side
of many rows is read whole whenever the other side changes; the index of a side holds
all its rows under the one key.  The common case is cheap: a side that is a single row
(an aggregate without GROUP BY, such as TPC-DS q88's eight counts or q23's maximum) has
an index of one row, and a change to the large side reads that one row.  Conditions
across the groups that are not equalities (``x > other.y``) are applied after the
cross join; they are accepted only when every group but one is such a single row
(otherwise the cross product of two large inputs would be filtered afterwards, a
non-equi join, which stays refused).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from joinstate.nodes import AggNode, FilterNode, JoinAllNode, JoinNode, Node, ProjectNode
from planner._sqlerrors import snippet
from planner._sqlscope import Bound, unique_name
from planner.rule import Decision

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlglot import exp

    from joinstate import Stream

__all__ = ["CROSS_KEY", "at_most_one_row", "cross_groups", "with_cross_key"]

CROSS_KEY = "__cross"
"""The name (made unique per item) of the constant column cross-joined items share."""


class _Conj(Protocol):
    node: exp.Expr
    aliases: frozenset[str]
    used: bool


class _Recorder(Protocol):
    def record(self, decision: Decision) -> None: ...


def at_most_one_row(stream: Stream) -> bool:
    """Whether ``stream`` never holds more than one row (checked on its graph)."""
    return _single(stream.node)


def _single(node: Node) -> bool:
    if isinstance(node, AggNode):
        return not node.keys
    if isinstance(node, FilterNode | ProjectNode):
        return _single(node.inputs[0])
    if isinstance(node, JoinNode):
        if node.how in ("left_semi", "left_anti"):
            return _single(node.inputs[0])
        # a full join of two single rows that do not match has two rows
        return node.how != "full" and all(_single(i) for i in node.inputs)
    if isinstance(node, JoinAllNode):
        return all(_single(i) for i in node.inputs)
    return False


def with_cross_key(bound: Bound) -> tuple[Bound, str]:
    """``bound`` with a constant column to cross-join on (and the column's name).

    A single-row item declares the column unique: joining it multiplies no row, which
    the join-order rule reads.
    """
    col = unique_name(CROSS_KEY, set(bound.stream.columns))
    stream = bound.stream.with_columns({col: pc.scalar(pa.scalar(1, pa.int8()))})
    unique = bound.unique + (((col,),) if at_most_one_row(bound.stream) else ())
    return Bound(stream, bound.refs, bound.aliases, bound.label, bound.source, unique,
                 bound.filtered), col


def _groups(n: int, keyed: Sequence[tuple[int, str, int, str]]) -> list[list[int]]:
    """The members each group of equalities connects, in member order."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for li, _, ri, _ in keyed:
        parent[find(li)] = find(ri)
    out: dict[int, list[int]] = {}
    for i in range(n):
        out.setdefault(find(i), []).append(i)
    return sorted(out.values(), key=lambda g: g[0])


def cross_groups(recorder: _Recorder, members: list[Bound],
                 keyed: list[tuple[int, str, int, str]], multi: Sequence[_Conj],
                 where: exp.Expr) -> tuple[list[Bound], list[tuple[int, str, int, str]]]:
    """Join the groups of ``members`` no equality connects on a constant key.

    Returns the members (one item of each group given a constant column) and the key
    pairs with the cross edges added; unchanged when every member is connected, or when
    a condition across the groups is not an equality and more than one group may hold
    several rows (the FROM planner then refuses the non-equi join).
    """
    groups = _groups(len(members), keyed)
    if len(groups) < 2:
        return members, keyed
    owner = {a: gi for gi, g in enumerate(groups) for i in g for a in members[i].aliases}
    across = [c for c in multi if len({owner[a] for a in c.aliases if a in owner}) > 1]
    single = [all(at_most_one_row(members[i].stream) for i in g) and len(g) == 1
              for g in groups]
    if across and sum(not s for s in single) > 1:
        return members, keyed
    members = list(members)
    anchors: list[tuple[int, str]] = []
    for g in groups:
        # The item that carries the key: a single-row group's only item, else the item
        # listed first (the join-order rule orders the joins of its group around it).
        i = g[0]
        members[i], col = with_cross_key(members[i])
        anchors.append((i, col))
    first, fcol = anchors[0]
    keyed = keyed + [(first, fcol, i, col) for i, col in anchors[1:]]
    labels = [", ".join(members[i].label for i in g) for g in groups]
    n_single = sum(single)
    recorder.record(Decision(
        topic="cross_join", subject=f"FROM {', '.join(labels)}",
        choice=[[members[i].label for i in g] for g in groups],
        reason=(f"{len(groups)} groups of inputs share no equality: joined on a constant "
                f"key ({n_single} of them a single row, whose index holds one row); a "
                "change to a side pairs with every row of the other sides"
                + (f"; {len(across)} condition(s) across them filter the product "
                   f"({snippet(across[0].node)})" if across else "")),
        figures={"groups": len(groups), "single_row": n_single}, rule="sql"))
    return members, keyed
