"""Which Arrow types a side may hold, which casts are safe, and how a delta is conformed.

A delta must carry exactly the side's columns (any order) plus an optional int64
``_weight``.  Casting is allowed only where no value can change meaning (int32 into an
int64 column, string into large_string ...); anything else is rejected with an error
that names the column, so a schema drift upstream is caught at the door instead of
turning into wrong join output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate.errors import SchemaMismatchError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "WEIGHT",
    "check_column_types",
    "check_storable",
    "conform_delta",
    "finer_unit",
    "is_safe_cast",
    "is_value_castable",
    "weights_of",
]

WEIGHT = "_weight"


def check_storable(schema: pa.Schema, side: str) -> None:
    """Raise if a column of ``schema`` has a type the row codec cannot store exactly."""
    for f in schema:
        if f.name == WEIGHT:
            raise SchemaMismatchError(
                f"{side} side: column {WEIGHT!r} is reserved for change weights; rename it"
            )
        if not _storable(f.type):
            raise SchemaMismatchError(
                f"{side} side: column {f.name!r} has type {f.type}, which joinstate cannot "
                "store; supported: integers, floats, bool, (large_)string, (large_)binary, "
                "fixed_size_binary, date32/64, time32/64, timestamp, duration, decimal128"
            )


def _storable(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or (pa.types.is_floating(t) and not pa.types.is_float16(t))
        or pa.types.is_boolean(t)
        or pa.types.is_string(t) or pa.types.is_large_string(t)
        or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_date(t) or pa.types.is_time(t)
        or pa.types.is_timestamp(t) or pa.types.is_duration(t)
        or pa.types.is_decimal128(t)
    )


_INT_RANGE = {
    pa.int8(): (-(2**7), 2**7 - 1), pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1), pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1), pa.uint16(): (0, 2**16 - 1),
    pa.uint32(): (0, 2**32 - 1), pa.uint64(): (0, 2**64 - 1),
}
_UNIT_RANK = {"s": 0, "ms": 1, "us": 2, "ns": 3}


def finer_unit(a: str, b: str) -> str:
    """The finer of two time units (``"s"``, ``"ms"``, ``"us"``, ``"ns"``)."""
    return a if _UNIT_RANK[a] >= _UNIT_RANK[b] else b


def is_safe_cast(src: pa.DataType, dst: pa.DataType) -> bool:
    """True if every value of ``src`` has one exact representation in ``dst`` (by type)."""
    if src.equals(dst) or pa.types.is_null(src):
        return True
    if pa.types.is_dictionary(src):
        return is_safe_cast(src.value_type, dst)
    if pa.types.is_integer(src) and pa.types.is_integer(dst):
        lo, hi = _INT_RANGE[src]
        dlo, dhi = _INT_RANGE[dst]
        return dlo <= lo and hi <= dhi
    if pa.types.is_integer(src) and pa.types.is_floating(dst):
        mantissa = 53 if pa.types.is_float64(dst) else 24
        lo, hi = _INT_RANGE[src]
        return max(abs(lo), hi) <= 2**mantissa
    if pa.types.is_float32(src) and pa.types.is_float64(dst):
        return True
    strings = (pa.types.is_string, pa.types.is_large_string)
    binaries = (pa.types.is_binary, pa.types.is_large_binary)
    for family in (strings, binaries):
        if any(f(src) for f in family) and any(f(dst) for f in family):
            return True
    if pa.types.is_date32(src) and pa.types.is_date64(dst):
        return True
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst):
        # Finer units are exact up to overflow, which the value-checked cast catches.
        # Time zones only label the same UTC instant, so any aware -> aware cast is exact;
        # naive <-> aware is not (the wall-clock time would need a zone to mean anything).
        same_kind = (src.tz is None) == (dst.tz is None)
        return same_kind and _UNIT_RANK[src.unit] <= _UNIT_RANK[dst.unit]
    if pa.types.is_duration(src) and pa.types.is_duration(dst):
        return _UNIT_RANK[src.unit] <= _UNIT_RANK[dst.unit]
    if pa.types.is_decimal(src) and pa.types.is_decimal128(dst):
        int_digits = src.precision - src.scale
        return dst.scale >= src.scale and dst.precision - dst.scale >= int_digits
    return False


def is_value_castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """True if ``src`` may be cast to ``dst`` with every value checked by the cast.

    Narrowing within a family (int64 literals into an int16 column, ns timestamps into a
    us column) is allowed because Arrow's safe cast fails on any value that would
    overflow or lose digits; crossing families (string to int, float to int) is not,
    since "12" or 1.0 fitting is luck, not a schema.
    """
    if is_safe_cast(src, dst):
        return True
    if pa.types.is_dictionary(src):
        return is_value_castable(src.value_type, dst)
    pairs = (
        (pa.types.is_integer, pa.types.is_integer),
        (pa.types.is_timestamp, pa.types.is_timestamp),
        (pa.types.is_duration, pa.types.is_duration),
        (pa.types.is_decimal, pa.types.is_decimal128),
    )
    if any(a(src) and b(dst) for a, b in pairs):
        return not pa.types.is_timestamp(src) or (src.tz is None) == (dst.tz is None)
    return False


def check_column_types(
    schema: pa.Schema, given: Mapping[str, pa.DataType], side: str
) -> None:
    """Check the column names and types of a delta (or of a DataFrame about to be one).

    Raises :class:`SchemaMismatchError` naming the first unknown, missing or unsafely
    typed column; ``_weight`` may be absent or any integer type that fits int64.  Shared
    by :func:`conform_delta` and by drivers that validate before any data moves (Spark).
    """
    unknown = [n for n in given if n not in schema.names and n != WEIGHT]
    if unknown:
        raise SchemaMismatchError(
            f"{side} side: delta column {unknown[0]!r} is not in the side's schema "
            f"(expected columns {schema.names} and optionally {WEIGHT!r})"
        )
    missing = [n for n in schema.names if n not in given]
    if missing:
        raise SchemaMismatchError(f"{side} side: delta is missing column {missing[0]!r}")
    for f in schema:
        src = given[f.name]
        if not src.equals(f.type) and not is_value_castable(src, f.type):
            raise SchemaMismatchError(
                f"{side} side: column {f.name!r} has type {src}, which cannot be "
                f"cast safely to the declared {f.type}; cast it explicitly upstream"
            )
    w = given.get(WEIGHT)
    if w is not None:
        _check_weight_type(w, f"{side} side")


_WEIGHT_MEANING = "+n inserts n copies of the row, -n deletes n copies"


def _check_weight_type(t: pa.DataType, what: str) -> None:
    if not pa.types.is_integer(t) or not is_safe_cast(t, pa.int64()):
        raise SchemaMismatchError(
            f"{what}: column {WEIGHT!r} must be int64 (or an integer type that fits in it), "
            f"got {t}; cast it to int64 upstream ({_WEIGHT_MEANING})"
        )


def weights_of(table: pa.Table, what: str) -> np.ndarray:
    """The ``_weight`` column of ``table`` as int64 (every row +1 without one), checked.

    Raises :class:`SchemaMismatchError` naming the column, the fault and the remedy, for
    a type that does not fit int64 (uint64, floats, strings: no value is guessed) or a
    NULL weight (the first such row is named).  ``what`` starts the message (the side,
    source or file the change set came from).
    """
    if WEIGHT not in table.column_names:
        return np.ones(table.num_rows, dtype=np.int64)
    col = table.column(WEIGHT)
    _check_weight_type(col.type, what)
    if col.null_count:
        first = int(pc.index(pc.is_null(col), True).as_py())
        raise SchemaMismatchError(
            f"{what}: column {WEIGHT!r} has NULL weights ({col.null_count:,} row(s), the "
            f"first at row {first:,}); every change needs a weight ({_WEIGHT_MEANING}): fill "
            "them, or drop the column to insert every row once"
        )
    w = col.to_numpy() if col.type == pa.int64() else pc.cast(col, pa.int64()).to_numpy()
    return np.ascontiguousarray(w, dtype=np.int64)


def _conformed(schema: pa.Schema, delta: pa.Table, side: str
               ) -> tuple[pa.Table, np.ndarray] | None:
    """``delta`` as it is, if it is already in ``schema``; else None.

    Already in it: ``schema``'s columns in order, of its types and metadata, then at
    most ``_weight``, one chunk per column, no NULL in a not-null column.  Most pushes
    come this way; the checks a column at a time cost ~10 µs each (a wide dimension
    table's small push ~0.3 ms).  Anything else takes the checked path, which names
    what is wrong.
    """
    n = len(schema)
    names = delta.column_names
    if names[:n] != schema.names or len(names) > n + 1 or (
            len(names) == n + 1 and names[n] != WEIGHT):
        return None
    body = delta if len(names) == n else delta.drop_columns([WEIGHT])
    if not body.schema.equals(schema, check_metadata=True) or any(
            c.num_chunks > 1 for c in body.columns):
        return None
    if any(not f.nullable and c.null_count for f, c in zip(schema, body.columns,
                                                              strict=True)):
        return None  # the column by column path names the column
    return body, weights_of(delta, f"{side} side")


def conform_delta(
    schema: pa.Schema, delta: pa.Table | pa.RecordBatch, side: str
) -> tuple[pa.Table, np.ndarray]:
    """Return ``delta`` as a table in ``schema``'s column order, and its weights as int64.

    Raises :class:`SchemaMismatchError` naming the first missing, unknown or unsafely
    typed column, or a NULL weight.
    """
    if isinstance(delta, pa.RecordBatch):
        delta = pa.Table.from_batches([delta])
    if not isinstance(delta, pa.Table):
        raise SchemaMismatchError(
            f"{side} side: a delta must be a pyarrow Table or RecordBatch, "
            f"got {type(delta).__name__}"
        )
    names = delta.column_names
    fast = _conformed(schema, delta, side)
    if fast is not None:
        return fast
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SchemaMismatchError(f"{side} side: delta has duplicate column(s) {dup}")
    check_column_types(schema, {n: delta.schema.field(n).type for n in names}, side)
    columns = []
    for f in schema:
        col = delta.column(f.name)
        if not col.type.equals(f.type):
            try:
                col = pc.cast(col, f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatchError(
                    f"{side} side: column {f.name!r} ({col.type}) has a value that does not fit "
                    f"the declared {f.type}: {exc}"
                ) from exc
        if not f.nullable and col.null_count:
            raise SchemaMismatchError(
                f"{side} side: column {f.name!r} is declared not-null but has NULLs"
            )
        columns.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    table = pa.Table.from_arrays(columns, schema=schema)
    return table, weights_of(delta, f"{side} side")
