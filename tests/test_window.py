"""Window functions: the operator against DuckDB on random change streams, and in SQL.

Every case builds a window over a small random table (a few partitions, ties on every
ORDER BY column, NULL partition and order values, NaN, duplicate rows), pushes a stream
of inserts, deletes and duplicates, and after every push compares ``read()`` (the
integrated output) with DuckDB's answer for the same SQL over the current rows.  Float
sums are compared to a tolerance; a recomputed old value that is not bit-equal to the one
emitted earlier would leave rows that never cancel, which the row counts catch.
"""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("duckdb")

import duckdb

import joinstate as js
from joinstate import inspect
from joinstate.errors import OverRetractionError, SchemaMismatchError, WeightOverflowError
from joinstate.testing import compare
from planner.sql import UnsupportedSQLError, compile, plan

SCHEMA = pa.schema([("g", pa.string()), ("h", pa.int32()), ("x", pa.int64()),
                    ("y", pa.decimal128(9, 2)), ("f", pa.float64())])


def random_row(rng: random.Random) -> tuple[Any, ...]:
    return (rng.choice(["a", "b", "c", None]), rng.choice([1, 2, None]),
            rng.choice([0, 1, 2, 3, 3, 5, None]),
            rng.choice([Decimal("1.50"), Decimal("-2.25"), Decimal("10.00"), None]),
            rng.choice([0.1, 2.5, -1.75, float("nan"), None, 1e10, 0.3]))


def table_of(rows: list[tuple[Any, ...]], w: list[int] | None = None) -> pa.Table:
    cols: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMA]
    t = pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(cols, SCHEMA, strict=True)],
                             schema=SCHEMA)
    return t.append_column("_weight", pa.array(w if w is not None else [1] * len(rows),
                                               pa.int64()))


def changes(seed: int, pushes: int = 7) -> list[list[tuple[tuple[Any, ...], int]]]:
    """Batches of (row, weight): inserts, deletes of held rows, duplicates of held rows."""
    rng = random.Random(seed)
    held: list[tuple[Any, ...]] = []
    out = []
    for i in range(pushes):
        batch: list[tuple[tuple[Any, ...], int]] = []
        if i and held:
            for r in rng.sample(held, min(len(held), rng.randint(1, 8))):
                held.remove(r)
                batch.append((r, -1))
            for r in rng.sample(held, min(len(held), rng.randint(0, 3))):
                held.append(r)
                batch.append((r, 1))
        for _ in range(40 if i == 0 else rng.randint(0, 6)):
            r = random_row(rng)
            held.append(r)
            batch.append((r, 1))
        out.append(batch)
    return out


def duck(rows: list[tuple[Any, ...]], sql: str) -> pa.Table:
    con = duckdb.connect()
    try:
        con.register("t_in", table_of(rows).drop_columns(["_weight"]))
        con.execute("CREATE TABLE t AS SELECT * FROM t_in")
        return con.execute(sql).to_arrow_table()
    finally:
        con.close()


def check_stream(store: js.StateStore, stream: js.Stream, sql: str, seed: int,
                 reopen_at: int | None = None, path: Path | None = None) -> int:
    """Push the change stream of ``seed``; after each push read() must equal ``sql``'s answer.

    Returns the number of non-empty answers seen.
    """
    graph = js.Graph().output("out", stream, materialize=True)
    p = js.Pipeline(store, "w", graph)
    held: list[tuple[Any, ...]] = []
    nonempty = 0
    for i, batch in enumerate(changes(seed)):
        if i == reopen_at:
            assert path is not None
            store.close()
            store = js.StateStore(path)
            p = js.Pipeline(store, "w", graph)
        p.push("t", table_of([r for r, _ in batch], [w for _, w in batch]))
        for r, w in batch:
            if w > 0:
                held.append(r)
            else:
                held.remove(r)
        want = duck(held, sql)
        got = p.read("out").select(want.column_names)
        res = compare(got, want)
        assert res["ok"], f"seed {seed}, push {i}: {res}"
        nonempty += want.num_rows > 0
    p.verify()
    if reopen_at is not None:
        store.close()
    return nonempty


