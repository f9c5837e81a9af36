"""The row hash of string and binary columns, computed for all of them at once.

The row record stores these hashes, so the joint computation must give exactly the
values of hashing each column on its own (its one-column encoding's ``xxh3_128``).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate import _source_rows
from joinstate.codec import RowCodec
from joinstate.keys import row_hash

if TYPE_CHECKING:
    import pytest

_SEEDS = (np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344))
_MULS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))
_SHIFTS = (np.uint64(29), np.uint64(32))


def _column_words(arr: pa.Array) -> list[np.ndarray]:
    """Words of one column hashed alone: the definition the record's format rests on."""
    if arr.type in (pa.string(), pa.binary(), pa.large_string(), pa.large_binary()):
        enc = RowCodec(pa.schema([pa.field("v", arr.type)])).encode(pa.table({"v": arr}))
        rh = np.ascontiguousarray(row_hash(enc).matrix()).view("<u8")
        words = [rh[:, 0].copy(), rh[:, 1].copy()]
    else:
        words = _source_rows._words(arr, None)  # noqa: SLF001 - fixed-width words
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
        words = [np.where(valid, w, np.uint64(0)) for w in words]
    return words


def _reference(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The row hash computed column by column (one chunk: the tables here are small)."""
    n = table.num_rows
    lanes = [np.full(n, s, np.uint64) for s in _SEEDS]
    nulls = np.zeros(n, np.uint64)

    def mix(word: np.ndarray) -> None:
        for h, mul, shift in zip(lanes, _MULS, _SHIFTS, strict=True):
            h ^= word
            h *= mul
            h ^= h >> shift

    with np.errstate(over="ignore"):
        for i, col in enumerate(table.columns):
            arr = col.combine_chunks()
            if arr.null_count:
                valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
                nulls |= (~valid).astype(np.uint64) << np.uint64(i)
            for word in _column_words(arr):
                mix(word)
        mix(nulls)
        a = _source_rows._fmix(lanes[0])  # noqa: SLF001 - the lanes' finaliser
        lanes[1] ^= a
        return a, _source_rows._fmix(lanes[1])  # noqa: SLF001


def test_string_columns_hashed_together_equal_each_hashed_alone() -> None:
    rng = random.Random(7)
    n = 300
    words = [None, "", "a", "ab", "é", "x" * 40]
    blobs = [None, b"", b"\x00", b"\xff\x00", b"y" * 33]
    t = pa.table({
        "k": pa.array(range(n), pa.int64()),
        "s1": pa.array([rng.choice(words) for _ in range(n)], pa.string()),
        "b1": pa.array([rng.choice(blobs) for _ in range(n)], pa.binary()),
        "s2": pa.array([rng.choice(words) for _ in range(n)], pa.large_string()),
        "f": pa.array([rng.choice([None, 1.5, -0.0]) for _ in range(n)], pa.float64()),
        "b2": pa.array([rng.choice(blobs) for _ in range(n)], pa.large_binary()),
        "s3": pa.array([rng.choice(["", "same"]) for _ in range(n)], pa.string()),
    })
    lo, hi = _source_rows.row_hashes(t)
    want_lo, want_hi = _reference(t)
    assert (lo == want_lo).all() and (hi == want_hi).all()
    # a slice (non-zero offsets) and several chunks hash the same rows the same way
    part = t.slice(17, 40)
    lo_s, hi_s = _source_rows.row_hashes(part)
    assert (lo_s == lo[17:57]).all() and (hi_s == hi[17:57]).all()
    chunked = pa.Table.from_batches(t.to_batches(max_chunksize=64))
    lo_c, hi_c = _source_rows.row_hashes(chunked)
    assert (lo_c == lo).all() and (hi_c == hi).all()


def test_a_value_moved_between_string_columns_changes_the_hash() -> None:
    t = pa.table({"a": pa.array(["x", ""]), "b": pa.array(["", "x"])})
    lo, hi = _source_rows.row_hashes(t)
    assert (lo[0], hi[0]) != (lo[1], hi[1])
    lo_r, hi_r = _reference(t)
    assert (lo == lo_r).all() and (hi == hi_r).all()


def test_string_columns_too_large_to_join_are_hashed_in_parts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    n = 50
    t = pa.table({f"s{j}": pa.array([f"v{j}-{i}" * (i % 4) for i in range(n)], pa.string())
                  for j in range(5)})
    want_lo, want_hi = _reference(t)
    for limit in (1, 600, 1 << 30):  # one column per join, some per join, all at once
        monkeypatch.setattr(_source_rows, "_JOINED_BYTES", limit)
        lo, hi = _source_rows.row_hashes(t)
        assert (lo == want_lo).all() and (hi == want_hi).all(), limit
