"""Canonical join keys, their xxh3 prefix, key type compatibility and shard routing.

Equal keys must meet whatever their declared types: an int16 ``7`` on one side and an
int64 ``7`` on the other must produce the same canonical bytes, hence the same 8-byte
prefix, the same RocksDB key and the same shard.  A mistake here never raises: it
silently loses matches.  These tests therefore check

* ``hash_prefix`` against the ``xxhash`` package itself (its vectorised 8-byte path is a
  hand-written port of XXH3, and the generic path serves variable-length keys);
* the canonical encoding documented in :mod:`joinstate.keys` (int64 / uint64 / float64
  big-endian, u32 length + bytes for strings) for every integer width, floats (``-0.0``
  and every NaN fold together), strings vs large strings, timestamps in different units
  and time zones, dates, and multi-column keys with their NULL mask;
* that key pairs which can never compare equal (string vs int, tz-aware vs naive
  timestamps, decimals of different scales) are refused at ``store.join``;
* that ``join.shard_of`` routes equal keys of both sides to the same shard.
"""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import joinstate
from joinstate._bytes import Bytes
from joinstate.keys import KeyCodec, hash_prefix, key_plan, row_hash

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

SETTINGS = settings(deadline=None)


def xxh3(items: Sequence[bytes]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(b) for b in items]


# --------------------------------------------------------------------------- hash_prefix


@settings(SETTINGS, max_examples=200)
@given(items=st.lists(st.binary(min_size=8, max_size=8), max_size=50))
def test_hash_prefix_of_8_byte_keys_matches_xxhash(items: list[bytes]) -> None:
    """The vectorised XXH3 port equals the reference for any 8 bytes."""
    mat = np.frombuffer(b"".join(items), dtype=np.uint8).reshape(len(items), 8)
    canon = Bytes.from_fixed(mat)
    assert canon.width == 8
    got = hash_prefix(canon)
    assert got.dtype == np.uint64
    assert got.tolist() == xxh3(items)


def test_hash_prefix_of_8_byte_edge_keys() -> None:
    items = [b"\x00" * 8, b"\xff" * 8, b"\x80" + b"\x00" * 7, b"\x00" * 7 + b"\x01",
             struct.pack(">q", -1), struct.pack(">q", 2**63 - 1), struct.pack(">q", -(2**63))]
    rng = np.random.default_rng(1)
    items += [bytes(r) for r in rng.integers(0, 256, (1000, 8), dtype=np.uint8)]
    canon = Bytes.from_list(items)  # the Arrow path also detects the fixed width
    assert canon.width == 8
    assert hash_prefix(canon).tolist() == xxh3(items)


@settings(SETTINGS, max_examples=200)
@given(items=st.lists(st.binary(max_size=300), max_size=30))
def test_hash_prefix_of_variable_length_keys_matches_xxhash(items: list[bytes]) -> None:
    """Keys of any length (0, 1-3, 4-8, 9-16, 17-128, 129-240, >240 bytes) hash like xxhash."""
    got = hash_prefix(Bytes.from_list(items))
    assert got.tolist() == xxh3(items)


@pytest.mark.parametrize("width", [0, 1, 3, 4, 7, 9, 16, 17, 128, 129, 240, 241])
def test_hash_prefix_of_fixed_non_8_widths(width: int) -> None:
    """Fixed-width keys other than 8 bytes take the generic path, still exact."""
    rng = np.random.default_rng(width)
    mat = rng.integers(0, 256, (20, width), dtype=np.uint8)
    items = [bytes(r) for r in mat]
    assert hash_prefix(Bytes.from_fixed(mat)).tolist() == xxh3(items)


@settings(SETTINGS, max_examples=200)
@given(items=st.lists(st.binary(max_size=300), max_size=30))
def test_row_hash_matches_xxhash(items: list[bytes]) -> None:
    """The bag layout's row discriminator is xxh3-128 of each encoded row, byte for byte
    (it is stored in index keys, so a change would orphan every stored row)."""
    got = row_hash(Bytes.from_list(items))
    assert got.width == 16
    assert got.to_list() == [xxhash.xxh3_128_digest(b) for b in items]


