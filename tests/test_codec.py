"""Row codec round trips: ``RowCodec.decode(RowCodec.encode(t))`` must give ``t`` back exactly
(floats canonicalised: ``-0.0`` reads back as ``0.0``, every NaN as the one quiet NaN).

The row codec is the only way rows get into and out of RocksDB, and its bytes double as
a row's identity (consolidation and the bag layout's row hash rely on them).  So these
property tests check, for every storable Arrow type (integers at their extremes, floats
bit for bit including NaN payloads, ``-0.0`` and infinities, strings and binaries with
NUL bytes and empty values, dates, times, timestamps with and without time zones,
durations, decimals) and NULLs everywhere:

* the round trip is exact up to float canonicalisation (:func:`sql_canonical`), for
  single types, random column mixes, sliced arrays (a non-zero Arrow offset) and chunked
  tables;
* equal rows encode to equal bytes whatever their physical representation (slices,
  chunks, garbage under NULL slots), and different rows to different bytes, in particular
  NULL vs zero / empty, and ``-0.0`` vs ``0.0`` or two NaNs are the same row (SQL
  equality, what Spark does for joins and grouping);
* the same holds end to end: rows pushed through a real ``StateStore`` come back from
  ``join.state`` as the consolidated input, for every storage layout.

Values are compared through :func:`canonical_column`, which reads floats as their bit
patterns and temporal types as their integer storage, so NaN and ``-0.0`` are compared
exactly and no precision is lost in a Python conversion; expected tables go through
:func:`sql_canonical` (written with Arrow compute, independently of the codec) first.
"""

from __future__ import annotations

import itertools
import tempfile
from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import joinstate
from joinstate.codec import RowCodec

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

Row = tuple[Any, ...]

SETTINGS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
    ],
)

