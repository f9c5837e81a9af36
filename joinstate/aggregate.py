r"""Aggregation state of one ``group_by(...).aggregate(...)``, kept in RocksDB.

A pipeline's group-by turns a Z-set of input rows into a Z-set of output rows (one per
group: the key values, then the aggregates).  This module keeps what that needs, so that
a batch costs O(groups it touches), never a rescan of a group's rows:

``agg[<base>]`` (:func:`joinstate.names.aggregate_cf`), one entry per group
    key: 8-byte big-endian ``xxh3`` of the group's canonical key, then the canonical key
    itself.  The canonical key is, per key column, one marker byte (0 NULL, 1 a value)
    followed by the column's :class:`~joinstate.keys.KeyCodec` bytes (zeros for NULL):
    the join keys' encoding, so ``-0.0``/``0.0`` and every NaN form one group, plus the
    marker because a join key never matches NULL while SQL ``GROUP BY`` makes NULL one
    group.  Prefix-free, so one group's key never starts another's.
    value: a :class:`~joinstate.codec.RowCodec` row of the *state schema*: the key
    values (``k0``..), ``n`` = count(*) (the weight of the group's rows), then each
    aggregate's fields (``a<i>``...): count(col) its count; sum of integers / decimals
    the exact sum (int64 / decimal128(38,s)) and the count of non-NULL values that says
    NULL from 0; sum of floats a compensated pair (hi, lo) of the finite values plus the
    counts of non-NULL values, NaNs, +inf and -inf, so that inserting and retracting a
    NaN or an infinity leaves no trace; min/max the order-preserving bytes (below) of
    the current extreme, NULL when the group has no non-NULL value.
    Counters: ``entries`` = groups stored, ``rows`` = the summed count(*).

``agg[<base>].minmax`` (:func:`joinstate.names.aggregate_values_cf`), only with min/max
    key: group key (as above) + one slot byte (which min/max input column) + the value's
    order-preserving bytes; value: its multiplicity, int64 little-endian.  Bytewise key
    order is value order, so after a retraction of a group's extreme the new one is the
    first (min) or last (max) surviving entry under ``group key + slot``: one bounded
    iterator read per group whose extreme went away, never a scan of the group.
    Counters: ``entries`` = distinct (group, column, value), ``rows`` = their total.

Order-preserving value bytes: integers, dates, times, timestamps and durations as int64
big-endian with the sign bit flipped (uint64 plain big-endian); floats as float64 with
``-0.0`` folded into ``0.0`` and one NaN, big-endian with the sign bit flipped for
non-negative values and every bit flipped for negative ones (NaN sorts above +inf, as
in Spark); decimal128 as its 16 bytes big-endian, sign bit flipped; bool one byte;
strings and binaries their raw bytes (they are the last part of the key, so they need
no terminator: bytewise order is code-point order).

Why the multiset is a separate family and not a list in the group's value: a group can
hold millions of rows; rewriting its value on every change would cost O(group).

Everything a batch changes is *staged* into the caller's transaction after every check
passed (over-retraction, int64 / decimal overflow), so a failing batch changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import rocksdict as rd

from joinstate import _rocks
from joinstate._bytes import Bytes
from joinstate.codec import RowCodec
from joinstate.errors import (
    OverRetractionError,
    SchemaMismatchError,
    StateCorruptedError,
    WeightOverflowError,
)
from joinstate.keys import KeyCodec, hash_prefix, prefix_bytes, single_plan
from joinstate.names import aggregate_cf, aggregate_values_cf
from joinstate.schema import WEIGHT
from joinstate.zset import (
    I64_MAX,
    I64_MIN,
    Groups,
    checked_add,
    checked_sum,
    checked_sum_by,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from joinstate.db import Database
    from joinstate.transaction import Transaction

__all__ = ["AggSpec", "GroupState"]

AggFunc = Literal["sum", "count", "min", "max"]
_FUNCS = ("sum", "count", "min", "max")
_SAFE = float(2**62)  # below this bound (in float64) no int64 result can have wrapped
_SIGN = np.uint64(1 << 63)
_DEC_MAX = 10**38 - 1
_BIN = pa.large_binary()
_I64 = pa.int64()
_MAX_SLOTS = 255  # min/max input columns: the slot byte, and slot + 1 bounds a seek


class AggSpec(NamedTuple):
    """One aggregate: output column ``name`` = ``func(column)`` (``column`` None: count(*))."""

    name: str
    func: AggFunc
    column: str | None


# ---- exact integers ------------------------------------------------------------------

class _Exact:
    """Exact integers: int64 where they provably fit, Python ints for the rest.

    Sums of decimals may legitimately exceed int64 (decimal128(38,s) holds 38 digits)
    and sums of int64 may pass through out-of-range values before coming back, so the
    arithmetic must be exact.  A float64 bound proves the common case safe (as in
    :mod:`joinstate.zset`); only entries near the int64 limits go through Python ints.
    """

    __slots__ = ("big", "small")

    def __init__(self, small: np.ndarray, big: dict[int, int] | None = None) -> None:
        self.small = small
        self.big = big if big is not None else {}

    def exact(self, i: int) -> int:
        """Entry ``i`` as a Python int."""
        return self.big[i] if i in self.big else int(self.small[i])

    @classmethod
    def of_ints(cls, arr: pa.Array) -> _Exact:
        """Integer values (no NULLs) of any Arrow integer type."""
        v = np.asarray(arr.to_numpy(zero_copy_only=False))
        if v.dtype == np.uint64:
            over = np.flatnonzero(v > np.uint64(I64_MAX))
            small = v.astype(np.int64)
            big = {i: int(v[i]) for i in over.tolist()}
            small[over] = 0
            return cls(small, big)
        return cls(v.astype(np.int64))

    @classmethod
    def of_decimals(cls, arr: pa.Array) -> _Exact:
        """The unscaled values of decimal128 values (no NULLs)."""
        raw = _fixed_view(arr, 16).view("<i8")
        lo, hi = raw[:, 0], raw[:, 1]
        fits = hi == (lo >> 63)
        small = np.where(fits, lo, 0)
        big = {i: int.from_bytes(raw[i].tobytes(), "little", signed=True)
               for i in np.flatnonzero(~fits).tolist()}
        return cls(small, big)

    def group_sums(self, inv: np.ndarray, w: np.ndarray, n_groups: int) -> _Exact:
        """Per group, the exact sum of ``value * weight``."""
        bound = np.bincount(
            inv, weights=np.abs(self.small.astype(np.float64)) * np.abs(w.astype(np.float64)),
            minlength=n_groups,
        )
        risky = bound >= _SAFE
        if self.big:
            risky[inv[list(self.big)]] = True
        safe = ~risky[inv]
        small = np.zeros(n_groups, dtype=np.int64)
        np.add.at(small, inv[safe], self.small[safe] * w[safe])
        big: dict[int, int] = {}
        for r in np.flatnonzero(~safe).tolist():
            g = int(inv[r])
            big[g] = big.get(g, 0) + self.exact(r) * int(w[r])
        return _Exact(small, big)

    def plus(self, other: _Exact) -> _Exact:
        """Element-wise exact sum."""
        risky = np.abs(self.small.astype(np.float64)) + np.abs(other.small.astype(np.float64)) \
            >= _SAFE
        for g in (*self.big, *other.big):
            risky[g] = True
        small = np.where(risky, 0, self.small + np.where(risky, 0, other.small))
        big = {g: self.exact(g) + other.exact(g) for g in np.flatnonzero(risky).tolist()}
        return _Exact(small, big)

    def is_zero(self) -> np.ndarray:
        """Mask of the zero entries."""
        z = self.small == 0
        for g, v in self.big.items():
            z[g] = v == 0
        return z

    def to_int64(self, what: Callable[[int], str]) -> np.ndarray:
        """As int64; :class:`WeightOverflowError` (naming ``what(i)``) if one does not fit."""
        out = self.small.copy()
        for g, v in self.big.items():
            if not I64_MIN <= v <= I64_MAX:
                raise WeightOverflowError(
                    f"{what(g)} would be {v}, outside the int64 range of the sum's type "
                    f"[{I64_MIN}, {I64_MAX}]; nothing of the batch was applied"
                )
            out[g] = v
        return out

    def to_decimal(self, t: pa.DataType, what: Callable[[int], str]) -> pa.Array:
        """As decimal128 ``t`` (38 digits); :class:`WeightOverflowError` beyond them."""
        n = len(self.small)
        raw = np.empty((n, 2), dtype="<i8")
        raw[:, 0] = self.small
        raw[:, 1] = self.small >> 63
        for g, v in self.big.items():
            if abs(v) > _DEC_MAX:
                raise WeightOverflowError(
                    f"{what(g)} would have {len(str(abs(v)))} digits, more than the 38 of "
                    f"{t}; nothing of the batch was applied"
                )
            raw[g] = np.frombuffer(v.to_bytes(16, "little", signed=True), dtype="<i8")
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(raw)])


# ---- column helpers ------------------------------------------------------------------

def _array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _i64(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 column as numpy, NULL (an absent group) as 0."""
    return np.asarray(pc.fill_null(col, 0).to_numpy(), dtype=np.int64)


