"""Vectorised grouping, consolidation and checked arithmetic for Z-sets (rows, int64 weights).

Weights are int64.  numpy wraps on overflow without a word, so every sum and product
of weights the engine forms goes through the checked helpers here: a cheap float64
bound proves the common case safe, and only values near the int64 limits are
recomputed exactly with Python integers (two's-complement sums are exact modulo 2**64,
so an int64 sum is right whenever the true sum is in range).  A result that does not
fit raises :class:`~joinstate.errors.WeightOverflowError` naming what overflowed.

:class:`ExactInts` is the same arithmetic for values that may legitimately pass beyond
int64 on the way (sums of decimals, which hold 38 digits; sums of int64 values that
come back into range): int64 where the bound proves them safe, Python ints for the
rest, checked only when converted back.  This module is the one home of that
arithmetic: joins, aggregates, indexes and population use it and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from joinstate._bytes import Bytes
from joinstate.errors import StateCorruptedError, WeightOverflowError

__all__ = [
    "I64_MAX",
    "I64_MIN",
    "ExactInts",
    "Groups",
    "checked_add",
    "checked_int",
    "checked_mul",
    "checked_sum",
    "checked_sum_by",
    "consolidate",
    "expand",
    "group_rows",
    "group_u64",
    "sort_order",
    "sum_by",
]

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1
_SAFE = float(2**62)  # below this bound (in float64) no int64 result can have wrapped
_DEC_MAX = 10**38 - 1  # the largest unscaled value of a decimal128 (38 digits)


class Groups:
    """``inv[i]`` is row i's group; ``first[g]`` is the first row of group g.

    ``order``, when known, lists the grouped rows sorted by their hash (the groups are
    numbered in that order): what writing in key order needs, kept from the sort that
    made the groups instead of sorting again.
    """

    __slots__ = ("first", "inv", "order")

    def __init__(self, inv: np.ndarray, first: np.ndarray, order: np.ndarray | None = None
                 ) -> None:
        self.inv = inv
        self.first = first
        self.order = order

    def __len__(self) -> int:
        return len(self.first)


def _groups_from_sorted(order: np.ndarray, boundary: np.ndarray) -> Groups:
    gid_sorted = np.cumsum(boundary) - 1
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = gid_sorted
    return Groups(inv, order[boundary], order)


def group_u64(h: np.ndarray) -> Groups:
    """Group equal uint64 values."""
    if len(h) == 0:
        return Groups(np.zeros(0, np.int64), np.zeros(0, np.int64))
    order = np.argsort(h, kind="stable")
    s = h[order]
    boundary = np.empty(len(s), dtype=bool)
    boundary[0] = True
    np.not_equal(s[1:], s[:-1], out=boundary[1:])
    return _groups_from_sorted(order, boundary)


EncodingsOf = Callable[[np.ndarray], "Bytes"]
"""Gathers the encodings of some rows: lets a caller build only those that are needed."""


def group_rows(rh: Bytes, enc: Bytes | EncodingsOf) -> Groups:
    """Group rows by their 128-bit hash, verifying that grouped rows really are equal.

    ``enc`` is the rows' encodings, or a function gathering them by position: only the
    rows that share a hash with another are compared, so a caller whose encodings are
    costly to assemble (spread over several segments) passes a function.
    """
    n = len(rh)
    if n == 0:
        return Groups(np.zeros(0, np.int64), np.zeros(0, np.int64))
    words = np.ascontiguousarray(rh.matrix()).view("<u8")
    order = np.argsort(words[:, 0])
    s0 = words[order, 0]
    boundary = np.empty(n, dtype=bool)
    boundary[0] = True
    np.not_equal(s0[1:], s0[:-1], out=boundary[1:])
    if boundary.all():
        # Common case: no two rows share even 64 bits of hash, so all rows are distinct.
        ident = np.arange(n, dtype=np.int64)
        return Groups(ident, ident)
    s1 = words[order, 1]
    if (s1[1:][~boundary[1:]] != s1[:-1][~boundary[1:]]).any():
        # Rows that share the first 64 bits but not the second: sort by both.
        order = np.lexsort((words[:, 1], words[:, 0]))
        s = words[order]
        np.any(s[1:] != s[:-1], axis=1, out=boundary[1:])
    groups = _groups_from_sorted(order, boundary)
    if len(groups) < n:
        dup = np.flatnonzero(groups.first[groups.inv] != np.arange(n))
        take = enc.take if isinstance(enc, Bytes) else enc
        if not take(dup).equals(take(groups.first[groups.inv[dup]])).all():
            msg = "xxh3_128 collision between two different rows"
            raise StateCorruptedError(msg)
    return groups


def group_keys(khash: np.ndarray, canon: Bytes) -> Groups:
    """Group rows by canonical key (hash first, then an exact check)."""
    groups = group_u64(khash)
    if len(groups) < len(khash):
        rep = groups.first[groups.inv]
        if not canon.equals(canon.take(rep)).all():
            # A 64-bit collision between different keys: group exactly instead.
            firsts: dict[bytes, int] = {}
            inv = np.fromiter(
                (firsts.setdefault(k, len(firsts)) for k in canon.to_list()),
                dtype=np.int64, count=len(khash),
            )
            first = np.zeros(len(firsts), dtype=np.int64)
            first[inv[::-1]] = np.arange(len(khash) - 1, -1, -1)
            return Groups(inv, first)
    return groups


def sum_by(inv: np.ndarray, w: np.ndarray, n_groups: int) -> np.ndarray:
    """int64 sums of ``w`` per group, for sums known to be in range (see checked_sum_by)."""
    out = np.zeros(n_groups, dtype=np.int64)
    np.add.at(out, inv, w)
    return out


def _overflow(what: str, value: int, of: str = "weights") -> WeightOverflowError:
    return WeightOverflowError(
        f"{what} would be {value}, outside the int64 range of {of} "
        f"[{I64_MIN}, {I64_MAX}]; nothing of the batch was applied"
    )


def checked_int(value: int, what: str) -> int:
    """``value`` if it fits int64, else :class:`WeightOverflowError` naming ``what``."""
    if not I64_MIN <= value <= I64_MAX:
        raise _overflow(what, value)
    return value


def checked_sum(w: np.ndarray, what: str) -> int:
    """The exact sum of ``w`` as a Python int, raising if it leaves int64."""
    if not len(w):
        return 0
    if float(np.abs(w.astype(np.float64)).sum()) < _SAFE:
        return int(w.sum())
    return checked_int(sum(w.tolist()), what)


def checked_sum_by(inv: np.ndarray, w: np.ndarray, n_groups: int, what: str) -> np.ndarray:
    """Per-group sums of ``w`` (int64), raising :class:`WeightOverflowError` on overflow."""
    out = sum_by(inv, w, n_groups)
    if not len(w):
        return out
    bound = np.zeros(n_groups, dtype=np.float64)
    np.add.at(bound, inv, np.abs(w.astype(np.float64)))
    risky = np.flatnonzero(bound >= _SAFE)
    if len(risky):
        exact: dict[int, int] = dict.fromkeys(risky.tolist(), 0)
        for g, x in zip(inv.tolist(), w.tolist(), strict=True):
            if g in exact:
                exact[g] += x
        for g, total in exact.items():
            out[g] = checked_int(total, what)
    return out


def checked_add(a: np.ndarray, b: np.ndarray, what: str) -> np.ndarray:
    """Element-wise ``a + b`` (int64), raising on overflow."""
    out = a + b
    risky = np.flatnonzero(np.abs(a.astype(np.float64)) + np.abs(b.astype(np.float64)) >= _SAFE)
    for i in risky.tolist():
        checked_int(int(a[i]) + int(b[i]), what)
    return out


def checked_mul(a: np.ndarray, b: np.ndarray, what: str) -> np.ndarray:
    """Element-wise ``a * b`` (int64), raising on overflow (weights of joined pairs)."""
    out = a * b
    risky = np.flatnonzero(np.abs(a.astype(np.float64) * b.astype(np.float64)) >= _SAFE)
    for i in risky.tolist():
        checked_int(int(a[i]) * int(b[i]), what)
    return out


class ExactInts:
    """Exact integers: int64 where they provably fit, Python ints for the rest.

    ``small[i]`` is entry ``i`` unless ``i`` is in ``big``, which holds the entries that
    do not fit int64 or were too near its limits to add in it.  Built from Arrow
    integers or decimals (their unscaled values), summed per group with weights and
    element-wise, and checked when converted back (:meth:`to_int64`,
    :meth:`to_decimal`).
    """

    __slots__ = ("big", "small")

    def __init__(self, small: np.ndarray, big: dict[int, int] | None = None) -> None:
        self.small = small
        self.big = big if big is not None else {}

    def __len__(self) -> int:
        return len(self.small)

    def exact(self, i: int) -> int:
        """Entry ``i`` as a Python int."""
        return self.big[i] if i in self.big else int(self.small[i])

    @classmethod
    def of_ints(cls, arr: pa.Array) -> ExactInts:
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
    def of_decimals(cls, arr: pa.Array) -> ExactInts:
        """The unscaled values of decimal128 values (no NULLs)."""
        n = len(arr)
        buf = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
        raw = buf[arr.offset * 16 : (arr.offset + n) * 16].reshape(n, 16).view("<i8")
        lo, hi = raw[:, 0], raw[:, 1]
        fits = hi == (lo >> 63)
        small = np.where(fits, lo, 0)
        big = {i: int.from_bytes(raw[i].tobytes(), "little", signed=True)
               for i in np.flatnonzero(~fits).tolist()}
        return cls(small, big)

    def group_sums(self, inv: np.ndarray, w: np.ndarray, n_groups: int) -> ExactInts:
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
        return ExactInts(small, big)

    def plus(self, other: ExactInts) -> ExactInts:
        """Element-wise exact sum."""
        risky = np.abs(self.small.astype(np.float64)) + np.abs(other.small.astype(np.float64)) \
            >= _SAFE
        for g in (*self.big, *other.big):
            risky[g] = True
        small = np.where(risky, 0, self.small + np.where(risky, 0, other.small))
        big = {g: self.exact(g) + other.exact(g) for g in np.flatnonzero(risky).tolist()}
        return ExactInts(small, big)

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
                raise _overflow(what(g), v, "the sum's type")
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


def consolidate(rh: Bytes, enc: Bytes | EncodingsOf, w: np.ndarray, what: str
                ) -> tuple[np.ndarray, np.ndarray]:
    """Group equal rows, sum their weights, drop zeros: ``(first row of each, weight)``.

    The one consolidation (an incoming delta, a scan of stored entries, the probe
    cache): rows are equal when their encodings are (row hash first, then verified).
    """
    g = group_rows(rh, enc)
    if len(g) < len(w):
        sums = checked_sum_by(g.inv, w, len(g), what)
        idx = g.first
    else:
        sums = w
        idx = np.arange(len(w), dtype=np.int64)
    live = sums != 0
    if not live.all():
        return idx[live], sums[live]
    return idx, sums


def sort_order(a: np.ndarray) -> np.ndarray:
    """A stable sorting permutation of ``a``; no sort when ``a`` is already sorted."""
    if len(a) < 2 or not (a[1:] < a[:-1]).any():
        return np.arange(len(a), dtype=np.int64)
    return np.argsort(a, kind="stable")


def expand(row_group: np.ndarray, entry_group: np.ndarray, n_groups: int) -> tuple[
    np.ndarray, np.ndarray
]:
    """All pairs (row, entry) with equal group; ``row_group`` < 0 never pairs."""
    order = sort_order(entry_group)
    counts = np.bincount(entry_group, minlength=n_groups).astype(np.int64)
    starts = np.cumsum(counts) - counts
    valid = row_group >= 0
    rows = np.flatnonzero(valid)
    g = row_group[rows]
    c = counts[g]
    total = int(c.sum())
    row_idx = np.repeat(rows, c)
    first_out = np.cumsum(c) - c
    pos = np.repeat(starts[g] - first_out, c) + np.arange(total, dtype=np.int64)
    return row_idx, order[pos]