CASES: dict[str, tuple[dict[str, Any], str]] = {
    "ranks_and_running_aggregates": (
        {"partition_by": ["g"], "order_by": [("x", "descending")],
         "rk": ("rank",), "dr": ("dense_rank",), "s": ("sum", "y"), "a": ("avg", "f"),
         "mn": ("min", "y"), "mx": ("max", "f"), "c": ("count", "x"), "n": ("count", None)},
        "SELECT *, rank() OVER w rk, dense_rank() OVER w dr, sum(y) OVER w s, "
        "avg(f) OVER w a, min(y) OVER w mn, max(f) OVER w mx, count(x) OVER w c, "
        "count(*) OVER w n FROM t WINDOW w AS (PARTITION BY g ORDER BY x DESC)"),
    "whole_partition_null_keys": (
        {"partition_by": ["g", "h"], "s": ("sum", "y"), "a": ("avg", "x"),
         "mn": ("min", "f"), "mx": ("max", "g"), "n": ("count", None), "sf": ("sum", "f")},
        "SELECT *, sum(y) OVER w s, avg(x) OVER w a, min(f) OVER w mn, max(g) OVER w mx, "
        "count(*) OVER w n, sum(f) OVER w sf FROM t WINDOW w AS (PARTITION BY g, h)"),
    "global_nan_nulls_first": (
        {"order_by": [("f", "ascending", "at_start")], "rk": ("rank",),
         "dr": ("dense_rank",), "s": ("sum", "x"), "mx": ("max", "y")},
        "SELECT *, rank() OVER w rk, dense_rank() OVER w dr, sum(x) OVER w s, "
        "max(y) OVER w mx FROM t WINDOW w AS (ORDER BY f ASC NULLS FIRST)"),
    "descending_nan_first": (
        {"partition_by": ["h"], "order_by": [("f", "descending"), ("x", "ascending")],
         "rk": ("rank",), "s": ("sum", "f")},
        "SELECT *, rank() OVER w rk, sum(f) OVER w s FROM t "
        "WINDOW w AS (PARTITION BY h ORDER BY f DESC, x ASC)"),
    "rows_frames": (
        {"partition_by": ["g"],
         "order_by": [("x", "ascending"), ("y", "descending"), ("f", "ascending"),
                      ("h", "ascending")],
         "rn": ("row_number",), "s": ("sum", "y", "rows"), "sf": ("sum", "f", "rows"),
         "n": ("count", None, "rows"), "mn": ("min", "x", "rows"),
         "mx": ("max", "y", "rows"), "a": ("avg", "x", "rows")},
        "SELECT *, row_number() OVER w rn, sum(y) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING "
        "AND CURRENT ROW) s, sum(f) OVER (w ROWS UNBOUNDED PRECEDING) sf, count(*) OVER "
        "(w ROWS UNBOUNDED PRECEDING) n, min(x) OVER (w ROWS UNBOUNDED PRECEDING) mn, "
        "max(y) OVER (w ROWS UNBOUNDED PRECEDING) mx, avg(x) OVER (w ROWS UNBOUNDED "
        "PRECEDING) a FROM t WINDOW w AS (PARTITION BY g ORDER BY x, y DESC, f, h)"),
    "top_n_per_partition": (
        {"partition_by": ["g"], "order_by": [("x", "descending")], "top": {"rk": 2},
         "rk": ("rank",), "s": ("sum", "y")},
        "SELECT * FROM (SELECT *, rank() OVER w rk, sum(y) OVER w s FROM t "
        "WINDOW w AS (PARTITION BY g ORDER BY x DESC)) WHERE rk <= 2"),
    "global_top_n_dense": (
        {"order_by": [("y", "ascending")], "top": {"dr": 1}, "dr": ("dense_rank",)},
        "SELECT * FROM (SELECT *, dense_rank() OVER (ORDER BY y) dr FROM t) WHERE dr <= 1"),
}


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_window_matches_duckdb(case: str, seed: int, tmp_path: Path) -> None:
    spec, sql = CASES[case]
    kw = dict(spec)
    part = kw.pop("partition_by", ())
    order = kw.pop("order_by", ())
    top = kw.pop("top", None)
    with js.StateStore(tmp_path / "s") as store:
        stream = js.source("t", SCHEMA).window(part, order, top=top, **kw)
        assert check_stream(store, stream, sql, seed) >= 5


