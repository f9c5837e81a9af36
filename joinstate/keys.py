"""Canonical join-key bytes, their 8-byte xxh3 prefix, and type compatibility of keys.

Both sides of a join must produce the same bytes for equal key values, whatever their
declared widths: int16 ``7`` on the left and int64 ``7`` on the right both become the
8 big-endian bytes of int64 ``7``.  :func:`key_plan` fixes, once per join, the common
type of every key column (and rejects pairs that can never be equal, like string vs
integer); :class:`KeyCodec` then encodes a side's key columns into that form.

Canonical encoding per column (concatenated for multi-column keys; the result is
prefix-free, so iterating a key prefix never reaches a longer, different key):

* integers, dates, times, timestamps, durations: int64 big-endian in the common unit
  (both sides uint64: uint64 big-endian);
* floats: float64 big-endian with ``-0.0`` folded into ``0.0`` and one NaN pattern;
* bool: one byte; decimal128: its 16 bytes at the common scale;
* strings and binaries: u32 big-endian length, then the bytes.

The prefix is ``xxh3_64`` of those bytes, big-endian.  It spreads keys over the
keyspace (so hash memtables and prefix blooms work) and routes keys to shards.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from joinstate._bytes import Bytes
from joinstate.errors import SchemaMismatchError
from joinstate.schema import finer_unit

T = TypeVar("T")

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["KeyCodec", "KeyColumn", "hash_prefix", "key_plan", "row_hash"]


@dataclass(frozen=True)
class KeyColumn:
    """How one key column is canonicalised: cast to ``common`` then encoded as ``kind``."""

    common: pa.DataType
    kind: str  # "i64" | "u64" | "f64" | "bool" | "dec" | "var"


def _family(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_duration(t):
        return "duration"
    if pa.types.is_decimal128(t):
        return "decimal"
    return "unsupported"


def _common(lt: pa.DataType, rt: pa.DataType, what: str) -> KeyColumn:
    fam_l, fam_r = _family(lt), _family(rt)
    if fam_l != fam_r or fam_l == "unsupported":
        raise SchemaMismatchError(
            f"join key {what}: left type {lt} and right type {rt} can never compare equal; "
            "join keys must both be integers, both strings, both timestamps, ..."
        )
    if fam_l == "int":
        both_unsigned = lt == pa.uint64() and rt == pa.uint64()
        return KeyColumn(pa.uint64(), "u64") if both_unsigned else KeyColumn(pa.int64(), "i64")
    if fam_l == "float":
        return KeyColumn(pa.float64(), "f64")
    if fam_l == "bool":
        return KeyColumn(pa.bool_(), "bool")
    if fam_l == "string":
        return KeyColumn(pa.large_string(), "var")
    if fam_l == "binary":
        return KeyColumn(pa.large_binary(), "var")
    if fam_l == "date":
        return KeyColumn(pa.date32() if lt == rt == pa.date32() else pa.date64(), "i64")
    if fam_l == "timestamp":
        if (lt.tz is None) != (rt.tz is None):
            raise SchemaMismatchError(
                f"join key {what}: {lt} vs {rt}: a time-zone-aware timestamp never equals a "
                "naive one; convert one side"
            )
        unit = finer_unit(lt.unit, rt.unit)
        return KeyColumn(pa.timestamp(unit, tz="UTC" if lt.tz else None), "i64")
    if fam_l == "time":
        unit = finer_unit(lt.unit, rt.unit)
        return KeyColumn(pa.time64(unit) if unit in ("us", "ns") else pa.time32(unit), "i64")
    if fam_l == "duration":
        return KeyColumn(pa.duration(finer_unit(lt.unit, rt.unit)), "i64")
    if lt.scale != rt.scale:
        raise SchemaMismatchError(
            f"join key {what}: decimals {lt} and {rt} have different scales; cast one side"
        )
    return KeyColumn(pa.decimal128(38, lt.scale), "dec")


def key_plan(
    left: pa.Schema, left_key: Sequence[str], right: pa.Schema, right_key: Sequence[str]
) -> list[KeyColumn]:
    """The common type of every key column pair, or a :class:`SchemaMismatchError`."""
    if len(left_key) != len(right_key):
        raise SchemaMismatchError(
            f"join keys differ in length: left {list(left_key)} vs right {list(right_key)}"
        )
    plan = []
    for lk, rk in zip(left_key, right_key, strict=True):
        plan.append(_common(left.field(lk).type, right.field(rk).type, f"{lk!r} = {rk!r}"))
    return plan


def single_plan(schema: pa.Schema, columns: Sequence[str]) -> list[KeyColumn]:
    """A plan for columns matched only against themselves (e.g. a side's unique key)."""
    return [_common(schema.field(c).type, schema.field(c).type, repr(c)) for c in columns]


class KeyCodec:
    """Encode a side's key columns into canonical bytes."""

    def __init__(self, columns: Sequence[str], plan: Sequence[KeyColumn], side: str) -> None:
        self.columns = list(columns)
        self.plan = list(plan)
        self.side = side

    def encode(self, table: pa.Table) -> tuple[Bytes, np.ndarray]:
        """Canonical key bytes per row, and a mask of rows whose key has a NULL."""
        n = table.num_rows
        null = np.zeros(n, dtype=bool)
        parts: list[Bytes] = []
        for name, kc in zip(self.columns, self.plan, strict=True):
            col = table.column(name)
            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            if arr.null_count:
                null |= ~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            parts.append(self._encode_column(name, arr, kc))
        if not parts:
            return Bytes.from_fixed(np.zeros((n, 0), dtype=np.uint8)), null
        return Bytes.concat_rows(parts), null

    def shard_of(self, table: pa.Table | pa.RecordBatch, shards: int) -> np.ndarray:
        """Shard number of every row: ``xxh3(canonical key) % shards`` (int64).

        Equal keys get equal shards on both sides of a join whatever their integer
        widths (both sides share one key plan); rows with a NULL key go to shard 0 (they
        never match, so any shard is correct).  The one implementation of routing: the
        in-process join and Spark's router both call it.
        """
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise SchemaMismatchError(f"shards={shards!r} must be an int >= 1")
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        canon, null = self.encode(table)
        h = hash_prefix(canon) % np.uint64(shards)
        h[null] = 0
        return h.astype(np.int64)

    def _encode_column(self, name: str, arr: pa.Array, kc: KeyColumn) -> Bytes:
        n = len(arr)
        if not arr.type.equals(kc.common):
            try:
                arr = pc.cast(arr, kc.common, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatchError(
                    f"{self.side} side: key column {name!r} has a value that does not fit the "
                    f"join's common key type {kc.common}: {exc}"
                ) from exc
        if kc.kind == "var":
            if arr.null_count:
                arr = pc.fill_null(arr, pa.scalar(b"" if kc.common == pa.large_binary() else "",
                                                  kc.common))
            body = Bytes.from_arrow(arr)
            lengths = body.lengths().astype(">u4").view(np.uint8).reshape(n, 4)
            return Bytes.concat_rows([Bytes.from_fixed(lengths), body])
        if kc.kind == "bool":
            vals = np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), np.uint8)
            return Bytes.from_fixed(vals.reshape(n, 1))
        width = 16 if kc.kind == "dec" else int(arr.type.bit_width // 8)
        raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[
            arr.offset * width : (arr.offset + n) * width
        ].reshape(n, width)
        if kc.kind == "dec":
            mat = raw.copy()
        elif kc.kind == "f64":
            v = raw.view("<f8").reshape(n).copy()
            v[v == 0.0] = 0.0  # folds -0.0 into 0.0
            v[np.isnan(v)] = np.nan
            mat = v.astype(">f8").view(np.uint8).reshape(n, 8)
        else:
            src = "<u8" if kc.kind == "u64" else f"<i{width}"
            dst = ">u8" if kc.kind == "u64" else ">i8"
            mat = raw.view(src).reshape(n).astype(dst).view(np.uint8).reshape(n, 8)
        if arr.null_count:
            valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            mat[~valid] = 0
        return Bytes.from_fixed(mat)


# ---- hashing ------------------------------------------------------------------------

# xxh3's default secret, bytes 8..23, folded as the 4-to-8-byte path does; checked
# against the xxhash package by the tests (tests/test_keys.py).
_SECRET_8_24 = bytes.fromhex("7c01812cf721ad1cded46de9839097db")
_BITFLIP = np.uint64(
    int.from_bytes(_SECRET_8_24[:8], "little") ^ int.from_bytes(_SECRET_8_24[8:], "little")
)
_PRIME = np.uint64(0x9FB21C651E98DF25)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _xxh3_8(mat: np.ndarray) -> np.ndarray:
    """xxh3_64 (seed 0) of n 8-byte strings, vectorised: XXH3's 4..8-byte path."""
    words = np.ascontiguousarray(mat).view("<u4").reshape(-1, 2).astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (words[:, 1] + (words[:, 0] << np.uint64(32))) ^ _BITFLIP
        x ^= _rotl(x, 49) ^ _rotl(x, 24)
        x *= _PRIME
        x ^= (x >> np.uint64(35)) + np.uint64(8)
        x *= _PRIME
        x ^= x >> np.uint64(28)
    return x


def hash_prefix(canon: Bytes) -> np.ndarray:
    """``xxh3_64`` of every canonical key, as uint64 (the key prefix, big-endian on disk)."""
    n = len(canon)
    if canon.width == 8:
        return _xxh3_8(canon.matrix())
    return np.fromiter(_each(xxhash.xxh3_64_intdigest, canon), dtype=np.uint64, count=n)


def row_hash(rows: Bytes) -> Bytes:
    """128-bit ``xxh3`` of every encoded row: the bag layout's row discriminator."""
    n = len(rows)
    digests = np.fromiter(_each(xxhash.xxh3_128_digest, rows), dtype="S16", count=n)
    return Bytes.from_fixed(digests.view(np.uint8).reshape(n, 16))


def _each(fn: Callable[[bytes], T], strings: Bytes) -> Iterator[T]:
    """``fn`` of every string, computed as numpy consumes them.

    Fixed-width strings are cut one at a time by ``struct`` in C, so each row's
    ``bytes`` object is freed before the next is made: a batch then reuses one slot of
    heap instead of first-touching a fresh megabyte per 10k rows (and it is ~1.7x
    faster than building the list).  Variable widths go through one list.
    """
    if strings.width:
        return itertools.starmap(fn, struct.iter_unpack(f"{strings.width}s",
                                                        strings.data.tobytes()))
    return map(fn, strings.to_list())


def prefix_bytes(prefix: np.ndarray) -> Bytes:
    """The uint64 prefixes as 8 big-endian bytes each."""
    return Bytes.from_fixed(prefix.astype(">u8").view(np.uint8).reshape(len(prefix), 8))
