"""Differential tests of the group-by aggregation state (``joinstate.aggregate``).

A plain-Python oracle integrates every delta into a multiset of input rows and computes
the group-by from scratch after each batch; the state (``GroupState.state()``) and the
integral of every output change must both equal it.  No code is shared with the library.
"""

from __future__ import annotations

import datetime
import math
import random
import re
import tempfile
from collections import Counter
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import joinstate
from joinstate.aggregate import AggSpec, GroupState

NAN = float("nan")  # one object, so rows holding it are equal dict keys
I64_MAX = 2**63 - 1

SCHEMA = pa.schema([
    ("k1", pa.int64()), ("k2", pa.string()),
    ("i64", pa.int64()), ("i32", pa.int32()), ("dec", pa.decimal128(7, 2)),
    ("f64", pa.float64()), ("s", pa.string()), ("d", pa.date32()), ("b", pa.bool_()),
])
VALUE_COLUMNS = ["i64", "i32", "dec", "f64", "s", "d", "b"]
SUMMABLE = {"i64", "i32", "dec", "f64"}
AGGS = [AggSpec("n", "count", None)] + [
    AggSpec(f"{f}_{c}", f, c)
    for c in VALUE_COLUMNS for f in ("count", "sum", "min", "max")
    if f != "sum" or c in SUMMABLE
]
POOLS: dict[str, list[Any]] = {
    "k1": [None, 0, 1, 2],
    "k2": [None, "a", "b"],
    "i64": [None, -7, -1, 0, 3, 10**12, -(10**12)],
    "i32": [None, -(2**31), 5, 2**31 - 1, 0],
    "dec": [None, Decimal("-99999.99"), Decimal("0.01"), Decimal("12.50"), Decimal("99999.99")],
    "f64": [None, -1.5, 0.0, -0.0, 2.25, 1e10, NAN, math.inf, -math.inf],
    "s": [None, "", "a", "ab", "b", "\u00e9t\u00e9", "zz"],
    "d": [None, datetime.date(1970, 1, 1), datetime.date(1969, 12, 31),
          datetime.date(2024, 2, 29)],
    "b": [None, False, True],
}

Row = tuple[Any, ...]


# ---- the oracle ---------------------------------------------------------------------------

def _canon(v: Any) -> Any:
    """Hashable, comparable stand-in: NaN is one value, -0.0 is 0.0."""
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return 0.0 if v == 0 else v
    return v


def _order(v: Any) -> Any:
    """Sort key of a non-NULL value: floats with NaN above everything (Spark)."""
    if isinstance(v, float):
        return (math.isnan(v), 0.0 if math.isnan(v) else v)
    return v


def _agg(func: str, col: str | None, rows: list[tuple[dict[str, Any], int]], schema: pa.Schema
         ) -> Any:
    if col is None:
        return sum(m for _, m in rows)
    vals = [(r[col], m) for r, m in rows if r[col] is not None]
    if func == "count":
        return sum(m for _, m in vals)
    if not vals:
        return None
    t = schema.field(col).type
    if func == "sum":
        if pa.types.is_floating(t):
            xs = [v for v, _ in vals]
            if any(math.isnan(x) for x in xs) or (math.inf in xs and -math.inf in xs):
                return NAN
            if math.inf in xs:
                return math.inf
            if -math.inf in xs:
                return -math.inf
            return math.fsum(v * m for v, m in vals)
        with localcontext(prec=100):  # exact: the default 28 digits would round
            return sum((v * m for v, m in vals), Decimal(0) if pa.types.is_decimal(t) else 0)
    pick = min if func == "min" else max
    best = pick((v for v, _ in vals), key=_order)
    return 0.0 if isinstance(best, float) and best == 0 else best


