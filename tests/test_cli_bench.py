"""``joinstate bench tpcds``: a real small run, the wiring, and every bad argument.

The real run (SF0.01, one strategy, one round, one size, one batch) takes a few seconds
plus the TPC-DS generation on a fresh machine (cached afterwards).  The wiring tests
replace q4's load, population, change-batch pass and recompute (and Spark's parts) with
recorders returning the synthetic results of tests/bench_results.py, so they check what
the command runs, in which order, with which arguments, and what it does with the
answers, without running a benchmark.  The Spark run itself is in
tests/spark/test_spark_bench_cli.py.
"""

from __future__ import annotations

import copy
import io
import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from bench_results import synthetic_results
from cli_runner import assert_one_line_error, run

from bench import q4, spark_tpcds, tpcds_cli

if TYPE_CHECKING:
    from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n"


def test_small_run_writes_report_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run("bench", "tpcds", "--sf", "0.01", "--no-spark", "--strategies", "auto",
                 "--rounds", "1", "--sizes", "0.001", "--repeat", "1", "--out", out)
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report.md'}" in result.output
    data = json.loads((out / "report.json").read_text())
    assert data["ok"] is True and data["spark"] is None
    passes = data["q4"]["passes"]
    assert [p["name"] for p in passes] == ["shared"]
    n_checks = sum(len(p["checks"]) for p in passes)
    assert all(c["ok"] for p in passes for c in p["checks"])
    assert f"every answer matched DuckDB ({n_checks} checks)" in result.output
    # one round of auto alone: the change-batch pass's population is auto's run
    (run_,) = data["q4"]["population_runs"]
    assert run_["requested"] == "auto" and run_["strategy"].startswith("auto")
    (pop,) = data["q4"]["population_strategies"]
    assert pop["change_batch_pass"] is True and pop["runs_s"] == [run_["s"]]
    assert pop["samples"][-1]["rows"] == sum(data["q4"]["rows"].values())
    assert pop["labels"]["ix.q4~union17[customer_id]"] == "year_total by customer_id"
    pngs = sorted(out.glob("*.png"))
    names = {p.stem for p in pngs}
    assert {"population-time", "incremental", "scale"} <= names
    assert any(n.startswith("population-timeline-auto") for n in names)
    md = (out / "report.md").read_text()
    for png in pngs:
        data_png = png.read_bytes()
        assert data_png[:8] == PNG and len(data_png) > 5_000, png
        assert f"]({png.name})" in md
    assert "| 0.1% |" in md and "**Every answer matched DuckDB**" in md
    assert "## Where joinstate wins and where it loses" in md


# ---- the wiring, with the suite's steps replaced by recorders -------------------------


def _tables() -> dict[str, pa.Table]:
    sizes = {"customer": 3000, "date_dim": 10, "store_sales": 20, "catalog_sales": 10,
             "web_sales": 5}
    return {n: pa.table({"x": list(range(k))}) for n, k in sizes.items()}


