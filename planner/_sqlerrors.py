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

__all__ = ["SQLError", "UnsupportedSQLError", "parse_error", "plain", "quoting", "snippet"]

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
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NODE_CLASS = re.compile(r"<class 'sqlglot\.expressions\.(?:\w+\.)*(\w+)'>")


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


def plain(text: str) -> str:
    """``text`` without terminal escape codes (sqlglot underlines the token at fault)."""
    return _ANSI.sub("", text)


def parse_error(exc: Exception) -> str:
    """What a sqlglot parse or tokenizer error says, as one plain line.

    ``Expecting ) at line 1, column 14, at `FROM` in `SELECT (k FROM s``` -- the position
    and the text around it, the token at fault named in words instead of underlined with
    terminal codes, and sqlglot's node classes named as the SQL keyword
    (``<class 'sqlglot.expressions.query.Where'>`` reads ``WHERE``).
    """
    errors = getattr(exc, "errors", None) or []
    first = errors[0] if errors and isinstance(errors[0], dict) else None
    if first is None:
        text = plain(str(exc))
    else:
        what = str(first.get("description") or "syntax error")
        context = " ".join(plain(f"{first.get('start_context', '')}{first.get('highlight', '')}"
                                 f"{first.get('end_context', '')}").split())
        token = " ".join(plain(str(first.get("highlight") or "")).split())
        text = f"{what} at line {first.get('line')}, column {first.get('col')}"
        if token:
            text += f", at `{token}`"
        if context:
            text += f" in `{context}`"
    text = _NODE_CLASS.sub(lambda m: m.group(1).upper(), text)
    return " ".join(text.split())