def oracle(live: Counter[Row], schema: pa.Schema, keys: list[str], aggs: list[AggSpec]
           ) -> dict[Row, Row]:
    """The group-by of the integrated input, from scratch: key tuple -> aggregates."""
    groups: dict[Row, list[tuple[dict[str, Any], int]]] = {}
    for row, m in live.items():
        assert m > 0
        r = dict(zip(schema.names, row, strict=True))
        groups.setdefault(tuple(_canon(r[k]) for k in keys), []).append((r, m))
    out = {
        k: tuple(_agg(a.func, a.column, rows, schema) for a in aggs)
        for k, rows in groups.items() if sum(m for _, m in rows) > 0
    }
    if not keys and not out:  # SQL: an aggregate without GROUP BY has its row over no rows
        out[()] = tuple(_agg(a.func, a.column, [], schema) for a in aggs)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return bool(type(a) is type(b) and a == b)


def as_dict(table: pa.Table, keys: list[str]) -> dict[Row, Row]:
    names = [n for n in table.column_names if n not in keys]
    out = {}
    for r in table.to_pylist():
        key = tuple(_canon(r[k]) for k in keys)
        assert key not in out, f"group {key} appears twice"
        out[key] = tuple(r[n] for n in names)
    return out


def assert_matches(got: dict[Row, Row], want: dict[Row, Row], names: list[str]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        for name, a, b in zip(names, got[k], want[k], strict=True):
            assert _same(a, b), f"group {k} {name}: got {a!r}, want {b!r}"


def _row_key(r: dict[str, Any]) -> Row:
    return tuple(_canon(v) for v in r.values())


# ---- harness ------------------------------------------------------------------------------

class Harness:
    """A GroupState, the oracle's integrated input and the integral of the output."""

    def __init__(self, path: Path, keys: list[str], aggs: list[AggSpec] = AGGS,
                 schema: pa.Schema = SCHEMA) -> None:
        self.path, self.keys, self.aggs, self.schema = path, keys, aggs, schema
        self.live: Counter[Row] = Counter()
        self.integral: Counter[Row] = Counter()
        self.open()
        if not keys:  # the row a pipeline emits when it creates a keyless aggregate
            self.integral[_row_key(self.g.empty_row().to_pylist()[0])] += 1

    def open(self) -> None:
        self.store = joinstate.StateStore(self.path)
        self.g = GroupState(self.store, "agg_test", self.schema, self.keys, self.aggs)

    def reopen(self) -> None:
        self.store.close()
        self.open()

    def push(self, batch: list[tuple[Row, int]]) -> tuple[pa.Table, np.ndarray]:
        table = pa.table(
            {c: pa.array([r[i] for r, _ in batch], self.schema.field(c).type)
             for i, c in enumerate(self.schema.names)}, schema=self.schema)
        w = np.array([m for _, m in batch], dtype=np.int64)
        txn = self.store.transaction()
        out, ow = self.g.stage(table, w, txn)
        txn.commit()
        assert out.schema == self.g.output_schema
        for row, m in batch:
            # every NaN is one value (the NAN object, so that rows holding it are equal)
            row = tuple(NAN if isinstance(v, float) and math.isnan(v) else v for v in row)
            self.live[row] += m
        assert all(m >= 0 for m in self.live.values())
        self.live = Counter({r: m for r, m in self.live.items() if m})
        for r, m in zip(out.to_pylist(), ow.tolist(), strict=True):
            assert m in (-1, 1)
            self.integral[_row_key(r)] += m
            if not self.integral[_row_key(r)]:
                del self.integral[_row_key(r)]
        return out, ow

    def check(self) -> None:
        state = self.g.state()
        want = oracle(self.live, self.schema, self.keys, self.aggs)
        assert_matches(as_dict(state, self.keys), want, [a.name for a in self.aggs])
        stored = len(want) - (not self.keys and not self.live)  # the empty row is not stored
        assert self.g.rows() == stored and len(want) == state.num_rows
        assert self.integral == Counter(_row_key(r) for r in state.to_pylist())


def random_row(rng: random.Random, schema: pa.Schema = SCHEMA) -> Row:
    return tuple(rng.choice(POOLS[c]) for c in schema.names)


def random_batch(rng: random.Random, live: Counter[Row], keys: list[str]) -> list[
    tuple[Row, int]
]:
    """Inserts (some repeated, some weight 2), deletes of present rows, +/- pairs, and
    now and then the deletion of a whole group or of a group's current extreme."""
    batch: list[tuple[Row, int]] = []
    left = Counter(live)
    for _ in range(rng.randint(1, 25)):
        op = rng.random()
        if op < 0.45 or not left:
            row = random_row(rng)
            batch.append((row, rng.choice((1, 1, 2))))
            if rng.random() < 0.2:
                batch.append((row, 1))  # repeated row, unconsolidated
        elif op < 0.75:
            row = rng.choice(sorted(left, key=repr))
            m = rng.randint(1, left[row])
            left[row] -= m
            if not left[row]:
                del left[row]
            if m > 1 and rng.random() < 0.5:
                batch += [(row, -1)] * m  # unconsolidated retractions
            else:
                batch.append((row, -m))
        elif op < 0.85:
            row = random_row(rng)
            batch += [(row, 1), (row, -1)]  # cancels within the batch
        elif op < 0.93:
            # delete every row holding the group's current extreme of some column
            col = rng.choice(VALUE_COLUMNS)
            i = SCHEMA.names.index(col)
            rows = [r for r in left if r[i] is not None]
            if rows:
                best = (min if rng.random() < 0.5 else max)(rows, key=lambda r: _order(r[i]))
                target = _canon(best[i])
                kidx = [SCHEMA.names.index(k) for k in keys]
                for r in [r for r in left if [r[j] for j in kidx] == [best[j] for j in kidx]
                          and r[i] is not None and _canon(r[i]) == target]:
                    batch.append((r, -left.pop(r)))
        else:
            # delete a whole group
            row = rng.choice(sorted(left, key=repr))
            kidx = [SCHEMA.names.index(k) for k in keys]
            for r in [r for r in left if [r[j] for j in kidx] == [row[j] for j in kidx]]:
                batch.append((r, -left.pop(r)))
    rng.shuffle(batch)
    return batch


# ---- differential tests -------------------------------------------------------------------

@pytest.mark.parametrize(("keys", "seed"), [
    (["k1", "k2"], 1), (["k1", "k2"], 2), (["k1"], 3), (["k2"], 4), ([], 5),
])
def test_random_streams(tmp_path: Path, keys: list[str], seed: int) -> None:
    rng = random.Random(seed)
    h = Harness(tmp_path / "s", keys)
    for i in range(40):
        h.push(random_batch(rng, h.live, keys))
        h.check()
        if i == 25:
            h.reopen()
            h.check()
    h.store.close()


def test_groups_vanish_and_come_back(tmp_path: Path) -> None:
    h = Harness(tmp_path / "s", ["k1"])
    r1 = (1, "a", 5, 1, Decimal("1.00"), 1.5, "x", datetime.date(2020, 1, 1), True)
    r2 = (1, "b", None, None, None, None, None, None, None)
    h.push([(r1, 2), (r2, 1)])
    h.check()
    out, w = h.push([(r1, -2), (r2, -1)])
    assert w.tolist() == [-1] and h.g.rows() == 0
    h.check()
    out, w = h.push([(r2, 1)])
    assert w.tolist() == [1]
    assert out.column("min_i64").to_pylist() == [None]
    assert out.column("sum_i64").to_pylist() == [None]
    assert out.column("count_i64").to_pylist() == [0]
    h.check()
    h.store.close()



def test_a_change_that_leaves_the_values_emits_nothing(tmp_path: Path) -> None:
    """A group whose output values stay the same emits no -row/+row pair; one whose
    every value is retracted (only NULLs left) reads NULL, next to a group that keeps its
    values (the old and the new rows of both go through the output together)."""
    aggs = [AggSpec("sum_i64", "sum", "i64"), AggSpec("sum_dec", "sum", "dec"),
            AggSpec("count_i64", "count", "i64")]
    h = Harness(tmp_path / "s", ["k1"], aggs)
    row = (1, "a", 5, 1, Decimal("1.50"), 1.5, "x", datetime.date(2020, 1, 1), True)
    other = (2, "a", 7, 1, Decimal("2.00"), 1.5, "x", datetime.date(2020, 1, 1), True)
    h.push([(row, 1), (other, 1)])
    nulls = (1, "b", None, None, None, None, None, None, None)
    out, w = h.push([(nulls, 1)])  # count(*) changes, no output value does
    assert out.num_rows == 0 and not len(w)
    h.check()
    zero = (2, "b", 0, 1, Decimal("0.00"), 1.5, "x", datetime.date(2020, 1, 1), True)
    out, w = h.push([(row, -1), (zero, 1)])  # group 1: NULL sums; group 2: +1 count
    got = {(r["k1"], m): r for r, m in zip(out.to_pylist(), w.tolist(), strict=True)}
    assert set(got) == {(1, -1), (1, 1), (2, -1), (2, 1)}
    assert got[(1, 1)] == {"k1": 1, "sum_i64": None, "sum_dec": None, "count_i64": 0}
    assert got[(2, 1)] == {"k1": 2, "sum_i64": 7, "sum_dec": Decimal("2.00"), "count_i64": 2}
    assert got[(2, -1)]["count_i64"] == 1
    h.check()
    h.store.close()

def test_min_max_after_deleting_the_extreme(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64()), ("x", pa.int64())])
    aggs = [AggSpec("lo", "min", "x"), AggSpec("hi", "max", "x"), AggSpec("n", "count", None)]
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    h.push([((1, v), 1) for v in (5, 3, 9, 3, 7)] + [((2, v), 1) for v in (1, 2)])
    assert as_dict(h.g.state(), ["k"]) == {(1,): (3, 9, 5), (2,): (1, 2, 2)}
    h.push([((1, 3), -1)])  # one of two copies of the minimum: unchanged
    assert as_dict(h.g.state(), ["k"])[(1,)] == (3, 9, 4)
    h.push([((1, 3), -1), ((1, 9), -1)])  # both extremes gone: the next ones come up
    assert as_dict(h.g.state(), ["k"])[(1,)] == (5, 7, 2)
    h.push([((1, 5), -1), ((1, 7), -1), ((1, 6), 1)])  # extreme gone, new value wins
    assert as_dict(h.g.state(), ["k"])[(1,)] == (6, 6, 1)
    h.push([((1, 4), 1), ((1, 4), -1), ((1, 8), 1)])  # a cancelled insert is no candidate
    assert as_dict(h.g.state(), ["k"])[(1,)] == (6, 8, 2)
    h.check()
    h.store.close()


