"""DuckDB's type rules, over Arrow types: what type an SQL expression has.

The SQL compiler promises DuckDB's answers, and DuckDB's answers carry DuckDB's types:
``INTEGER + INTEGER`` stays ``INTEGER`` (and raises on overflow), ``/`` is a ``DOUBLE``
division, decimal ``+``/``*`` widen precision by fixed rules.  The rules here were read
off DuckDB 1.x (``typeof(...)`` of each case) and are applied to Arrow types, so every
compiled expression is cast to the type DuckDB would give it:

* integers keep the wider operand's width; an integer *literal* takes the other
  operand's integer type when its value fits (``tinyint_col + 1`` is ``TINYINT``),
  else its own (``INTEGER`` if it fits 32 bits, else ``BIGINT``);
* an integer meets a decimal as ``DECIMAL(w, 0)``, ``w`` = 3, 5, 10, 19 digits for
  8-, 16-, 32-, 64-bit integers;
* decimal ``a + b``: scale ``max(sa, sb)``, precision ``max(pa - sa, pb - sb) + scale
  + 1``; ``a * b``: precision ``pa + pb``, scale ``sa + sb``; a result wider than 18
  digits from inputs of at most 18 is narrowed to 18 (DuckDB then checks overflow,
  as the cast here does), and nothing is wider than 38;
* a float operand makes the result a float (``FLOAT`` unless a ``DOUBLE`` is there);
* ``/`` of integers or decimals is ``DOUBLE``;
* the common type of branches (``CASE``, ``COALESCE``, ``UNION``, comparisons) takes the
  most integer digits and the largest scale.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "INT_DIGITS",
    "TypeRuleError",
    "Typed",
    "common_type",
    "decimal_arith_type",
    "describe",
    "int_literal_type",
    "is_decimal",
    "is_float",
    "is_integer",
    "is_numeric",
    "is_string",
    "is_temporal",
    "literal_decimal_type",
]

INT_DIGITS: dict[pa.DataType, int] = {
    pa.int8(): 3, pa.int16(): 5, pa.int32(): 10, pa.int64(): 19,
    pa.uint8(): 3, pa.uint16(): 5, pa.uint32(): 10, pa.uint64(): 20,
}
"""Digits of an integer type when it meets a decimal (DuckDB's widths)."""

MAX_DECIMAL = 38
INT64_DIGITS = 18
"""A DuckDB decimal of up to 18 digits is stored in 64 bits; results of such inputs that
would need more are kept at 18 digits (with an overflow check)."""


class TypeRuleError(Exception):
    """Two types have no common type or an operation has no rule; the caller words it."""


@dataclass(frozen=True)
class Typed:
    """A compiled scalar: its Arrow expression, its type, and what is known of it.

    ``const`` marks a constant (a literal or an expression of literals); ``value`` is
    the Python value of a literal; ``literal`` says which kind of literal it is
    (``"int"``, ``"string"``, ``"decimal"``, ``"null"`` or ``""``), because DuckDB types
    literals by what they meet (an integer literal takes a column's integer width, a
    string literal is cast to the type it is compared with).
    """

    expr: Any  # pyarrow.compute.Expression (untyped in pyarrow's stubs)
    type: pa.DataType
    const: bool = False
    value: Any = None
    literal: str = ""


def is_integer(t: pa.DataType) -> bool:
    """Signed or unsigned integer of any width."""
    return bool(pa.types.is_integer(t))


def is_decimal(t: pa.DataType) -> bool:
    """decimal128 or decimal256."""
    return bool(pa.types.is_decimal(t))


def is_float(t: pa.DataType) -> bool:
    """float16/32/64."""
    return bool(pa.types.is_floating(t))


def is_numeric(t: pa.DataType) -> bool:
    """Integer, decimal or float."""
    return is_integer(t) or is_decimal(t) or is_float(t)


def is_string(t: pa.DataType) -> bool:
    """string, large_string or string_view."""
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_string_view(t))


def is_temporal(t: pa.DataType) -> bool:
    """date32/64 or timestamp."""
    return bool(pa.types.is_date(t) or pa.types.is_timestamp(t))


_DUCK_INT = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER",
             pa.int64(): "BIGINT", pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT",
             pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT"}


def describe(t: pa.DataType) -> str:
    """DuckDB's name of an Arrow type, for messages."""
    if t in _DUCK_INT:
        return _DUCK_INT[t]
    if is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if t == pa.float32():
        return "FLOAT"
    if t == pa.float64():
        return "DOUBLE"
    if is_string(t):
        return "VARCHAR"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_null(t):
        return "NULL"
    return str(t)


def int_literal_type(value: int) -> pa.DataType:
    """DuckDB's type of an integer literal on its own: INTEGER, else BIGINT."""
    if -(2**31) <= value < 2**31:
        return pa.int32()
    if -(2**63) <= value < 2**63:
        return pa.int64()
    msg = f"integer literal {value} needs HUGEINT (128 bits), which Arrow has no type for"
    raise TypeRuleError(msg)


