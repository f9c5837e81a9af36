"""joinstate.testing: the Z-set helpers users test their pipelines with."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pytest

import joinstate
from joinstate.testing import assert_zset_equal, compare, consolidate, expand, integrate, zset

W = "_weight"


def test_zset_sums_weights_and_drops_zeros() -> None:
    t = pa.table({"k": [1, 1, 2, 3, 3], "s": ["a", "a", "b", "c", "c"],
                  W: pa.array([1, 2, -1, 4, -4], pa.int64())})
    assert zset(t) == Counter({(1, "a"): 3, (2, "b"): -1})
    assert zset(t, ["s"]) == Counter({("a",): 3, ("b",): -1})
    assert zset(t.drop_columns([W])) == Counter({(1, "a"): 2, (2, "b"): 1, (3, "c"): 2})
    assert zset(t.to_batches()[0]) == zset(t)


def test_zset_reads_a_change_data_feed() -> None:
    cdf = pa.table({"k": [1, 1, 2, 3], "_change_type": ["insert", "insert", "delete",
                                                        "update_postimage"]})
    assert zset(cdf) == Counter({(1,): 2, (2,): -1, (3,): 1})
    assert zset(joinstate.to_changes(pa.table({"k": [5], W: [-3]}))) == Counter({(5,): -3})
    with pytest.raises(ValueError, match="'upsert'"):
        zset(pa.table({"k": [1], "_change_type": ["upsert"]}))
    with pytest.raises(ValueError, match="both"):
        zset(cdf.append_column(W, pa.array([1] * 4, pa.int64())))


def test_zset_refuses_null_weights_and_unknown_columns() -> None:
    with pytest.raises(ValueError, match="NULL"):
        zset(pa.table({"k": [1, 2], W: pa.array([1, None], pa.int64())}))
    with pytest.raises(KeyError, match="'nope'"):
        zset(pa.table({"k": [1]}), ["k", "nope"])


def test_floats_compare_as_sql_or_by_bits() -> None:
    a = pa.table({"f": [0.0, math.nan, 1.5]})
    b = pa.table({"f": [-0.0, -math.nan, 1.5]})
    assert zset(a) == zset(b)  # -0.0 is 0.0, every NaN is one NaN
    assert list(zset(pa.table({"f": [math.nan, float("nan")]})).values()) == [2]
    assert zset(a, float_bits=True) != zset(b, float_bits=True)
    assert zset(a, float_bits=True) == zset(a, float_bits=True)


def test_decimals_exact_and_nested_values_hashable() -> None:
    t = pa.table({"d": pa.array([Decimal("1.10"), Decimal("1.11")], pa.decimal128(7, 2)),
                  "l": [[1.0, -0.0], [2.0]], "s": [{"x": 1}, {"x": 2}]})
    z = zset(t)
    assert z == Counter({(Decimal("1.10"), (1.0, 0.0), (("x", 1),)): 1,
                         (Decimal("1.11"), (2.0,), (("x", 2),)): 1})


def test_integrate_adds_tables_and_zsets_by_column_name() -> None:
    one = pa.table({"a": [1, 2], "b": ["x", "y"], W: pa.array([1, 1], pa.int64())})
    other = pa.table({"b": ["x"], "a": [1], W: pa.array([-1], pa.int64())})  # other order
    assert integrate([one, other]) == Counter({(2, "y"): 1})
    assert integrate([one, Counter({(2, "y"): -1})]) == Counter({(1, "x"): 1})
    assert integrate([]) == Counter()


def test_assert_zset_equal_passes_and_shows_the_first_differences() -> None:
    got = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"], W: pa.array([2, 1, 1], pa.int64())})
    same = pa.table({"v": ["a", "a", "b", "c"], "k": [1, 1, 2, 3]})
    assert_zset_equal(got, same)
    assert_zset_equal(got, Counter({(1, "a"): 2, (2, "b"): 1, (3, "c"): 1}))
    want = Counter({(1, "a"): 1, (2, "b"): 1, (4, "d"): 1})
    with pytest.raises(AssertionError) as err:
        assert_zset_equal(got, want, what="per_customer", limit=2)
    text = str(err.value)
    assert text.startswith("per_customer: 3 row(s) differ")
    assert "columns (k, v)" in text
    assert "(1, 'a'): got 2, want 1" in text and "(3, 'c'): got 1, want 0" in text
    assert "... and 1 more" in text and "(4, 'd')" not in text
    with pytest.raises(AssertionError, match="columns differ"):
        assert_zset_equal(got, pa.table({"k": [1]}))


def test_compare_doubles_to_tolerance_and_names_first_difference() -> None:
    want = pa.table({"k": ["a", "b", None], "d": pa.array([Decimal("1.10"), None,
                                                          Decimal("2.00")], pa.decimal128(7, 2)),
                     "x": [1.0, 1e6, 0.0]})
    close = pa.table({"k": [None, "b", "a"], "d": pa.array([Decimal("2.00"), None,
                                                           Decimal("1.10")], pa.decimal128(38, 2)),
                      "x": [1e-12, 1e6 * (1 + 1e-12), 1.0]})
    assert compare(close, want)["ok"]
    off = close.set_column(2, "x", pa.array([0.0, 1e6 * (1 + 1e-6), 1.0]))
    r = compare(off, want)
    assert not r["ok"] and r["mismatches"] == 1
    assert r["got_at_first"]["k"] == "b" and r["want_at_first"]["k"] == "b"
    dec = close.set_column(1, "d", pa.array([Decimal("2.01"), None, Decimal("1.10")],
                                            pa.decimal128(38, 2)))
    r = compare(dec, want)
    assert not r["ok"]
    assert r["only_got"][0]["d"] == Decimal("2.01") and r["only_want"][0]["d"] == Decimal("2.00")
    r = compare(want.slice(1), want)
    assert not r["ok"] and r["only_want_rows"] == 1 and r["only_got_rows"] == 0
    assert not compare(want.select(["k", "x", "d"]), want)["ok"]


def test_compare_infinities_only_with_themselves() -> None:
    inf, nan = math.inf, math.nan
    want = pa.table({"x": [inf, -inf, nan, 1.0]})
    assert compare(want, want)["ok"]
    for got in ([1.0, -inf, nan, 1.0], [inf, inf, nan, 1.0], [inf, -inf, nan, inf],
                [inf, -inf, 0.0, 1.0]):
        assert not compare(pa.table({"x": got}), want)["ok"], got


def test_consolidate_and_expand() -> None:
    t = pa.table({"a": ["x", "x", None, None, "y"], "f": [1.5, 1.5, None, None, 2.0],
                  W: pa.array([1, 1, 1, -1, 1], pa.int64())})
    c = consolidate(t)
    assert sorted(zip(c["a"].to_pylist(), c[W].to_pylist(), strict=True),
                  key=repr) == [("x", 2), ("y", 1)]
    assert zset(expand(c)) == zset(t)
    assert expand(c).num_rows == 3
    with pytest.raises(ValueError, match="negative weight"):
        expand(pa.table({"a": [1], W: pa.array([-1], pa.int64())}))