def test_strings_with_empty_values_and_adjacent_slots(tmp_path: Path) -> None:
    """'' sorts first, and the max seek must not step into the next column's entries."""
    schema = pa.schema([("k", pa.string()), ("a", pa.string()), ("b", pa.string())])
    aggs = [AggSpec("amax", "max", "a"), AggSpec("bmin", "min", "b"),
            AggSpec("amin", "min", "a"), AggSpec("bmax", "max", "b")]
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    h.push([(("g", "x", ""), 1), (("g", "", "y"), 1), (("g", "m", "\uffff"), 1)])
    h.check()
    h.push([(("g", "x", ""), -1)])
    h.check()
    h.push([(("g", "m", "\uffff"), -1)])
    h.check()
    assert as_dict(h.g.state(), ["k"]) == {("g",): ("", "y", "", "y")}
    h.store.close()


def _bits(x: float) -> int:
    return int(np.array([x], "<f8").view("<u8")[0])


def test_count_star_of_everything(tmp_path: Path) -> None:
    schema = pa.schema([("x", pa.int64())])
    h = Harness(tmp_path / "s", [], [AggSpec("n", "count", None)], schema)
    assert h.g.state().to_pylist() == [{"n": 0}]  # the row is there over no rows
    out, w = h.push([((1,), 1), ((2,), 2), ((1,), 1)])
    assert out.to_pylist() == [{"n": 0}, {"n": 4}] and w.tolist() == [-1, 1]
    out, w = h.push([((1,), -2), ((2,), -2)])
    assert out.to_pylist() == [{"n": 4}, {"n": 0}] and w.tolist() == [-1, 1]
    h.check()
    h.store.close()