# --------------------------------------------------------------------------- types


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in [lo, hi], with the extremes and their neighbours drawn often."""
    edges = sorted({lo, lo + 1, hi - 1, hi, 0 if lo <= 0 <= hi else lo, -1 if lo < 0 else hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


# Bit patterns of special float64 / float32 values: +-0, +-inf, quiet and signalling NaNs
# with payloads and both signs, the smallest subnormal, the largest finite value.
F64_SPECIAL = [
    0x0000000000000000, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
    0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF8DEADBEEF0001,
    0xFFFFFFFFFFFFFFFF, 0x0000000000000001, 0x7FEFFFFFFFFFFFFF, 0x3FF0000000000000,
]
F32_SPECIAL = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
    0x7F800001, 0x7FC0BEEF, 0xFFFFFFFF, 0x00000001, 0x7F7FFFFF, 0x3F800000,
]


def _float_bits(bits: int, special: list[int]) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(special), st.integers(0, 2**bits - 1))


_DAY_MS = 86_400_000


class ColumnType:
    """A storable Arrow type, how to draw Python values for it and build an array of them."""

    def __init__(
        self, type_: pa.DataType, values: st.SearchStrategy[Any],
        build: Callable[[list[Any]], pa.Array] | None = None,
    ) -> None:
        self.type = type_
        self.values = values
        self._build = build

    def build(self, vals: list[Any]) -> pa.Array:
        arr = self._build(vals) if self._build is not None else pa.array(vals, self.type)
        assert arr.type == self.type
        return arr

    def __repr__(self) -> str:
        return str(self.type)


def _viewed(storage: pa.DataType, target: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    """Build ``storage`` values, then reinterpret them as ``target`` (bit for bit)."""
    return lambda vals: pa.array(vals, storage).view(target)


def _decimals(precision: int, scale: int) -> ColumnType:
    top = 10**precision - 1
    values = _ints(-top, top).map(lambda i: Decimal(f"{i}E-{scale}"))
    return ColumnType(pa.decimal128(precision, scale), values)


def _all_types() -> list[ColumnType]:
    out: list[ColumnType] = []
    for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64(),
              pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()):
        out.append(ColumnType(t, _ints(*_int_range(t))))
    out.append(ColumnType(pa.float64(), _float_bits(64, F64_SPECIAL),
                          _viewed(pa.uint64(), pa.float64())))
    out.append(ColumnType(pa.float32(), _float_bits(32, F32_SPECIAL),
                          _viewed(pa.uint32(), pa.float32())))
    out.append(ColumnType(pa.bool_(), st.booleans()))
    text = st.one_of(st.sampled_from(["", "\x00", "é", "日本語", "🦆\U0010ffff"]), st.text())
    out.append(ColumnType(pa.string(), text))
    out.append(ColumnType(pa.large_string(), text))
    blob = st.one_of(st.sampled_from([b"", b"\x00", b"\x00\x00\xff", b"a\x00b"]), st.binary())
    out.append(ColumnType(pa.binary(), blob))
    out.append(ColumnType(pa.large_binary(), blob))
    out.append(ColumnType(pa.binary(3), st.binary(min_size=3, max_size=3)))
    out.append(ColumnType(pa.date32(), _ints(-(2**31), 2**31 - 1),
                          _viewed(pa.int32(), pa.date32())))
    out.append(ColumnType(pa.date64(), _ints(-(10**8), 10**8).map(lambda d: d * _DAY_MS),
                          _viewed(pa.int64(), pa.date64())))
    out.append(ColumnType(pa.time32("s"), _ints(0, 86_399), _viewed(pa.int32(), pa.time32("s"))))
    out.append(ColumnType(pa.time32("ms"), _ints(0, _DAY_MS - 1),
                          _viewed(pa.int32(), pa.time32("ms"))))
    out.append(ColumnType(pa.time64("us"), _ints(0, _DAY_MS * 1000 - 1),
                          _viewed(pa.int64(), pa.time64("us"))))
    out.append(ColumnType(pa.time64("ns"), _ints(0, _DAY_MS * 1_000_000 - 1),
                          _viewed(pa.int64(), pa.time64("ns"))))
    i64 = _ints(-(2**63), 2**63 - 1)
    for unit in ("s", "ms", "us", "ns"):
        for tz in (None, "UTC", "Asia/Kolkata"):
            t = pa.timestamp(unit, tz=tz)
            out.append(ColumnType(t, i64, _viewed(pa.int64(), t)))
    for unit in ("s", "ns"):
        out.append(ColumnType(pa.duration(unit), i64, _viewed(pa.int64(), pa.duration(unit))))
    for precision, scale in ((1, 0), (9, 2), (18, 18), (38, 0), (38, 10)):
        out.append(_decimals(precision, scale))
    return out


TYPES = _all_types()

# --------------------------------------------------------------------------- helpers


def canonical_column(col: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Exact, hashable Python values of a column (None for NULL).

    Floats become their bit patterns (so NaN == NaN and -0.0 != 0.0), temporal types
    their integer storage (no datetime conversion, no precision loss).
    """
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_floating(t):
        arr = arr.view(pa.uint64() if t.bit_width == 64 else pa.uint32())
    elif pa.types.is_temporal(t):
        arr = arr.view(pa.int64() if t.bit_width == 64 else pa.int32())
    return arr.to_pylist()


def canonical_rows(table: pa.Table, columns: Sequence[str] | None = None) -> list[Row]:
    names = table.column_names if columns is None else list(columns)
    cols = [canonical_column(table.column(n)) for n in names]
    return list(zip(*cols, strict=True)) if cols else [()] * table.num_rows


def sql_canonical(table: pa.Table) -> pa.Table:
    """``table`` with float columns as the codec stores them: -0.0 -> 0.0, NaN -> one NaN."""
    cols = []
    for col in table.columns:
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if pa.types.is_floating(arr.type):
            nan = pa.scalar(float("nan"), arr.type)
            arr = pc.if_else(pc.is_nan(arr), nan, pc.add(arr, pa.scalar(0.0, arr.type)))
        cols.append(arr)
    return pa.Table.from_arrays(cols, schema=table.schema)