def test_window_state_survives_a_reopen(tmp_path: Path) -> None:
    spec, sql = CASES["rows_frames"]
    kw = dict(spec)
    stream = js.source("t", SCHEMA).window(kw.pop("partition_by"), kw.pop("order_by"), **kw)
    store = js.StateStore(tmp_path / "s")
    check_stream(store, stream, sql, 3, reopen_at=4, path=tmp_path / "s")


def test_window_below_a_join_and_an_aggregate(tmp_path: Path) -> None:
    """A window over an aggregate (SUM(SUM(y)) OVER ...) feeding a join downstream."""
    t = js.source("t", SCHEMA)
    per = t.group_by(["g", "h"]).aggregate(s=("sum", "y"))
    win = per.window(["g"], [("s", "descending")], tot=("sum", "s", "partition"),
                     rk=("rank",))
    joined = win.join(t.select(["g", "x"]), on="g")
    sql = ("SELECT w.*, t.x FROM (SELECT g, h, sum(y) s, sum(sum(y)) OVER (PARTITION BY g) "
           "tot, rank() OVER (PARTITION BY g ORDER BY sum(y) DESC) rk FROM t GROUP BY g, h) "
           "w JOIN t ON w.g = t.g")
    with js.StateStore(tmp_path / "s") as store:
        assert check_stream(store, joined, sql, 5) >= 5


# ---- faults, errors, state -----------------------------------------------------------


def test_over_retraction_of_an_unchecked_source_changes_nothing(tmp_path: Path) -> None:
    t = js.source("t", SCHEMA, retractions="unchecked")
    g = js.Graph().output("out", t.window(["g"], [("x", "ascending")], rk=("rank",)),
                          materialize=True)
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "w", g)
        rows = [("a", 1, 1, Decimal("1.00"), 0.5), ("a", 1, 2, Decimal("1.00"), 0.5)]
        p.push("t", table_of(rows))
        before = p.read("out")
        with pytest.raises(OverRetractionError):
            p.push("t", table_of([("a", 1, 9, None, None)], [-1]))
        assert p.read("out").equals(before)
        p.verify()
        out = p.push("t", table_of(rows[:1], [-1]))["out"]
        assert sorted(out.to_pylist(), key=str) == sorted([
            {"g": "a", "h": 1, "x": 1, "y": Decimal("1.00"), "f": 0.5, "rk": 1, "_weight": -1},
            {"g": "a", "h": 1, "x": 2, "y": Decimal("1.00"), "f": 0.5, "rk": 2, "_weight": -1},
            {"g": "a", "h": 1, "x": 2, "y": Decimal("1.00"), "f": 0.5, "rk": 1, "_weight": 1},
        ], key=str)


def test_int64_sum_overflow_raises_and_applies_nothing(tmp_path: Path) -> None:
    schema = pa.schema([("g", pa.int64()), ("v", pa.int64())])
    g = js.Graph().output("out", js.source("t", schema).window(
        ["g"], [("v", "ascending")], s=("sum", "v", "rows")), materialize=True)
    big = 2**62
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "w", g)
        p.push("t", pa.table({"g": [1, 1], "v": [big, 1], "_weight": [1, 1]}))
        before = p.read("out")
        with pytest.raises(WeightOverflowError, match="window"):
            p.push("t", pa.table({"g": [1], "v": [big + 5], "_weight": [1]}))
        assert p.read("out").equals(before)
        p.push("t", pa.table({"g": [2], "v": [big], "_weight": [1]}))
        assert p.read("out").num_rows == 3


