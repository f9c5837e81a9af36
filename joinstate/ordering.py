"""Sort orders: how an ``order_by`` is declared, checked and applied.

Two places order rows: a window function (rows of a partition, ``ORDER BY`` inside
``OVER``) and a materialized output read with ``order_by`` / ``limit``.  Both take the
same declaration, ``[(column, "ascending" | "descending"[, "at_start" | "at_end"])]``
(the third item says where NULLs go; ``"at_end"`` by default, as DuckDB and Spark place
them for ascending keys), so one function checks it and one computes the order.
"""

from __future__ import annotations

from collections import abc

import pyarrow as pa
import pyarrow.compute as pc

from joinstate.errors import SchemaMismatchError

__all__ = ["OrderBy", "check_order_by", "orderable", "sort_indices"]

#: A checked order: (column, "ascending" | "descending", "at_start" | "at_end") per key.
OrderBy = tuple[tuple[str, str, str], ...]

_FORM = ("(column, 'ascending' | 'descending'[, 'at_start' | 'at_end' for where NULLs "
         "go])")


def orderable(t: pa.DataType) -> bool:
    """Whether values of type ``t`` have an order (numbers, decimals, text, bytes, times)."""
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_string(t) or pa.types.is_large_binary(t)
                or pa.types.is_temporal(t))


def check_order_by(owner: str, schema: pa.Schema, order_by: object) -> OrderBy:
    """``order_by`` as a checked :data:`OrderBy` over ``schema``'s columns.

    ``owner`` starts every message (``"output 'top'"``, ``"window"``).  Raises
    :class:`~joinstate.errors.SchemaMismatchError` naming the item at fault: not a
    list of pairs, an unknown direction or NULL placement, a missing column, or a
    column whose type has no order.
    """
    if isinstance(order_by, str | bytes) or not isinstance(order_by, abc.Sequence):
        raise SchemaMismatchError(
            f"{owner}: order_by={order_by!r} must be a list of {_FORM}")
    out = []
    for item in order_by:
        if (not isinstance(item, tuple | list) or len(item) not in (2, 3)
                or item[1] not in ("ascending", "descending")
                or (len(item) == 3 and item[2] not in ("at_start", "at_end"))):
            raise SchemaMismatchError(f"{owner}: order_by item {item!r} must be {_FORM}")
        if item[0] not in schema.names:
            raise SchemaMismatchError(
                f"{owner}: order_by column {item[0]!r} is not a column (columns: "
                f"{schema.names})")
        t = schema.field(item[0]).type
        if not orderable(t):
            raise SchemaMismatchError(
                f"{owner}: order_by column {item[0]!r} is {t}, which has no order")
        out.append((str(item[0]), str(item[1]), str(item[2]) if len(item) == 3 else "at_end"))
    return tuple(out)


def sort_indices(rows: pa.Table, order_by: OrderBy) -> pa.Array:
    """The permutation sorting ``rows`` by ``order_by``, NULLs placed per key.

    pyarrow places NULLs per key from version 25 on; an older one has one placement for
    all keys, which serves every order whose keys agree on it and refuses the others.
    """
    try:
        return pc.sort_indices(rows, sort_keys=list(order_by))
    except (TypeError, ValueError):
        places = {p for _, _, p in order_by}
        if len(places) > 1:
            raise SchemaMismatchError(
                "order_by mixes NULLS FIRST and NULLS LAST keys, which needs pyarrow >= 25 "
                f"(this is {pa.__version__}); upgrade pyarrow") from None
        return pc.sort_indices(rows, sort_keys=[(c, o) for c, o, _ in order_by],
                               null_placement=places.pop())
