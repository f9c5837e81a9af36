"""``spark_io.rowhash.row_hash64``: a function of the row's values, whatever the buffers.

NULL-key rows are routed by it, so a row must hash alike however Arrow holds it (a
slice of a bigger array, several chunks, a dictionary, NULLs with garbage under them)
and rows that differ in one value should not.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spark_io.rowhash import row_hash64

pytestmark = pytest.mark.spark


def sample(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    ints = rng.integers(-10**12, 10**12, n)
    return pa.table({
        "i8": pa.array((ints % 100).astype(np.int8)),
        "u32": pa.array((ints % 4000).astype(np.uint32)),
        "i64": pa.array([None if i % 7 == 0 else int(v) for i, v in enumerate(ints)],
                        pa.int64()),
        "f": pa.array([None if i % 5 == 0 else float(v) / 3 for i, v in enumerate(ints)]),
        "b": pa.array([None if i % 11 == 0 else bool(v % 2) for i, v in enumerate(ints)]),
        "s": pa.array([None if i % 13 == 0 else f"value {v}" * (i % 3) for i, v in
                       enumerate(ints)]),
        "d": pa.array([Decimal(int(v) % 10**6) / 100 for v in ints], pa.decimal128(9, 2)),
        "day": pa.array([dt.date(2000, 1, 1) + dt.timedelta(days=int(v) % 9000) for v in ints],
                        pa.date32()),
        "ts": pa.array([int(v) for v in ints], pa.timestamp("us", tz="UTC")),
        "fb": pa.array([int(v).to_bytes(8, "big", signed=True)[:5] for v in ints],
                       pa.binary(5)),
    })


def test_slices_chunks_and_dictionaries_hash_alike() -> None:
    table = sample(3000)
    whole = row_hash64(table)
    assert len(set(whole.tolist())) == len(table)  # distinct rows, distinct hashes
    part = table.slice(1234, 500)
    assert (row_hash64(part) == whole[1234:1734]).all()
    chunked = pa.concat_tables([table.slice(0, 1000), table.slice(1000)])
    assert chunked.column("s").num_chunks == 2
    assert (row_hash64(chunked) == whole).all()
    as_dict = table.set_column(table.schema.get_field_index("s"), "s",
                               table.column("s").dictionary_encode())
    assert (row_hash64(as_dict) == whole).all()
    large = table.set_column(table.schema.get_field_index("s"), "s",
                             table.column("s").cast(pa.large_string()))
    assert (row_hash64(large) == whole).all()


def test_each_value_counts_and_nulls_are_values() -> None:
    table = sample(200)
    base = row_hash64(table)
    for i, name in enumerate(table.column_names):
        col = table.column(name).combine_chunks()
        shifted = pa.concat_arrays([col.slice(1), col.slice(0, 1)])  # other rows' values
        changed = row_hash64(table.set_column(i, name, shifted))
        one_null = pc.not_equal(pc.is_null(col), pc.is_null(shifted))
        differs = np.asarray(pc.not_equal(col, shifted).fill_null(False)) | np.asarray(one_null)
        assert (changed[differs] != base[differs]).all(), name
    nulls = table.set_column(2, "i64", pa.nulls(200, pa.int64()))
    zeros = table.set_column(2, "i64", pa.array([0] * 200, pa.int64()))
    assert (row_hash64(nulls) != row_hash64(zeros)).all()
    assert (row_hash64(table, ["i64", "s"]) != row_hash64(table, ["s", "i64"])).any()