def _f64(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(col, 0.0).to_numpy(), dtype=np.float64)


def _fixed_view(arr: pa.Array, width: int) -> np.ndarray:
    """The ``(n, width)`` bytes of a fixed-width array's values (no copy)."""
    n = len(arr)
    buf = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return buf[arr.offset * width : (arr.offset + n) * width].reshape(n, width)


def _take(arr: pa.Array | pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    """Gather by position; -1 gives NULL."""
    return _array(arr).take(pa.array(idx, type=_I64, mask=idx < 0))


def _canonical(arr: pa.Array) -> pa.Array:
    """Float values with ``-0.0`` folded into ``0.0`` and one NaN (group keys, as joins)."""
    if not pa.types.is_floating(arr.type):
        return arr
    arr = pc.if_else(pc.equal(arr, 0), pa.scalar(0.0, arr.type), arr)
    return pc.if_else(pc.is_nan(arr), pa.scalar(float("nan"), arr.type), arr)


def _group_bytes(b: Bytes) -> Groups:
    """Group equal byte strings (Arrow's hash table: exact, no per-row Python)."""
    n = len(b)
    if n == 0:
        return Groups(np.zeros(0, np.int64), np.zeros(0, np.int64))
    if b.width == 0:
        return Groups(np.zeros(n, np.int64), np.zeros(1, np.int64))
    if b.width is not None:  # fixed_size_binary hashes 2-4x faster than large_binary
        arr = pa.Array.from_buffers(pa.binary(b.width), n, [None, pa.py_buffer(b.data)])
    else:
        arr = b.arrow()
    enc = pc.dictionary_encode(arr)
    inv = np.asarray(enc.indices.to_numpy(), dtype=np.int64)
    first = np.empty(len(enc.dictionary), dtype=np.int64)
    first[inv[::-1]] = np.arange(n - 1, -1, -1, dtype=np.int64)
    return Groups(inv, first)


def _best(groups: np.ndarray, values: pa.Array, n_groups: int, largest: bool) -> pa.Array:
    """Per group, the smallest (or largest) of ``values`` (bytewise); NULL without any."""
    if not len(groups):
        return pa.nulls(n_groups, _BIN)
    t = pa.table({"g": groups, "v": values})
    order = np.asarray(pc.sort_indices(
        t, sort_keys=[("g", "ascending"), ("v", "descending" if largest else "ascending")]
    ).to_numpy(), dtype=np.int64)
    gs = groups[order]
    head = np.ones(len(gs), dtype=bool)
    head[1:] = gs[1:] != gs[:-1]
    sel = order[head]
    pos = np.full(n_groups, -1, dtype=np.int64)
    pos[groups[sel]] = np.arange(len(sel))
    return _take(values.take(pa.array(sel)), pos)


def _better(a: pa.Array, b: pa.Array, largest: bool) -> pa.Array:
    """Element-wise the smaller (larger) of two byte arrays; NULL loses."""
    cmp = pc.greater(a, b) if largest else pc.less(a, b)
    take_a = pc.or_(pc.fill_null(cmp, False), pc.is_null(b))
    return pc.if_else(take_a, a, b)


# ---- order-preserving value bytes ----------------------------------------------------

def _order_kind(t: pa.DataType) -> str | None:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "u64" if t == pa.uint64() else "int"
    if (pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t)
            or pa.types.is_duration(t)):
        return "int"
    if pa.types.is_floating(t) and not pa.types.is_float16(t):
        return "float"
    if pa.types.is_decimal128(t):
        return "dec"
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        return "var"
    if pa.types.is_fixed_size_binary(t):
        return "fixed"
    return None