def test_decimal_sums_beyond_int64_are_exact(tmp_path: Path) -> None:
    schema = pa.schema([("g", pa.int64()), ("v", pa.decimal128(38, 0))])
    g = js.Graph().output("out", js.source("t", schema).window(
        ["g"], [("v", "ascending")], s=("sum", "v", "rows")), materialize=True)
    vals = [Decimal(10**30), Decimal(10**30 + 7), Decimal(-5)]
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "w", g)
        p.push("t", pa.table({"g": [1, 1, 1], "v": pa.array(vals, schema.field("v").type),
                              "_weight": [1, 1, 1]}))
        got = sorted(p.read("out")["s"].to_pylist())
        assert got == [Decimal(-5), Decimal(10**30 - 5), Decimal(2 * 10**30 + 2)]


def test_builder_refuses_bad_windows() -> None:
    t = js.source("t", SCHEMA)
    with pytest.raises(SchemaMismatchError, match="must be one of"):
        t.window(["g"], rk=("lag", "x"))
    with pytest.raises(SchemaMismatchError, match="ROWS frame needs order_by"):
        t.window(["g"], s=("sum", "x", "rows"))
    with pytest.raises(SchemaMismatchError, match="no column 'nope'"):
        t.window(["nope"], rk=("rank",))
    with pytest.raises(SchemaMismatchError, match="integer column"):
        t.window(["g"], [("x", "ascending")], top={"g": 3}, rk=("rank",))
    with pytest.raises(SchemaMismatchError, match="numbers only"):
        t.window(["g"], s=("sum", "g"))
    with pytest.raises(SchemaMismatchError, match="at least one function"):
        t.window(["g"])


def test_window_state_is_inspected_verified_and_dropped(tmp_path: Path) -> None:
    t = js.source("t", SCHEMA)
    g = js.Graph().output("out", t.window([], [("x", "ascending")], rk=("rank",)))
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "w", g)
        p.push("t", table_of([random_row(random.Random(i)) for i in range(30)]))
        facts = inspect.describe(store, "w")
        idx = [i for i in facts["indexes"] if "window" in i["column_family"]]
        assert len(idx) == 1 and idx[0]["rows"] == 30
        assert "window window1" in p.explain() and "1 partition(s)" in p.explain()
        assert any("window" in cf for cf in p.verify()["indexes"])
        assert store.verify()["pipelines"]["w"]["indexes"]
        store.drop_pipeline("w")
        assert not [cf for cf in store.column_families() if "window" in cf]


def test_window_graph_pickles_and_keeps_its_spec() -> None:
    t = js.source("t", SCHEMA)
    g = js.Graph().output("out", t.window(["g"], [("x", "descending", "at_start")],
                                          top={"rk": 3}, rk=("rank",), s=("sum", "y")))
    again = pickle.loads(pickle.dumps(g))
    assert again.spec() == g.spec()
    node = again.outputs["out"]
    assert node.kind == "window" and node.top == (("rk", 3),)
    assert node.local_under(["g"]) and not node.local_under(["x"])


# ---- SQL ----------------------------------------------------------------------------


