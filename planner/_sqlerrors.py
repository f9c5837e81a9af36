"""The SQL compiler's errors, and how a refused construct is quoted.

Every refusal names the construct as SQL text (the user's table aliases kept, quoting
dropped) and says why the incremental engine does not maintain it, so that a person can
rewrite that part of the query.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from planner.errors import PlannerError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlglot import exp

__all__ = ["SQLError", "UnsupportedSQLError", "quoting", "snippet"]

MAX_SNIPPET = 240


class SQLError(PlannerError):
    """The SQL cannot be compiled as written; the message quotes the SQL at fault.

    For example a syntax error, an unknown table or column, a type DuckDB would reject.
    """


class UnsupportedSQLError(SQLError):
    """Valid SQL outside the incremental subset; the message quotes it and says why.

    For example a window function, a correlated subquery, a non-equi join.
    """

    def __init__(self, construct: str, why: str) -> None:
        super().__init__(f"{construct}: {why}")
        self.construct = construct
        self.why = why


_EXPLICIT_ALIASES: ContextVar[frozenset[str] | None] = ContextVar("explicit_aliases",
                                                                  default=None)
_AUTO_ALIAS = re.compile(r"^_col_\d+$")


@contextmanager
def quoting(explicit_aliases: frozenset[str]) -> Iterator[None]:
    """Quote SQL as the user wrote it while compiling one query.

    sqlglot's ``qualify`` names every column's table and every table's alias; a quote
    keeps the qualifiers the user wrote (``explicit_aliases``) and drops the others.
    """
    token = _EXPLICIT_ALIASES.set(explicit_aliases)
    try:
        yield
    finally:
        _EXPLICIT_ALIASES.reset(token)


def snippet(node: exp.Expr | str, limit: int = MAX_SNIPPET) -> str:
    """``node`` as the DuckDB SQL a person would write, in backquotes."""
    if isinstance(node, str):
        text = node
    else:
        from sqlglot import exp as _exp

        explicit = _EXPLICIT_ALIASES.get()
        if explicit is not None and len({c.table for c in node.find_all(_exp.Column)}) > 1:
            explicit = None  # columns of several tables: every qualifier says which

        def clean(n: _exp.Expr) -> _exp.Expr:
            if isinstance(n, _exp.Identifier) and n.args.get("quoted"):
                name = n.this
                if name.isidentifier() and name == name.lower():
                    return _exp.Identifier(this=name, quoted=False)
            if isinstance(n, _exp.Column) and explicit is not None and n.table and \
                    n.table not in explicit:
                n.set("table", None)
            if isinstance(n, _exp.Alias) and _AUTO_ALIAS.match(n.alias):
                return n.this.transform(clean)
            if isinstance(n, _exp.Table) and n.alias and n.alias == n.name:
                n.set("alias", None)
            return n

        text = node.copy().transform(clean).sql(dialect="duckdb")
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"`{text}`"