@pytest.mark.parametrize("width", [0, 1, 8, 16, 52, 241])
def test_row_hash_of_fixed_widths_keeps_zero_bytes(width: int) -> None:
    """Fixed-width rows (cut one at a time) ending or starting in NUL bytes, and digests
    ending in NUL bytes, are hashed and stored exactly."""
    rng = np.random.default_rng(width)
    mat = rng.integers(0, 256, (300, width), dtype=np.uint8)
    mat[::3, -1:] = 0
    mat[1::3, :1] = 0
    items = [bytes(r) for r in mat]
    want = [xxhash.xxh3_128_digest(b) for b in items]
    got = row_hash(Bytes.from_fixed(mat))
    assert len(got) == len(items)
    assert got.to_list() == want
    assert row_hash(Bytes.from_fixed(mat[:0])).to_list() == []


# --------------------------------------------------------------------------- canonical bytes


def schema1(t: pa.DataType, name: str = "k") -> pa.Schema:
    return pa.schema([pa.field(name, t)])


def encode_pair(
    left: pa.Array, right: pa.Array
) -> tuple[list[bytes], np.ndarray, list[bytes], np.ndarray]:
    """Canonical bytes and NULL masks of a one-column key on each side, planned together."""
    ls, rs = schema1(left.type, "lk"), schema1(right.type, "rk")
    plan = key_plan(ls, ["lk"], rs, ["rk"])
    lb, ln = KeyCodec(["lk"], plan, "left").encode(pa.table({"lk": left}))
    rb, rn = KeyCodec(["rk"], plan, "right").encode(pa.table({"rk": right}))
    return lb.to_list(), ln, rb.to_list(), rn


INT_WIDTH_PAIRS = [
    (pa.int16(), pa.int64()), (pa.int64(), pa.int16()), (pa.uint32(), pa.int64()),
    (pa.int16(), pa.uint32()), (pa.int8(), pa.uint8()), (pa.uint16(), pa.int32()),
]


@pytest.mark.parametrize(("lt", "rt"), INT_WIDTH_PAIRS, ids=str)
@settings(SETTINGS, max_examples=40)
@given(values=st.lists(st.one_of(st.none(), st.integers(0, 127)), max_size=30))
def test_int_widths_give_identical_canonical_bytes(
    lt: pa.DataType, rt: pa.DataType, values: list[int | None]
) -> None:
    lb, ln, rb, rn = encode_pair(pa.array(values, lt), pa.array(values, rt))
    want_null = [v is None for v in values]
    assert ln.tolist() == want_null
    assert rn.tolist() == want_null
    for v, a, b in zip(values, lb, rb, strict=True):
        if v is not None:
            assert a == b == struct.pack(">q", v)  # the documented canonical form


@settings(SETTINGS, max_examples=100)
@given(values=st.lists(st.integers(-(2**15), 2**15 - 1), min_size=1, max_size=30))
def test_negative_int16_and_int64_agree(values: list[int]) -> None:
    lb, _, rb, _ = encode_pair(pa.array(values, pa.int16()), pa.array(values, pa.int64()))
    assert lb == rb == [struct.pack(">q", v) for v in values]


def test_int_extremes_and_uint64() -> None:
    ext = [-(2**63), -1, 0, 2**63 - 1]
    lb, _, rb, _ = encode_pair(pa.array(ext, pa.int64()), pa.array(ext, pa.int64()))
    assert lb == rb == [struct.pack(">q", v) for v in ext]
    big = [0, 2**63, 2**64 - 1]
    lb, _, rb, _ = encode_pair(pa.array(big, pa.uint64()), pa.array(big, pa.uint64()))
    assert lb == rb == [struct.pack(">Q", v) for v in big]