def test_float_keys_follow_canonical_rules(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.float64()), ("x", pa.int32())])
    aggs = [AggSpec("n", "count", None), AggSpec("s", "sum", "x")]
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    neg_nan = float(np.array([0xFFF8000000000001], "<u8").view("<f8")[0])
    out, _ = h.push([((-0.0, 1), 1), ((0.0, 2), 1), ((neg_nan, 4), 1), ((NAN, 3), 1),
                     ((None, 5), 1), ((None, None), 1)])
    got = {_canon(r["k"]): (r["n"], r["s"]) for r in out.to_pylist()}
    assert got == {0.0: (2, 3), "NaN": (2, 7), None: (2, 5)}
    keys = [r["k"] for r in out.to_pylist() if r["k"] is not None]
    # the group keys come out canonical: 0.0 (never -0.0) and numpy's one quiet NaN
    assert sorted(_bits(k) for k in keys) == sorted([0, _bits(np.nan)])
    h.push([((0.0, 1), -1), ((-0.0, 2), -1)])  # retract with the other zero
    h.check()
    h.store.close()


def test_float_values_follow_canonical_rules(tmp_path: Path) -> None:
    """min/max see -0.0 as 0.0 and every NaN as one value, above +inf (as Spark)."""
    schema = pa.schema([("k", pa.int8()), ("f", pa.float64())])
    aggs = [AggSpec("lo", "min", "f"), AggSpec("hi", "max", "f"), AggSpec("s", "sum", "f")]
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    neg_nan = float(np.array([0xFFF8000000000001], "<u8").view("<f8")[0])
    h.push([((1, -0.0), 1), ((2, neg_nan), 1), ((2, math.inf), 1)])
    state = h.g.state().to_pylist()
    assert [_bits(r["lo"]) for r in state if r["k"] == 1] == [0]
    assert [(r["lo"], _bits(r["hi"])) for r in state if r["k"] == 2] == [
        (math.inf, _bits(np.nan))]
    # retract with the other zero / another NaN: the same values
    h.push([((1, 0.0), -1), ((1, 2.0), 1), ((2, NAN), -1)])
    assert as_dict(h.g.state(), ["k"]) == {(1,): (2.0, 2.0, 2.0),
                                           (2,): (math.inf, math.inf, math.inf)}
    h.store.close()