def assert_same_table(got: pa.Table, want: pa.Table) -> None:
    """``got`` has ``want``'s schema and exactly its values, NULLs and float bits included."""
    got.validate(full=True)
    assert got.schema == want.schema, f"{got.schema} != {want.schema}"
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        assert canonical_column(got.column(name)) == canonical_column(want.column(name)), name


def column_arrays(ct: ColumnType, n: int, nulls: bool = True) -> st.SearchStrategy[pa.Array]:
    value = st.one_of(st.none(), ct.values) if nulls else ct.values
    return st.lists(value, min_size=n, max_size=n).map(ct.build)


@st.composite
def tables(
    draw: st.DrawFn, types: Sequence[ColumnType] | None = None, max_rows: int = 20,
    max_columns: int = 8,
) -> pa.Table:
    """A table of random rows; columns are ``types`` if given, else a random mix."""
    n = draw(st.integers(0, max_rows))
    if types is None:
        types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=max_columns))
    arrays = [draw(column_arrays(ct, n)) for ct in types]
    fields = [pa.field(f"c{i}", ct.type) for i, ct in enumerate(types)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def round_trip(table: pa.Table, schema: pa.Schema | None = None) -> pa.Table:
    codec = RowCodec(schema if schema is not None else table.schema)
    return codec.decode(codec.encode(table))


def encoded(table: pa.Table) -> list[bytes]:
    return RowCodec(table.schema).encode(table).to_list()


def fresh_copy(table: pa.Table) -> pa.Table:
    """The same values in new, zero-offset, single-chunk buffers."""
    idx = pa.array(np.arange(table.num_rows, dtype=np.int64))
    return pa.Table.from_arrays(
        [c.combine_chunks().take(idx) for c in table.columns], schema=table.schema
    )


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("ct", TYPES, ids=str)
@settings(SETTINGS, max_examples=25)
@given(data=st.data())
def test_round_trip_every_type(ct: ColumnType, data: st.DataObject) -> None:
    """Each storable type, alone and NULL-mixed, comes back value for value."""
    t = data.draw(tables(types=[ct], max_rows=12))
    assert_same_table(round_trip(t), sql_canonical(t))
    # The extremes and special values are always covered, not left to chance.
    specials = {pa.float64(): F64_SPECIAL, pa.float32(): F32_SPECIAL}
    if pa.types.is_integer(ct.type):
        vals: list[Any] = [*_int_range(ct.type), None, 0]
    elif ct.type in specials:
        vals = [*specials[ct.type], None]
    else:
        return
    edge = pa.table({"c0": ct.build(vals)})
    assert_same_table(round_trip(edge), sql_canonical(edge))


@settings(SETTINGS, max_examples=100)
@given(t=tables())
def test_round_trip_random_column_mix(t: pa.Table) -> None:
    assert_same_table(round_trip(t), sql_canonical(t))


def test_round_trip_every_type_at_once() -> None:
    """One wide row set with every type: fixed and variable fields interleaved."""
    rng = np.random.default_rng(7)
    n = 50
    arrays = [_seeded_array(ct, n, rng) for ct in TYPES]
    t = pa.Table.from_arrays(arrays, names=[f"c{i}" for i in range(len(TYPES))])
    assert_same_table(round_trip(t), sql_canonical(t))


def _seeded_array(ct: ColumnType, n: int, rng: np.random.Generator) -> pa.Array:
    """Deterministic values for ``ct`` without hypothesis (every 3rd row NULL)."""
    t = ct.type
    if pa.types.is_integer(t):
        lo, hi = _int_range(t)
        vals: list[Any] = [lo, hi] + [int(x) for x in rng.integers(lo, hi, n - 2, endpoint=True,
                                                                    dtype=np.int64 if lo < 0
                                                                    else np.uint64)]
    elif pa.types.is_floating(t):
        special = F64_SPECIAL if t.bit_width == 64 else F32_SPECIAL
        vals = [special[i % len(special)] for i in range(n)]
    elif pa.types.is_boolean(t):
        vals = [bool(i % 2) for i in range(n)]
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        vals = ["é" * (i % 4) + "\x00" * (i % 2) for i in range(n)]
    elif pa.types.is_fixed_size_binary(t):
        vals = [bytes([i % 256, 0, 255]) for i in range(n)]
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        vals = [b"\x00" * (i % 3) + bytes([i % 256]) for i in range(n)]
    elif pa.types.is_decimal(t):
        top = 10**t.precision - 1
        vals = [Decimal(f"{(-1) ** i * (top // (i + 1))}E-{t.scale}") for i in range(n)]
    elif t == pa.date64():
        vals = [(i - n // 2) * _DAY_MS for i in range(n)]
    else:
        vals = list(range(n))
    vals = [None if i % 3 == 2 else v for i, v in enumerate(vals)]
    return ct.build(vals)


@settings(SETTINGS, max_examples=100)
@given(t=tables(max_rows=30), data=st.data())
def test_round_trip_sliced_and_chunked(t: pa.Table, data: st.DataObject) -> None:
    """Non-zero Arrow offsets and several chunks encode like a fresh contiguous copy."""
    n = t.num_rows
    start = data.draw(st.integers(0, n), label="start")
    length = data.draw(st.integers(0, n - start), label="length")
    sliced = t.slice(start, length)
    if length:
        assert all(c.chunk(0).offset == start for c in sliced.columns)
    copy = fresh_copy(sliced)
    assert_same_table(round_trip(sliced), sql_canonical(copy))
    assert encoded(sliced) == encoded(copy)

    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4), label="cuts"))
    bounds = [0, *cuts, n]
    chunked = pa.concat_tables([t.slice(a, b - a) for a, b in itertools.pairwise(bounds)])
    assert chunked.num_rows == n
    assert_same_table(round_trip(chunked), sql_canonical(fresh_copy(t)))
    assert encoded(chunked) == encoded(t)