def literal_decimal_type(text: str) -> pa.DataType:
    """DuckDB's type of a decimal literal: every digit written counts (``0.010``: (4,3))."""
    digits = text.lstrip("+-")
    whole, _, frac = digits.partition(".")
    scale = len(frac)
    precision = max(len(whole) + scale, 1)
    if precision > MAX_DECIMAL:
        msg = f"decimal literal {text} has more than {MAX_DECIMAL} digits"
        raise TypeRuleError(msg)
    return pa.decimal128(precision, scale)


def _fits(value: int, t: pa.DataType) -> bool:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return 0 <= value < 2**bits
    return bool(-(2 ** (bits - 1)) <= value < 2 ** (bits - 1))


def _as_decimal(t: pa.DataType) -> tuple[int, int]:
    """(precision, scale) of a decimal, or of an integer as DuckDB widens it."""
    if is_decimal(t):
        return t.precision, t.scale
    return INT_DIGITS[t], 0


def _wider_int(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if a == b:
        return a
    sa, sb = pa.types.is_signed_integer(a), pa.types.is_signed_integer(b)
    if sa == sb:
        return a if a.bit_width >= b.bit_width else b
    signed, unsigned = (a, b) if sa else (b, a)
    if unsigned == pa.uint64():
        msg = "UBIGINT with a signed integer needs HUGEINT, which Arrow has no type for"
        raise TypeRuleError(msg)
    need = unsigned.bit_width * 2
    return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[
        max(signed.bit_width, need)]


def _literal_int_to(a: Typed, other: Typed) -> pa.DataType:
    """The type an integer literal takes next to ``other``."""
    if a.literal == "int" and is_integer(other.type) and _fits(int(a.value), other.type):
        return other.type
    return a.type


def common_type(a: Typed, b: Typed) -> pa.DataType:
    """The type both operands are cast to (comparisons, CASE branches, UNION columns).

    Raises :class:`TypeRuleError` when DuckDB would refuse (or needs a cast we lack).
    """
    ta, tb = a.type, b.type
    if pa.types.is_null(ta):
        return tb
    if pa.types.is_null(tb):
        return ta
    if is_integer(ta) and is_integer(tb):
        ta, tb = _literal_int_to(a, b), _literal_int_to(b, a)
        return _wider_int(ta, tb)
    if ta == tb:
        return ta
    if is_numeric(ta) and is_numeric(tb):
        if is_float(ta) or is_float(tb):
            return pa.float64() if pa.float64() in (ta, tb) or not (
                ta == pa.float32() or tb == pa.float32()) else pa.float32()
        (pa_, sa), (pb, sb) = _as_decimal(ta), _as_decimal(tb)
        scale = max(sa, sb)
        precision = min(max(pa_ - sa, pb - sb) + scale, MAX_DECIMAL)
        return pa.decimal128(precision, scale)
    if is_string(ta) and is_string(tb):
        return pa.string()
    if is_temporal(ta) and is_temporal(tb):
        if pa.types.is_timestamp(ta) or pa.types.is_timestamp(tb):
            tz = {getattr(t, "tz", None) for t in (ta, tb) if pa.types.is_timestamp(t)}
            if len(tz) > 1:
                msg = f"{describe(ta)} with time zones {sorted(map(str, tz))}"
                raise TypeRuleError(msg)
            return pa.timestamp("us", tz=tz.pop())
        return pa.date32()
    msg = f"{describe(ta)} and {describe(tb)} have no common type"
    raise TypeRuleError(msg)


def decimal_arith_type(op: str, ta: pa.DataType, tb: pa.DataType) -> pa.DataType:
    """DuckDB's result type of ``a op b`` for ``op`` in ``+ - *`` with a decimal operand."""
    (pa_, sa), (pb, sb) = _as_decimal(ta), _as_decimal(tb)
    widest = max(pa_, pb)
    if op in ("+", "-"):
        scale = max(sa, sb)
        precision = max(pa_ - sa, pb - sb) + scale
        if precision < MAX_DECIMAL:
            precision += 1
        if precision > INT64_DIGITS and widest <= INT64_DIGITS:
            precision = INT64_DIGITS
    else:
        scale = sa + sb
        if scale > MAX_DECIMAL:
            msg = f"a product of scale {scale} exceeds DECIMAL's {MAX_DECIMAL} digits"
            raise TypeRuleError(msg)
        precision = pa_ + pb
        if precision > INT64_DIGITS and widest <= INT64_DIGITS and scale < INT64_DIGITS:
            precision = INT64_DIGITS
    return pa.decimal128(min(precision, MAX_DECIMAL), scale)


def python_value(t: pa.DataType, value: Any) -> Any:
    """``value`` (a Python literal) converted for a scalar of Arrow type ``t``."""
    if value is None:
        return None
    if pa.types.is_date(t) and isinstance(value, dt.datetime):
        return value.date()
    return value