@pytest.mark.parametrize("t", [pa.int32(), pa.uint64(), pa.float32(), pa.decimal128(38, 3),
                               pa.timestamp("us", tz="UTC"), pa.large_string(),
                               pa.binary(), pa.bool_(), pa.time32("s"), pa.duration("us")])
def test_min_max_types(tmp_path: Path, t: pa.DataType) -> None:
    pools: dict[pa.DataType, list[Any]] = {
        pa.int32(): [-(2**31), -1, 0, 7, 2**31 - 1],
        pa.uint64(): [0, 1, 2**63 - 1, 2**63, 2**64 - 1],
        pa.float32(): [-math.inf, -2.5, -0.0, 1.5, math.inf, NAN],
        pa.decimal128(38, 3): [Decimal("-" + "9" * 30 + ".999"), Decimal("-0.001"),
                               Decimal("0.000"), Decimal("123.456"), Decimal("9" * 30 + ".999")],
        pa.timestamp("us", tz="UTC"): [datetime.datetime(1900, 1, 1, tzinfo=datetime.UTC),
                                       datetime.datetime(2020, 5, 5, 1, 2, 3,
                                                         tzinfo=datetime.UTC)],
        pa.large_string(): ["", "a", "a\x00", "b", "\U0001f600"],
        pa.binary(): [b"", b"\x00", b"\x00\x00", b"\xff", b"\x7f\xff"],
        pa.bool_(): [False, True],
        pa.time32("s"): [datetime.time(0, 0), datetime.time(23, 59, 59)],
        pa.duration("us"): [datetime.timedelta(days=-3), datetime.timedelta(0),
                            datetime.timedelta(microseconds=5)],
    }
    vals = pools[t]
    schema = pa.schema([("k", pa.int8()), ("x", t)])
    aggs = [AggSpec("lo", "min", "x"), AggSpec("hi", "max", "x"), AggSpec("c", "count", "x")]
    if t != pa.uint64() and (pa.types.is_integer(t) or pa.types.is_floating(t)
                             or pa.types.is_decimal(t)):
        aggs.append(AggSpec("s", "sum", "x"))
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    rng = random.Random(7)
    for _ in range(12):
        batch: list[tuple[Row, int]] = [((rng.choice([1, 2]), rng.choice(vals)), 1)
                                        for _ in range(3)]
        present = sorted(h.live, key=repr)
        for row in rng.sample(present, min(len(present), 2)):
            batch.append((row, -1))
        h.push(batch)
        h.check()
    got = h.g.state().schema
    assert got.field("lo").type == t and got.field("hi").type == t
    h.store.close()