# --------------------------------------------------------------------------- row identity


@settings(SETTINGS, max_examples=100)
@given(t=tables(max_rows=15, max_columns=4), data=st.data())
def test_equal_rows_encode_to_equal_bytes(t: pa.Table, data: st.DataObject) -> None:
    """Encoding is a function of the row's SQL values only, and injective on them."""
    n = t.num_rows
    if n == 0:
        return
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=30), label="idx")
    taken = t.take(pa.array(idx, pa.int64()))
    base, again = encoded(t), encoded(taken)
    assert again == [base[i] for i in idx]
    rows = canonical_rows(sql_canonical(t))
    for i in range(n):
        for j in range(n):
            assert (base[i] == base[j]) == (rows[i] == rows[j]), (rows[i], rows[j])


@pytest.mark.parametrize(
    ("type_", "width"),
    [(pa.int64(), 8), (pa.int16(), 2), (pa.float64(), 8), (pa.timestamp("us", tz="UTC"), 8),
     (pa.decimal128(20, 3), 16), (pa.binary(4), 4)],
    ids=str,
)
def test_garbage_under_null_slots_is_ignored(type_: pa.DataType, width: int) -> None:
    """A NULL encodes the same whatever bytes Arrow left under the slot."""
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little"))
    mat = np.zeros((3, width), dtype=np.uint8)
    mat[0, 0], mat[2, 0] = 1, 3  # small valid values: fit any precision
    clean = pa.Array.from_buffers(type_, 3, [validity, pa.py_buffer(mat.copy())])
    mat[1, :] = 0x5A  # garbage under the NULL slot
    dirty = pa.Array.from_buffers(type_, 3, [validity, pa.py_buffer(mat)])
    assert dirty.is_null().to_pylist() == [False, True, False]
    assert encoded(pa.table({"c": dirty})) == encoded(pa.table({"c": clean}))
    assert_same_table(round_trip(pa.table({"c": dirty})), pa.table({"c": clean}))


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary(),
                                   pa.large_binary()], ids=str)
