"""``joinstate bench tpcds --spark`` end to end, as the installed command (a subprocess).

A subprocess because ``bench.q4spark.run`` starts and stops its own local SparkSession,
which would stop the test session's shared one.  The smallest run the command allows
(SF0.01, one strategy, one size, one batch, no unshared pass) still runs about a dozen
Spark jobs: marked ``slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_bench_tpcds_on_local_spark(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("Spark needs Java 17 (java not on PATH, JAVA_HOME unset)")
    script = Path(sys.executable).parent / "joinstate"
    out = tmp_path / "report"
    done = subprocess.run(
        [str(script), "bench", "tpcds", "--sf", "0.01", "--spark", "--strategies", "auto",
         "--rounds", "1", "--sizes", "0.001", "--repeat", "1", "--no-unshared", "--check", "end",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"report: {out / 'report.md'}" in done.stdout
    data = json.loads((out / "report.json").read_text())
    steps = data["spark"]["steps"]
    assert [s["step"].split(":")[0] for s in steps][-3:] == ["batch 1", "batch 2", "batch 3"]
    assert all(s["ok"] for s in steps) and data["ok"] is True
    assert (out / "spark" / "q4-spark.json").exists()
    md = (out / "report.md").read_text()
    assert "## Local Spark: 2 shards" in md and "on local Spark too" in md
    assert (out / "incremental.png").read_bytes()[:4] == b"\x89PNG"
