"""The final ORDER BY of an expression that is not an output column.

SQL orders an answer by any expression over its SELECT's scope (TPC-DS q47 by
``sum_sales - avg_monthly_sales``, q36 by a ``CASE`` over output columns, q70 by one over
``GROUPING()``).  The answer is materialized and sorted when it is read, so such an
expression becomes a hidden column of the final SELECT: compiled like a projection
(after GROUP BY and window functions when there are some), kept in the materialized
state to sort by, and left out of the output (``joinstate.Graph.output(hide=...)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from planner._sqlscope import unique_name

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["hidden_order"]


def hidden_order(order: exp.Order | None, body: exp.Expr, names: Sequence[str]
                 ) -> tuple[exp.Order | None, list[str]]:
    """Add ``order``'s keys that are not output columns to ``body``'s SELECT list.

    They are appended as ``__order<i>`` projections of ``body`` (the final query without
    its ORDER BY); returns ``order`` with those keys naming them, and their names.
    Nothing is added for a UNION (its ORDER BY may only name output columns) nor for
    SELECT DISTINCT (a hidden column would change which rows are distinct; SQL requires
    the keys to be selected there).
    """
    if order is None or not isinstance(body, exp.Select) or body.args.get("distinct"):
        return order, []
    order = order.copy()
    projections = list(body.expressions)
    selected = {p.alias_or_name.lower() for p in projections}
    inner = [p.this if isinstance(p, exp.Alias) else p for p in projections]
    taken = set(names) | selected
    aliases = {p.alias.lower(): p.this for p in projections if isinstance(p, exp.Alias)}
    hidden: list[str] = []
    for o in order.expressions:
        e = o.this
        if isinstance(e, exp.Column) and not e.table and e.name.lower() in selected:
            continue
        if any(i == e for i in inner):
            continue
        name = unique_name(f"__order{len(hidden)}", taken)
        body.append("expressions", exp.alias_(_unalias(e, aliases), name, quoted=True))
        inner.append(e)
        hidden.append(name)
        e.replace(exp.column(name))
    return order, hidden


def _unalias(node: exp.Expr, aliases: dict[str, exp.Expr]) -> exp.Expr:
    """``node`` with each output alias it names replaced by the alias's expression.

    The hidden projection is compiled below the SELECT list, where aliases are not names;
    an unqualified column is an alias (qualify has qualified every FROM column).
    """
    out = node.copy()
    for col in list(out.find_all(exp.Column)):
        if not col.table and col.name.lower() in aliases:
            repl = aliases[col.name.lower()].copy()
            if col is out:
                return repl
            col.replace(repl)
    return out