def test_null_string_with_bytes_under_it_is_ignored(type_: pa.DataType) -> None:
    large = pa.types.is_large_string(type_) or pa.types.is_large_binary(type_)
    offsets = np.array([0, 1, 4, 5], dtype=np.int64 if large else np.int32)
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little"))
    dirty = pa.Array.from_buffers(
        type_, 3, [validity, pa.py_buffer(offsets), pa.py_buffer(b"axyzb")]
    )
    clean = pa.array(["a", None, "b"] if "string" in str(type_) else [b"a", None, b"b"], type_)
    assert dirty.to_pylist() == clean.to_pylist()
    assert encoded(pa.table({"c": dirty})) == encoded(pa.table({"c": clean}))
    assert_same_table(round_trip(pa.table({"c": dirty})), pa.table({"c": clean}))


ZEROS: list[tuple[pa.DataType, Any]] = [
    (pa.int8(), 0), (pa.int64(), 0), (pa.uint64(), 0), (pa.float64(), 0.0),
    (pa.float32(), 0.0), (pa.bool_(), False), (pa.string(), ""), (pa.large_string(), ""),
    (pa.binary(), b""), (pa.large_binary(), b""), (pa.binary(2), b"\x00\x00"),
    (pa.date32(), 0), (pa.timestamp("ns"), 0), (pa.timestamp("s", tz="UTC"), 0),
    (pa.decimal128(10, 2), Decimal("0.00")),
]


@pytest.mark.parametrize(("type_", "zero"), ZEROS, ids=[str(t) for t, _ in ZEROS])
def test_null_differs_from_zero_and_empty(type_: pa.DataType, zero: Any) -> None:
    """NULL and the zero/empty value are different rows, and each round-trips as itself."""
    t = pa.table({"a": pa.array([None, zero], type_), "b": pa.array([None, zero], type_)})
    enc = encoded(t)
    assert enc[0] != enc[1]
    back = round_trip(t)
    assert back.column("a").is_null().to_pylist() == [True, False]
    assert canonical_column(back.column("b")) == canonical_column(pa.array([None, zero], type_))
    # A NULL in one column only differs from the same row with the other column NULL.
    mixed = pa.table({"a": pa.array([None, zero], type_), "b": pa.array([zero, None], type_)})
    m = encoded(mixed)
    assert m[0] != m[1]
    assert_same_table(round_trip(mixed), sql_canonical(mixed))


F64_NAN, F32_NAN = 0x7FF8000000000000, 0x7FC00000
FLOAT_CASES = [
    # (type, bits of +0.0 / -0.0, NaN bit patterns: quiet, signalling, payloads, negative)
    (pa.float64(), pa.uint64(), [0x0, 0x8000000000000000], F64_NAN,
     [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF8DEADBEEF0001,
      0xFFFFFFFFFFFFFFFF]),
    (pa.float32(), pa.uint32(), [0x0, 0x80000000], F32_NAN,
     [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC0BEEF, 0xFFFFFFFF]),
]


@pytest.mark.parametrize(("type_", "bits_type", "zeros", "nan", "nans"), FLOAT_CASES,
                         ids=["float64", "float32"])
def test_signed_zero_and_nans_are_one_row(
    type_: pa.DataType, bits_type: pa.DataType, zeros: list[int], nan: int, nans: list[int]
) -> None:
    """Row identity is SQL equality: -0.0 == 0.0 and every NaN is one value (as in Spark)."""
    bits = [*zeros, *nans, 0x1, None]
    arr = pa.array(bits, bits_type).view(type_)
    before = canonical_column(arr)
    t = pa.table({"f": arr, "g": pa.array(range(len(bits)), pa.int8()).cast(pa.int8())})
    enc = RowCodec(pa.schema([("f", type_)])).encode(t.select(["f"])).to_list()
    assert enc[0] == enc[1], "-0.0 must encode like 0.0"
    assert len({enc[i] for i in range(2, 2 + len(nans))}) == 1, "every NaN must encode alike"
    assert len(set(enc)) == 4  # zero, NaN, the subnormal, NULL
    back = round_trip(t.select(["f"]))
    assert canonical_column(back.column("f")) == [0, 0, *[nan] * len(nans), 0x1, None]
    assert canonical_column(arr) == before, "encode must not modify the caller's buffers"
    # Sliced (non-zero offset) and with garbage NaN / -0.0 bytes under NULL slots.
    sliced = arr.slice(1)
    assert encoded(pa.table({"f": sliced})) == enc[1:]
    mat = pa.array([zeros[1], nans[3]], bits_type).view(type_).buffers()[1]
    validity = pa.py_buffer(np.packbits([0, 0], bitorder="little"))
    dirty = pa.Array.from_buffers(type_, 2, [validity, mat])
    assert encoded(pa.table({"f": dirty})) == [enc[-1], enc[-1]]


