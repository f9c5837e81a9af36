"""``./dev demo --spark`` at a small size, on the test session's SparkSession."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bench.demo import run_spark_demo

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_spark_demo_matches_duckdb(spark: SparkSession, tmp_path: Path) -> None:
    assert run_spark_demo(tmp_path / "state", 2_000, 20_000, 4_096, shards=2, spark=spark) == 0
    assert spark.range(3).count() == 3  # the shared session survives (a stopped one raises)
