"""Evaluating ``pyarrow.compute`` expressions on change sets, and what they read.

A pipeline's filters, projections and aggregate arguments are plain
``pyarrow.compute.Expression`` objects: users already know them, Arrow evaluates them
vectorised (through Acero), and there is no expression language of our own to learn or
to get wrong.  Two things Arrow does not offer directly are here: evaluating a list of
expressions on a table (one Acero project node, ~0.1 ms) and finding the columns an
expression reads, which the pipeline needs to keep only those columns in its indexes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from joinstate.errors import SchemaMismatchError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["as_expression", "evaluate", "mask", "masks", "output_types", "references"]


def as_expression(value: object, what: str) -> pc.Expression:
    """``value`` as an Expression: a column name becomes ``pc.field(name)``."""
    if isinstance(value, str):
        return pc.field(value)
    if isinstance(value, pc.Expression):
        return value
    raise SchemaMismatchError(
        f"{what} must be a pyarrow.compute.Expression or a column name, got "
        f"{type(value).__name__} ({value!r})"
    )


def _field_name(expr: pc.Expression, schema: pa.Schema) -> str | None:
    """The column ``expr`` is a plain reference to, or None (anything computed)."""
    name = str(expr)
    if schema.get_field_index(name) < 0:
        return None
    return name if expr.equals(pc.field(name)) else None


def evaluate(table: pa.Table, exprs: Sequence[pc.Expression], names: Sequence[str]) -> pa.Table:
    """A table with one column per expression, evaluated on ``table`` (row order kept).

    A list of plain column references (a projection that only picks and renames, common
    in pipelines) is a column selection: no Acero plan (~80 us each) is built for it.
    """
    if not exprs:
        return pa.table({})
    fields = [_field_name(e, table.schema) for e in exprs]
    if all(f is not None for f in fields):
        return table.select(cast("list[str]", fields)).rename_columns(list(names))
    decl = ac.Declaration.from_sequence([
        ac.Declaration("table_source", ac.TableSourceNodeOptions(table)),
        ac.Declaration("project", ac.ProjectNodeOptions(list(exprs), list(names))),
    ])
    # One thread keeps the row order (the weights are a separate array aligned with it).
    return decl.to_table(use_threads=False)


def mask(table: pa.Table, expr: pc.Expression) -> np.ndarray:
    """Rows for which the predicate is true (SQL: a NULL predicate drops the row)."""
    return masks(table, [expr])[0]


def masks(table: pa.Table, exprs: Sequence[pc.Expression]) -> list[np.ndarray]:
    """:func:`mask` of every predicate, evaluated together in one Arrow plan.

    A plan costs ~70 µs whatever the row count, so several predicates over one table
    (the filters of a self-join's legs) are cheaper together than one by one.
    """
    if table.num_rows == 0:
        return [np.zeros(0, dtype=bool) for _ in exprs]
    cols = evaluate(table, exprs, [f"m{i}" for i in range(len(exprs))])
    return [np.asarray(pc.fill_null(c, False).to_numpy(zero_copy_only=False), dtype=bool)
            for c in cols.columns]


def output_types(
    schema: pa.Schema, exprs: Sequence[pc.Expression], names: Sequence[str], what: str
) -> list[pa.DataType]:
    """The type of each expression on ``schema``; raises naming the expression at fault."""
    types = []
    empty = schema.empty_table()
    for expr, name in zip(exprs, names, strict=True):
        try:
            col = evaluate(empty, [expr], [name]).column(0)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SchemaMismatchError(
                f"{what}: expression {name!r} = {expr} cannot be evaluated on the columns "
                f"{schema.names}: {exc}"
            ) from exc
        types.append(col.type)
    return types


def references(schema: pa.Schema, expr: pc.Expression) -> set[str]:
    """The columns of ``schema`` that ``expr`` reads.

    Arrow has no public accessor for an expression's field references, so each column is
    tried: if the expression no longer binds without it, it reads it.  Costs one bind per
    column, once, when a pipeline is compiled.
    """
    if any(expr.equals(pc.field(n)) for n in schema.names):
        return {n for n in schema.names if expr.equals(pc.field(n))}
    used = set()
    for i, name in enumerate(schema.names):
        reduced = schema.remove(i)
        try:
            evaluate(reduced.empty_table(), [expr], ["x"])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            used.add(name)
    return used
