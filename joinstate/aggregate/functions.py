"""The aggregate functions of a group-by: each one's state fields, fold and output.

One class per function (count(*), count, sum of integers or decimals, sum of floats,
min/max), behind :class:`Agg`: which fields it adds to a group's stored row, how a
batch folds into them (:class:`Fold` carries the batch, its groups and their old
state), and how the output column is read back from the state.  Every check (a count
below zero or above count(*), a sum left without values, an overflow) raises before
anything is staged.  The exact sums use :class:`joinstate.zset.ExactInts`; min/max
read their candidates from the value multiset (:mod:`joinstate.aggregate.minmax`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate._bytes import Bytes
from joinstate.aggregate.values import (
    contiguous,
    f64,
    i64,
    order_decode,
    order_kind,
    take_or_null,
    valid_mask,
)
from joinstate.errors import OverRetractionError, SchemaMismatchError
from joinstate.zset import ExactInts, checked_add, checked_sum_by

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "FUNCS",
    "Agg",
    "AggFunc",
    "AggSpec",
    "_Count",
    "_CountStar",
    "Extreme",
    "_FloatSum",
    "Fold",
    "_Sum",
]

AggFunc = Literal["sum", "count", "min", "max"]
FUNCS = ("sum", "count", "min", "max")
_BIN = pa.large_binary()
_I64 = pa.int64()


class AggSpec(NamedTuple):
    """One aggregate: output column ``name`` = ``func(column)`` (``column`` None: count(*))."""

    name: str
    func: AggFunc
    column: str | None


def _int64s(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A stored count as an output column: NULL (an absent group) as 0."""
    arr = contiguous(col)
    if arr.null_count == 0 and arr.type == _I64:
        return arr
    return pa.array(i64(arr), _I64)


class Fold:
    """What folding one batch into the touched groups' state needs to know."""

    __slots__ = ("_all", "_n_delta", "describe", "extremes", "inv", "n_groups", "n_new", "old",
                 "table", "w")

    def __init__(self, table: pa.Table, w: np.ndarray, inv: np.ndarray, n_groups: int,
                 old: pa.Table, n_new: np.ndarray, describe: Callable[[int], str],
                 n_delta: np.ndarray | None = None) -> None:
        self.table = table
        self.w = w
        self.inv = inv
        self.n_groups = n_groups
        self.old = old
        self.n_new = n_new
        self.describe = describe
        self.extremes: dict[str, pa.Array] = {}
        # Every row, and count(*)'s change per group: what a column without NULLs has.
        # Shared, so that the aggregates over such columns (most) neither build the row
        # list nor sum the weights again, each.
        self._all = np.arange(table.num_rows, dtype=np.int64)
        self._n_delta = n_delta

    def over(self, g: int, what: str, old: object, new: object) -> OverRetractionError:
        """The error for a count of group ``g`` that would become impossible."""
        return self.impossible(g, f"take {what} from {old} to {new}")

    def impossible(self, g: int, what: str) -> OverRetractionError:
        """The error for a batch that would ``what`` in group ``g``."""
        return OverRetractionError(
            f"{self.describe(g)}: the batch would {what}; retract only rows that are "
            "present; nothing of the batch was applied"
        )

    def valid_rows(self, column: str) -> tuple[pa.Array, np.ndarray]:
        """The non-NULL values of ``column`` and the rows they are in."""
        arr = contiguous(self.table.column(column))
        if arr.null_count == 0:
            return arr, self._all
        rows = np.flatnonzero(valid_mask(arr))
        return arr.take(pa.array(rows)), rows

    def count_delta(self, rows: np.ndarray, what: str) -> np.ndarray:
        """The summed weight of ``rows`` per group."""
        if rows is self._all and self._n_delta is not None:
            return self._n_delta
        return checked_sum_by(self.inv[rows], self.w[rows], self.n_groups, what)

    def check_count(self, old: np.ndarray, new: np.ndarray, what: str) -> None:
        """A non-NULL count must stay within [0, count(*)]."""
        bad = np.flatnonzero((new < 0) | (new > self.n_new))
        if len(bad):
            g = int(bad[0])
            raise self.over(g, f"{what} (with count(*) {int(self.n_new[g])})",
                            int(old[g]), int(new[g]))


class Agg:
    """One aggregate: its state fields, how a batch folds into them, its output."""

    def __init__(self, spec: AggSpec, index: int, in_type: pa.DataType | None) -> None:
        self.spec = spec
        self.f = f"a{index}"
        self.in_type = in_type
        col = "*" if spec.column is None else repr(spec.column)
        self.label = f"{spec.func}({col}) [{spec.name!r}]"

    def fields(self) -> list[pa.Field]:
        """The fields it adds to a group's stored row (named ``a<index>...``)."""
        return []

    def out_type(self) -> pa.DataType:
        """The type of its output column."""
        return _I64

    def fold(self, ctx: Fold) -> list[pa.Array]:
        """Its fields' new values for every touched group (raises before any write)."""
        return []

    def output(self, st: pa.Table) -> pa.Array:
        """Its output column, read from stored rows ``st``."""
        raise NotImplementedError


