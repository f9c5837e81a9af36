"""kill -9 of a process populating a pipeline or pushing to it, at seeded points.

After the kill the store reopens, population resumes, live pushes are retried with the
same commit ids, and the integrated output (the interrupted run's re-delivered range
dropped) equals a recomputation from scratch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_population_pipeline import apply_live, data, integrate, reference

CHILD = Path(__file__).with_name("pipeline_crash_child.py")


def run(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], check=False,
                          capture_output=True, text=True, timeout=300)


def read(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as f:
        return pa.ipc.open_file(f).read_all()


@pytest.fixture(scope="module")
def total_commits(tmp_path_factory: pytest.TempPathFactory) -> int:
    base = tmp_path_factory.mktemp("ref")
    r = run({"path": str(base / "s"), "out": str(base / "out"), "resume": False,
             "kill": ["none", 0]})
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout.strip().splitlines()[-1])["commit"])


@pytest.mark.cover
@pytest.mark.parametrize("point", ["commit-before", "commit"])
@pytest.mark.parametrize("fraction", [0.2, 0.55, 0.9, 0.99])
def test_kill_then_resume_gives_the_exact_result(tmp_path: Path, total_commits: int,
                                                 point: str, fraction: float) -> None:
    n = max(1, int(total_commits * fraction))
    spec = {"path": str(tmp_path / "s"), "out": str(tmp_path / "out"), "resume": False,
            "kill": [point, n]}
    first = run(spec)
    assert first.returncode == -9, (first.returncode, first.stderr[-2000:])
    delivered_before = {p.name for p in (tmp_path / "out").glob("*.arrow")}
    second = run(dict(spec, resume=True, kill=["none", 0]))
    assert second.returncode == 0, second.stderr[-3000:]
    d = data(seed=7)
    # Population outputs: per source, the last delivery of each batch index counts (a
    # re-delivered batch overwrote its file); live pushes: one file per commit id.
    files = sorted((tmp_path / "out").glob("*.arrow"))
    pop = [read(f) for f in files if not f.name.startswith("live-")]
    got_pop = integrate(pop)
    assert got_pop == reference(d), f"killed at {point} #{n}; had {sorted(delivered_before)}"
    live = [read(f) for f in files if f.name.startswith("live-")]
    assert integrate(pop + live) == reference(apply_live(d))


@pytest.fixture(scope="module")
def ingest_counts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    base = tmp_path_factory.mktemp("ref-ingest")
    r = run({"path": str(base / "s"), "out": str(base / "out"), "resume": False,
             "kill": ["none", 0], "ingest_min_rows": 1})
    assert r.returncode == 0, r.stderr
    counts: dict[str, int] = json.loads(r.stdout.strip().splitlines()[-1])
    return counts


@pytest.mark.parametrize("point", ["ingest-intent", "ingest-done"])
@pytest.mark.parametrize("fraction", [0.3, 0.8])
def test_kill_around_a_push_written_as_sst_files(tmp_path: Path, ingest_counts: dict[str, int],
                                                  point: str, fraction: float) -> None:
    """Population pushes whose blind inserts are ingested SST files: a kill -9 between
    the push's batch (with its intent) and the ingestion, or just after it, resumes to
    the exact result."""
    assert ingest_counts["ingest-intent"] >= 4, ingest_counts  # the path is taken
    n = max(1, int(ingest_counts["ingest-intent"] * fraction))
    spec = {"path": str(tmp_path / "s"), "out": str(tmp_path / "out"), "resume": False,
            "kill": [point, n], "ingest_min_rows": 1}
    first = run(spec)
    assert first.returncode == -9, (first.returncode, first.stderr[-2000:])
    second = run(dict(spec, resume=True, kill=["none", 0]))
    assert second.returncode == 0, second.stderr[-3000:]
    d = data(seed=7)
    files = sorted((tmp_path / "out").glob("*.arrow"))
    pop = [read(f) for f in files if not f.name.startswith("live-")]
    assert integrate(pop) == reference(d), f"killed at {point} #{n}"
    live = [read(f) for f in files if f.name.startswith("live-")]
    assert integrate(pop + live) == reference(apply_live(d))
