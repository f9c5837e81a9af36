"""The contract suite's fixtures: the shared test helpers on the path, one SparkSession.

The suite runs the differential join cases (``tests/test_differential.py``) and the
random pipelines (``tests/test_pipeline_random.py``) as one set of cases over every
execution path (``contract_paths.py``); the helpers live one directory up.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # oracle.py, pipeline_oracle.py, distsim.py, the cases

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession (skips without pyspark or Java, as tests/spark does)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("Spark needs Java 17 (java not on PATH, JAVA_HOME unset)")
    import spark_io

    session = spark_io.local_session("joinstate-contract", cores=2)
    yield session
    session.stop()
