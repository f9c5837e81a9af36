"""ROLLUP, CUBE, GROUPING SETS and GROUPING() through the SQL compiler, against DuckDB.

Each case compiles a query and pushes a random change stream (inserts, duplicates,
deletes, updates, NULL group keys and values) into its sources; after every push the
integrated output, ``read()`` and the result types equal DuckDB's answer on the current
tables (tests/test_planner_sql.py's harness).  A grouping set is a group-by of its own
in a union, computed from a finer set's output where its aggregates add up exactly:
the cases cover rolled-up sets (sums, counts, min/max, AVG), sets read from the input
(float sums), the empty set's row over an empty input, and HAVING over the union.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("duckdb")

from test_planner_sql import SOURCES, SQLHarness

import joinstate
from planner.sql import SQLError, UnsupportedSQLError, plan

if TYPE_CHECKING:
    import random
    from collections.abc import Iterator
    from pathlib import Path


class Harness(SQLHarness):
    """The harness, with every push carrying rows.

    An aggregate over no rows (the ``()`` set) has its row from the pipeline's creation
    on; the pipeline returns it with the first push that carries a row, which the
    integrated output needs to see before it is compared.
    """

    def random_push(self, rng: random.Random) -> None:
        while True:
            source = rng.choice(list(self.p.sources))
            entries = self.gens[source].delta(rng, self.current[source])
            if entries:
                self.push(source, entries)
                return


@pytest.fixture
def store(tmp_path: Path) -> Iterator[joinstate.StateStore]:
    with joinstate.StateStore(tmp_path / "state") as s:
        yield s


def run(store: joinstate.StateStore, sql: str, seed: int, pushes: int = 14, **kw: Any
        ) -> Harness:
    h = Harness(store, sql, **kw)
    try:
        h.run(seed, pushes)
    finally:
        h.close()
    return h


CASES = {
    "rollup": """
        SELECT k, t, sum(d) AS sd, count(*) AS n, count(v) AS nv, min(t) AS mt,
               max(w) AS mw, avg(v) AS av, grouping(k, t) AS g, grouping(t) AS gt
        FROM s GROUP BY ROLLUP (k, t)""",
    "cube-having": """
        SELECT k, k2, t, sum(v) AS sv, sum(f) AS sf, count(*) AS n
        FROM s GROUP BY CUBE (k, k2, t) HAVING count(*) > 1""",
    "grouping-sets": """
        SELECT k, t, sum(w) AS sw, grouping(k) AS gk FROM s
        GROUP BY GROUPING SETS ((k, t), (t), ())""",
    "expression-key": """
        SELECT k2 + 1 AS kk, t, sum(d) AS sd, grouping(k2 + 1) AS g FROM s
        GROUP BY ROLLUP (k2 + 1, t)""",
    "composite-element": """
        SELECT k, t, v, count(*) AS n FROM s GROUP BY ROLLUP ((k, t), v)""",
    "duplicate-sets": """
        SELECT k, t, count(*) AS n FROM s GROUP BY GROUPING SETS ((k), (k), (t))""",
    "plain-and-rollup": """
        SELECT k, t, v, sum(w) AS n FROM s GROUP BY k, ROLLUP (t, v)
        HAVING grouping(t) = 0 OR sum(w) > 3""",
    "nested-sets": """
        SELECT k, t, sum(w) AS n FROM s GROUP BY GROUPING SETS (ROLLUP (k), CUBE (t))""",
    "join-and-moments": """
        SELECT c.grp, s.k, sum(s.d) AS sd, stddev_samp(s.v) AS sv, min(c.name) AS mn
        FROM s JOIN c ON s.k = c.ck GROUP BY ROLLUP (c.grp, s.k)""",
    "over-a-union": """
        SELECT channel, id, sum(amount) AS amount, count(*) AS n FROM (
            SELECT 'store' AS channel, k AS id, d AS amount FROM s
            UNION ALL SELECT 'catalog' AS channel, k AS id, x AS amount FROM e) AS u
        GROUP BY ROLLUP (channel, id)""",
    "grouping-of-plain-group-by": """
        SELECT k, grouping(k) AS g, count(*) AS n FROM s GROUP BY k""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_grouping_sets_equal_duckdb(store: joinstate.StateStore, case: str) -> None:
    run(store, CASES[case], seed=hash(case) % 1000)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
@pytest.mark.parametrize("case", sorted(CASES))
def test_grouping_sets_equal_duckdb_more_seeds(store: joinstate.StateStore, case: str,
                                               seed: int) -> None:
    run(store, CASES[case], seed=seed, pushes=20)


def test_the_empty_set_has_its_row_before_any_push(store: joinstate.StateStore) -> None:
    h = Harness(store, "SELECT k, sum(d) AS sd, count(*) AS n, grouping(k) AS g FROM s "
                       "GROUP BY ROLLUP (k)")
    try:
        assert h.p.read("q").to_pylist() == [{"k": None, "sd": None, "n": 0, "g": 1}]
        want, _ = h.duck(h.sql)
        assert want.to_pylist() == h.p.read("q").to_pylist()
    finally:
        h.close()


def test_sets_are_rolled_up_from_finer_sets_when_exact() -> None:
    sql = "SELECT k, k2, t, sum(d) AS sd, count(*) AS n FROM s GROUP BY ROLLUP (k, k2, t)"
    (d,) = [d for d in plan(sql, SOURCES).decisions if d.topic == "grouping_sets"]
    assert d.choice == [["k", "k2", "t"], ["k", "k2"], ["k"], []]
    assert d.figures == {"sets": 4, "rolled_up": 3}
    assert "(k, k2) from (k, k2, t)" in d.reason
    assert "grouping_sets" in plan(sql, SOURCES).explain()
    # a float sum of sums would round differently: those sets read the input
    floats = "SELECT k, sum(f) AS sf FROM s GROUP BY ROLLUP (k)"
    (d,) = [d for d in plan(floats, SOURCES).decisions if d.topic == "grouping_sets"]
    assert d.figures["rolled_up"] == 0


def test_rolled_up_sets_read_the_finer_aggregate(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "state") as st:
        from planner.sql import compile

        p = compile("SELECT k, t, sum(d) AS sd FROM s GROUP BY ROLLUP (k, t)", SOURCES,
                    store=st, name="r")
        text = p.explain()
        # one group-by reads the source; each coarser one reads the previous group-by
        assert text.count("agg") >= 3
        assert "sum(__a0)" in text


@pytest.mark.parametrize(("sql", "error", "match"), [
    ("SELECT grouping(k) AS g, count(*) FROM s", SQLError, "GROUP BY"),
    ("SELECT k, grouping(v) FROM s GROUP BY ROLLUP (k)", SQLError, "GROUP BY expression"),
    ("SELECT count(*) FROM s GROUP BY CUBE (k, k2, v, w, d, f, t, dt, small, k, k2, v, w)",
     UnsupportedSQLError, "CUBE"),
])
def test_bad_grouping_is_named(sql: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        plan(sql, SOURCES)