class _CountStar(Agg):
    """count(*): the group's ``n``, kept for every group anyway."""

    def output(self, st: pa.Table) -> pa.Array:
        return _int64s(st.column("n"))


class _Count(Agg):
    """count(column): the number of non-NULL values."""

    def fields(self) -> list[pa.Field]:
        return [pa.field(self.f, _I64)]

    def fold(self, ctx: Fold) -> list[pa.Array]:
        assert self.spec.column is not None
        _, rows = ctx.valid_rows(self.spec.column)
        what = f"{self.label}: the count of non-NULL values"
        old = i64(ctx.old.column(self.f))
        new = checked_add(old, ctx.count_delta(rows, what), what)
        ctx.check_count(old, new, what)
        return [pa.array(new, _I64)]

    def output(self, st: pa.Table) -> pa.Array:
        return _int64s(st.column(self.f))


class _Sum(Agg):
    """sum of integers (int64, checked) or decimals (decimal128(38,s), exact)."""

    def __init__(self, spec: AggSpec, index: int, in_type: pa.DataType | None) -> None:
        super().__init__(spec, index, in_type)
        assert in_type is not None
        self.decimal = pa.types.is_decimal(in_type)
        self.type = pa.decimal128(38, in_type.scale) if self.decimal else _I64

    def fields(self) -> list[pa.Field]:
        return [pa.field(self.f, self.type), pa.field(self.f + ".nn", _I64)]

    def out_type(self) -> pa.DataType:
        return self.type

    def _stored(self, col: pa.ChunkedArray | pa.Array) -> ExactInts:
        if not self.decimal:
            return ExactInts(i64(col))
        if col.null_count:
            col = pc.fill_null(col, pa.scalar(0, self.type))
        return ExactInts.of_decimals(contiguous(col))

    def fold(self, ctx: Fold) -> list[pa.Array]:
        assert self.spec.column is not None
        vals, rows = ctx.valid_rows(self.spec.column)
        what = f"{self.label}: the count of non-NULL values"
        old_nn = i64(ctx.old.column(self.f + ".nn"))
        nn = checked_add(old_nn, ctx.count_delta(rows, what), what)
        ctx.check_count(old_nn, nn, what)
        v = ExactInts.of_decimals(vals) if self.decimal else ExactInts.of_ints(vals)
        old = self._stored(ctx.old.column(self.f))
        new = old.plus(v.group_sums(ctx.inv[rows], ctx.w[rows], ctx.n_groups))
        residue = np.flatnonzero((nn == 0) & ~new.is_zero())
        if len(residue):
            # Every non-NULL value retracted, yet the sum is not 0: a retracted row
            # carried another value than the one inserted.
            g = int(residue[0])
            raise ctx.impossible(g, f"leave {self.label} = {new.exact(g)} with no non-NULL "
                                    "value left")

        def what_g(g: int) -> str:
            return f"{ctx.describe(g)}: {self.label}"

        if self.decimal:
            return [new.to_decimal(self.type, what_g), pa.array(nn, _I64)]
        return [pa.array(new.to_int64(what_g), _I64), pa.array(nn, _I64)]

    def output(self, st: pa.Table) -> pa.Array:
        nn = i64(st.column(self.f + ".nn"))
        if nn.all():  # every group has a value (nn is never negative): the sums as stored
            return contiguous(st.column(self.f))
        return contiguous(pc.if_else(pa.array(nn > 0), st.column(self.f),
                                     pa.scalar(None, self.type)))


