"""DISTINCT aggregates and STDDEV/VAR through the SQL compiler, against DuckDB.

Random change streams (inserts, duplicates, deletes, updates, NULL keys and values) are
pushed and after every push the integrated output, ``read()`` and the result types
equal DuckDB's (tests/test_planner_sql.py's harness).  COUNT/SUM/AVG(DISTINCT x) are two
group-bys (keys and value, then keys); several distinct arguments are combined by a
union grouped on the keys, NULL keys included.  The moments are count, sum and sum of
squares, exact decimals for integers up to 32 bits and decimals up to 18 digits: a
variance read after deletes is the correctly rounded one, where a float formula loses
every digit when the mean is large against the deviation.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

pytest.importorskip("duckdb")

from test_grouping_sets import Harness, run
from test_planner_sql import SOURCES

import joinstate
from planner.sql import SQLError, UnsupportedSQLError, compile, plan

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[joinstate.StateStore]:
    with joinstate.StateStore(tmp_path / "state") as s:
        yield s


CASES = {
    "distinct-with-others": """
        SELECT k, t, count(DISTINCT v) AS cv, sum(DISTINCT w) AS sw, avg(DISTINCT d) AS ad,
               sum(d) AS sd, count(*) AS n, count(v) AS nv, min(t) AS mt, max(DISTINCT w) AS mw
        FROM s GROUP BY k, t""",
    "several-arguments": """
        SELECT k, count(DISTINCT v) AS cv, count(DISTINCT t) AS ct, sum(DISTINCT d) AS sd,
               max(dt) AS mdt, sum(w) AS sw
        FROM s GROUP BY k""",
    "global": """
        SELECT count(DISTINCT v) AS cv, count(DISTINCT t) AS ct, sum(d) AS sd,
               count(*) AS n FROM s""",
    "global-filtered-out": """
        SELECT count(DISTINCT k) AS n, sum(DISTINCT v) AS sv FROM s WHERE v > 5""",
    "filter-clause": """
        SELECT k, count(DISTINCT v) FILTER (WHERE w > 0) AS cv,
               stddev_pop(d) FILTER (WHERE t = 'a') AS sp FROM s GROUP BY k""",
    "in-rollup": """
        SELECT k, t, count(DISTINCT v) AS cv, sum(w) AS sw FROM s GROUP BY ROLLUP (k, t)""",
    "float-values": """
        SELECT k, count(DISTINCT f) AS cf, sum(DISTINCT f) AS sf FROM s GROUP BY k""",
    "having": """
        SELECT k, count(DISTINCT v) AS cv FROM s GROUP BY k HAVING count(DISTINCT v) > 1""",
    "moments": """
        SELECT k, stddev_samp(d) AS a, stddev_pop(d) AS b, var_samp(v) AS c,
               var_pop(v) AS dd, stddev(w) AS e, variance(f) AS ff, stddev_samp(small) AS g,
               stddev_samp(v) / avg(v) AS cov
        FROM s GROUP BY k""",
    "moments-global-join": """
        SELECT stddev_samp(s.v + e.x) AS a, var_pop(c.score) AS b
        FROM s JOIN e ON s.k = e.k JOIN c ON s.k = c.ck""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_distinct_and_moments_equal_duckdb(store: joinstate.StateStore, case: str) -> None:
    run(store, CASES[case], seed=len(case))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
@pytest.mark.parametrize("case", sorted(CASES))
def test_distinct_and_moments_more_seeds(store: joinstate.StateStore, case: str,
                                         seed: int) -> None:
    run(store, CASES[case], seed=seed, pushes=20)


def test_distinct_is_two_group_bys_and_says_so() -> None:
    p = plan("SELECT k, count(DISTINCT v) AS cv, sum(w) AS sw FROM s GROUP BY k", SOURCES)
    (d,) = [d for d in p.decisions if d.topic == "distinct_aggregate"]
    assert d.choice == 1
    assert "two group-bys" in d.reason
    p = plan("SELECT count(DISTINCT v), count(DISTINCT t) FROM s", SOURCES)
    (d,) = [d for d in p.decisions if d.topic == "distinct_aggregate"]
    assert d.choice == 2 and "union grouped on the keys" in d.reason


def _exact_variance(values: list[Decimal]) -> float:
    n = len(values)
    mean = sum(map(Fraction, values), Fraction(0)) / n
    return float(sum((Fraction(v) - mean) ** 2 for v in values) / (n - 1))


def test_decimal_moments_are_exact_under_deletes(store: joinstate.StateStore) -> None:
    # Values near 99999.99 that differ in their last digit: sum(x^2) - sum(x)^2 / n in
    # doubles cancels every significant digit; the exact decimals do not.
    schema = pa.schema([("g", pa.int32()), ("x", pa.decimal128(7, 2))])
    sources = {"t": schema}
    p = compile("SELECT g, var_samp(x) AS v, stddev_samp(x) AS s FROM t GROUP BY g",
                sources, store=store, name="m")
    rng = random.Random(7)
    rows = [(1, Decimal("99999.99") - Decimal(rng.randint(0, 3)) / 100) for _ in range(300)]

    def push(batch: list[tuple[int, Decimal]], w: int) -> None:
        p.push("t", pa.table({"g": pa.array([r[0] for r in batch], pa.int32()),
                              "x": pa.array([r[1] for r in batch], schema.field("x").type),
                              "_weight": pa.array([w] * len(batch), pa.int64())}))

    push(rows, 1)
    gone, kept = rows[:290], rows[290:]
    push(gone, -1)
    (got,) = p.read("m").to_pylist()
    want = _exact_variance([x for _, x in kept])
    assert got["v"] == pytest.approx(want, rel=1e-15)
    assert got["s"] == pytest.approx(math.sqrt(want), rel=1e-15)
    naive_sum = sum(float(x) for _, x in kept)
    naive = (sum(float(x) ** 2 for _, x in kept) - naive_sum ** 2 / len(kept)) / 9
    assert abs(naive - want) > 1e-6 * want  # what a float formula would have said
    # one value left: the sample variance is NULL, as in DuckDB
    push(kept[1:], -1)
    assert p.read("m").to_pylist() == [{"g": 1, "v": None, "s": None}]


def test_moments_of_a_non_number_are_refused() -> None:
    with pytest.raises(SQLError, match="deviation of VARCHAR"):
        plan("SELECT stddev_samp(t) FROM s", SOURCES)


def test_distinct_of_several_columns_is_refused() -> None:
    with pytest.raises(UnsupportedSQLError, match="distinct tuples"):
        plan("SELECT count(DISTINCT k, v) FROM s", SOURCES)


def test_a_first_push_without_rows_returns_nothing_yet(store: joinstate.StateStore) -> None:
    h = Harness(store, "SELECT count(DISTINCT v) AS cv FROM s")
    try:
        assert h.p.read("q").to_pylist() == [{"cv": 0}]
        h.random_push(random.Random(3))
        h.check()
    finally:
        h.close()
