"""Column helpers and order-preserving value bytes for the aggregation state.

Order-preserving value bytes (what min/max keep, :mod:`joinstate.aggregate.minmax`):
integers, dates, times, timestamps and durations as int64 big-endian with the sign bit
flipped (uint64 plain big-endian); floats as float64 with ``-0.0`` folded into ``0.0``
and one NaN, big-endian with the sign bit flipped for non-negative values and every bit
flipped for negative ones (NaN sorts above +inf, as in Spark); decimal128 as its 16
bytes big-endian, sign bit flipped; bool one byte; strings and binaries their raw bytes
(they are the last part of a key, so they need no terminator: bytewise order is
code-point order).  So comparing two values' bytes compares the values, and a RocksDB
iterator walks a group's values in order.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate._bytes import Bytes
from joinstate.errors import StateCorruptedError
from joinstate.zset import Groups

__all__ = [
    "best",
    "better",
    "canonical",
    "contiguous",
    "f64",
    "fixed_view",
    "group_bytes",
    "i64",
    "order_decode",
    "order_encode",
    "order_kind",
    "take_or_null",
    "valid_mask",
]

_SIGN = np.uint64(1 << 63)
_BIN = pa.large_binary()
_I64 = pa.int64()


def contiguous(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One array (chunks combined)."""
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def valid_mask(arr: pa.Array) -> np.ndarray:
    """Where ``arr`` is not NULL."""
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def i64(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 column as numpy, NULL (an absent group) as 0."""
    if col.null_count:
        col = pc.fill_null(col, 0)
    return np.asarray(col.to_numpy(), dtype=np.int64)


def f64(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A float column as numpy float64, NULL as 0.0."""
    if col.null_count:
        col = pc.fill_null(col, 0.0)
    return np.asarray(col.to_numpy(), dtype=np.float64)


def fixed_view(arr: pa.Array, width: int) -> np.ndarray:
    """The ``(n, width)`` bytes of a fixed-width array's values (no copy)."""
    n = len(arr)
    buf = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return buf[arr.offset * width : (arr.offset + n) * width].reshape(n, width)


def take_or_null(arr: pa.Array | pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    """Gather by position; -1 gives NULL."""
    return contiguous(arr).take(pa.array(idx, type=_I64, mask=idx < 0))


def canonical(arr: pa.Array) -> pa.Array:
    """Float values with ``-0.0`` folded into ``0.0`` and one NaN (group keys, as joins)."""
    if not pa.types.is_floating(arr.type):
        return arr
    arr = pc.if_else(pc.equal(arr, 0), pa.scalar(0.0, arr.type), arr)
    return pc.if_else(pc.is_nan(arr), pa.scalar(float("nan"), arr.type), arr)


def group_bytes(b: Bytes) -> Groups:
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


def best(groups: np.ndarray, values: pa.Array, n_groups: int, largest: bool) -> pa.Array:
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
    return take_or_null(values.take(pa.array(sel)), pos)


def better(a: pa.Array, b: pa.Array, largest: bool) -> pa.Array:
    """Element-wise the smaller (larger) of two byte arrays; NULL loses."""
    cmp = pc.greater(a, b) if largest else pc.less(a, b)
    take_a = pc.or_(pc.fill_null(cmp, False), pc.is_null(b))
    return pc.if_else(take_a, a, b)


def order_kind(t: pa.DataType) -> str | None:
    """How values of ``t`` are encoded in order (see the module docstring); None: cannot."""
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


def storage_type(t: pa.DataType) -> pa.DataType:
    """The integer type with ``t``'s memory layout (dates, times ... are integers)."""
    if pa.types.is_integer(t):
        return t
    return pa.int32() if pa.types.is_date32(t) or pa.types.is_time32(t) else _I64


def order_encode(arr: pa.Array, kind: str) -> Bytes:
    """Order-preserving bytes of non-NULL values (see the module docstring)."""
    n = len(arr)
    if kind == "var":
        return Bytes.from_arrow(arr.cast(_BIN))
    if kind == "bool":
        vals = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.uint8)
        return Bytes.from_fixed(vals.reshape(n, 1))
    if kind == "fixed":
        return Bytes.from_fixed(fixed_view(arr, arr.type.byte_width))
    if kind == "dec":
        be = fixed_view(arr, 16)[:, ::-1].copy()
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
        st = storage_type(arr.type)
        ints = (arr if st == arr.type else arr.view(st)).to_numpy(zero_copy_only=False)
        u = np.asarray(ints).astype(np.int64).view(np.uint64) ^ _SIGN
    return Bytes.from_fixed(u.astype(">u8").view(np.uint8).reshape(n, 8))


def order_decode(b: Bytes, kind: str, t: pa.DataType) -> pa.Array:
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
    st = storage_type(t)
    out = pa.array((u ^ _SIGN).view(np.int64), _I64).cast(st)
    return out if st == t else out.view(t)
