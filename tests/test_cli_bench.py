"""``joinstate bench tpcds``: a real small run, the wiring, and every bad argument.

The real run (SF0.01, one strategy, one size, one batch) takes a few seconds plus the
TPC-DS generation on a fresh machine (cached afterwards).  The wiring tests replace
``bench.q4.run_q4`` / ``bench.q4spark.run`` with functions returning the synthetic results
of tests/bench_results.py, so they check what the command passes and does with the answer
without running a benchmark.  The Spark run itself is in tests/spark/test_spark_bench_cli.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from bench_results import synthetic_results
from cli_runner import assert_one_line_error, run

from bench import q4, q4spark, spark_tpcds, tpcds_cli

if TYPE_CHECKING:
    from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n"




def test_small_run_writes_report_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run("bench", "tpcds", "--sf", "0.01", "--no-spark", "--strategies", "auto",
                 "--sizes", "0.001", "--repeat", "1", "--out", out)
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report.md'}" in result.output
    data = json.loads((out / "report.json").read_text())
    assert data["ok"] is True and data["spark"] is None
    passes = data["q4"]["passes"]
    assert [p["name"] for p in passes] == ["shared", "unshared"]
    n_checks = sum(len(p["checks"]) for p in passes)
    assert all(c["ok"] for p in passes for c in p["checks"])
    assert f"every answer matched DuckDB ({n_checks} checks)" in result.output
    (pop,) = data["q4"]["population_strategies"]
    assert pop["strategy"].startswith("auto")
    assert pop["samples"][-1]["rows"] == sum(data["q4"]["rows"].values())
    pngs = sorted(out.glob("*.png"))
    names = {p.stem for p in pngs}
    assert {"population-time", "incremental", "sharing"} <= names
    assert any(n.startswith("population-timeline-auto") for n in names)
    md = (out / "report.md").read_text()
    for png in pngs:
        data_png = png.read_bytes()
        assert data_png[:8] == PNG and len(data_png) > 5_000, png
        assert f"]({png.name})" in md
    assert "| 0.1% |" in md and "**Every answer matched DuckDB**" in md


@pytest.fixture
def fake_q4(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace run_q4 by a recorder returning synthetic results; returns the calls."""
    calls: list[dict[str, Any]] = []

    def fake(sf: float, sizes: Any, repeat: int, out: Any, **kw: Any) -> dict[str, Any]:
        calls.append({"sf": sf, "sizes": list(sizes), "repeat": repeat, "out": out, **kw})
        return synthetic_results(spark=False)["q4"]

    monkeypatch.setattr(q4, "run_q4", fake)
    return calls