def _storage(t: pa.DataType) -> pa.DataType:
    """The integer type with ``t``'s memory layout (dates, times ... are integers)."""
    if pa.types.is_integer(t):
        return t
    return pa.int32() if pa.types.is_date32(t) or pa.types.is_time32(t) else _I64


def _order_encode(arr: pa.Array, kind: str) -> Bytes:
    """Order-preserving bytes of non-NULL values (see the module docstring)."""
    n = len(arr)
    if kind == "var":
        return Bytes.from_arrow(arr.cast(_BIN))
    if kind == "bool":
        vals = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.uint8)
        return Bytes.from_fixed(vals.reshape(n, 1))
    if kind == "fixed":
        return Bytes.from_fixed(_fixed_view(arr, arr.type.byte_width))
    if kind == "dec":
        be = _fixed_view(arr, 16)[:, ::-1].copy()
        be[:, 0] ^= 0x80
        return Bytes.from_fixed(be)
    if kind == "float":
        v = np.array(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
        v[v == 0] = 0.0
        v[np.isnan(v)] = np.nan
        u = v.view(np.uint64)
        u = np.where((u & _SIGN) != 0, ~u, u | _SIGN)
    elif kind == "u64":
        u = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.uint64)
    else:
        st = _storage(arr.type)
        ints = (arr if st == arr.type else arr.view(st)).to_numpy(zero_copy_only=False)
        u = np.asarray(ints).astype(np.int64).view(np.uint64) ^ _SIGN
    return Bytes.from_fixed(u.astype(">u8").view(np.uint8).reshape(n, 8))


def _order_decode(b: Bytes, kind: str, t: pa.DataType) -> pa.Array:
    """Values of type ``t`` back from their order-preserving bytes."""
    n = len(b)
    if n == 0:
        return pa.array([], type=t)
    if kind == "var":
        return b.arrow().cast(t)
    if b.width is None:
        raise StateCorruptedError(
            f"stored min/max values of type {t} have different lengths: the catalog and "
            "the data disagree"
        )
    mat = np.ascontiguousarray(b.matrix())
    if kind == "bool":
        return pa.array(mat[:, 0].astype(bool), pa.bool_())
    if kind == "fixed":
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(mat)])
    if kind == "dec":
        be = mat.copy()
        be[:, 0] ^= 0x80
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(np.ascontiguousarray(be[:, ::-1]))])
    u = mat.view(">u8").reshape(n).astype(np.uint64)
    if kind == "float":
        u = np.where((u & _SIGN) != 0, u ^ _SIGN, ~u)
        return pa.array(u.view(np.float64), pa.float64()).cast(t)
    if kind == "u64":
        return pa.array(u, pa.uint64())
    st = _storage(t)
    out = pa.array((u ^ _SIGN).view(np.int64), _I64).cast(st)
    return out if st == t else out.view(t)


# ---- one aggregate -------------------------------------------------------------------

class _Fold:
    """What folding one batch into the touched groups' state needs to know."""

    __slots__ = ("describe", "extremes", "inv", "n_groups", "n_new", "old", "table", "w")

    def __init__(self, table: pa.Table, w: np.ndarray, inv: np.ndarray, n_groups: int,
                 old: pa.Table, n_new: np.ndarray, describe: Callable[[int], str]) -> None:
        self.table = table
        self.w = w
        self.inv = inv
        self.n_groups = n_groups
        self.old = old
        self.n_new = n_new
        self.describe = describe
        self.extremes: dict[str, pa.Array] = {}

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
        arr = _array(self.table.column(column))
        if arr.null_count == 0:
            return arr, np.arange(len(arr), dtype=np.int64)
        rows = np.flatnonzero(_valid(arr))
        return arr.take(pa.array(rows)), rows

    def count_delta(self, rows: np.ndarray, what: str) -> np.ndarray:
        """The summed weight of ``rows`` per group."""
        return checked_sum_by(self.inv[rows], self.w[rows], self.n_groups, what)

    def check_count(self, old: np.ndarray, new: np.ndarray, what: str) -> None:
        """A non-NULL count must stay within [0, count(*)]."""
        bad = np.flatnonzero((new < 0) | (new > self.n_new))
        if len(bad):
            g = int(bad[0])
            raise self.over(g, f"{what} (with count(*) {int(self.n_new[g])})",
                            int(old[g]), int(new[g]))


