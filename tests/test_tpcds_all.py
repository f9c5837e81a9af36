"""The 99-query TPC-DS harness (bench.tpcds_all, ``joinstate bench tpcds --queries``).

By default: the argument parsing, the candidate-row rewriting, one query per construct
the SQL compiler maintains (a window, a correlated subquery, EXISTS, a scalar subquery,
ROLLUP, INTERSECT, EXCEPT, COUNT DISTINCT, STDDEV, a cross join, q4) at SF0.01, each
compiled, populated, given three change batches and checked against DuckDB; a wrong
answer failing the command (exit 1) with the report still written, and so does a
right answer that proves nothing (empty, or unchanged by every batch); the seeds of
the queries empty at small scale factors give them an answer.  All 99 at SF0.1 (the
scale the seeds are kept for) run under ``-m slow``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("duckdb_extension_tpcds")

import cli_runner
import numpy as np
import pyarrow as pa

from bench import tpcds, tpcds_all
from bench.q4 import Integrated

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SF = 0.01

REPRESENTATIVE = {
    12: "window: sum() over (partition by i_class)",
    1: "correlated scalar subquery (avg per store)",
    69: "EXISTS / NOT EXISTS",
    6: "scalar subquery in WHERE and a correlated one",
    27: "ROLLUP with grouping()",
    38: "INTERSECT (seeded: customers buying on one day in every channel)",
    87: "EXCEPT",
    28: "COUNT(DISTINCT) in six one-row aggregates, cross joined",
    17: "STDDEV_SAMP",
    4: "q4: three channels, a six-way self-join (seeded)",
}
"""One query per construct (and what it stands for)."""


@pytest.fixture(scope="module")
def base() -> dict[str, pa.Table]:
    return tpcds_all.load_tables(SF)


def test_parse_queries() -> None:
    assert tpcds_all.parse_queries("all") == list(range(1, 100))
    assert tpcds_all.parse_queries("3, 7,40-42,7") == [3, 7, 40, 41, 42]
    assert tpcds_all.parse_queries("q3") == [3]
    for bad, needle in (("0", "outside 1-99"), ("98-100", "outside 1-99"),
                        ("x", "not a query number"), (",", "no query given"),
                        ("5-3", "outside 1-99")):
        with pytest.raises(tpcds_all.QueryArgumentError, match=needle):
            tpcds_all.parse_queries(bad)


def test_bad_queries_option_is_a_one_line_usage_error() -> None:
    res = cli_runner.run("bench", "tpcds", "--queries", "100")
    cli_runner.assert_one_line_error(res, 2, "--queries", "1-99")


def test_candidate_queries_keep_each_scopes_joins_and_filters() -> None:
    qs = tpcds_all.candidate_queries(tpcds.query(3), tpcds_all.TABLES)
    assert sorted(t for t, _ in qs) == ["date_dim", "item", "store_sales"]
    for _, q in qs:
        assert q.startswith("SELECT DISTINCT")
        assert "i_manufact_id = 128" in q and "d_moy = 11" in q
        assert "GROUP BY" not in q and "LIMIT" not in q
    # CTEs travel with a scope that reads them; a correlated scope is skipped
    q1 = tpcds_all.candidate_queries(tpcds.query(1), tpcds_all.TABLES)
    assert {t for t, _ in q1} == {"store_returns", "date_dim", "store", "customer"}
    assert all("ctr_total_return" not in q or q.startswith("WITH") for _, q in q1)


def test_candidates_are_rows_that_pass_the_filters(base: dict[str, pa.Table]) -> None:
    names = ["store_sales", "date_dim", "item"]
    cands, skipped = tpcds_all.candidates(tpcds.query(42), base, names)
    assert not skipped
    dates = base["date_dim"].filter(pa.compute.is_in(base["date_dim"]["__rid"],
                                                     pa.array(cands["date_dim"])))
    assert dates.num_rows and set(dates["d_year"].to_pylist()) == {2000}
    assert set(dates["d_moy"].to_pylist()) == {11}
    items = base["item"].filter(pa.compute.is_in(base["item"]["__rid"],
                                                 pa.array(cands["item"])))
    assert set(items["i_manager_id"].to_pylist()) == {1}


@pytest.mark.parametrize("n", sorted(REPRESENTATIVE))
def test_representative_query_matches_duckdb(n: int, base: dict[str, pa.Table],
                                             tmp_path: Path) -> None:
    r = tpcds_all.run_query(n, base, tmp_path, seed=0)
    assert r.status == "ok", f"q{n} ({REPRESENTATIVE[n]}): {r.reason}\n{r.traceback}"
    assert [c["step"] for c in r.checks] == ["population", "batch 1", "batch 2", "batch 3"]
    assert len(r.batch_s) == 3 and r.population_s is not None and len(r.duckdb_s) == 4
    for rows in r.batch_rows:  # every batch mixes the four kinds
        assert {"new", "delete", "reinsert"} <= set(rows), rows
        dims = [s for s in r.sources if s not in tpcds_all.FACTS]
        assert ("update" in rows) == bool(dims), (rows, dims)
    assert r.nonempty, f"q{n}: the answer after population is empty: the checks prove little"
    assert all(r.changed), f"q{n}: a batch left the answer as it was: {r.changed}"


def _doubled_add(self: Integrated, outs: Any) -> None:
    """Record every delta twice: the view's integrated output is wrong (never negative)."""
    for name, d in outs.items():
        if d.num_rows:
            self.pending.setdefault(name, []).extend([d, d])


