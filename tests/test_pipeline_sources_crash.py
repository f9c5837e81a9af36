"""kill -9 of a process pushing into a pipeline whose sources keep row records.

The child (tests/pipeline_sources_crash_child.py) pushes a seeded stream with commit ids,
bad retractions mixed in, and is killed before or after its ``n``-th commit; bucket
rewrites of the record are made frequent.  After a rerun (which replays what committed
and applies the rest), the record, the indexes and the aggregates agree
(``Pipeline.verify``), every output reads what the stream's legal changes give, and the
sources still refuse what they do not hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import joinstate

sys.path.insert(0, str(Path(__file__).parent))

from pipeline_sources_crash_child import build, delta, stream

CHILD = Path(__file__).with_name("pipeline_sources_crash_child.py")


def run(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], check=False,
                          capture_output=True, text=True, timeout=300)


def expected() -> dict[str, Counter[tuple[Any, ...]]]:
    """What the outputs hold after the stream's legal changes (plain Python)."""
    sales: Counter[tuple[Any, ...]] = Counter()
    names = {}
    for source, entries, legal in stream():
        for r, w in entries:
            if legal and source == "sales":
                sales[r] += w
            elif legal:
                names[r[0]] = r[1]
    rows = [r for r, w in sales.items() for _ in range(w)]
    by_ck: dict[int, list[Any]] = {}
    for _, ck, amt in rows:
        s, n = by_ck.setdefault(ck, [None, 0])
        by_ck[ck] = [s if amt is None else (amt if s is None else s + amt), n + 1]
    amts = [a for _, _, a in rows if a is not None]
    return {
        "by_ck": Counter((ck, s, n) for ck, (s, n) in by_ck.items()),
        "names": Counter((names[ck], amt) for _, ck, amt in rows if ck in names),
        "total": Counter([(len(rows), sum(amts) if amts else None)]),
    }


@pytest.fixture(scope="module")
def total_commits(tmp_path_factory: pytest.TempPathFactory) -> int:
    base = tmp_path_factory.mktemp("ref")
    r = run({"path": str(base / "s"), "compact_min": 0, "kill": ["none", 0]})
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert counts["refused"] == 15
    return int(counts["commit"])


@pytest.mark.cover
@pytest.mark.parametrize("point", ["commit-before", "commit"])
@pytest.mark.parametrize("fraction", [0.1, 0.4, 0.75, 0.97])
def test_kill_then_rerun_keeps_records_and_indexes_consistent(
        tmp_path: Path, total_commits: int, point: str, fraction: float) -> None:
    n = max(2, int(total_commits * fraction))
    spec = {"path": str(tmp_path / "s"), "compact_min": 0, "kill": [point, n]}
    first = run(spec)
    assert first.returncode == -9, (first.returncode, first.stderr[-2000:])
    with joinstate.StateStore(tmp_path / "s") as store:  # the state as the kill left it
        build(store).verify()
    second = run(dict(spec, kill=["none", 0]))
    assert second.returncode == 0, second.stderr[-3000:]
    want = expected()
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        facts = p.verify()
        assert set(facts["row_records"]) == {"rows[q~sales]"}
        for out, rows in want.items():
            got = Counter(tuple(r.values()) for r in p.read(out).to_pylist())
            assert got == rows, f"{out}: killed at {point} #{n}"
        held = sum(rows for (_, _, rows) in want["by_ck"])
        assert facts["row_records"]["rows[q~sales]"]["rows"] == held
        with pytest.raises(joinstate.OverRetractionError, match="source 'sales'"):
            p.push("sales", delta("sales", [((999, 0, 1), -1)]))
