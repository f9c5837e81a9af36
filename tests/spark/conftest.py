"""One SparkSession for the whole test session (starting Spark costs seconds).

Tests here are marked ``spark`` (``pytestmark`` in each module); the fixture skips them
when pyspark or Java is missing, so the core suite still runs on a machine without them.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("Spark needs Java 17 (java not on PATH, JAVA_HOME unset)")
    import spark_io

    session = spark_io.local_session("joinstate-tests", cores=2)
    yield session
    session.stop()