def test_unsigned_and_wide_sums(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int8()), ("u", pa.uint64()), ("d", pa.decimal128(38, 0))])
    aggs = [AggSpec("su", "sum", "u"), AggSpec("sd", "sum", "d")]
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    big, neg = Decimal("9" * 37), Decimal("-" + "9" * 37)  # (-big would round to 28 digits)
    # values beyond int64 that cancel inside one batch are exact
    h.push([((1, 2**64 - 1, big), 1), ((1, 2**64 - 1, big), -1), ((1, 5, neg), 2)])
    h.check()
    assert as_dict(h.g.state(), ["k"]) == {(1,): (10, Decimal("-" + "1" + "9" * 36 + "8"))}
    with pytest.raises(joinstate.WeightOverflowError):  # uint64 sum goes to int64
        h.push([((1, 2**63, big), 1)])
    h.store.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from([None, 0, 1]),
                                   st.sampled_from([None, -2, 0, 3]),
                                   st.integers(-2, 2)), max_size=8), max_size=6))
def test_hypothesis_small_streams(batches: list[list[tuple[Any, Any, int]]]) -> None:
    """Weights that would over-retract are clipped, so every batch is valid."""
    schema = pa.schema([("k", pa.int64()), ("x", pa.int64())])
    aggs = [AggSpec("n", "count", None), AggSpec("c", "count", "x"), AggSpec("s", "sum", "x"),
            AggSpec("lo", "min", "x"), AggSpec("hi", "max", "x")]
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp) / "s", ["k"], aggs, schema)
        for ops in batches:
            left = Counter(h.live)
            batch = []
            for k, x, m in ops:
                m = max(m, -left[(k, x)])
                left[(k, x)] += m
                if m:
                    batch.append(((k, x), m))
            h.push(batch)
            h.check()
        h.store.close()


# ---- refusals leave the state untouched ---------------------------------------------------

def _snapshot(h: Harness) -> tuple[Any, ...]:
    cfs = h.g.column_families()
    return ([_row_key(r) for r in h.g.state().to_pylist()], h.g.rows(),
            [(h.store.counter(cf, "rows"), h.store.counter(cf, "entries")) for cf in cfs])


def _refused(h: Harness, batch: list[tuple[Row, int]], error: type[Exception]) -> None:
    before = _snapshot(h)
    table = pa.table({c: pa.array([r[i] for r, _ in batch], h.schema.field(c).type)
                      for i, c in enumerate(h.schema.names)})
    txn = h.store.transaction()
    with pytest.raises(error):
        h.g.stage(table, np.array([m for _, m in batch], np.int64), txn)
    assert not txn.blocks  # nothing was staged
    txn.commit()  # committing what is left changes nothing either
    assert _snapshot(h) == before


