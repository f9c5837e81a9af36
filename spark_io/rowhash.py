"""A vectorised 64-bit hash of whole rows: where a join's NULL-key rows go.

A row whose join key has a NULL never matches, so any shard may hold it, but every
change to that row must reach the shard that holds it: its shard must be a function of
the row's values.  Sending them all to shard 0 (the core's ``KeyCodec.shard_of``) puts
every NULL-key row on one shard; TPC-DS ``store_sales`` has 4.5% of them, which at two
shards made shard 0 load 8% more rows than shard 1.  :func:`row_hash64` spreads them
instead, computed with numpy over Arrow buffers (no per-row Python).

Rows the core stores as one row must hash alike, so each value is taken in its
canonical form: floats with ``-0.0`` as ``0.0`` and every NaN as one NaN (as joinstate's
row codec does), integers and temporal values by their integer value in the side's
own type (rows are conformed to the side's schema first), decimals by their 128/256-bit
integer, strings and binaries by their length and first 8 bytes, and a NULL as a fixed
word.  Types it does not look into (lists, structs, ...) add nothing: the hash is
still a function of the row, only a coarser one.  It is not the core's row hash
(xxh3-128 of the encoded row, computed per row in Python); it only has to be cheap,
deterministic and well spread.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["row_hash64"]

_SEED = np.uint64(0x6A09E667F3BCC908)
_NULL = np.uint64(0x9E3779B97F4A7C15)
_PREFIX = 8
_SIGNED = {8: pa.int8(), 16: pa.int16(), 32: pa.int32()}
_UNSIGNED = {8: pa.uint8(), 16: pa.uint16(), 32: pa.uint32()}
"""Bytes of each string or binary value that are hashed (with its length)."""


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _valid(arr: pa.Array) -> np.ndarray | None:
    """Validity as a bool array, or None when no value is NULL."""
    if not arr.null_count:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _fixed_words(arr: pa.Array, bits: int) -> list[np.ndarray]:
    """A fixed-width column's values as ``bits // 64`` uint64 words each (bits >= 64)."""
    n = len(arr)
    words = bits // 64
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint64, count=(arr.offset + n) * words)
    mat = raw[arr.offset * words:].reshape(n, words)
    return [mat[:, i] for i in range(words)]


def _int_words(arr: pa.Array) -> list[np.ndarray]:
    """An integer or temporal column as its integer values, widened to uint64."""
    width = arr.type.bit_width
    if width == 64:
        return _fixed_words(arr, 64)
    kinds = _UNSIGNED if pa.types.is_unsigned_integer(arr.type) else _SIGNED
    if width not in kinds:
        return []  # an interval type: not looked into
    vals = arr.view(kinds[width]).cast(pa.int64()).fill_null(0)
    return [np.asarray(vals.to_numpy(zero_copy_only=False)).view(np.uint64)]


def _float_words(arr: pa.Array) -> np.ndarray:
    f = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
    f = np.where(f == 0.0, 0.0, f)  # -0.0 is 0.0
    f = np.where(np.isnan(f), np.nan, f)  # one NaN
    return f.view(np.uint64)


def _binary_words(arr: pa.Array) -> list[np.ndarray]:
    """Length and the first :data:`_PREFIX` bytes (as one word) of each value."""
    n = len(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32,
                            count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    prefix = np.zeros(n, dtype=np.uint64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else None
    if data is not None and len(data):
        last = len(data) - 1
        for j in range(_PREFIX):
            byte = data[np.minimum(starts + j, last)].astype(np.uint64)
            prefix |= np.where(lengths > j, byte, np.uint64(0)) << np.uint64(8 * j)
    return [lengths.astype(np.uint64), prefix]


def _fixed_binary_words(arr: pa.Array) -> list[np.ndarray]:
    n, width = len(arr), arr.type.byte_width
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8,
                        count=(arr.offset + n) * width)[arr.offset * width:]
    mat = raw.reshape(n, width)[:, :_PREFIX]
    padded = np.zeros((n, _PREFIX), dtype=np.uint8)
    padded[:, :mat.shape[1]] = mat
    return [padded.view(np.uint64).reshape(n)]


def _words(arr: pa.Array) -> list[np.ndarray]:
    """The words a column contributes (values only; NULLs are masked by the caller)."""
    t = arr.type
    if pa.types.is_boolean(t):
        return [np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False),
                           dtype=np.uint64)]
    if pa.types.is_floating(t):
        return [_float_words(arr)]
    if pa.types.is_integer(t) or pa.types.is_temporal(t):
        return _int_words(arr)
    if pa.types.is_decimal(t):
        if t.bit_width < 64:
            return _int_words(arr.view(_SIGNED[t.bit_width]))
        return _fixed_words(arr, t.bit_width)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_large_binary(t):
        return _binary_words(arr)
    if pa.types.is_fixed_size_binary(t):
        return _fixed_binary_words(arr)
    return []


def row_hash64(table: pa.Table, columns: list[str] | None = None) -> np.ndarray:
    """A well-spread uint64 per row, a function of the row's (canonical) values.

    ``columns`` (default: all) are the columns that count, in that order.
    """
    n = table.num_rows
    h = np.full(n, _SEED, dtype=np.uint64)
    for name in columns if columns is not None else table.column_names:
        col = table.column(name)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if isinstance(arr, pa.ChunkedArray):  # no chunks at all
            arr = pa.array([], arr.type)
        if pa.types.is_dictionary(arr.type):
            arr = pc.cast(arr, arr.type.value_type)
        valid = _valid(arr)
        for word in _words(arr):
            if valid is not None:
                word = np.where(valid, word, _NULL)
            h = _mix(h ^ word)
    return _mix(h)