def test_uint64_value_beyond_int64_against_int64_key_is_refused(tmp_path: Path) -> None:
    """uint64 vs int64 plans to int64; a uint64 value that does not fit must raise, not wrap."""
    left = joinstate.Side(schema1(pa.uint64()), key=["k"])
    right = joinstate.Side(schema1(pa.int64()), key=["k"])
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=left, right=right)
        with pytest.raises(joinstate.SchemaMismatchError, match="'k'"):
            join.push("left", pa.table({"k": pa.array([2**63], pa.uint64())}))
        assert join.state("left").num_rows == 0
        join.push("left", pa.table({"k": pa.array([5], pa.uint64())}))
        out = join.push("right", pa.table({"k": pa.array([5], pa.int64())}))
        assert out.column("k").to_pylist() == [5]


def test_float_zero_signs_and_nans_fold() -> None:
    bits = [0x0000000000000000, 0x8000000000000000, 0x7FF8000000000000, 0xFFF8000000000000,
            0x7FF0000000000001, 0x7FF8DEADBEEF0001]
    arr = pa.array(bits, pa.uint64()).view(pa.float64())
    lb, _, rb, _ = encode_pair(arr, arr)
    assert lb == rb
    assert lb[0] == lb[1] == struct.pack(">d", 0.0)
    assert len(set(lb[2:])) == 1  # one NaN pattern


@settings(SETTINGS, max_examples=100)
@given(values=st.lists(st.one_of(st.none(), st.floats(width=32)), max_size=30))
def test_float32_and_float64_keys_agree(values: list[float | None]) -> None:
    lb, ln, rb, rn = encode_pair(pa.array(values, pa.float32()), pa.array(values, pa.float64()))
    assert ln.tolist() == rn.tolist() == [v is None for v in values]
    for v, a, b in zip(values, lb, rb, strict=True):
        if v is None:
            continue
        assert a == b
        if v == v and v != 0.0:  # not NaN, not a zero
            assert a == struct.pack(">d", v)


@settings(SETTINGS, max_examples=100)
@given(values=st.lists(st.one_of(st.none(), st.text()), max_size=20))
def test_string_and_large_string_keys_agree(values: list[str | None]) -> None:
    lb, ln, rb, rn = encode_pair(pa.array(values, pa.string()), pa.array(values, pa.large_string()))
    assert ln.tolist() == rn.tolist() == [v is None for v in values]
    for v, a, b in zip(values, lb, rb, strict=True):
        if v is not None:
            raw = v.encode()
            assert a == b == struct.pack(">I", len(raw)) + raw


def test_binary_and_large_binary_keys_agree() -> None:
    vals = [b"", b"\x00", b"\x00\x01", b"abc"]
    lb, _, rb, _ = encode_pair(pa.array(vals, pa.binary()), pa.array(vals, pa.large_binary()))
    assert lb == rb == [struct.pack(">I", len(v)) + v for v in vals]


def test_multi_column_string_keys_are_prefix_free() -> None:
    """("a", "bc") and ("ab", "c") concatenate to the same text but are different keys."""
    s = pa.schema([("x", pa.string()), ("y", pa.string())])
    plan = key_plan(s, ["x", "y"], s, ["x", "y"])
    canon, _ = KeyCodec(["x", "y"], plan, "left").encode(
        pa.table({"x": ["a", "ab", ""], "y": ["bc", "c", "abc"]}, schema=s)
    )
    assert len(set(canon.to_list())) == 3