def test_a_wrong_answer_fails_the_command_and_still_writes_the_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(Integrated, "add", _doubled_add)
    out = tmp_path / "out"
    res = cli_runner.run("bench", "tpcds", "--queries", "96", "--sf", SF, "--out", out)
    assert res.exit_code == 1, res.output
    assert "q96" in res.output and "CHECK FAILED" in res.output
    report = json.loads((out / "report.json").read_text())
    assert not report["ok"] and report["summary"]["failed"] == [96]
    assert report["results"][0]["checks"][0] == {
        "step": "population", "ok": False, "what": "output",
        "detail": report["results"][0]["checks"][0]["detail"]}
    assert "**failed**" in (out / "report.md").read_text()


def test_the_command_writes_report_and_chart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = cli_runner.run("bench", "tpcds", "--queries", "96", "--sf", SF, "--out", out)
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert [r["query"] for r in report["results"]] == [96]
    assert report["summary"]["compiled"] == 1 and report["summary"]["matched_all"] == 1
    row = report["results"][0]
    assert len(row["batch_s"]) == 3 and len(row["duckdb_s"]) == 4 and len(row["rows"]) == 4
    assert "| q96 | ok |" in (out / "report.md").read_text()
    assert (out / "tpcds-all.png").stat().st_size > 1000


