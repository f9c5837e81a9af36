"""SQL scalar expressions (sqlglot nodes) as ``pyarrow.compute`` expressions, DuckDB-typed.

:class:`ExprCompiler` walks one expression tree, one method per sqlglot node type, and
returns a :class:`~planner._sqltypes.Typed`: the Arrow expression and the type DuckDB
gives the SQL.  Operands are cast to that type before Arrow computes, so results are
DuckDB's: checked integer arithmetic (overflow raises, as in DuckDB), decimal precision
and scale by DuckDB's rules (:mod:`planner._sqltypes`), ``/`` as a ``DOUBLE`` division
(``x / 0`` is ``inf``, ``NaN`` for ``0 / 0``), ``%`` and ``//`` NULL for a zero divisor,
three-valued ``AND``/``OR``/``NOT``/``IN``, ``CASE`` whose NULL condition counts as
false.  Column references and whole sub-expressions (group keys and aggregates after a
``GROUP BY``) are resolved by a :class:`Scope` the relational compiler provides.

What is not here is refused with :class:`~planner._sqlerrors.UnsupportedSQLError`,
quoting the expression.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Protocol

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc
from sqlglot import exp

from planner._sqlerrors import SQLError, UnsupportedSQLError, snippet
from planner._sqltypes import (
    INT_DIGITS,
    Typed,
    TypeRuleError,
    common_type,
    decimal_arith_type,
    describe,
    int_literal_type,
    is_decimal,
    is_float,
    is_integer,
    is_numeric,
    is_string,
    is_temporal,
    literal_decimal_type,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["ExprCompiler", "Scope", "arrow_type", "cast_to", "constant", "null_of", "refuse"]

MAX_ARROW_DECIMAL128 = 38


class Scope(Protocol):
    """What names mean where an expression is compiled."""

    def column(self, node: exp.Column) -> Typed:
        """The stream column a column reference reads (raises if unknown)."""
        ...

    def lookup(self, node: exp.Expr) -> Typed | None:
        """A whole sub-expression that is already a column (a group key, an aggregate)."""
        ...


def null_of(t: pa.DataType) -> Typed:
    """A typed NULL constant."""
    return Typed(pc.scalar(pa.scalar(None, t)), t, const=True, value=None, literal="null")


def refuse(kind: str, node: exp.Expr | str, why: str) -> NoReturn:
    """Raise :class:`UnsupportedSQLError` for ``kind`` at ``node``, saying ``why``."""
    raise UnsupportedSQLError(f"{kind} {snippet(node)}", why)


def arrow_type(dtype: exp.DataType) -> pa.DataType:
    """The Arrow type of an SQL type name (DuckDB's meanings)."""
    t = dtype.this
    D = exp.DataType.Type
    simple = {
        D.TINYINT: pa.int8(), D.SMALLINT: pa.int16(), D.INT: pa.int32(),
        D.BIGINT: pa.int64(), D.UTINYINT: pa.uint8(), D.USMALLINT: pa.uint16(),
        D.UINT: pa.uint32(), D.UBIGINT: pa.uint64(), D.FLOAT: pa.float32(),
        D.DOUBLE: pa.float64(), D.VARCHAR: pa.string(), D.TEXT: pa.string(),
        D.CHAR: pa.string(), D.BOOLEAN: pa.bool_(), D.DATE: pa.date32(),
        D.TIMESTAMP: pa.timestamp("us"), D.DATETIME: pa.timestamp("us"),
    }
    if t in simple:
        return simple[t]
    if t == D.DECIMAL:
        params = [int(p.name) for p in dtype.expressions]
        precision, scale = (params + [18, 3][len(params):])[:2] if params else (18, 3)
        if not 1 <= precision <= MAX_ARROW_DECIMAL128 or not 0 <= scale <= precision:
            raise SQLError(f"type {snippet(dtype)}: DECIMAL(precision, scale) needs "
                           f"1 <= precision <= 38 and 0 <= scale <= precision")
        return pa.decimal128(precision, scale)
    refuse("type", dtype, "only integer, DECIMAL, FLOAT/DOUBLE, VARCHAR, "
                       "BOOLEAN, DATE and TIMESTAMP types are compiled")


def cast_to(v: Typed, t: pa.DataType) -> Any:
    """``v``'s expression as type ``t`` (a no-op when it already is)."""
    if v.type.equals(t):
        return v.expr
    if v.literal == "null":
        return pc.scalar(pa.scalar(None, t))
    if v.const and v.literal:
        # A literal is converted once, here, rather than cast on every row.
        try:
            return pc.scalar(pa.scalar(v.value, v.type).cast(t))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass  # e.g. out of range: cast per row, which raises as DuckDB does
    if is_integer(v.type) and is_decimal(t):
        # Arrow casts an integer only to a decimal wide enough for every value of its type.
        wide = pa.decimal128(INT_DIGITS[v.type] + t.scale, t.scale)
        if wide.precision > MAX_ARROW_DECIMAL128:
            wide = pa.decimal256(wide.precision, t.scale)
        e = v.expr.cast(wide)
        return e if wide.equals(t) else e.cast(t)
    return v.expr.cast(t)


def constant(v: Typed) -> pa.Scalar:
    """The value of a constant expression (``1999 + 1``), computed once by Arrow."""
    if v.literal and v.literal != "null":
        return pa.scalar(v.value, v.type)
    one = pa.table({"_": pa.array([0], pa.int8())})
    decl = ac.Declaration.from_sequence([
        ac.Declaration("table_source", ac.TableSourceNodeOptions(one)),
        ac.Declaration("project", ac.ProjectNodeOptions([v.expr], ["v"])),
    ])
    return decl.to_table(use_threads=False).column(0)[0].cast(v.type)


def _is_null_literal(v: Typed) -> bool:
    return v.literal == "null"


_INT_RE = re.compile(r"^\d+$")
_DEC_RE = re.compile(r"^(\d+\.\d*|\.\d+)$")


class ExprCompiler:
    """Compiles scalar SQL expressions over one :class:`Scope`."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self._dispatch: dict[type, Callable[[Any], Typed]] = {
            exp.Column: self.column, exp.Literal: self.literal, exp.Boolean: self.boolean,
            exp.Null: self.null, exp.Paren: self.paren, exp.Neg: self.neg,
            exp.Add: self.arith, exp.Sub: self.arith, exp.Mul: self.arith,
            exp.Div: self.divide, exp.IntDiv: self.int_div, exp.Mod: self.mod,
            exp.EQ: self.compare, exp.NEQ: self.compare, exp.GT: self.compare,
            exp.GTE: self.compare, exp.LT: self.compare, exp.LTE: self.compare,
            exp.NullSafeEQ: self.null_safe_eq, exp.NullSafeNEQ: self.null_safe_eq,
            exp.And: self.connector, exp.Or: self.connector, exp.Not: self.not_,
            exp.Is: self.is_, exp.In: self.in_, exp.Between: self.between,
            exp.Like: self.like, exp.ILike: self.like, exp.Case: self.case,
            exp.If: self.if_, exp.Coalesce: self.coalesce, exp.Nullif: self.nullif,
            exp.Cast: self.cast, exp.TryCast: self.cast, exp.Abs: self.abs_,
            exp.Upper: self.string_fn,
            exp.Lower: self.string_fn, exp.Length: self.length, exp.Substring: self.substring,
            exp.DPipe: self.concat, exp.Concat: self.concat, exp.Round: self.round_,
            exp.Extract: self.extract, exp.Year: self.date_part, exp.Month: self.date_part,
            exp.Day: self.date_part, exp.Interval: self.interval,
        }

    # ---- entry --------------------------------------------------------------------------

    def compile(self, node: exp.Expr) -> Typed:
        """``node`` as a typed Arrow expression."""
        hit = self.scope.lookup(node)
        if hit is not None:
            return hit
        handler = self._dispatch.get(type(node))
        if handler is not None:
            return handler(node)
        if isinstance(node, exp.Window):
            refuse("window function", node, "a window's value depends on other "
                               "rows of its partition; it is not maintained incrementally")
        if isinstance(node, exp.AggFunc):
            refuse("aggregate", node, "an aggregate is only allowed in the SELECT "
                               "list, HAVING or ORDER BY of a query with GROUP BY or "
                               "aggregates, not here")
        if isinstance(node, exp.Subquery | exp.Exists | exp.Select):
            refuse("subquery", node, "subqueries are compiled (decorrelated into joins) "
                               "in WHERE, ON, HAVING and the SELECT list, not inside an "
                               "aggregate's argument or a GROUP BY key")
        refuse(type(node).__name__.lower(), node,
                           "this expression has no incremental translation here")

    def predicate(self, node: exp.Expr) -> Typed:
        """A boolean expression (WHERE, HAVING, ON)."""
        v = self.compile(node)
        if _is_null_literal(v):
            return null_of(pa.bool_())
        if not pa.types.is_boolean(v.type):
            raise SQLError(f"{snippet(node)} is {describe(v.type)}, a condition must be "
                           "BOOLEAN")
        return v

    # ---- leaves -------------------------------------------------------------------------

    def column(self, node: exp.Column) -> Typed:
        """A column reference."""
        return self.scope.column(node)

    def literal(self, node: exp.Literal) -> Typed:
        """Numbers (INTEGER/BIGINT, DECIMAL(p,s) as written, DOUBLE with an exponent), strings."""
        text = node.this
        if node.is_string:
            return Typed(pc.scalar(text), pa.string(), const=True, value=text,
                         literal="string")
        return self._number(text, node)

    def _number(self, text: str, node: exp.Expr, negate: bool = False) -> Typed:
        try:
            if _INT_RE.match(text):
                value: Any = int(text)
                t = int_literal_type(value)
                value = -value if negate else value
                return Typed(pc.scalar(pa.scalar(value, t)), t, const=True, value=value,
                             literal="int")
            if _DEC_RE.match(text):
                t = literal_decimal_type(text)
                dvalue = Decimal(text)
                dvalue = -dvalue if negate else dvalue
                return Typed(pc.scalar(pa.scalar(dvalue, t)), t, const=True, value=dvalue,
                             literal="decimal")
            fvalue = float(text)
        except TypeRuleError as exc:
            raise UnsupportedSQLError(f"literal {snippet(node)}", str(exc)) from exc
        except ValueError as exc:
            raise SQLError(f"literal {snippet(node)} is not a number") from exc
        fvalue = -fvalue if negate else fvalue
        return Typed(pc.scalar(pa.scalar(fvalue, pa.float64())), pa.float64(), const=True,
                     value=fvalue)

    def boolean(self, node: exp.Boolean) -> Typed:
        """TRUE / FALSE."""
        value = bool(node.this)
        return Typed(pc.scalar(value), pa.bool_(), const=True, value=value)

    def null(self, node: exp.Null) -> Typed:
        """An untyped NULL: it takes the type of what it meets."""
        del node
        return Typed(pc.scalar(None), pa.null(), const=True, value=None, literal="null")

    def paren(self, node: exp.Paren) -> Typed:
        """``(x)``."""
        return self.compile(node.this)

    def interval(self, node: exp.Interval) -> Typed:
        """An INTERVAL is only meaningful added to a constant date (folded there)."""
        refuse("interval", node, "INTERVAL is compiled only when added to or "
                           "subtracted from a constant DATE or TIMESTAMP")

    # ---- arithmetic ---------------------------------------------------------------------

    def neg(self, node: exp.Neg) -> Typed:
        """``-x``: a negative literal keeps its literal type; else a checked negation."""
        inner = node.this
        if isinstance(inner, exp.Literal) and not inner.is_string:
            return self._number(inner.this, node, negate=True)
        v = self.compile(inner)
        if _is_null_literal(v):
            return v
        if not is_numeric(v.type):
            raise SQLError(f"{snippet(node)}: cannot negate {describe(v.type)}")
        if v.const and v.value is not None and v.literal in ("int", "decimal"):
            return Typed(pc.scalar(pa.scalar(-v.value, v.type)), v.type, const=True,
                         value=-v.value, literal=v.literal)
        fn = pc.negate if is_float(v.type) else pc.negate_checked
        return Typed(fn(v.expr), v.type, const=v.const)

    def _operands(self, node: exp.Binary) -> tuple[Typed, Typed]:
        a, b = self.compile(node.left), self.compile(node.right)
        return self._adapt(a, b, node)

    def _adapt(self, a: Typed, b: Typed, node: exp.Expr) -> tuple[Typed, Typed]:
        """String literals next to a typed operand are cast to its type, as DuckDB does."""
        if a.literal == "string" and not is_string(b.type) and not pa.types.is_null(b.type):
            a = self._cast_literal(a, b.type, node)
        elif b.literal == "string" and not is_string(a.type) and not pa.types.is_null(a.type):
            b = self._cast_literal(b, a.type, node)
        return a, b

    def _cast_literal(self, v: Typed, t: pa.DataType, node: exp.Expr) -> Typed:
        try:
            s = pa.scalar(v.value).cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SQLError(f"{snippet(node)}: the literal {v.value!r} is not a "
                           f"{describe(t)}") from exc
        return Typed(pc.scalar(s), t, const=True, value=s.as_py())

    def _common(self, a: Typed, b: Typed, node: exp.Expr) -> pa.DataType:
        try:
            return common_type(a, b)
        except TypeRuleError as exc:
            raise SQLError(f"{snippet(node)}: {exc}; cast one side") from exc

    def arith(self, node: exp.Binary) -> Typed:
        """``+ - *`` with DuckDB's result types; integer overflow raises."""
        op = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*"}[type(node)]
        right = node.right
        while isinstance(right, exp.Paren):
            right = right.this
        if isinstance(right, exp.Interval):
            return self._interval_fold(op, self.compile(node.left), right, node)
        a, b = self._operands(node)
        if is_temporal(a.type) or is_temporal(b.type):
            return self._days_fold(op, a, b, node)
        if _is_null_literal(a) or _is_null_literal(b):
            other = b if _is_null_literal(a) else a
            return null_of(other.type if not pa.types.is_null(other.type) else pa.int32())
        for v in (a, b):
            if not is_numeric(v.type):
                raise SQLError(f"{snippet(node)}: {op} needs numbers, got {describe(v.type)}")
        const = a.const and b.const
        if is_float(a.type) or is_float(b.type):
            rt = self._common(a, b, node)
            fn = {"+": pc.add, "-": pc.subtract, "*": pc.multiply}[op]
            return Typed(fn(cast_to(a, rt), cast_to(b, rt)), rt, const=const)
        if is_decimal(a.type) or is_decimal(b.type):
            return self._decimal_arith(op, a, b, node)
        rt = self._common(a, b, node)
        fn = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}[op]
        return Typed(fn(cast_to(a, rt), cast_to(b, rt)), rt, const=const)

    def _decimal_arith(self, op: str, a: Typed, b: Typed, node: exp.Expr) -> Typed:
        try:
            rt = decimal_arith_type(op, a.type, b.type)
        except TypeRuleError as exc:
            raise UnsupportedSQLError(f"decimal arithmetic {snippet(node)}", str(exc)) from exc
        da = a.type if is_decimal(a.type) else pa.decimal128(INT_DIGITS[a.type], 0)
        db = b.type if is_decimal(b.type) else pa.decimal128(INT_DIGITS[b.type], 0)
        if op == "*":
            arrow_p = da.precision + db.precision + 1
        else:
            scale = max(da.scale, db.scale)
            arrow_p = max(da.precision - da.scale, db.precision - db.scale) + scale + 1
        if arrow_p > MAX_ARROW_DECIMAL128:  # Arrow's own result would not fit decimal128
            da = pa.decimal256(da.precision, da.scale)
            db = pa.decimal256(db.precision, db.scale)
        ea, eb = cast_to(a, da), cast_to(b, db)
        fn = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}[op]
        return Typed(fn(ea, eb).cast(rt), rt, const=a.const and b.const)

    def divide(self, node: exp.Div) -> Typed:
        """``/``: DOUBLE division of numbers (FLOAT when only FLOATs and integers meet)."""
        a, b = self._operands(node)
        if _is_null_literal(a) or _is_null_literal(b):
            return null_of(pa.float64())
        for v in (a, b):
            if not is_numeric(v.type):
                raise SQLError(f"{snippet(node)}: / needs numbers, got {describe(v.type)}")
        floats = {t for t in (a.type, b.type) if is_float(t)}
        rt = pa.float32() if floats == {pa.float32()} and not (
            is_decimal(a.type) or is_decimal(b.type)) else pa.float64()
        return Typed(pc.divide(cast_to(a, rt), cast_to(b, rt)), rt, const=a.const and b.const)

    def _int_operands(self, node: exp.Binary, what: str) -> tuple[Typed, Typed, pa.DataType]:
        a, b = self._operands(node)
        if not (is_integer(a.type) or _is_null_literal(a)) or not (
                is_integer(b.type) or _is_null_literal(b)):
            refuse(what, node, f"{what} is compiled for integers only (got "
                               f"{describe(a.type)} and {describe(b.type)})")
        rt = self._common(a, b, node)
        if pa.types.is_null(rt):
            rt = pa.int32()
        return a, b, rt

    def _nonzero(self, b: Typed, rt: pa.DataType) -> Any:
        """The divisor with 0 replaced by NULL: DuckDB's ``x // 0`` and ``x % 0`` are NULL."""
        eb = cast_to(b, rt)
        return pc.if_else(pc.equal(eb, pc.scalar(pa.scalar(0, rt))),
                          pc.scalar(pa.scalar(None, rt)), eb)

    def int_div(self, node: exp.IntDiv) -> Typed:
        """``//`` on integers: truncated quotient; NULL for a zero divisor."""
        a, b, rt = self._int_operands(node, "integer division")
        return Typed(pc.divide_checked(cast_to(a, rt), self._nonzero(b, rt)), rt,
                     const=a.const and b.const)

    def mod(self, node: exp.Mod) -> Typed:
        """``%`` on integers: the sign of the dividend (as C and DuckDB); NULL for 0."""
        a, b, rt = self._int_operands(node, "modulo")
        ea, eb = cast_to(a, rt), self._nonzero(b, rt)
        q = pc.divide_checked(ea, eb)
        return Typed(pc.subtract_checked(ea, pc.multiply_checked(q, eb)), rt,
                     const=a.const and b.const)

    # ---- dates --------------------------------------------------------------------------

    def _interval_fold(self, op: str, a: Typed, interval: exp.Interval,
                       node: exp.Expr) -> Typed:
        """``DATE '...' +/- INTERVAL n unit``: a constant TIMESTAMP, as in DuckDB."""
        if op not in ("+", "-") or not a.const or not is_temporal(a.type) or a.value is None:
            refuse("date arithmetic", node, "only a constant DATE or TIMESTAMP "
                               "plus or minus an INTERVAL is compiled")
        n, unit = self._interval(interval)
        base = a.value
        when = base if isinstance(base, dt.datetime) else dt.datetime.combine(base, dt.time())
        when = _shift(when, -n if op == "-" else n, unit)
        t = pa.timestamp("us")
        return Typed(pc.scalar(pa.scalar(when, t)), t, const=True, value=when)

    def _days_fold(self, op: str, a: Typed, b: Typed, node: exp.Expr) -> Typed:
        """``DATE +/- INTEGER`` (days): a DATE, as in DuckDB; overflow checked."""
        if op in ("+", "-") and pa.types.is_date32(a.type) and (
                is_integer(b.type) or _is_null_literal(b)):
            days = a.expr.cast(pa.int32())
            n = cast_to(b, pa.int32()) if not _is_null_literal(b) else pc.scalar(
                pa.scalar(None, pa.int32()))
            fn = pc.add_checked if op == "+" else pc.subtract_checked
            return Typed(fn(days, n).cast(pa.date32()), pa.date32(), const=a.const and b.const)
        refuse("date arithmetic", node, "only DATE plus or minus an integer number of days, "
               "and a constant DATE or TIMESTAMP plus or minus an INTERVAL, are compiled")

    def _interval(self, node: exp.Interval) -> tuple[int, str]:
        unit = (node.args.get("unit") or exp.Var(this="DAY")).name.upper().rstrip("S")
        raw = node.this.name if node.this is not None else ""
        parts = raw.split()
        if len(parts) == 2:  # INTERVAL '30 days'
            raw, unit = parts[0], parts[1].upper().rstrip("S")
        if not re.match(r"^-?\d+$", raw) or unit not in ("DAY", "WEEK", "MONTH", "YEAR"):
            refuse("interval", node, "intervals of a whole number of days, weeks, "
                               "months or years are compiled")
        return int(raw), unit

    def extract(self, node: exp.Extract) -> Typed:
        """``EXTRACT(YEAR|MONTH|DAY FROM d)``: BIGINT."""
        part = node.this.name.upper()
        return self._part(part, self.compile(node.expression), node)

    def date_part(self, node: exp.Expr) -> Typed:
        """``year(d)``, ``month(d)``, ``day(d)``."""
        parts: dict[type, str] = {exp.Year: "YEAR", exp.Month: "MONTH", exp.Day: "DAY"}
        part = parts[type(node)]
        return self._part(part, self.compile(node.this), node)

    def _part(self, part: str, v: Typed, node: exp.Expr) -> Typed:
        fn = {"YEAR": pc.year, "MONTH": pc.month, "DAY": pc.day}.get(part)
        if fn is None or not is_temporal(v.type):
            refuse("date part", node, "YEAR, MONTH and DAY of a DATE or TIMESTAMP "
                               "are compiled")
        return Typed(fn(v.expr), pa.int64(), const=v.const)

    # ---- comparisons and logic ----------------------------------------------------------

    _CMP: ClassVar[dict[type, Callable[..., Any]]] = {
            exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.GT: pc.greater,
            exp.GTE: pc.greater_equal, exp.LT: pc.less, exp.LTE: pc.less_equal}

    def compare(self, node: exp.Binary) -> Typed:
        """``= <> < <= > >=`` in the operands' common type; NULL if either is NULL."""
        a, b = self._operands(node)
        return self._compare(type(node), a, b, node)

    def _compare(self, kind: type, a: Typed, b: Typed, node: exp.Expr) -> Typed:
        if _is_null_literal(a) or _is_null_literal(b):
            return null_of(pa.bool_())
        t = self._common(a, b, node)
        fn = self._CMP[kind]
        return Typed(fn(cast_to(a, t), cast_to(b, t)), pa.bool_(), const=a.const and b.const)

    def null_safe_eq(self, node: exp.Binary) -> Typed:
        """``IS [NOT] DISTINCT FROM``: NULLs compare equal, the result is never NULL."""
        a, b = self._operands(node)
        t = self._common(a, b, node)
        if pa.types.is_null(t):
            same: Any = pc.scalar(True)
        else:
            ea, eb = cast_to(a, t), cast_to(b, t)
            both_null = pc.and_kleene(pc.is_null(ea), pc.is_null(eb))
            same = pc.or_kleene(both_null, pc.coalesce(pc.equal(ea, eb), pc.scalar(False)))
        if isinstance(node, exp.NullSafeNEQ):
            same = pc.invert(same)
        return Typed(same, pa.bool_(), const=a.const and b.const)

    def connector(self, node: exp.Connector) -> Typed:
        """``AND`` / ``OR`` with SQL's three-valued logic (Kleene)."""
        fn = pc.and_kleene if isinstance(node, exp.And) else pc.or_kleene
        parts = [self.predicate(p) for p in node.flatten()]
        out = parts[0].expr
        for p in parts[1:]:
            out = fn(out, p.expr)
        return Typed(out, pa.bool_(), const=all(p.const for p in parts))

    def not_(self, node: exp.Not) -> Typed:
        """``NOT x``: NULL stays NULL."""
        if isinstance(node.this, exp.In) and node.this.args.get("query") is not None:
            refuse("NOT IN subquery", node, "subqueries are compiled (decorrelated into "
                   "joins) in WHERE, ON, HAVING and the SELECT list, not inside an "
                   "aggregate's argument or a GROUP BY key")
        v = self.predicate(node.this)
        return Typed(pc.invert(v.expr), pa.bool_(), const=v.const)

    def _negated(self, node: exp.Expr, v: Typed) -> Typed:
        if node.args.get("negate"):
            return Typed(pc.invert(v.expr), pa.bool_(), const=v.const)
        return v

    def is_(self, node: exp.Is) -> Typed:
        """``IS [NOT] NULL`` (``IS NOT NULL`` arrives as ``NOT (x IS NULL)``)."""
        if not isinstance(node.expression, exp.Null):
            refuse("IS", node, "only IS [NOT] NULL is compiled")
        v = self.compile(node.this)
        return self._negated(node, Typed(pc.is_null(v.expr), pa.bool_(), const=v.const))

    def in_(self, node: exp.In) -> Typed:
        """``x IN (a, b, ...)``: TRUE on a match, else NULL if x or an item is NULL."""
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            refuse("IN subquery", node, "subqueries are compiled (decorrelated into "
                               "joins) in WHERE, ON, HAVING and the SELECT list, not inside "
                               "an aggregate's argument or a GROUP BY key")
        x = self.compile(node.this)
        items = [self.compile(e) for e in node.expressions]
        adapted = [self._adapt(x, it, node)[1] for it in items]
        t = x.type
        for it in adapted:
            t = self._common(Typed(None, t), it, node)
        if pa.types.is_null(t):
            return null_of(pa.bool_())
        has_null = any(_is_null_literal(it) for it in adapted)
        values = [it for it in adapted if not _is_null_literal(it)]
        ex = cast_to(x, t)
        if values and all(it.const for it in values):
            arr = pa.array([constant(it).cast(t).as_py() for it in values], t)
            hit = pc.is_in(ex, value_set=arr)
        else:
            hit = pc.scalar(False)
            for it in values:
                hit = pc.or_kleene(hit, pc.equal(ex, cast_to(it, t)))
        nul = pc.scalar(pa.scalar(None, pa.bool_()))
        out = pc.if_else(pc.is_null(ex), nul, hit)
        if has_null:
            out = pc.if_else(pc.coalesce(out, pc.scalar(False)), pc.scalar(True), nul)
        return self._negated(node, Typed(out, pa.bool_(),
                                         const=x.const and all(i.const for i in items)))

    def between(self, node: exp.Between) -> Typed:
        """``x BETWEEN lo AND hi`` = ``x >= lo AND x <= hi``."""
        x = self.compile(node.this)
        lo = self._adapt(x, self.compile(node.args["low"]), node)[1]
        hi = self._adapt(x, self.compile(node.args["high"]), node)[1]
        ge = self._compare(exp.GTE, x, lo, node)
        le = self._compare(exp.LTE, x, hi, node)
        return self._negated(node, Typed(pc.and_kleene(ge.expr, le.expr), pa.bool_(),
                                         const=ge.const and le.const))

    def like(self, node: exp.Like | exp.ILike) -> Typed:
        """``LIKE`` / ``ILIKE`` with a constant pattern (``%`` and ``_``; no escapes)."""
        if node.args.get("escape") is not None:
            refuse("LIKE ... ESCAPE", node, "escape characters are not compiled")
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            refuse("LIKE", node, "the pattern must be a string literal")
        if "\\" in pattern.this:
            refuse("LIKE", node, "a backslash is an ordinary character in "
                               "DuckDB's LIKE but an escape in Arrow's; not compiled")
        v = self.compile(node.this)
        if _is_null_literal(v):
            return null_of(pa.bool_())
        if not is_string(v.type):
            raise SQLError(f"{snippet(node)}: LIKE needs a VARCHAR, got {describe(v.type)}")
        out = pc.match_like(v.expr, pattern=pattern.this, ignore_case=isinstance(node, exp.ILike))
        return self._negated(node, Typed(out, pa.bool_(), const=v.const))

    # ---- conditionals -------------------------------------------------------------------

    def _unify(self, values: Sequence[Typed], node: exp.Expr) -> tuple[pa.DataType, list[Any]]:
        """The branches' common type and each branch cast to it."""
        t: pa.DataType = pa.null()
        acc: Typed | None = None
        for v in values:
            if acc is None:
                acc, t = v, v.type
                continue
            t = self._common(acc, v, node)
            acc = Typed(None, t)
        if pa.types.is_null(t):
            t = pa.int32()  # DuckDB: CASE of only NULLs is INTEGER
        return t, [cast_to(v, t) for v in values]

    def case(self, node: exp.Case) -> Typed:
        """``CASE [x] WHEN ... THEN ... [ELSE ...] END``; no ELSE gives NULL."""
        subject = node.this
        conds: list[Any] = []
        results: list[Typed] = []
        subject_v = self.compile(subject) if subject is not None else None
        for when in node.args.get("ifs") or []:
            if subject_v is not None:
                w = self.compile(when.this)
                a, b = self._adapt(subject_v, w, when)
                cond = self._compare(exp.EQ, a, b, when)
            else:
                cond = self.predicate(when.this)
            conds.append(cond.expr)
            results.append(self.compile(when.args["true"]))
        default = node.args.get("default")
        else_v = self.compile(default) if default is not None else None
        t, exprs = self._unify(results + ([else_v] if else_v is not None else []), node)
        else_e = exprs.pop() if else_v is not None else pc.scalar(pa.scalar(None, t))
        out = pc.case_when(pc.make_struct(*conds, field_names=[f"c{i}" for i in range(
            len(conds))]), *exprs, else_e)
        return Typed(out, t)

    def if_(self, node: exp.If) -> Typed:
        """``IF(c, a, b)`` (DuckDB's function form of a two-branch CASE)."""
        cond = self.predicate(node.this)
        a = self.compile(node.args["true"])
        b = self.compile(node.args["false"]) if node.args.get("false") is not None else null_of(
            a.type if not pa.types.is_null(a.type) else pa.int32())
        t, (ea, eb) = self._unify([a, b], node)
        return Typed(pc.if_else(pc.coalesce(cond.expr, pc.scalar(False)), ea, eb), t)

    def coalesce(self, node: exp.Coalesce) -> Typed:
        """``COALESCE(a, b, ...)`` / ``IFNULL``: the first non-NULL, in the common type."""
        vals = [self.compile(node.this)] + [self.compile(e) for e in node.expressions]
        t, exprs = self._unify(vals, node)
        return Typed(pc.coalesce(*exprs), t, const=all(v.const for v in vals))

    def nullif(self, node: exp.Nullif) -> Typed:
        """``NULLIF(a, b)``: NULL where a = b, else a."""
        a = self.compile(node.this)
        b = self._adapt(a, self.compile(node.expression), node)[1]
        eq = self._compare(exp.EQ, a, b, node)
        t = a.type if not pa.types.is_null(a.type) else pa.int32()
        null = pc.scalar(pa.scalar(None, t))
        return Typed(pc.if_else(pc.coalesce(eq.expr, pc.scalar(False)), null, cast_to(a, t)), t)

    # ---- casts and functions ------------------------------------------------------------

    def cast(self, node: exp.Cast) -> Typed:
        """``CAST(x AS t)`` / ``x::t`` rounding as DuckDB does (not Arrow's truncation)."""
        if isinstance(node, exp.TryCast) or node.args.get("safe"):
            refuse("TRY_CAST", node, "a failed TRY_CAST is NULL, which Arrow's "
                               "cast does not offer; not compiled")
        t = arrow_type(node.to)
        v = self.compile(node.this)
        if _is_null_literal(v):
            return null_of(t)
        if v.type.equals(t):
            return v
        if v.const and v.value is not None and (v.literal == "string" or is_string(v.type)):
            return self._cast_literal(v, t, node)
        if is_float(v.type) and is_string(t):
            refuse("CAST", node, "a DOUBLE or FLOAT is written out differently by "
                               "Arrow and DuckDB; not compiled")
        e = v.expr
        if is_float(v.type) and is_integer(t):
            e = pc.round(e, 0, round_mode="half_to_even")  # DuckDB rounds half to even
        elif is_decimal(v.type) and is_integer(t):
            e = pc.round(e, 0, round_mode="half_towards_infinity")
        elif (is_decimal(v.type) and is_decimal(t) and t.scale < v.type.scale) or (
                is_float(v.type) and is_decimal(t)):
            e = pc.round(e, t.scale, round_mode="half_towards_infinity")
        if is_integer(v.type) and is_decimal(t):
            return Typed(cast_to(v, t), t, const=v.const)
        try:
            out = e.cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise UnsupportedSQLError(f"CAST {snippet(node)}", f"Arrow cannot cast "
                                      f"{describe(v.type)} to {describe(t)}") from exc
        return Typed(out, t, const=v.const)

    def abs_(self, node: exp.Abs) -> Typed:
        """``abs(x)``, same type, overflow checked."""
        v = self.compile(node.this)
        if not is_numeric(v.type):
            raise SQLError(f"{snippet(node)}: abs needs a number, got {describe(v.type)}")
        fn = pc.abs if is_float(v.type) else pc.abs_checked
        return Typed(fn(v.expr), v.type, const=v.const)

    def string_fn(self, node: exp.Expr) -> Typed:
        """``upper(s)``, ``lower(s)``."""
        v = self._string_arg(node.this, node)
        fn = pc.utf8_upper if isinstance(node, exp.Upper) else pc.utf8_lower
        return Typed(fn(v.expr), pa.string(), const=v.const)

    def _string_arg(self, arg: exp.Expr, node: exp.Expr) -> Typed:
        v = self.compile(arg)
        if _is_null_literal(v):
            return null_of(pa.string())
        if not is_string(v.type):
            raise SQLError(f"{snippet(node)}: needs a VARCHAR, got {describe(v.type)}")
        return Typed(cast_to(v, pa.string()), pa.string(), const=v.const, value=v.value)

    def length(self, node: exp.Length) -> Typed:
        """``length(s)``: characters, BIGINT."""
        v = self._string_arg(node.this, node)
        return Typed(pc.utf8_length(v.expr).cast(pa.int64()), pa.int64(), const=v.const)

    def substring(self, node: exp.Substring) -> Typed:
        """``substring(s, start[, length])`` with constant start >= 1 and length >= 0."""
        v = self._string_arg(node.this, node)
        start_n, len_n = node.args.get("start"), node.args.get("length")
        try:
            start = int(start_n.name) if isinstance(start_n, exp.Literal) else None
            length = int(len_n.name) if isinstance(len_n, exp.Literal) else (
                -1 if len_n is None else None)
        except ValueError:
            start = length = None
        if start is None or length is None or start < 1:
            refuse("substring", node, "only constant start >= 1 and length are "
                               "compiled")
        stop = None if length == -1 else start - 1 + length
        kwargs: dict[str, Any] = {"start": start - 1}
        if stop is not None:
            kwargs["stop"] = stop
        return Typed(pc.utf8_slice_codeunits(v.expr, **kwargs), pa.string(), const=v.const)

    def concat(self, node: exp.Expr) -> Typed:
        """``a || b`` (NULL if either is NULL); ``concat(...)`` skips NULLs."""
        args = ([node.this, node.expression] if isinstance(node, exp.DPipe)
                else list(node.expressions))
        vals = []
        for a in args:
            v = self.compile(a)
            if _is_null_literal(v):
                v = null_of(pa.string())
            elif not is_string(v.type):
                if is_float(v.type):
                    refuse("concatenation", node, "a DOUBLE is written out "
                                       "differently by Arrow and DuckDB; not compiled")
                v = Typed(v.expr.cast(pa.string()), pa.string(), const=v.const)
            vals.append(cast_to(v, pa.string()))
        if isinstance(node, exp.DPipe):
            out = pc.binary_join_element_wise(*vals, pc.scalar(""))
        else:
            out = pc.binary_join_element_wise(*vals, pc.scalar(""),
                                              null_handling="replace", null_replacement="")
        return Typed(out, pa.string())

    def round_(self, node: exp.Round) -> Typed:
        """``round(x[, n])``: half away from zero; a decimal keeps precision, scale n."""
        v = self.compile(node.this)
        dec = node.args.get("decimals")
        n = 0
        if dec is not None:
            d = self.compile(dec)
            if d.literal != "int":
                refuse("round", node, "the number of digits must be an integer "
                                   "literal")
            n = int(d.value)
        if is_integer(v.type):
            return v
        if is_decimal(v.type):
            if n >= v.type.scale:
                return v
            if n < 0:
                refuse("round", node, "a negative number of digits is not "
                                   "compiled for DECIMAL")
            t = pa.decimal128(v.type.precision, n)
            out = pc.round(v.expr, n, round_mode="half_towards_infinity")
            return Typed(out.cast(t), t, const=v.const)
        if is_float(v.type):
            return Typed(pc.round(v.expr, n, round_mode="half_towards_infinity"), v.type,
                         const=v.const)
        raise SQLError(f"{snippet(node)}: round needs a number, got {describe(v.type)}")


def _shift(when: dt.datetime, n: int, unit: str) -> dt.datetime:
    """``when`` moved by ``n`` units; months clamp the day to the month's end."""
    if unit == "DAY":
        return when + dt.timedelta(days=n)
    if unit == "WEEK":
        return when + dt.timedelta(weeks=n)
    months = n * (12 if unit == "YEAR" else 1)
    m = when.month - 1 + months
    year, month = when.year + m // 12, m % 12 + 1
    day = min(when.day, calendar.monthrange(year, month)[1])
    return when.replace(year=year, month=month, day=day)