def test_float_canonicalisation_in_multi_column_rows() -> None:
    """Only the float fields change: rows differing elsewhere stay different."""
    f = pa.array([0x8000000000000000, 0x0, 0xFFF8000000000001, 0x7FF8000000000000],
                 pa.uint64()).view(pa.float64())
    t = pa.table({"f": f, "h": pa.array([-0.0, 0.0, float("nan"), -float("nan")], pa.float32()),
                  "s": ["a", "a", "b", "b"]})
    enc = encoded(t)
    assert enc[0] == enc[1]
    assert enc[2] == enc[3]
    assert enc[0] != enc[2]
    assert_same_table(round_trip(t), sql_canonical(t))
    assert canonical_column(round_trip(t).column("f")) == [0, 0, F64_NAN, F64_NAN]


def test_canonicalisation_is_vectorised_over_many_rows() -> None:
    """A million floats with every kind of special value: canonical, and fast."""
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 2**63, 1_000_000, dtype=np.uint64, endpoint=True)
    raw[::7] = 0x8000000000000000
    raw[1::11] = 0x7FF0000000000000 | (raw[1::11] & 0xFFFFFFFFFFFFF) | 1  # NaNs
    t = pa.table({"f": pa.array(raw).view(pa.float64())})
    back = canonical_column(round_trip(t).column("f"))
    want = canonical_column(sql_canonical(t).column("f"))
    assert back == want
    assert 0x8000000000000000 not in back


@pytest.mark.parametrize("layout", ["bag", "key", "unique"])
@pytest.mark.parametrize("spelled", [(-0.0, 0.0), (float("nan"), -float("nan"))],
                         ids=["zero", "nan"])
def test_store_retracts_a_float_row_spelled_differently(
    layout: str, spelled: tuple[float, float]
) -> None:
    """Insert a row holding -0.0 (NaN), retract it spelled 0.0 (another NaN): state empty."""
    schema = pa.schema([("k", pa.int64()), ("id", pa.int64()), ("f", pa.float64()),
                        ("g", pa.float32())])
    unique = {"bag": None, "key": ["k"], "unique": ["id"]}[layout]
    side = joinstate.Side(schema, key=["k"], unique_key=unique)
    ins, ret = spelled

    def row(v: float, w: int) -> pa.Table:
        return pa.table({"k": [1], "id": [7], "f": [v], "g": pa.array([v], pa.float32()),
                         joinstate.WEIGHT: [w]})

    with tempfile.TemporaryDirectory() as d, joinstate.StateStore(d) as store:
        join = store.join("floats", left=side, right=OTHER)
        join.push("left", row(ins, 1))
        got = join.state("left")
        assert canonical_column(got.column("f")) == canonical_column(
            sql_canonical(row(ret, 1)).column("f"))
        join.push("left", row(ret, -1))
        assert join.state("left").num_rows == 0
        assert join.rows("left") == 0


# --------------------------------------------------------------------------- through a store


STORE_TYPES = TYPES
STORE_SCHEMA = pa.schema(
    [pa.field("k", pa.int64()), pa.field("id", pa.int64())]
    + [pa.field(f"c{i}", ct.type) for i, ct in enumerate(STORE_TYPES)]
)
OTHER = joinstate.Side(pa.schema([("k", pa.int64()), ("r", pa.string())]), key=["k"])