def test_an_empty_answer_fails_the_command_and_is_named(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    # without its seed (a store named 'ese'), q96 counts nothing: one row, a zero
    monkeypatch.delitem(tpcds_all.SEEDS, 96)
    out = tmp_path / "out"
    res = cli_runner.run("bench", "tpcds", "--queries", "96", "--sf", SF, "--out", out)
    assert res.exit_code == 1, res.output
    assert "q96" in res.output and "vacuous" in res.output
    report = json.loads((out / "report.json").read_text())
    row = report["results"][0]
    assert not report["ok"] and report["summary"]["vacuous"] == [96]
    assert row["status"] == "vacuous" and "empty" in row["reason"], row["reason"]
    assert all(c["ok"] for c in row["checks"])  # it matched DuckDB: that is not enough
    assert report["summary"]["matched_all"] == 1 and report["summary"]["failed"] == []
    assert "| q96 | **vacuous** |" in (out / "report.md").read_text()


def test_an_answer_no_batch_changes_fails(monkeypatch: pytest.MonkeyPatch,
                                          base: dict[str, pa.Table], tmp_path: Path) -> None:
    monkeypatch.setattr(tpcds_all.Changes, "batch", lambda self: tpcds_all.Batch())
    r = tpcds_all.run_query(96, base, tmp_path, seed=0)
    assert r.nonempty and r.changed == [False, False, False]
    assert all(c["ok"] for c in r.checks), r.checks
    assert r.status == "vacuous" and not r.ok
    assert "no change batch changed the answer" in r.reason, r.reason


def test_a_batch_that_leaves_the_answer_as_it_was_is_drawn_again(
        monkeypatch: pytest.MonkeyPatch, base: dict[str, pa.Table], tmp_path: Path) -> None:
    real = tpcds_all.Changes.batch
    calls: list[int] = []

    def first_empty(self: tpcds_all.Changes) -> tpcds_all.Batch:
        calls.append(1)
        return tpcds_all.Batch() if len(calls) == 1 else real(self)

    monkeypatch.setattr(tpcds_all.Changes, "batch", first_empty)
    r = tpcds_all.run_query(12, base, tmp_path, seed=0)
    assert r.status == "ok", (r.reason, r.traceback)
    assert r.changed[0], r.changed
    assert "batch 1 left the answer as it was" in r.redrawn, r.redrawn


def _changes(rows: int, cands: int, dims: bool = False) -> tuple[tpcds_all.Changes, str]:
    """Changes of one table of ``rows`` rows (a fact, or a dimension), ``cands`` of them
    candidates."""
    name = "date_dim" if dims else "store_sales"
    key = "d_date_sk" if dims else "ss_item_sk"
    t = pa.table({key: pa.array(np.arange(rows), pa.int64()),
                  "d_date" if dims else "ss_quantity": pa.array(np.arange(rows) % 7, pa.int64()),
                  tpcds_all.RID: pa.array(np.arange(rows), pa.int64())})
    sql = f"SELECT * FROM {name} WHERE {'d_date' if dims else 'ss_quantity'} = 1"
    changes = tpcds_all.Changes(sql, tpcds_all.Tables({name: t}), [name],
                                {name: np.arange(cands, dtype=np.int64)}, 0.01,
                                np.random.default_rng(0))
    return changes, name


def test_seeded_rows_deleted_and_re_inserted_stay_hot() -> None:
    # four seeded rows: every batch deletes some of them, also once they came back
    changes, name = _changes(2000, 400)
    seeded = changes.seed([(name, changes.tables.t[name].slice(0, 4).drop_columns(
        [tpcds_all.RID]))])
    assert seeded == {name: 4}
    hot = changes.hot[name].copy()
    for i in range(6):
        b = changes.batch()
        gone = b.deleted[name][tpcds_all.RID].to_numpy()
        assert np.isin(gone, hot).any(), f"batch {i + 1} deleted no seeded row"


def test_a_dimension_update_rewrites_at_most_a_quarter_of_the_candidates() -> None:
    changes, _ = _changes(4000, 12, dims=True)
    # twelve rows read, 40 updated per batch before: a query reading a few dates lost them
    for _ in range(3):
        touched = changes.batch().rows["update"] // 2  # each a delete and an insert
        assert 1 <= touched <= 3, touched


SEEDED = (3, 6, 13, 19, 25, 29, 31, 37, 64, 65, 82, 83, 85, 91)
"""Queries whose answer is empty without their seed: at SF0.01 (q3, q13, q19, q31; q6
with some change seeds) or at SF0.1 (the others; q29 has one at SF0.01)."""


@pytest.fixture(scope="module")
def duck(base: dict[str, pa.Table]) -> Iterator[Any]:
    """DuckDB holding the SF0.01 tables (tables, not Arrow scans: joins planned well)."""
    import duckdb

    con = duckdb.connect()
    try:
        for t, v in base.items():
            con.register("arrow_in", v.drop_columns([tpcds_all.RID]))
            con.execute(f"CREATE TABLE {t} AS SELECT * FROM arrow_in")
            con.unregister("arrow_in")
        yield con
    finally:
        con.close()


@pytest.mark.parametrize("n", SEEDED)
def test_a_seed_gives_the_query_an_answer_on_unique_keys(n: int, base: dict[str, pa.Table],
                                                         duck: Any) -> None:
    plain = {t: v.drop_columns([tpcds_all.RID]) for t, v in base.items()}
    added: dict[str, pa.Table] = {}
    for t, rows in tpcds_all.SEEDS[n](plain, np.random.default_rng([0, n])):
        assert rows.num_rows, f"q{n}: a seed step on {t} added no row"
        added[t] = pa.concat_tables([added[t], rows]) if t in added else rows
    schema = f"seeded_q{n}"  # the seeded tables, shadowing the plain ones
    duck.execute(f"CREATE SCHEMA {schema}")
    try:
        for t, rows in added.items():
            duck.register("arrow_in", rows)
            duck.execute(f"CREATE TABLE {schema}.{t} AS SELECT * FROM main.{t} UNION ALL "
                         "SELECT * FROM arrow_in")
            duck.unregister("arrow_in")
            if t not in tpcds_all.FACTS:  # dimensions stay unique on their surrogate key
                key = plain[t].schema.names[0]
                dup = duck.execute(f"SELECT count(*) - count(DISTINCT {key}) FROM "
                                   f"{schema}.{t}").fetchone()
                assert dup == (0,), f"q{n}: the seed repeats a key of {t}"
        duck.execute(f"SET search_path = '{schema},main'")
        answer = duck.execute(tpcds.query(n)).to_arrow_table()
    finally:
        duck.execute("SET search_path = 'main'")
        duck.execute(f"DROP SCHEMA {schema} CASCADE")
    assert not tpcds_all.is_trivial(answer), f"q{n}: its seed gives it no answer"


@pytest.fixture(scope="module")
def base_sf01() -> dict[str, pa.Table]:
    return tpcds_all.load_tables(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("n", range(1, 100))
def test_every_query_matches_duckdb(n: int, base_sf01: dict[str, pa.Table],
                                    tmp_path: Path) -> None:
    # SF0.1, the scale the seeds are kept for (they also give q3, q13, q19, q31 an
    # answer at SF0.01)
    r = tpcds_all.run_query(n, base_sf01, tmp_path, seed=0)
    assert r.status == "ok", f"q{n}: {r.reason}\n{r.traceback}"


def test_order_check_allows_ties_to_tolerance_on_a_hidden_key(tmp_path: Path) -> None:
    """Rows whose hidden ORDER BY key differs in the last bits may come either way.

    TPC-DS q89 orders by ``sum_sales - avg_monthly_sales``, which the answer does not
    show; DuckDB and joinstate round it apart.  A real misorder still fails.
    """
    import joinstate
    from planner.sql import compile

    sql = "SELECT k FROM t ORDER BY x - y, k LIMIT 3"
    t = pa.table({"k": [1, 2, 3, 4], "x": [0.1 + 0.2, 0.3, 5.0, 9.0],
                  "y": [0.0, 0.0, 0.0, 0.0]})
    with joinstate.StateStore(tmp_path / "s") as store:
        p = compile(sql, {"t": t.schema}, store=store, name="v")
        integrated = Integrated()
        integrated.add(p.push("t", t))
        want = pa.table({"k": [1, 2, 3, 4]})
        ours = p.read("v")["k"].to_pylist()
        assert ours == [2, 1, 3]  # 0.3 < 0.30000000000000004
        tied = tpcds_all.check_view(p, "v", integrated, want, pa.table({"k": [1, 2, 3]}),
                                    ["__order0", "k"])
        assert tied["ok"], tied
        wrong = tpcds_all.check_view(p, "v", integrated, want, pa.table({"k": [3, 2, 1]}),
                                     ["__order0", "k"])
        assert not wrong["ok"] and wrong["what"] == "order", wrong
        cut = tpcds_all.check_view(p, "v", integrated, want, pa.table({"k": [1, 2, 4]}),
                                   ["__order0", "k"])
        assert not cut["ok"], cut