class _Agg:
    """One aggregate: its state fields, how a batch folds into them, its output."""

    def __init__(self, spec: AggSpec, index: int, in_type: pa.DataType | None) -> None:
        self.spec = spec
        self.f = f"a{index}"
        self.in_type = in_type
        col = "*" if spec.column is None else repr(spec.column)
        self.label = f"{spec.func}({col}) [{spec.name!r}]"

    def fields(self) -> list[pa.Field]:
        return []

    def out_type(self) -> pa.DataType:
        return _I64

    def fold(self, ctx: _Fold) -> list[pa.Array]:
        return []

    def output(self, st: pa.Table) -> pa.Array:
        raise NotImplementedError


class _CountStar(_Agg):
    def output(self, st: pa.Table) -> pa.Array:
        return pa.array(_i64(st.column("n")), _I64)


class _Count(_Agg):
    def fields(self) -> list[pa.Field]:
        return [pa.field(self.f, _I64)]

    def fold(self, ctx: _Fold) -> list[pa.Array]:
        assert self.spec.column is not None
        _, rows = ctx.valid_rows(self.spec.column)
        what = f"{self.label}: the count of non-NULL values"
        old = _i64(ctx.old.column(self.f))
        new = checked_add(old, ctx.count_delta(rows, what), what)
        ctx.check_count(old, new, what)
        return [pa.array(new, _I64)]

    def output(self, st: pa.Table) -> pa.Array:
        return pa.array(_i64(st.column(self.f)), _I64)


class _Sum(_Agg):
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

    def _stored(self, col: pa.ChunkedArray | pa.Array) -> _Exact:
        if not self.decimal:
            return _Exact(_i64(col))
        return _Exact.of_decimals(_array(pc.fill_null(col, pa.scalar(0, self.type))))

    def fold(self, ctx: _Fold) -> list[pa.Array]:
        assert self.spec.column is not None
        vals, rows = ctx.valid_rows(self.spec.column)
        what = f"{self.label}: the count of non-NULL values"
        old_nn = _i64(ctx.old.column(self.f + ".nn"))
        nn = checked_add(old_nn, ctx.count_delta(rows, what), what)
        ctx.check_count(old_nn, nn, what)
        v = _Exact.of_decimals(vals) if self.decimal else _Exact.of_ints(vals)
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
        present = pc.greater(pc.fill_null(st.column(self.f + ".nn"), 0), 0)
        return _array(pc.if_else(present, st.column(self.f), pa.scalar(None, self.type)))


class _FloatSum(_Agg):
    """sum of floats: a compensated sum of the finite values, NaN/inf by count."""

    _COUNTS = (".nn", ".nan", ".pinf", ".ninf")
    _NAMES = ("non-NULL", "NaN", "+inf", "-inf")

    def fields(self) -> list[pa.Field]:
        return [pa.field(self.f, pa.float64()), pa.field(self.f + ".lo", pa.float64())] + [
            pa.field(self.f + s, _I64) for s in self._COUNTS
        ]

    def out_type(self) -> pa.DataType:
        return pa.float64()

    def fold(self, ctx: _Fold) -> list[pa.Array]:
        assert self.spec.column is not None
        vals, rows = ctx.valid_rows(self.spec.column)
        v = np.asarray(vals.cast(pa.float64()).to_numpy(zero_copy_only=False), np.float64)
        masks = (np.ones(len(v), bool), np.isnan(v), v == np.inf, v == -np.inf)
        counts = []
        for suffix, name, mask in zip(self._COUNTS, self._NAMES, masks, strict=True):
            what = f"{self.label}: the count of {name} values"
            old_c = _i64(ctx.old.column(self.f + suffix))
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
            hi, lo = _f64(ctx.old.column(self.f)), _f64(ctx.old.column(self.f + ".lo"))
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
        nn, nan, pinf, ninf = (_i64(st.column(self.f + s)) for s in self._COUNTS)
        with np.errstate(over="ignore", invalid="ignore"):
            v = _f64(st.column(self.f)) + _f64(st.column(self.f + ".lo"))
        v[pinf > 0] = np.inf
        v[ninf > 0] = -np.inf
        v[(nan > 0) | ((pinf > 0) & (ninf > 0))] = np.nan
        return pa.array(v, pa.float64(), mask=nn == 0)


class _Extreme(_Agg):
    """min / max: the current extreme's order bytes; the multiset lives in its own family."""

    def __init__(self, spec: AggSpec, index: int, in_type: pa.DataType | None,
                 slot: int, kind: str) -> None:
        super().__init__(spec, index, in_type)
        self.slot = slot
        self.kind = kind
        self.largest = spec.func == "max"

    def fields(self) -> list[pa.Field]:
        return [pa.field(self.f, _BIN)]

    def out_type(self) -> pa.DataType:
        assert self.in_type is not None
        return self.in_type

    def fold(self, ctx: _Fold) -> list[pa.Array]:
        new = ctx.extremes[self.f]
        bad = np.flatnonzero((ctx.n_new == 0) & _valid(new))
        if len(bad):
            g = int(bad[0])
            raise ctx.impossible(g, f"remove every row of the group while {self.label} "
                                    "still has values")
        return [new]

    def output(self, st: pa.Table) -> pa.Array:
        assert self.in_type is not None
        col = _array(st.column(self.f))
        valid = _valid(col)
        idx = np.flatnonzero(valid)
        vals = _order_decode(Bytes.from_arrow(col.take(pa.array(idx))), self.kind, self.in_type)
        if len(idx) == len(col):
            return vals
        pos = np.full(len(col), -1, dtype=np.int64)
        pos[idx] = np.arange(len(idx))
        return _take(vals, pos)