def test_over_retraction_is_refused(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64()), ("x", pa.int64()), ("f", pa.float64())])
    aggs = [AggSpec("n", "count", None), AggSpec("c", "count", "x"), AggSpec("s", "sum", "x"),
            AggSpec("lo", "min", "x"), AggSpec("fs", "sum", "f")]
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    h.push([((1, 5, 1.0), 2), ((2, None, None), 1), ((3, 4, None), 1)])
    over = joinstate.OverRetractionError
    _refused(h, [((9, 5, 1.0), -1)], over)  # a group that does not exist
    _refused(h, [((1, 5, 1.0), -3)], over)  # more copies than there are
    _refused(h, [((1, 7, 1.0), -1)], over)  # count fine, but 7 was never inserted (min)
    _refused(h, [((2, 5, None), -1)], over)  # the row has a NULL x, not 5
    _refused(h, [((3, None, None), -1)], over)  # the row has x = 4, not NULL
    _refused(h, [((1, 5, math.inf), -1)], over)  # no infinity was inserted
    _refused(h, [((1, 5, 1.0), 1), ((1, 5, 1.0), -4)], over)  # unconsolidated, net -3
    h.check()
    h.push([((1, 5, 1.0), -1), ((2, None, None), -1), ((3, 4, None), 1)])  # valid again
    h.check()
    h.store.close()


def test_lone_aggregates_detect_a_wrong_value(tmp_path: Path) -> None:
    """Without count(x), a sum or a min still notices a retracted row that never was."""
    schema = pa.schema([("k", pa.int64()), ("x", pa.int64())])
    h = Harness(tmp_path / "s", ["k"], [AggSpec("s", "sum", "x")], schema)
    h.push([((1, 5), 1)])
    _refused(h, [((1, 7), -1)], joinstate.OverRetractionError)  # leaves a sum with no row
    h.store.close()
    h = Harness(tmp_path / "m", ["k"], [AggSpec("lo", "min", "x")], schema)
    h.push([((1, 5), 1)])
    _refused(h, [((1, None), -1)], joinstate.OverRetractionError)  # leaves a min with no row
    h.store.close()


def test_overflow_is_refused(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64()), ("x", pa.int64()), ("d", pa.decimal128(38, 0))])
    aggs = [AggSpec("n", "count", None), AggSpec("s", "sum", "x"), AggSpec("sd", "sum", "d")]
    h = Harness(tmp_path / "s", ["k"], aggs, schema)
    big = Decimal("9" * 37 + "0")  # 9.99e37: two of them exceed 38 digits
    neg = Decimal("-" + "9" * 37 + "0")
    h.push([((1, I64_MAX, big), 1)])
    overflow = joinstate.WeightOverflowError
    _refused(h, [((1, 1, 0), 1)], overflow)  # int64 sum
    _refused(h, [((1, 0, big), 1)], overflow)  # decimal128(38, 0) sum
    _refused(h, [((2, 4, 0), 2**62)], overflow)  # value * weight
    _refused(h, [((2, 0, 0), I64_MAX), ((2, 0, 0), 1)], overflow)  # count(*)
    # through out-of-range values and back, within one batch: exact
    h.push([((1, I64_MAX, Decimal(0)), 1), ((1, -I64_MAX, Decimal(0)), 1), ((1, -5, neg), 1)])
    h.check()
    assert as_dict(h.g.state(), ["k"]) == {(1,): (4, I64_MAX - 5, Decimal(0))}
    h.store.close()


def test_refusal_then_reopen_and_continue(tmp_path: Path) -> None:
    h = Harness(tmp_path / "s", ["k1", "k2"])
    rng = random.Random(11)
    for _ in range(5):
        h.push(random_batch(rng, h.live, h.keys))
    row = next(iter(h.live))
    _refused(h, [(row, -h.live[row] - 1)], joinstate.OverRetractionError)
    h.reopen()
    h.check()
    for _ in range(5):
        h.push(random_batch(rng, h.live, h.keys))
        h.check()
    h.store.close()