@pytest.fixture
def fake_q4(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace q4's load, population, pass and recompute by recorders; returns the calls.

    Each call is recorded in order as ``{"step": ..., arguments}``; the results are the
    synthetic ones of tests/bench_results.py.
    """
    calls: list[dict[str, Any]] = []
    syn = synthetic_results(spark=False)["q4"]
    entry = syn["population_strategies"][1]  # auto->asymmetric, with samples

    def load(sf: float, cache_dir: Any = None) -> dict[str, pa.Table]:
        calls.append({"step": "load", "sf": sf, "cache_dir": cache_dir})
        return _tables()

    def population_strategies(tables: Any, strategies: list[str], workdir: Any, *,
                              chunk_rows: int) -> list[dict[str, Any]]:
        (name,) = strategies
        calls.append({"step": "population", "strategy": name, "chunk_rows": chunk_rows})
        picked = "auto->asymmetric" if name == "auto" else name
        return [{**copy.deepcopy(entry), "strategy": picked}]

    def run_pass(name: str, shared: bool, tables: Any, sizes: Any, repeat: int, seed: int,
                 workdir: Any, *, on_step: Any, **kw: Any) -> dict[str, Any]:
        calls.append({"step": "pass", "name": name, "shared": shared, "sizes": list(sizes),
                      "repeat": repeat, "seed": seed, **kw})
        on_step("population", 2000.0)
        on_step("0.001 #1 insert", 12.5)
        p = copy.deepcopy(syn["passes"][0])
        p["name"] = name
        p["population"] = {**copy.deepcopy(entry), "strategy": "auto->asymmetric"}
        p["final_tables"] = tables
        return p

    def recompute(tables: Any, runs: int) -> dict[str, Any]:
        calls.append({"step": "recompute", "runs": runs})
        return copy.deepcopy(syn["duckdb_recompute"])

    monkeypatch.setattr(q4, "load", load)
    monkeypatch.setattr(q4, "population_strategies", population_strategies)
    monkeypatch.setattr(q4, "run_pass", run_pass)
    monkeypatch.setattr(q4, "duckdb_recompute", recompute)
    return calls


def _order(calls: list[dict[str, Any]]) -> list[str]:
    return [c.get("strategy") or c.get("name") or c["step"] for c in calls]


def test_population_order_alternates_and_the_pass_stands_in_for_auto(
        tmp_path: Path, fake_q4: list[dict[str, Any]]) -> None:
    assert tpcds_cli.population_rounds(["a", "b", "c"], 3) == [
        ["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    result = run("bench", "tpcds", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    # round 1 as given, round 2 reversed; auto's round-2 run is the change-batch pass
    assert _order(fake_q4) == ["load", "symmetric", "asymmetric", "auto", "shared",
                               "asymmetric", "symmetric", "recompute"]
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    runs = data["q4"]["population_runs"]
    assert [(r["requested"], r["round"]) for r in runs] == [
        ("symmetric", 1), ("asymmetric", 1), ("auto", 1), ("auto", 2), ("asymmetric", 2),
        ("symmetric", 2)]
    assert [p["requested"] for p in data["q4"]["population_strategies"]] == [
        "symmetric", "asymmetric", "auto"]
    assert all(len(p["runs_s"]) == 2 for p in data["q4"]["population_strategies"])


def test_options_reach_the_suite(tmp_path: Path, fake_q4: list[dict[str, Any]]) -> None:
    result = run("bench", "tpcds", "--sf", "0.02", "--strategies", "symmetric, auto",
                 "--rounds", "3", "--sizes", "0.001,0.01", "--repeat", "2", "--unshared",
                 "--chunk-rows", "1000", "--check", "end", "--seed", "7", "--out",
                 tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert fake_q4[0] == {"step": "load", "sf": 0.02, "cache_dir": None}
    assert _order(fake_q4) == ["load", "symmetric", "auto", "auto", "symmetric",
                               "symmetric", "shared", "unshared", "recompute"]
    assert {c["chunk_rows"] for c in fake_q4 if "chunk_rows" in c} == {1000}
    shared = next(c for c in fake_q4 if c.get("name") == "shared")
    assert shared["sizes"] == [0.001, 0.01] and shared["repeat"] == 2 and shared["seed"] == 7
    assert shared["check_every"] == "end" and shared["shared"] is True
    assert shared["qualify"] == 3  # 0.1% of 3,000 customers
    assert (tmp_path / "r" / "report.md").exists()


def test_default_out_and_chunk_rows(tmp_path: Path, fake_q4: list[dict[str, Any]],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("bench", "tpcds")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bench-results" / "tpcds-sf0.01" / "report.md").exists()
    pops = [c for c in fake_q4 if c["step"] == "population"]
    assert {c["chunk_rows"] for c in pops} == {tpcds_cli.DEFAULT_CHUNK_ROWS}
    (shared,) = [c for c in fake_q4 if c["step"] == "pass"]  # no unshared pass by default
    assert shared["sizes"] == list(tpcds_cli.DEFAULT_SIZES)


def test_every_phase_reports_its_steps_as_it_runs(fake_q4: list[dict[str, Any]]) -> None:
    from rich.console import Console

    buf = io.StringIO()
    res = tpcds_cli.run(0.01, ["symmetric", "auto"], [0.001], repeat=1, rounds=2,
                        steps=tpcds_cli.Steps(Console(file=buf, width=300)))
    text = buf.getvalue()
    lines = [line.strip() for line in text.splitlines()]
    assert res["ok"] is True
    for needle in ("data: TPC-DS SF0.01", "population per strategy: runs 1-2 of 4",
                   "change batches, indexes shared", "population per strategy: runs 4-4",
                   "recompute: q4 from scratch"):
        assert any(line.startswith(needle) for line in lines), needle
    assert "symmetric (round 1): 2.0 s" in text and "auto->asymmetric (round 1)" in text
    assert "0.001 #1 insert: 12 ms" in text and "DuckDB: 20 ms" in text
    assert "(that population was auto's run 2 of 2)" in text
    assert set(res["phases"]) == {"data", "population runs 1-2", "change batches (shared)",
                                  "population runs 4-4", "recompute"}


def test_a_failed_check_exits_1_and_still_writes_the_report(
        tmp_path: Path, fake_q4: list[dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = q4.run_pass

    def failing(*a: Any, **k: Any) -> dict[str, Any]:
        p = real(*a, **k)
        p.update(checks=synthetic_results(failed=True)["q4"]["passes"][0]["checks"], ok=False)
        return p

    monkeypatch.setattr(q4, "run_pass", failing)
    out = tmp_path / "r"
    result = run("bench", "tpcds", "--out", out)
    assert result.exit_code == 1, result.output
    assert "CHECK FAILED: 1 of 2 answers differ" in result.output
    assert "0.01 #1 customer" in result.output
    assert "**CHECK FAILED**" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["ok"] is False


class _Session:
    stopped = 0

    def stop(self) -> None:
        _Session.stopped += 1


def _spark_sql(matches: bool, calls: list[Any]) -> Any:
    def recompute(tables: Any, runs: int, *, spark: Any) -> dict[str, Any]:
        calls.append(("spark_sql", runs, spark))
        ms = {"ms": [900.0, 500.0, 400.0], "first_ms": 900.0, "median_ms": 500.0,
              "max_ms": 900.0}
        return {"year_total": ms, "answer": ms,
                "rows": {"year_total": 10, "q4": 2 if matches else 3},
                "want_rows": {"year_total": 10, "q4": 2}, "matches_duckdb": matches,
                "parallelism": 2, "runs": runs}
    return recompute


@pytest.fixture
def fake_spark(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """Spark's parts replaced by recorders (no JVM); a fake JAVA_HOME; returns the calls."""
    pytest.importorskip("pyspark")
    import spark_io
    from bench import spark_sql, tpcds

    calls: list[Any] = []

    def fake_pipeline(session: Any, tables: Any, paths: Any, shards: int, share: float,
                      seed: int, batches: int, workdir: Any, steps: Any) -> dict[str, Any]:
        calls.append(("spark_pipeline", session, sorted(paths), shards, share, seed, batches))
        return synthetic_results()["spark"]

    def fake_baseline(sf: float, **kw: Any) -> dict[str, Any]:
        calls.append(("baseline", sf, kw))
        return {"sf": sf, "shards": kw["shards"], "cores": 2, "rows_in": 10, "want": [5, 1],
                "load_average_start": [1.0], "load_average_end": [1.0],
                "in_process": {"s": 1.0, "ok": True},
                "structured_streaming": {"s": 4.0, "ok": True}, "ok": True}

    monkeypatch.setattr(tpcds_cli, "spark_pipeline", fake_pipeline)
    monkeypatch.setattr(tpcds, "tables", lambda sf, *a, **k: {n: f"/{n}.parquet"
                                                              for n in q4.TABLES})
    monkeypatch.setattr(spark_tpcds, "run", fake_baseline)
    monkeypatch.setattr(spark_io, "local_session", lambda *a, **k: _Session())
    monkeypatch.setattr(spark_sql, "recompute", _spark_sql(True, calls))
    (tmp_path / "jdk").mkdir()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    return calls


def test_spark_run_is_wired(tmp_path: Path, fake_q4: list[dict[str, Any]],
                            fake_spark: list[Any]) -> None:
    out = tmp_path / "r"
    result = run("bench", "tpcds", "--spark", "--shards", "3", "--sizes", "0.0001,0.01,0.1",
                 "--out", out)
    assert result.exit_code == 0, result.output
    (sql, spark_call) = fake_spark  # no Structured Streaming baseline unless asked
    assert sql[0] == "spark_sql" and isinstance(sql[2], _Session)
    (_, session, paths, shards, share, seed, batches) = spark_call
    assert session is sql[2]  # one JVM for Spark SQL and SparkPipeline
    assert paths == sorted(q4.TABLES)
    assert (shards, share, seed, batches) == (3, 0.01, 0, 2)  # the middle size by default
    md = (out / "report.md").read_text()
    assert "## Local Spark: 3 shards" in md
    assert "Spark SQL q4 from scratch ms" in md
    assert "q4 500 ms (first run 900 ms)" in md and "its answer equals DuckDB's" in md
    assert "**SparkPipeline** (3 shards, local[2]): population 30.0 s" in md

    fake_spark.clear()
    result = run("bench", "tpcds", "--spark", "--streaming", "--shards", "3", "--out", out)
    assert result.exit_code == 0, result.output
    assert [c[0] for c in fake_spark] == ["spark_sql", "spark_pipeline", "baseline"]
    assert fake_spark[2][1:] == (0.01, {"shards": 3, "workdir": None})
    md = (out / "report.md").read_text()
    assert "## Spark Structured Streaming beside joinstate" in md
    assert "| Spark Structured Streaming join (RocksDB) | 4.0 | 2 | 4.00x |" in md


def test_spark_sql_answer_differing_from_duckdb_fails_the_run(
        tmp_path: Path, fake_q4: list[dict[str, Any]], fake_spark: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import spark_sql

    monkeypatch.setattr(spark_sql, "recompute", _spark_sql(False, []))
    result = run("bench", "tpcds", "--spark", "--out", tmp_path / "r")
    assert result.exit_code == 1, result.output
    assert "Spark SQL's q4 from scratch (3 rows) differs from DuckDB's (2 rows)" in \
        result.output


def test_a_failure_midway_stops_the_spark_session(
        tmp_path: Path, fake_q4: list[dict[str, Any]], fake_spark: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import spark_sql

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("the JVM went away")

    monkeypatch.setattr(spark_sql, "recompute", broken)
    before = _Session.stopped
    with pytest.raises(RuntimeError, match="the JVM went away"):
        tpcds_cli.run(0.01, ["auto"], [0.001], rounds=1, repeat=1, spark=True)
    assert _Session.stopped == before + 1


@pytest.mark.parametrize(("args", "needles"), [
    (["--sf", "0"], ["--sf", "> 0"]),
    (["--sf", "-1"], ["--sf"]),
    (["--sf", "abc"], ["--sf", "abc"]),
    (["--strategies", "bulk"], ["--strategies", "'bulk'", "symmetric"]),
    (["--strategies", ","], ["--strategies is empty"]),
    (["--strategies", "auto,auto"], ["repeated"]),
    (["--rounds", "0"], ["--rounds 0"]),
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

    monkeypatch.setattr(q4, "load", must_not_run)
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


def test_a_spark_pipeline_failure_fails_the_run_and_keeps_the_report(
        tmp_path: Path, fake_q4: list[dict[str, Any]], fake_spark: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("executor lost\nstack trace ...")

    monkeypatch.setattr(tpcds_cli, "spark_pipeline", broken)
    stopped = _Session.stopped
    out = tmp_path / "r"
    result = run("bench", "tpcds", "--spark", "--out", out)
    assert result.exit_code == 1, result.output
    assert "SparkPipeline stopped with an error: RuntimeError: executor lost" in result.output
    md = (out / "report.md").read_text()
    assert "**CHECK FAILED**" in md and "SparkPipeline stopped with an error" in md
    assert "## Population" in md  # the in-process figures are kept
    assert _Session.stopped == stopped + 1