# ---- the state of one group-by -------------------------------------------------------

class _Pairs(NamedTuple):
    """The (group, value) multiset entries one batch changes, for one min/max column."""

    slot: int
    rows: np.ndarray  # a row of the batch holding each entry's value
    groups: np.ndarray  # each entry's group
    values: Bytes  # each entry's order bytes
    keys: list[bytes]
    dv: np.ndarray  # each entry's weight change (non-zero)


class _Left(NamedTuple):
    """What the multiset entries of one min/max column look like after the batch."""

    alive: np.ndarray  # entries (of _Pairs) still counted
    zeroed: np.ndarray  # entries the batch deletes
    values: pa.Array  # every entry's order bytes
    skip: set[bytes]  # the keys of the deleted entries


class GroupState:
    """Aggregation state of one group-by, kept in RocksDB column families.

    ``base`` names the state (the families are ``agg[<base>]`` and, with min/max,
    ``agg[<base>].minmax``); ``input_schema`` holds the key and aggregated columns,
    already evaluated by the caller.  See the module docstring for the layout.
    """

    def __init__(self, store: Database, base: str, input_schema: pa.Schema,
                 keys: Sequence[str], aggs: Sequence[AggSpec]) -> None:
        self.store = store
        self.base = base
        self.input_schema = input_schema
        self.keys = list(keys)
        self.aggs = [AggSpec(*a) for a in aggs]
        self.cf = aggregate_cf(base)
        self.values_cf = aggregate_values_cf(base)
        self._check_keys()
        self._key_codecs: list[KeyCodec] = []
        for k in self.keys:
            try:
                plan = single_plan(input_schema, [k])
            except SchemaMismatchError as exc:
                raise SchemaMismatchError(
                    f"group-by {base!r}: key column {k!r} has type "
                    f"{input_schema.field(k).type}, which cannot be grouped on"
                ) from exc
            self._key_codecs.append(KeyCodec([k], plan, f"group-by {base!r}"))
        self._handlers: list[_Agg] = []
        self._slots: list[tuple[str, str]] = []  # (column, order kind) per min/max column
        for i, spec in enumerate(self.aggs):
            self._handlers.append(self._handler(i, spec))
        self.state_schema = pa.schema(
            [pa.field(f"k{j}", input_schema.field(k).type) for j, k in enumerate(self.keys)]
            + [pa.field("n", _I64)]
            + [f for h in self._handlers for f in h.fields()]
        )
        self.output_schema: pa.Schema = pa.schema(
            [input_schema.field(k) for k in self.keys]
            + [pa.field(h.spec.name, h.out_type()) for h in self._handlers]
        )
        self._codec = RowCodec(self.state_schema)
        # Old and new output rows of a stored group share their key columns (both are
        # the group's canonical key), so whether a group's output changed is decided on
        # the aggregate columns alone: encoding the keys (q4: seven strings) twice per
        # push cost more than the rest of the comparison.
        self._value_codec = RowCodec(pa.schema(list(self.output_schema)[len(self.keys):]))
        self._columns = list(dict.fromkeys(
            self.keys + [a.column for a in self.aggs if a.column is not None]
        ))
        for name in self.column_families():
            store.cf(name)

    # ---- validation -------------------------------------------------------------------

    def _fail(self, msg: str) -> SchemaMismatchError:
        return SchemaMismatchError(f"group-by {self.base!r}: {msg}")

    def _check_keys(self) -> None:
        names = self.input_schema.names
        for k in self.keys:
            if not isinstance(k, str) or k not in names:
                raise self._fail(f"key column {k!r} is not an input column (columns: {names})")
        if len(set(self.keys)) != len(self.keys):
            raise self._fail(f"key columns {self.keys} repeat a column")
        seen: set[str] = set(self.keys)
        for a in self.aggs:
            if not isinstance(a.name, str) or not a.name or a.name == WEIGHT:
                raise self._fail(f"aggregate name {a.name!r} is not a usable column name")
            if a.name in seen:
                raise self._fail(f"output column {a.name!r} appears twice (keys and aggregates "
                                 "share one namespace)")
            seen.add(a.name)
            if a.func not in _FUNCS:
                raise self._fail(f"aggregate {a.name!r}: unknown function {a.func!r} "
                                 f"(supported: {', '.join(_FUNCS)})")
            if a.column is None:
                if a.func != "count":
                    raise self._fail(f"aggregate {a.name!r}: {a.func} needs a column; only "
                                     "count takes None (count(*))")
            elif a.column not in names:
                raise self._fail(f"aggregate {a.name!r}: {a.func}({a.column!r}): no such input "
                                 f"column (columns: {names})")

    def _handler(self, i: int, spec: AggSpec) -> _Agg:
        if spec.column is None:
            return _CountStar(spec, i, None)
        t = self.input_schema.field(spec.column).type
        if spec.func == "count":
            if _order_kind(t) is None and not pa.types.is_null(t):
                raise self._fail(f"aggregate {spec.name!r}: count({spec.column!r}) of type {t} "
                                 "is not supported")
            return _Count(spec, i, t)
        if spec.func == "sum":
            if pa.types.is_integer(t) or pa.types.is_decimal128(t):
                return _Sum(spec, i, t)
            if pa.types.is_floating(t) and not pa.types.is_float16(t):
                return _FloatSum(spec, i, t)
            raise self._fail(f"aggregate {spec.name!r}: sum({spec.column!r}) of type {t}: sum "
                             "takes integers, float32/float64 or decimal128")
        kind = _order_kind(t)
        if kind is None:
            raise self._fail(f"aggregate {spec.name!r}: {spec.func}({spec.column!r}) of type "
                             f"{t} is not supported (integers, floats, decimal128, strings, "
                             "binaries, bool, dates, times, timestamps, durations)")
        slot = next((s for s, (c, _) in enumerate(self._slots) if c == spec.column), None)
        if slot is None:
            if len(self._slots) == _MAX_SLOTS:
                raise self._fail(f"more than {_MAX_SLOTS} distinct min/max columns")
            slot = len(self._slots)
            self._slots.append((spec.column, kind))
        return _Extreme(spec, i, t, slot, kind)

    def _conform(self, delta: pa.Table | pa.RecordBatch, w: np.ndarray) -> tuple[
        pa.Table, np.ndarray
    ]:
        if isinstance(delta, pa.RecordBatch):
            delta = pa.Table.from_batches([delta])
        if not isinstance(delta, pa.Table):
            raise self._fail(f"a delta must be a pyarrow Table, got {type(delta).__name__}")
        w = np.asarray(w)
        if w.shape != (delta.num_rows,) or not np.issubdtype(w.dtype, np.integer):
            raise self._fail(f"weights must be {delta.num_rows} integers, got {w.dtype} "
                             f"{w.shape}")
        w = w.astype(np.int64, copy=False)
        arrays = []
        for c in self._columns:
            if c not in delta.column_names:
                raise self._fail(f"the delta has no column {c!r}")
            want = self.input_schema.field(c).type
            col = _array(delta.column(c))
            if not col.type.equals(want):
                try:
                    col = pc.cast(col, want, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise self._fail(f"column {c!r} has type {col.type}, not the declared "
                                     f"{want}: {exc}") from exc
            arrays.append(col)
        names = self._columns
        if not names:  # count(*) of everything: a table without columns would lose its rows
            arrays, names = [pa.nulls(delta.num_rows)], ["__rows"]
        table = pa.Table.from_arrays(arrays, names=names)
        if (w == 0).any():
            keep = np.flatnonzero(w)
            table, w = table.take(pa.array(keep)), w[keep]
        return table, np.ascontiguousarray(w)

    # ---- public -----------------------------------------------------------------------

    def column_families(self) -> tuple[str, ...]:
        """The groups' family, and the min/max multiset's if there is a min or max."""
        return (self.cf, self.values_cf) if self._slots else (self.cf,)

    def rows(self) -> int:
        """Number of groups stored (a counter: O(1))."""
        return self.store.counter(self.cf, "entries")

    def state(self) -> pa.Table:
        """The full current output: one row per group (no ``_weight``).

        Without group keys there is always exactly one row: :meth:`empty_row` while no
        row is counted (SQL's aggregate over no input).
        """
        values = _rocks.iter_values(self.store.cf(self.cf), self.store.path, f"scan {self.cf}")
        if not values:
            return self.output_schema.empty_table() if self.keys else self.empty_row()
        return self._output(self._codec.decode(Bytes.from_list(values)))

    def empty_row(self) -> pa.Table:
        """The output row of a group without rows: count(*) and counts 0, the rest NULL.

        What an aggregate without group keys reads over an empty input (SQL, DuckDB).
        """
        state = pa.Table.from_arrays([pa.nulls(1, f.type) for f in self.state_schema],
                                     schema=self.state_schema)
        return self._output(state)

    def stage(self, delta: pa.Table | pa.RecordBatch, w: np.ndarray, txn: Transaction) -> tuple[
        pa.Table, np.ndarray
    ]:
        """Fold a change set into the state (staged into ``txn``); return the output change.

        ``w`` are the rows' weights (int64, unconsolidated: repeated rows and +/- are
        fine).  Reads the stored state of the touched groups (one multi-get), validates
        everything, then stages the writes -- so an :class:`OverRetractionError` or
        :class:`WeightOverflowError` leaves nothing staged.  The output holds, for every
        group whose output row changed, the old row with -1 (if it existed) and the new
        row with +1 (if the group still has rows); without group keys the row always
        exists (see :meth:`empty_row`), so the output replaces it.  Reads see the state
        before ``txn``: call it at most once per transaction.
        """
        table, w = self._conform(delta, w)
        if table.num_rows == 0:
            return self.output_schema.empty_table(), np.zeros(0, np.int64)
        canon = self._key_canon(table)
        groups = _group_bytes(canon)
        n_groups, inv, first = len(groups), groups.inv, groups.first
        gcanon = canon.take(first)
        gkeys = Bytes.concat_rows([prefix_bytes(hash_prefix(gcanon)), gcanon])
        gkey_list = gkeys.to_list()

        txn.note_read()
        raw = _rocks.multi_get(self.store.cf(self.cf), gkey_list, self.store.path,
                               f"read {self.cf}")
        present = np.fromiter((v is not None for v in raw), dtype=bool, count=n_groups)
        old = self._expand(raw, present)

        def describe(g: int) -> str:
            r = int(first[g])
            vals = tuple(table.column(k)[r].as_py() for k in self.keys)
            key = f"{self.keys} = {vals[0] if len(vals) == 1 else vals!r}" if vals else "()"
            return f"group-by {self.base!r}, group {key}"

        n_old = _i64(old.column("n"))
        n_new = checked_add(n_old, checked_sum_by(inv, w, n_groups, "a group's count(*)"),
                            "a group's count(*)")
        bad = np.flatnonzero(n_new < 0)
        ctx = _Fold(table, w, inv, n_groups, old, n_new, describe)
        if len(bad):
            g = int(bad[0])
            raise ctx.over(g, "count(*)", int(n_old[g]), int(n_new[g]))
        writes = self._fold_extremes(ctx, gkeys, gkey_list)
        firsts = table.take(pa.array(first))
        new_cols: list[pa.Array] = [_canonical(_array(firsts.column(k))) for k in self.keys]
        new_cols.append(pa.array(n_new, _I64))
        for h in self._handlers:
            new_cols += h.fold(ctx)
        new = pa.Table.from_arrays(new_cols, schema=self.state_schema)

        # Every check passed: compute the output change and stage the writes.
        old_out, new_out = self._output(old), self._output(new)
        same = self._same_values(old_out, new_out)
        alive = n_new > 0
        # Without group keys the one group's output row exists whether or not it has
        # rows (its empty form is empty_row(), what _output makes of an absent state):
        # it changes, never appears or disappears.
        shown, kept = (present, alive) if self.keys else (np.ones_like(present),) * 2
        emit_old = np.flatnonzero(shown & ~(kept & same))
        emit_new = np.flatnonzero(kept & ~(shown & same))
        out = pa.concat_tables([old_out.take(pa.array(emit_old)),
                                new_out.take(pa.array(emit_new))])
        out_w = np.concatenate([np.full(len(emit_old), -1, np.int64),
                                np.ones(len(emit_new), np.int64)])

        new_enc = self._codec.encode(new)
        unchanged = present & new_enc.equals(
            Bytes.from_list([b"" if v is None else v for v in raw]))
        put = np.flatnonzero(alive & ~unchanged)
        gone = np.flatnonzero(present & ~alive)
        put_values = new_enc.take(put).to_list()
        keys = [gkey_list[i] for i in put.tolist()] + [gkey_list[i] for i in gone.tolist()]
        values: list[bytes | None] = [*put_values, *([None] * len(gone))]
        txn.put_many(self.cf, keys, values)
        txn.add(self.cf, "entries", int((alive & ~present).sum()) - len(gone))
        txn.add(self.cf, "rows", checked_sum(n_new - n_old, f"rows of {self.cf}"))
        if writes is not None:
            vkeys, vvalues, d_entries, d_rows = writes
            txn.put_many(self.values_cf, vkeys, vvalues)
            txn.add(self.values_cf, "entries", d_entries)
            txn.add(self.values_cf, "rows", d_rows)
        return out, out_w

    # ---- internals --------------------------------------------------------------------

    def _key_canon(self, table: pa.Table) -> Bytes:
        """Per row: for each key column a NULL marker byte then its canonical key bytes."""
        n = table.num_rows
        parts: list[Bytes] = []
        for codec in self._key_codecs:
            body, null = codec.encode(table)
            parts.append(Bytes.from_fixed((~null).astype(np.uint8).reshape(n, 1)))
            parts.append(body)
        if not parts:
            return Bytes.from_fixed(np.zeros((n, 0), dtype=np.uint8))
        return Bytes.concat_rows(parts)

    def _expand(self, raw: list[bytes | None], present: np.ndarray) -> pa.Table:
        """The stored state of every touched group (NULL fields for absent groups)."""
        idx = np.flatnonzero(present)
        if len(idx):
            stored = self._codec.decode(Bytes.from_list([raw[i] or b"" for i in idx.tolist()]))
        else:
            stored = self.state_schema.empty_table()
        pos = np.full(len(raw), -1, dtype=np.int64)
        pos[idx] = np.arange(len(idx))
        return stored.take(pa.array(pos, type=_I64, mask=pos < 0))

    def _same_values(self, old_out: pa.Table, new_out: pa.Table) -> np.ndarray:
        """Per group, whether its aggregate values are unchanged (meaningful where stored)."""
        n = new_out.num_rows
        if not self._handlers:  # keys only: a stored group's output row never changes
            return np.ones(n, dtype=bool)
        k = len(self.keys)
        old_vals = pa.Table.from_arrays(old_out.columns[k:], schema=self._value_codec.schema)
        new_vals = pa.Table.from_arrays(new_out.columns[k:], schema=self._value_codec.schema)
        return self._value_codec.encode(old_vals).equals(self._value_codec.encode(new_vals))

    def _output(self, st: pa.Table) -> pa.Table:
        cols = [_array(st.column(f"k{j}")) for j in range(len(self.keys))]
        cols += [h.output(st) for h in self._handlers]
        return pa.Table.from_arrays(cols, schema=self.output_schema)

    def _pairs(self, ctx: _Fold, gkeys: Bytes) -> list[_Pairs]:
        """The multiset entries the batch changes, per min/max column (consolidated)."""
        found = []
        for slot, (column, kind) in enumerate(self._slots):
            vals, rows = ctx.valid_rows(column)
            if not len(rows):
                continue
            venc = _order_encode(vals, kind)
            tag = Bytes.from_fixed(np.full((len(rows), 1), slot, dtype=np.uint8))
            pk = Bytes.concat_rows([gkeys.take(ctx.inv[rows]), tag, venc])
            pg = _group_bytes(pk)
            dv = checked_sum_by(pg.inv, ctx.w[rows], len(pg),
                                f"group-by {self.base!r}: the weight of a {column!r} value")
            live = np.flatnonzero(dv)
            at = pg.first[live]
            found.append(_Pairs(slot, rows[at], ctx.inv[rows[at]], venc.take(at),
                                pk.take(at).to_list(), dv[live]))
        return found

    def _fold_extremes(self, ctx: _Fold, gkeys: Bytes, gkey_list: list[bytes]) -> tuple[
        list[bytes], list[bytes | None], int, int
    ] | None:
        """New min/max of every touched group; the multiset writes to stage.

        One multi-get reads every changed (group, value) count -- except where the
        group has no value of the column stored (a new group, or only NULLs so far):
        there is nothing to read, and loading a fresh group-by reads nothing at all.
        A group whose stored extreme is retracted to zero is re-read with one bounded
        seek under its prefix, skipping the entries this batch deletes (reads see the
        state before it).
        """
        if not self._slots:
            return None
        stored = {h.slot: _valid(_array(ctx.old.column(h.f)))
                  for h in self._handlers if isinstance(h, _Extreme)}
        per_slot = {p.slot: p for p in self._pairs(ctx, gkeys)}
        reads = {slot: np.flatnonzero(stored[slot][p.groups]) for slot, p in per_slot.items()}
        got = _rocks.multi_get(
            self.store.cf(self.values_cf),
            [p.keys[i] for slot, p in per_slot.items() for i in reads[slot].tolist()],
            self.store.path, f"read {self.values_cf}",
        )
        got_counts = np.fromiter(
            (0 if v is None else int.from_bytes(v, "little", signed=True) for v in got),
            dtype=np.int64, count=len(got),
        )
        vkeys: list[bytes] = []
        vvalues: list[bytes | None] = []
        d_entries = d_rows = 0
        at = 0
        left: dict[int, _Left] = {}
        for slot, p in per_slot.items():
            column = self._slots[slot][0]
            old = np.zeros(len(p.keys), dtype=np.int64)
            old[reads[slot]] = got_counts[at : at + len(reads[slot])]
            at += len(reads[slot])
            what = f"group-by {self.base!r}: the multiplicity of a {column!r} value"
            new = checked_add(old, p.dv, what)
            bad = np.flatnonzero(new < 0)
            if len(bad):
                i = int(bad[0])
                value = ctx.table.column(column)[int(p.rows[i])].as_py()
                raise ctx.over(int(p.groups[i]), f"the multiplicity of {column} = {value!r}",
                               int(old[i]), int(new[i]))
            vkeys += p.keys
            vvalues += [None if c == 0 else c.to_bytes(8, "little", signed=True)
                        for c in new.tolist()]
            d_entries += int((new > 0).sum()) - int((old > 0).sum())
            d_rows += checked_sum(p.dv, what)
            zeroed = np.flatnonzero(new == 0)
            left[slot] = _Left(np.flatnonzero(new > 0), zeroed, p.values.arrow(),
                               {p.keys[i] for i in zeroed.tolist()})
        for h in self._handlers:
            if isinstance(h, _Extreme):
                ctx.extremes[h.f] = self._extreme(ctx, h, per_slot.get(h.slot),
                                                  left.get(h.slot), gkey_list)
        return vkeys, vvalues, d_entries, d_rows

    def _extreme(self, ctx: _Fold, h: _Extreme, p: _Pairs | None, left: _Left | None,
                 gkey_list: list[bytes]) -> pa.Array:
        """The new extreme of ``h`` for every touched group.

        The stored extreme stays a candidate unless the batch deleted its entry; then
        the group's surviving stored entries are sought.  The best value the batch
        leaves alive is the other candidate.
        """
        stored = _array(ctx.old.column(h.f)).cast(_BIN)
        if p is None or left is None:
            return stored
        alive = left.alive
        cand = _best(p.groups[alive], left.values.take(pa.array(alive)), ctx.n_groups,
                     h.largest)
        gone = np.zeros(ctx.n_groups, dtype=bool)
        z = left.zeroed
        if len(z):
            zg = p.groups[z]
            hit = pc.fill_null(pc.equal(left.values.take(pa.array(z)), stored.take(pa.array(zg))),
                               False)
            gone[zg[np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool)]] = True
        if gone.any():
            g_idx = np.flatnonzero(gone)
            tag = bytes([h.slot])
            found = self._seek([gkey_list[g] + tag for g in g_idx.tolist()], left.skip,
                               h.largest)
            pos = np.arange(ctx.n_groups, dtype=np.int64)
            pos[g_idx] = ctx.n_groups + np.arange(len(g_idx))
            stored = pa.concat_arrays([stored, pa.array(found, _BIN)]).take(pa.array(pos))
        return _better(stored, cand, h.largest)

    def _seek(self, prefixes: list[bytes], skip: set[bytes], largest: bool) -> list[
        bytes | None
    ]:
        """Per prefix, the first (last) stored value under it whose key is not in ``skip``.

        Bounded: besides the answer, the walk only visits keys in ``skip`` (entries the
        batch deletes), so the cost is O(retractions), never O(group).
        """
        ro = rd.ReadOptions()
        ro.set_total_order_seek(True)
        out: list[bytes | None] = []
        path, what = self.store.path, f"read {self.values_cf}"
        with _rocks.rocks_errors(path, what):
            it = self.store.cf(self.values_cf).iter(ro)
            try:
                for p in prefixes:
                    found: bytes | None = None
                    upper = p
                    if largest:
                        upper = p[:-1] + bytes([p[-1] + 1])
                        it.seek_for_prev(upper)
                        step = it.prev
                    else:
                        it.seek(p)
                        step = it.next
                    while it.valid():
                        k = it.key()
                        if not k.startswith(p):
                            if largest and k >= upper:
                                step()  # exactly ``upper``: the next slot's empty value
                                continue
                            break
                        if k in skip:
                            step()
                            continue
                        found = k[len(p):]
                        break
                    it.status()  # raises if the walk stopped on an error, not the end
                    out.append(found)
            finally:
                del it
        return out