# ---- the interface ------------------------------------------------------------------------

def test_schema_and_families(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        g = GroupState(store, "q", SCHEMA, ["k2", "k1"], AGGS)
        assert g.output_schema.names == ["k2", "k1"] + [a.name for a in AGGS]
        types = dict(zip(g.output_schema.names, g.output_schema.types, strict=True))
        assert types["sum_i32"] == pa.int64() and types["sum_f64"] == pa.float64()
        assert types["sum_dec"] == pa.decimal128(38, 2) and types["min_dec"] == pa.decimal128(7, 2)
        assert types["max_d"] == pa.date32() and types["count_s"] == pa.int64()
        assert g.column_families() == ("agg[q]", "agg[q].minmax")
        assert set(g.column_families()) <= set(store.column_families())
        plain = GroupState(store, "p", SCHEMA, ["k1"], [AggSpec("s", "sum", "i64")])
        assert plain.column_families() == ("agg[p]",)
        assert g.state().num_rows == 0 and g.rows() == 0
        out, w = g.stage(SCHEMA.empty_table(), np.zeros(0, np.int64), store.transaction())
        assert out.num_rows == 0 and out.schema == g.output_schema and len(w) == 0


@pytest.mark.parametrize(("keys", "aggs", "needle"), [
    (["nope"], [AggSpec("n", "count", None)], "'nope'"),
    (["k1", "k1"], [AggSpec("n", "count", None)], "repeat"),
    (["k1"], [AggSpec("k1", "count", None)], "'k1'"),
    (["k1"], [AggSpec("n", "count", None), AggSpec("n", "sum", "i64")], "'n'"),
    (["k1"], [AggSpec("x", "avg", "i64")], "'avg'"),  # type: ignore[arg-type]
    (["k1"], [AggSpec("x", "sum", None)], "sum needs a column"),
    (["k1"], [AggSpec("x", "max", "zzz")], "'zzz'"),
    (["k1"], [AggSpec("x", "sum", "s")], "sum('s')"),
    (["k1"], [AggSpec("x", "sum", "b")], "sum('b')"),
    (["k1"], [AggSpec("x", "min", "l")], "min('l')"),
    (["l"], [AggSpec("n", "count", None)], "'l'"),
])
def test_bad_specs_name_the_culprit(tmp_path: Path, keys: list[str], aggs: list[AggSpec],
                                    needle: str) -> None:
    schema = SCHEMA.append(pa.field("l", pa.list_(pa.int64())))
    with joinstate.StateStore(tmp_path / "s") as store, \
            pytest.raises(joinstate.SchemaMismatchError, match=re.escape(needle)):
        GroupState(store, "q", schema, keys, aggs)


def test_bad_deltas_name_the_culprit(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        g = GroupState(store, "q", SCHEMA, ["k1"], [AggSpec("s", "sum", "i64")])
        txn = store.transaction()
        with pytest.raises(joinstate.SchemaMismatchError, match="'i64'"):
            g.stage(pa.table({"k1": [1]}), np.ones(1, np.int64), txn)
        with pytest.raises(joinstate.SchemaMismatchError, match="'i64'"):
            g.stage(pa.table({"k1": [1], "i64": ["x"]}), np.ones(1, np.int64), txn)
        with pytest.raises(joinstate.SchemaMismatchError, match="weights"):
            g.stage(pa.table({"k1": [1], "i64": [1]}), np.ones(2, np.int64), txn)
        # narrower types and extra columns are fine
        out, w = g.stage(pa.table({"k1": pa.array([1], pa.int8()), "i64": pa.array([2], pa.int16()),
                                   "other": ["x"]}), np.ones(1, np.int64), txn)
        assert out.to_pylist() == [{"k1": 1, "s": 2}] and w.tolist() == [1]