def run_sql(tmp_path: Path, sql: str, seed: int) -> js.Pipeline:
    """Compile ``sql`` over source t and check it against DuckDB through a change stream."""
    store = js.StateStore(tmp_path / "s")
    p = compile(sql, {"t": SCHEMA}, store=store, name="q")
    held: list[tuple[Any, ...]] = []
    seen = 0
    for i, batch in enumerate(changes(seed)):
        p.push("t", table_of([r for r, _ in batch], [w for _, w in batch]))
        for r, w in batch:
            if w > 0:
                held.append(r)
            else:
                held.remove(r)
        want = duck(held, sql)
        got = p.read("q")
        assert got.num_rows == want.num_rows, f"push {i}: {got.num_rows} vs {want.num_rows}"
        got = got.rename_columns(want.column_names)
        if "LIMIT" not in sql:
            res = compare(got, want)
            assert res["ok"], f"push {i}: {res}"
        seen += want.num_rows > 0
    assert seen >= 5
    return p


SQL = [
    "SELECT g, h, sum(y) AS s, sum(sum(y)) OVER (PARTITION BY g) AS tot, "
    "sum(y) * 100.0 / sum(sum(y)) OVER (PARTITION BY g) AS ratio, "
    "rank() OVER (PARTITION BY g ORDER BY sum(y) DESC) AS rk FROM t GROUP BY g, h",
    "SELECT * FROM (SELECT g, x, y, rank() OVER (PARTITION BY g ORDER BY x DESC) AS rk "
    "FROM t) AS q WHERE rk <= 2",
    "SELECT * FROM (SELECT x, f, rank() OVER (ORDER BY x) AS a, dense_rank() OVER "
    "(ORDER BY f DESC) AS b FROM t) AS q WHERE a <= 3 OR b < 3",
    "SELECT h, x, avg(sum(f)) OVER (PARTITION BY h) AS av, max(sum(y)) OVER "
    "(PARTITION BY h ORDER BY x ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS mx "
    "FROM t WHERE x IS NOT NULL GROUP BY h, x",
    "SELECT g, count(*) OVER (PARTITION BY g ORDER BY h RANGE BETWEEN UNBOUNDED PRECEDING "
    "AND UNBOUNDED FOLLOWING) AS n, x + 1 AS x1 FROM t",
]


@pytest.mark.parametrize("i", range(len(SQL)))
def test_sql_windows_match_duckdb(i: int, tmp_path: Path) -> None:
    p = run_sql(tmp_path, SQL[i], seed=10 + i)
    p.store.close()  # type: ignore[union-attr]


def test_sql_rank_filter_is_a_maintained_top_n() -> None:
    got = plan(SQL[2], {"t": SCHEMA})
    tops = [d for d in got.decisions if d.topic == "top_n"]
    assert len(tops) == 1 and sorted(tops[0].choice.values()) == [2, 3]
    assert any(d.topic == "window" for d in got.decisions)


def test_sql_order_by_an_expression_that_is_not_selected(tmp_path: Path) -> None:
    sql = ("SELECT g, x FROM t WHERE x IS NOT NULL ORDER BY x * -2, g NULLS FIRST, "
           "CASE WHEN g = 'a' THEN 0 ELSE h END LIMIT 4")
    p = run_sql(tmp_path, sql, seed=7)
    read = p.read("q")
    assert read.column_names == ["g", "x"]
    held_order = [r["x"] for r in read.to_pylist()]
    assert held_order == sorted(held_order, reverse=True)
    p.store.close()  # type: ignore[union-attr]


@pytest.mark.parametrize(("sql", "what"), [
    ("SELECT lag(x) OVER (ORDER BY x) FROM t", "window function"),
    ("SELECT sum(x) OVER (ORDER BY x ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t",
     "window frame"),
    ("SELECT ntile(2) OVER (ORDER BY x) FROM t", "window function"),
    ("SELECT sum(x) OVER (ROWS UNBOUNDED PRECEDING) FROM t", "window frame"),
])
def test_sql_refuses_windows_it_does_not_maintain(sql: str, what: str) -> None:
    with pytest.raises(UnsupportedSQLError, match=what):
        plan(sql, {"t": SCHEMA})


