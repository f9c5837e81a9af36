"""The 99-query TPC-DS harness (bench.tpcds_all, ``joinstate bench tpcds --queries``).

By default: the argument parsing, the candidate-row rewriting, one query per construct
the SQL compiler maintains (a window, a correlated subquery, EXISTS, a scalar subquery,
ROLLUP, INTERSECT, EXCEPT, COUNT DISTINCT, STDDEV, a cross join, q4) at SF0.01, each
compiled, populated, given three change batches and checked against DuckDB, and a
wrong answer failing the command (exit 1) with the report still written.  All 99 at
SF0.01 run under ``-m slow``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("duckdb_extension_tpcds")

import cli_runner
import pyarrow as pa

from bench import tpcds, tpcds_all
from bench.q4 import Integrated

if TYPE_CHECKING:
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


@pytest.mark.slow
@pytest.mark.parametrize("n", range(1, 100))
def test_every_query_matches_duckdb(n: int, base: dict[str, pa.Table], tmp_path: Path) -> None:
    r = tpcds_all.run_query(n, base, tmp_path, seed=0)
    assert r.status == "ok", f"q{n}: {r.reason}\n{r.traceback}"
