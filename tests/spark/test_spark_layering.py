"""pyspark is imported only by spark_io and bench: the core works without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

BLOCKED = """
import sys
sys.modules["pyspark"] = None  # any "import pyspark..." now raises ImportError
import joinstate, population, compaction
assert not any(m == "pyspark" or m.startswith("pyspark.") for m in sys.modules
               if sys.modules[m] is not None)
print("ok")
"""


def test_core_imports_without_pyspark() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCKED], check=True, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "ok"


def test_spark_io_import_does_not_start_spark() -> None:
    code = ("import spark_io, sys; from pyspark.sql import SparkSession;"
            "assert SparkSession.getActiveSession() is None; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "ok"