def test_frames_of_one_partition_do_not_depend_on_other_partitions() -> None:
    """A float running sum per partition equals, to the bit, the sum of that partition
    computed alone (what makes a recomputed old value cancel the one emitted earlier)."""
    from joinstate import windowfn

    rng = np.random.default_rng(0)
    vals = rng.normal(size=200) * 10.0 ** rng.integers(-5, 10, 200)
    part = np.repeat(np.arange(20), 10)
    t = pa.table({"v": vals, "o": rng.integers(0, 3, 200)})
    funcs = [("s", "sum", "v", "rows")]
    perm, (got,) = windowfn.evaluate(t, None, part, [("o", "ascending", "at_end")], funcs,
                                     [pa.float64()], lambda: "test")
    for p in (0, 7, 19):
        alone = t.filter(pa.array(part == p))
        _, (one,) = windowfn.evaluate(alone, None, np.zeros(10, np.int64),
                                          [("o", "ascending", "at_end")], funcs,
                                          [pa.float64()], lambda: "test")
        mine = np.asarray(got)[part[perm] == p]
        assert mine.tobytes() == np.asarray(one).tobytes()


# ---- kill -9 --------------------------------------------------------------------------

CHILD = Path(__file__).with_name("window_crash_child.py")


def _child(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], check=False,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("point", "n"), [
    ("commit", 3), pytest.param("commit-before", 2, marks=pytest.mark.slow),
    pytest.param("commit-before", 6, marks=pytest.mark.slow)])
def test_kill_during_pushes_then_retry_gives_the_exact_answer(tmp_path: Path, point: str,
                                                              n: int) -> None:
    spec = {"path": str(tmp_path / "s"), "out": str(tmp_path / "out.arrow"), "seed": 4,
            "kill": [point, n]}
    first = _child(spec)
    assert first.returncode == -9, (first.returncode, first.stderr[-2000:])
    second = _child(dict(spec, kill=["none", 0]))
    assert second.returncode == 0, second.stderr[-3000:]
    with pa.memory_map(str(tmp_path / "out.arrow")) as f:
        got = pa.ipc.open_file(f).read_all()
    held: list[tuple[Any, ...]] = []
    for batch in changes(4):
        for r, w in batch:
            if w > 0:
                held.append(r)
            else:
                held.remove(r)
    want = duck(held, "SELECT * FROM (SELECT *, rank() OVER w rk, sum(y) OVER w s FROM t "
                      "WINDOW w AS (PARTITION BY g ORDER BY x DESC)) WHERE rk <= 2")
    assert got.num_rows and compare(got.select(want.column_names), want)["ok"]


def test_a_row_held_too_many_times_is_refused_not_expanded(tmp_path: Path) -> None:
    schema = pa.schema([("g", pa.int64()), ("v", pa.int64())])
    g = js.Graph().output("out", js.source("t", schema).window(
        ["g"], [("v", "ascending")], rn=("row_number",)), materialize=True)
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "w", g)
        p.push("t", pa.table({"g": [1], "v": [1], "_weight": [3]}))
        with pytest.raises(WeightOverflowError, match="multiplicities"):
            p.push("t", pa.table({"g": [1], "v": [2], "_weight": [10**12]}))
        assert sorted(p.read("out")["rn"].to_pylist()) == [1, 2, 3]


def test_hidden_order_columns_are_only_for_reading(tmp_path: Path) -> None:
    t = js.source("t", SCHEMA)
    s = t.select({"g": "g", "key": "x"})
    with pytest.raises(SchemaMismatchError, match="hide"):
        js.Graph().output("o", s, hide=["key"])
    g = js.Graph().output("o", s, materialize=True, order_by=[("key", "descending")],
                          hide=["key"])
    assert g.outputs["o"].schema.names == ["g"]
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "h", g)
        out = p.push("t", table_of([("a", 1, 1, None, None), ("b", 1, 5, None, None)]))["o"]
        assert out.column_names == ["g", "_weight"]
        assert p.read("o")["g"].to_pylist() == ["b", "a"]