def test_options_reach_the_suite(tmp_path: Path, fake_q4: list[dict[str, Any]]) -> None:
    result = run("bench", "tpcds", "--sf", "0.02", "--strategies", "symmetric, auto",
                 "--sizes", "0.001,0.01", "--repeat", "2", "--no-unshared", "--chunk-rows",
                 "1000", "--check", "end", "--seed", "7", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    (call,) = fake_q4
    assert call["sf"] == 0.02 and call["sizes"] == [0.001, 0.01] and call["repeat"] == 2
    assert call["strategies"] == ["symmetric", "auto"] and call["unshared"] is False
    assert call["chunk_rows"] == 1000 and call["check_every"] == "end" and call["seed"] == 7
    assert call["out"] is None  # the report is ours, not run_q4's q4.md
    assert call["spark_sql"] is False  # Spark SQL's recompute only with --spark
    assert (tmp_path / "r" / "report.md").exists()


def test_default_out_and_chunk_rows(tmp_path: Path, fake_q4: list[dict[str, Any]],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("bench", "tpcds")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bench-results" / "tpcds-sf0.01" / "report.md").exists()
    (call,) = fake_q4
    assert call["chunk_rows"] == tpcds_cli.DEFAULT_CHUNK_ROWS
    assert call["sizes"] == list(tpcds_cli.DEFAULT_SIZES)
    assert call["strategies"] == ["symmetric", "asymmetric", "auto"]


def test_a_failed_check_exits_1_and_still_writes_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(q4, "run_q4", lambda *a, **k: synthetic_results(failed=True)["q4"])
    out = tmp_path / "r"
    result = run("bench", "tpcds", "--out", out)
    assert result.exit_code == 1, result.output
    assert "CHECK FAILED: 1 of 4 answers differ" in result.output
    assert "0.01 #1 customer" in result.output
    assert "**CHECK FAILED**" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["ok"] is False


def test_spark_run_is_wired(tmp_path: Path, fake_q4: list[dict[str, Any]],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    calls: list[tuple[Any, ...]] = []

    def fake_spark(sf: float, shards: int, share: float, seed: int, **kw: Any
                   ) -> dict[str, Any]:
        calls.append((sf, shards, share, seed, kw))
        return synthetic_results()["spark"]

    monkeypatch.setattr(q4spark, "run", fake_spark)
    baseline_calls: list[tuple[Any, ...]] = []

    def fake_baseline(sf: float, **kw: Any) -> dict[str, Any]:
        baseline_calls.append((sf, kw))
        return {"sf": sf, "shards": kw["shards"], "cores": 2, "rows_in": 10, "want": [5, 1],
                "load_average_start": [1.0], "load_average_end": [1.0],
                "in_process": {"s": 1.0, "ok": True},
                "structured_streaming": {"s": 4.0, "ok": True}, "ok": True}

    monkeypatch.setattr(spark_tpcds, "run", fake_baseline)
    java_home = tmp_path / "jdk"
    java_home.mkdir()
    out = tmp_path / "r"
    result = run("bench", "tpcds", "--spark", "--shards", "3", "--sizes", "0.0001,0.01,0.1",
                 "--out", out, env={"JAVA_HOME": str(java_home)})
    assert result.exit_code == 0, result.output
    ((sf, shards, share, seed, kw),) = calls
    assert (sf, shards, share, seed) == (0.01, 3, 0.01, 0)  # the middle size by default
    assert kw["out"] == out / "spark"
    assert fake_q4[0]["spark_sql"] is True  # Spark SQL recomputes q4 beside DuckDB
    md = (out / "report.md").read_text()
    assert "## Local Spark: 2 shards" in md  # from the (synthetic) Spark results
    ((bsf, bkw),) = baseline_calls  # Spark Structured Streaming's join beside joinstate
    assert (bsf, bkw["shards"]) == (0.01, 3)
    assert "## Spark Structured Streaming beside joinstate" in md
    assert "| Spark Structured Streaming join (RocksDB) | 4.0 | 2 | 4.00x |" in md


def _with_spark_sql(matches: bool) -> dict[str, Any]:
    res = synthetic_results(spark=False)["q4"]
    ms = {"ms": [900.0, 500.0, 400.0], "first_ms": 900.0, "median_ms": 500.0,
          "max_ms": 900.0}
    res["spark_sql_recompute"] = {
        "year_total": ms, "answer": ms, "rows": {"year_total": 10, "q4": 2 if matches else 3},
        "want_rows": {"year_total": 10, "q4": 2}, "matches_duckdb": matches,
        "parallelism": 2, "runs": 3}
    return res


def test_spark_sql_recompute_is_reported(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(q4, "run_q4", lambda *a, **k: _with_spark_sql(True))
    result = run("bench", "tpcds", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Spark SQL q4 from scratch ms" in md
    assert "q4 500.0 ms (first run 900.0 ms)" in md or "q4 500 ms (first run 900 ms)" in md
    assert "its answer equals DuckDB's" in md


def test_spark_sql_answer_differing_from_duckdb_fails_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _with_spark_sql(False)
    res["ok"] = False  # what run_q4 says when Spark SQL's answer differs
    monkeypatch.setattr(q4, "run_q4", lambda *a, **k: res)
    result = run("bench", "tpcds", "--out", tmp_path / "r")
    assert result.exit_code == 1, result.output
    assert "Spark SQL's q4 from scratch (3 rows) differs from DuckDB's (2 rows)" in \
        result.output


@pytest.mark.parametrize(("args", "needles"), [
    (["--sf", "0"], ["--sf", "> 0"]),
    (["--sf", "-1"], ["--sf"]),
    (["--sf", "abc"], ["--sf", "abc"]),
    (["--strategies", "bulk"], ["--strategies", "'bulk'", "symmetric"]),
    (["--strategies", ","], ["--strategies is empty"]),
    (["--strategies", "auto,auto"], ["repeated"]),
    (["--sizes", "2"], ["--sizes", "2 not in (0, 1]"]),
    (["--sizes", "0"], ["--sizes", "not in (0, 1]"]),
    (["--sizes", "abc"], ["--sizes", "numbers"]),
    (["--sizes", ""], ["--sizes is empty"]),
    (["--repeat", "0"], ["--repeat 0"]),
    (["--chunk-rows", "0"], ["--chunk-rows 0"]),
    (["--shards", "0"], ["--shards 0"]),
    (["--spark-share", "1.5"], ["--spark-share 1.5"]),
    (["--check", "never"], ["--check", "never"]),
    (["--frobnicate"], ["--frobnicate"]),
])
def test_bad_arguments_fail_before_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           args: list[str], needles: list[str]) -> None:
    def must_not_run(*a: Any, **k: Any) -> Any:
        raise AssertionError("the suite ran despite a bad argument")

    monkeypatch.setattr(q4, "run_q4", must_not_run)
    out = tmp_path / "r"
    assert_one_line_error(run("bench", "tpcds", *args, "--out", out), 2, *needles)
    assert not out.exists()


def test_out_must_be_a_directory(tmp_path: Path, fake_q4: list[dict[str, Any]]) -> None:
    a_file = tmp_path / "report.md"
    a_file.write_text("x")
    assert_one_line_error(run("bench", "tpcds", "--out", a_file), 2, "--out")
    assert fake_q4 == []


def test_spark_without_java_says_so(tmp_path: Path, fake_q4: list[dict[str, Any]]) -> None:
    pytest.importorskip("pyspark")
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run("bench", "tpcds", "--spark", "--out", tmp_path / "r",
                 env={"PATH": str(empty), "JAVA_HOME": None})
    assert_one_line_error(result, 2, "--spark needs Java 17", "--no-spark")
    assert fake_q4 == []


def test_missing_bench_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         fake_q4: list[dict[str, Any]]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert_one_line_error(run("bench", "tpcds", "--out", tmp_path / "r"), 2, "matplotlib",
                          "joinstate[bench]")
    assert fake_q4 == []


def test_help_has_examples() -> None:
    for args in (["bench", "--help"], ["bench", "tpcds", "--help"], ["--help"]):
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert "Examples" in result.output and "joinstate bench tpcds" in result.output
    text = run("bench", "tpcds", "--help").output
    for option in ("--sf", "--strategies", "--sizes", "--spark / --no-spark", "--out"):
        assert option in text


def test_sparkjoin_table_shows_each_tasks_time_and_cpu() -> None:
    """The slower task sets a populate's time: the report shows both tasks' seconds/CPU."""
    res = {"sf": 1.0, "rows_in": 300, "want": [200, 0], "cores": 2, "shards": 2,
           "load_average_start": [0.5], "load_average_end": [0.7],
           "in_process": {"s": 3.0, "ok": True, "load_average": 0.5},
           "spark_join": [{"s": 2.0, "ok": True, "shards": 2, "read": "auto", "setup_s": 1.0,
                           "load_average": 0.6,
                           "jobs": [{"side": "both", "s": 1.9, "task_s": [1.6, 1.85],
                                     "task_cpu_s": [1.5, 1.75], "task_rows": [150, 150],
                                     "task_minor_faults": [10, 20]}]}]}
    md = spark_tpcds.to_markdown(res)
    assert "(jobs: both 1.9 s (tasks 1.6/1.9 s, CPU 1.5/1.8 s); setup 1.0 s apart)" in md
    assert "| 2.0 | 150 | 0.67x |" in md