@settings(SETTINGS, max_examples=100)
@given(
    rows=st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-5, 5)),
                  st.one_of(st.none(), st.sampled_from(["", "a", "é"])),
                  st.one_of(st.none(), st.booleans())),
        max_size=30,
    )
)
def test_multi_column_null_mask_and_bytes(rows: list[tuple[Any, Any, Any]]) -> None:
    """A row's key is NULL iff any key column is; non-NULL keys encode column by column."""
    left = pa.schema([("a", pa.int32()), ("b", pa.string()), ("c", pa.bool_())])
    right = pa.schema([("a", pa.int64()), ("b", pa.large_string()), ("c", pa.bool_())])
    cols = ["a", "b", "c"]
    plan = key_plan(left, cols, right, cols)
    data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    lb, ln = KeyCodec(cols, plan, "left").encode(pa.table(data, schema=left))
    rb, rn = KeyCodec(cols, plan, "right").encode(pa.table(data, schema=right))
    assert ln.tolist() == rn.tolist() == [None in r for r in rows]
    for r, x, y in zip(rows, lb.to_list(), rb.to_list(), strict=True):
        if None in r:
            continue
        raw = r[1].encode()
        assert x == y == struct.pack(">q", r[0]) + struct.pack(">I", len(raw)) + raw + bytes(
            [int(r[2])])


def test_timestamp_units_and_time_zones_agree() -> None:
    """The same instant in ms and us (and two time zones) gives the same canonical bytes."""
    ms = pa.array([0, 1_700_000_000_123, None, -1], pa.timestamp("ms", tz="Europe/Paris"))
    us = pa.array([0, 1_700_000_000_123_000, None, -1000], pa.timestamp("us", tz="UTC"))
    lb, ln, rb, rn = encode_pair(ms, us)
    assert ln.tolist() == rn.tolist() == [False, False, True, False]
    assert lb[:2] == rb[:2] and lb[3] == rb[3]
    assert lb[1] == struct.pack(">q", 1_700_000_000_123_000)
    naive_s = pa.array([1, 2], pa.timestamp("s"))
    naive_ns = pa.array([1_000_000_000, 2_000_000_000], pa.timestamp("ns"))
    lb, _, rb, _ = encode_pair(naive_s, naive_ns)
    assert lb == rb


def test_date32_and_date64_agree() -> None:
    day = 86_400_000
    lb, _, rb, _ = encode_pair(
        pa.array([0, 19_000, -3], pa.date32()), pa.array([0, 19_000 * day, -3 * day], pa.date64())
    )
    assert lb == rb


def test_decimals_of_same_scale_agree() -> None:
    vals = [Decimal("1.50"), Decimal("-0.01"), None]
    lb, ln, rb, _ = encode_pair(pa.array(vals, pa.decimal128(5, 2)),
                                pa.array(vals, pa.decimal128(30, 2)))
    assert ln.tolist() == [False, False, True]
    assert lb[:2] == rb[:2]
    assert lb[0] != lb[1]


# --------------------------------------------------------------------------- refused pairs


REFUSED = [
    (pa.string(), pa.int64(), "string"),
    (pa.int32(), pa.large_string(), "int32"),
    (pa.timestamp("us", tz="UTC"), pa.timestamp("us"), "time-zone"),
    (pa.timestamp("s"), pa.timestamp("ms", tz="Asia/Tokyo"), "time-zone"),
    (pa.decimal128(10, 2), pa.decimal128(10, 3), "scale"),
    (pa.float64(), pa.int64(), "double"),
    (pa.binary(), pa.string(), "binary"),
    (pa.date32(), pa.timestamp("s"), "date32"),
]


@pytest.mark.parametrize(("lt", "rt", "word"), REFUSED, ids=lambda x: str(x))
def test_incompatible_key_types_raise_at_join(
    tmp_path: Path, lt: pa.DataType, rt: pa.DataType, word: str
) -> None:
    left = joinstate.Side(pa.schema([("lkey", lt), ("v", pa.int64())]), key=["lkey"])
    right = joinstate.Side(pa.schema([("rkey", rt)]), key=["rkey"])
    with joinstate.StateStore(tmp_path) as store:
        with pytest.raises(joinstate.SchemaMismatchError) as info:
            store.join("j", left=left, right=right)
        msg = str(info.value)
        assert "lkey" in msg and "rkey" in msg
        assert word in msg
        assert isinstance(info.value, joinstate.JoinStateError)
        # Nothing was registered: a compatible spec under the same name still works.
        ok = joinstate.Side(pa.schema([("rkey", lt)]), key=["rkey"])
        store.join("j", left=left, right=ok)