def consolidated(rows: list[Row], weights: Sequence[int]) -> Counter[Row]:
    total: Counter[Row] = Counter()
    for r, w in zip(rows, weights, strict=True):
        total[r] += w
    return Counter({r: w for r, w in total.items() if w != 0})


def state_counter(join: joinstate.Join, side: str, schema: pa.Schema) -> Counter[Row]:
    state = join.state(side)  # type: ignore[arg-type]
    assert state.schema.names == [*schema.names, joinstate.WEIGHT]
    for f in schema:
        assert state.schema.field(f.name).type == f.type, f.name
    assert state.schema.field(joinstate.WEIGHT).type == pa.int64()
    weights = state.column(joinstate.WEIGHT).to_pylist()
    rows = canonical_rows(state, schema.names)
    assert len(set(rows)) == len(rows), "state() must be consolidated"
    assert all(w > 0 for w in weights)
    return Counter(dict(zip(rows, weights, strict=True)))


@st.composite
def store_deltas(draw: st.DrawFn, layout: str) -> tuple[pa.Table, list[int], pa.Table, list[int]]:
    """A first delta of all-type rows and a second one retracting part of it.

    ``bag``: keys repeat, rows may repeat, weights 1..3.  ``key``: one row per key.
    ``unique``: keys repeat, one row per ``id``.
    """
    n = draw(st.integers(1, 12))
    arrays = [draw(column_arrays(ct, n)) for ct in STORE_TYPES]
    if layout == "key":
        keys: list[int | None] = draw(st.permutations(range(n)))
    else:
        keys = draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=n, max_size=n))
    ids = list(range(n))
    t = pa.Table.from_arrays(
        [pa.array(keys, pa.int64()), pa.array(ids, pa.int64()), *arrays], schema=STORE_SCHEMA
    )
    if layout == "bag":
        dup = draw(st.lists(st.integers(0, n - 1), max_size=5))
        t = pa.concat_tables([t, t.take(pa.array(dup, pa.int64()))])
        weights = draw(st.lists(st.integers(1, 3), min_size=t.num_rows, max_size=t.num_rows))
    else:
        weights = [1] * n
    retract = sorted(set(draw(st.lists(st.integers(0, n - 1), max_size=n))))
    second = t.take(pa.array(retract, pa.int64()))
    return t, weights, second, [-1] * len(retract)


@pytest.mark.parametrize("layout", ["bag", "key", "unique"])
@settings(SETTINGS, max_examples=12)
@given(data=st.data())
def test_store_state_round_trips_every_type(layout: str, data: st.DataObject) -> None:
    """Rows pushed through a real store come back from ``state`` exactly, consolidated."""
    first, w1, second, w2 = data.draw(store_deltas(layout))
    unique = {"bag": None, "key": ["k"], "unique": ["id"]}[layout]
    side = joinstate.Side(STORE_SCHEMA, key=["k"], unique_key=unique)
    assert side.layout == layout
    with tempfile.TemporaryDirectory() as d:
        with joinstate.StateStore(d) as store:
            join = store.join("codec", left=side, right=OTHER)
            join.push("left", first.append_column(joinstate.WEIGHT, pa.array(w1, pa.int64())))
            rows1 = canonical_rows(sql_canonical(first))
            assert state_counter(join, "left", STORE_SCHEMA) == consolidated(rows1, w1)
            join.push("left", second.append_column(joinstate.WEIGHT, pa.array(w2, pa.int64())))
            expected = consolidated(rows1 + canonical_rows(sql_canonical(second)), w1 + w2)
            assert state_counter(join, "left", STORE_SCHEMA) == expected
        # And again from disk, with no cache in between.
        with joinstate.StateStore(d) as store:
            join = store.join("codec", left=side, right=OTHER)
            assert state_counter(join, "left", STORE_SCHEMA) == expected