class _FloatSum(Agg):
    """sum of floats: a compensated sum of the finite values, NaN/inf by count."""

    _COUNTS = (".nn", ".nan", ".pinf", ".ninf")
    _NAMES = ("non-NULL", "NaN", "+inf", "-inf")

    def fields(self) -> list[pa.Field]:
        return [pa.field(self.f, pa.float64()), pa.field(self.f + ".lo", pa.float64())] + [
            pa.field(self.f + s, _I64) for s in self._COUNTS
        ]

    def out_type(self) -> pa.DataType:
        return pa.float64()

    def fold(self, ctx: Fold) -> list[pa.Array]:
        assert self.spec.column is not None
        vals, rows = ctx.valid_rows(self.spec.column)
        v = np.asarray(vals.cast(pa.float64()).to_numpy(zero_copy_only=False), np.float64)
        masks = (np.ones(len(v), bool), np.isnan(v), v == np.inf, v == -np.inf)
        counts = []
        for suffix, name, mask in zip(self._COUNTS, self._NAMES, masks, strict=True):
            what = f"{self.label}: the count of {name} values"
            old_c = i64(ctx.old.column(self.f + suffix))
            new_c = checked_add(old_c, ctx.count_delta(rows[mask], what), what)
            ctx.check_count(old_c, new_c, what)
            counts.append(new_c)
        nn = counts[0]
        special = counts[1] + counts[2] + counts[3]
        bad = np.flatnonzero(special > nn)
        if len(bad):
            g = int(bad[0])
            raise ctx.impossible(g, f"leave {self.label} with more NaN or infinite values "
                                    f"({int(special[g])}) than non-NULL ones ({int(nn[g])})")
        fin = np.isfinite(v)
        with np.errstate(over="ignore", invalid="ignore"):
            d = np.bincount(ctx.inv[rows[fin]], weights=v[fin] * ctx.w[rows[fin]],
                            minlength=ctx.n_groups)
            hi, lo = f64(ctx.old.column(self.f)), f64(ctx.old.column(self.f + ".lo"))
            s = hi + d  # Knuth's two-sum: s + err == hi + d exactly
            bp = s - hi
            err = (hi - (s - bp)) + (d - bp)
            lo = lo + err
        empty = nn == 0  # no value left: forget the rounding residue
        s[empty] = 0.0
        lo[empty] = 0.0
        return [pa.array(s, pa.float64()), pa.array(lo, pa.float64())] + [
            pa.array(c, _I64) for c in counts
        ]

    def output(self, st: pa.Table) -> pa.Array:
        nn, nan, pinf, ninf = (i64(st.column(self.f + s)) for s in self._COUNTS)
        with np.errstate(over="ignore", invalid="ignore"):
            v = f64(st.column(self.f)) + f64(st.column(self.f + ".lo"))
        v[pinf > 0] = np.inf
        v[ninf > 0] = -np.inf
        v[(nan > 0) | ((pinf > 0) & (ninf > 0))] = np.nan
        return pa.array(v, pa.float64(), mask=nn == 0)


class Extreme(Agg):
    """min / max: the current extreme's order bytes; the multiset lives in its own family."""

    def __init__(self, spec: AggSpec, index: int, in_type: pa.DataType | None,
                 slot: int, kind: str) -> None:
        super().__init__(spec, index, in_type)
        self.slot = slot
        self.kind = kind
        self.largest = spec.func == "max"

    def fields(self) -> list[pa.Field]:
        """The current extreme's order-preserving bytes (NULL: no value)."""
        return [pa.field(self.f, _BIN)]

    def out_type(self) -> pa.DataType:
        """The input column's type."""
        assert self.in_type is not None
        return self.in_type

    def fold(self, ctx: Fold) -> list[pa.Array]:
        """The new extremes, found by the multiset first (``ctx.extremes``)."""
        new = ctx.extremes[self.f]
        bad = np.flatnonzero((ctx.n_new == 0) & valid_mask(new))
        if len(bad):
            g = int(bad[0])
            raise ctx.impossible(g, f"remove every row of the group while {self.label} "
                                    "still has values")
        return [new]

    def output(self, st: pa.Table) -> pa.Array:
        """The extremes decoded back to the input column's type."""
        assert self.in_type is not None
        col = contiguous(st.column(self.f))
        valid = valid_mask(col)
        idx = np.flatnonzero(valid)
        vals = order_decode(Bytes.from_arrow(col.take(pa.array(idx))), self.kind, self.in_type)
        if len(idx) == len(col):
            return vals
        pos = np.full(len(col), -1, dtype=np.int64)
        pos[idx] = np.arange(len(idx))
        return take_or_null(vals, pos)


def make(index: int, spec: AggSpec, input_schema: pa.Schema,
         fail: Callable[[str], SchemaMismatchError], slot: Callable[[str, str], int]) -> Agg:
    """The aggregate function of ``spec``, the ``index``-th of its group-by.

    Raises ``fail(reason)`` for an input type the function cannot aggregate;
    ``slot(column, order kind)`` gives a min/max input column its multiset slot.
    """
    if spec.column is None:
        return _CountStar(spec, index, None)
    t = input_schema.field(spec.column).type
    if spec.func == "count":
        if order_kind(t) is None and not pa.types.is_null(t):
            raise fail(f"aggregate {spec.name!r}: count({spec.column!r}) of type {t} "
                       "is not supported")
        return _Count(spec, index, t)
    if spec.func == "sum":
        if pa.types.is_integer(t) or pa.types.is_decimal128(t):
            return _Sum(spec, index, t)
        if pa.types.is_floating(t) and not pa.types.is_float16(t):
            return _FloatSum(spec, index, t)
        raise fail(f"aggregate {spec.name!r}: sum({spec.column!r}) of type {t}: sum "
                   "takes integers, float32/float64 or decimal128")
    kind = order_kind(t)
    if kind is None:
        raise fail(f"aggregate {spec.name!r}: {spec.func}({spec.column!r}) of type "
                   f"{t} is not supported (integers, floats, decimal128, strings, "
                   "binaries, bool, dates, times, timestamps, durations)")
    return Extreme(spec, index, t, slot(spec.column, kind), kind)
