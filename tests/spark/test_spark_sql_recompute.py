"""Spark SQL computing q4 from scratch (the recompute beside DuckDB in the q4 reports).

A from-scratch time is only worth reporting if the answer is right: checked here on the
SF0.01 tables, and on tables changed so that q4's answer is not empty (qualifying sales),
and that a wrong answer would be caught (a table taken away from Spark's input changes
its answer, which the check must report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bench import q4, spark_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_spark_sql_answer_equals_duckdb(spark: SparkSession) -> None:
    pytest.importorskip("duckdb")
    work = q4.Workload(q4.load(0.01), seed=3)
    for source, delta in work.qualifying_sales(5):
        work.apply(source, delta)
    res = spark_sql.recompute(work.tables, runs=2, spark=spark)
    assert res["matches_duckdb"] is True
    assert res["rows"]["q4"] == res["want_rows"]["q4"] > 0
    assert res["rows"]["year_total"] == res["want_rows"]["year_total"] > 0
    assert len(res["answer"]["ms"]) == 2 and res["answer"]["median_ms"] > 0


def test_a_different_spark_answer_is_reported(spark: SparkSession,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("duckdb")
    work = q4.Workload(q4.load(0.01), seed=3)
    for source, delta in work.qualifying_sales(5):
        work.apply(source, delta)
    # DuckDB sees the qualifying sales, Spark does not: the answers differ.
    before = q4.load(0.01)
    real = q4.Reference.answer

    def duckdb_on_changed(self: q4.Reference, _tables: object) -> object:
        return real(self, work.tables)

    monkeypatch.setattr(q4.Reference, "answer", duckdb_on_changed)
    res = spark_sql.recompute(before, runs=1, spark=spark)
    assert res["matches_duckdb"] is False
