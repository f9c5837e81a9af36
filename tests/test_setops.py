"""INTERSECT / EXCEPT (and ALL), cross joins, and the repeat operator, against DuckDB.

The SQL cases push random change streams (inserts, duplicates, deletes, updates, NULLs
in every column) and compare the integrated output, ``read()`` and the types with
DuckDB's answer after every push (tests/test_planner_sql.py's harness).  Set operations
count each row's copies per query in one group-by on all columns, so NULLs compare
equal, as SQL's set operations have it; ``ALL`` repeats a row by its count.  Cross joins
are joins on a constant key: a product of two relations, single-row sides (aggregates
without GROUP BY, as TPC-DS q88 and q90 join them), and a non-equi condition applied
after a cross join with a single row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("duckdb")

from test_grouping_sets import run
from test_planner_sql import SOURCES

import joinstate
from planner.sql import UnsupportedSQLError, plan

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[joinstate.StateStore]:
    with joinstate.StateStore(tmp_path / "state") as s:
        yield s


SET_CASES = {
    "intersect": "SELECT k, t FROM s INTERSECT SELECT k, label FROM e",
    "except": "SELECT k, t FROM s EXCEPT SELECT k, label FROM e",
    "intersect-chain": "SELECT k FROM s INTERSECT SELECT k FROM e INTERSECT SELECT ck FROM c",
    "except-chain": "SELECT k FROM s EXCEPT SELECT k FROM e EXCEPT SELECT ck FROM c",
    "intersect-all": "SELECT k, t FROM s INTERSECT ALL SELECT k, label FROM e",
    "except-all": "SELECT k, t FROM s EXCEPT ALL SELECT k, label FROM e",
    "except-all-chain": "SELECT k, v FROM s EXCEPT ALL SELECT k, x FROM e "
                        "EXCEPT ALL SELECT ck, grp FROM c",
    "distinct-branches": "SELECT count(*) AS n FROM (SELECT DISTINCT k, t FROM s INTERSECT "
                         "SELECT DISTINCT k, label FROM e) AS x",
    "in-a-union": "SELECT k FROM s UNION ALL SELECT k FROM e INTERSECT SELECT ck FROM c",
    "types-aligned": "SELECT d FROM s INTERSECT SELECT x FROM e",
    "nested": "(SELECT k FROM s EXCEPT SELECT k FROM e) UNION "
              "(SELECT ck FROM c INTERSECT ALL SELECT k FROM s)",
}

CROSS_CASES = {
    "product": "SELECT s.k, s.v, e.x FROM s, e WHERE s.v = 1 AND e.x = 2",
    "cross-join-syntax": "SELECT c.name, e.label FROM c CROSS JOIN e WHERE c.grp = 1",
    "single-rows": "SELECT a.n, b.m, c.top FROM (SELECT count(*) AS n FROM s) AS a, "
                   "(SELECT sum(x) AS m FROM e) AS b, (SELECT max(score) AS top FROM c) AS c",
    "ratio-of-single-rows": "SELECT CASE WHEN b.m = 0 THEN NULL ELSE a.n / b.m END AS r "
                            "FROM (SELECT count(*) AS n FROM s WHERE v > 0) AS a, "
                            "(SELECT count(*) AS m FROM e) AS b",
    "filter-against-a-single-row": "SELECT s.k, s.w FROM s, (SELECT max(x) AS m FROM e) AS b "
                                   "WHERE s.w > b.m",
    "grouped-product": "SELECT a.k, b.ek, a.n * b.m AS nm FROM "
                       "(SELECT k, count(*) AS n FROM s GROUP BY k) AS a, "
                       "(SELECT ek, sum(x) AS m FROM e GROUP BY ek) AS b",
    "aggregate-over-product": "SELECT s.k, sum(s.v) AS sv, max(b.m) AS m FROM s, "
                              "(SELECT max(x) AS m FROM e) AS b GROUP BY s.k "
                              "HAVING sum(s.v) > max(b.m)",
}


@pytest.mark.parametrize("case", sorted(SET_CASES))
def test_set_operations_equal_duckdb(store: joinstate.StateStore, case: str) -> None:
    run(store, SET_CASES[case], seed=len(case))


@pytest.mark.parametrize("case", sorted(CROSS_CASES))
def test_cross_joins_equal_duckdb(store: joinstate.StateStore, case: str) -> None:
    run(store, CROSS_CASES[case], seed=len(case))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
@pytest.mark.parametrize("case", sorted(SET_CASES) + sorted(CROSS_CASES))
def test_set_operations_and_cross_joins_more_seeds(store: joinstate.StateStore, case: str,
                                                   seed: int) -> None:
    run(store, {**SET_CASES, **CROSS_CASES}[case], seed=seed, pushes=20)


def test_set_operations_and_cross_joins_say_how() -> None:
    (d,) = [d for d in plan(SET_CASES["except-chain"], SOURCES).decisions
            if d.topic == "set_operation"]
    assert d.subject == "EXCEPT of 3 queries" and "only the first query's count" in d.reason
    (d,) = [d for d in plan(CROSS_CASES["single-rows"], SOURCES).decisions
            if d.topic == "cross_join"]
    assert d.figures == {"groups": 3, "single_row": 3}
    # three single rows on one constant key: one delta join, no intermediate state
    assert any(d.topic == "join_all" for d in plan(CROSS_CASES["single-rows"],
                                                     SOURCES).decisions)


def test_a_non_equi_join_of_two_relations_stays_refused() -> None:
    with pytest.raises(UnsupportedSQLError, match="non-equi join"):
        plan("SELECT s.k FROM s JOIN e ON s.k < e.k", SOURCES)
    with pytest.raises(UnsupportedSQLError, match="non-equi join"):
        plan("SELECT s.k FROM s, e WHERE s.v > e.x", SOURCES)


# ---- the repeat operator -----------------------------------------------------------------


def _delta(a: list[int], n: list[int | None], w: list[int]) -> pa.Table:
    return pa.table({"a": pa.array(a, pa.int32()), "n": pa.array(n, pa.int64()),
                     "_weight": pa.array(w, pa.int64())})


def test_repeat_multiplies_weights_by_the_count(store: joinstate.StateStore) -> None:
    s = joinstate.source("s", pa.schema([("a", pa.int32()), ("n", pa.int64())]))
    p = joinstate.Pipeline(store, "r", joinstate.Graph().output("o", s.repeat("n"),
                                                                 materialize=True))
    out = p.push("s", _delta([1, 2, 3], [2, 0, 3], [1, 1, 2]))["o"]
    assert dict(zip(out["a"].to_pylist(), out["_weight"].to_pylist(), strict=True)) == {
        1: 2, 3: 6}
    out = p.push("s", _delta([3], [3], [-1]))["o"]
    assert out.to_pylist() == [{"a": 3, "_weight": -3}]
    assert sorted(p.read("o")["a"].to_pylist()) == [1, 1, 3, 3, 3]
    assert "repeat1 each row n times" in p.explain()


@pytest.mark.parametrize("bad", [-1, None])
def test_repeat_refuses_a_bad_count_and_applies_nothing(store: joinstate.StateStore,
                                                         bad: int | None) -> None:
    s = joinstate.source("s", pa.schema([("a", pa.int32()), ("n", pa.int64())]))
    p = joinstate.Pipeline(store, "r", joinstate.Graph().output("o", s.repeat("n"),
                                                                 materialize=True))
    p.push("s", _delta([1], [2], [1]))
    with pytest.raises(joinstate.ExpressionError, match="count column 'n'"):
        p.push("s", _delta([1, 5], [2, bad], [-1, 1]))
    assert p.read("o")["a"].to_pylist() == [1, 1]
    # the source did not take the refused push either: its row is still there once
    p.push("s", _delta([1], [2], [-1]))
    assert p.read("o").num_rows == 0


def test_repeat_overflow_is_named(store: joinstate.StateStore) -> None:
    s = joinstate.source("s", pa.schema([("a", pa.int32()), ("n", pa.int64())]))
    p = joinstate.Pipeline(store, "r", joinstate.Graph().output("o", s.repeat("n")))
    big = int(np.iinfo(np.int64).max // 2 + 1)
    with pytest.raises(joinstate.WeightOverflowError):
        p.push("s", _delta([1], [big], [2]))


@pytest.mark.parametrize(("column", "match"), [("x", "no column"), ("a", "integer")])
def test_repeat_checks_its_column(column: str, match: str) -> None:
    s = joinstate.source("s", pa.schema([("a", pa.string()), ("n", pa.int64())]))
    with pytest.raises(joinstate.SchemaMismatchError, match=match):
        s.repeat(column)
    with pytest.raises(joinstate.SchemaMismatchError, match="only column"):
        joinstate.source("t", pa.schema([("n", pa.int64())])).repeat("n")