def test_key_length_mismatch_raises(tmp_path: Path) -> None:
    left = joinstate.Side(pa.schema([("a", pa.int64()), ("b", pa.int64())]), key=["a", "b"])
    right = joinstate.Side(pa.schema([("a", pa.int64())]), key=["a"])
    with joinstate.StateStore(tmp_path) as store, pytest.raises(
        joinstate.SchemaMismatchError, match="differ in length"
    ):
        store.join("j", left=left, right=right)


# --------------------------------------------------------------------------- shards


@pytest.mark.parametrize("shards", [1, 2, 7, 64])
def test_shard_of_agrees_across_int_widths(tmp_path: Path, shards: int) -> None:
    values = [*range(-300, 300, 7), None, 0, 32767, -32768]
    pos = [v for v in values if v is not None and v >= 0]
    left = joinstate.Side(pa.schema([("k", pa.int16()), ("x", pa.string())]), key=["k"])
    right = joinstate.Side(pa.schema([("k", pa.int64())]), key=["k"])
    other = joinstate.Side(pa.schema([("k", pa.uint32())]), key=["k"])
    with joinstate.StateStore(tmp_path) as store:
        j1 = store.join("a", left=left, right=right)
        j2 = store.join("b", left=left, right=other)
        ltab = pa.table({"k": pa.array(values, pa.int16()), "x": ["x"] * len(values)})
        s_left = j1.shard_of("left", ltab, shards)
        s_right = j1.shard_of("right", pa.table({"k": pa.array(values, pa.int64())}), shards)
        assert s_left.tolist() == s_right.tolist()
        want = [0 if v is None else xxhash.xxh3_64_intdigest(struct.pack(">q", v)) % shards
                for v in values]
        assert s_left.tolist() == want
        assert all(0 <= s < shards for s in s_left.tolist())
        # uint32 against int16 (a different join, so a different plan): same routing.
        s_u = j2.shard_of("right", pa.table({"k": pa.array(pos, pa.uint32())}), shards)
        s_l = j2.shard_of("left", pa.RecordBatch.from_pydict(
            {"k": pa.array(pos, pa.int16()), "x": ["x"] * len(pos)}), shards)
        assert s_u.tolist() == s_l.tolist()


def test_shard_of_spreads_keys(tmp_path: Path) -> None:
    side = joinstate.Side(pa.schema([("k", pa.int64())]), key=["k"])
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=side, right=side)
        shards = join.shard_of("left", pa.table({"k": pa.array(range(4000), pa.int64())}), 4)
        counts = np.bincount(shards, minlength=4)
        assert counts.min() > 800  # xxh3 spreads consecutive integers evenly


def test_equal_keys_of_different_widths_match_in_a_join(tmp_path: Path) -> None:
    """End to end: int16 / uint32 keys on the left meet int64 keys on the right."""
    left = joinstate.Side(pa.schema([("k", pa.int16()), ("u", pa.uint32())]), key=["k", "u"])
    right = joinstate.Side(pa.schema([("k", pa.int64()), ("u", pa.int64()), ("r", pa.string())]),
                           key=["k", "u"])
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=left, right=right, suffixes=("_l", "_r"))
        join.push("left", pa.table({"k": pa.array([1, -2, 3, None], pa.int16()),
                                    "u": pa.array([10, 20, 30, 40], pa.uint32())}))
        out = join.push("right", pa.table({"k": [1, -2, 3, None], "u": [10, 20, 31, 40],
                                           "r": ["a", "b", "c", "d"]}))
        got = sorted(zip(out.column("k_l").to_pylist(), out.column("r").to_pylist(),
                         out.column(joinstate.WEIGHT).to_pylist(), strict=True))
        assert got == [(-2, "b", 1), (1, "a", 1)]
