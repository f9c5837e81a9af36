"""kill -9 anywhere around the switch to live: a resumed population ends exact and live.

The switch to live (phase ``live``, progress markers gone) is one atomic write, for
pipelines and single joins: a crash on either side of it leaves either an interrupted
population (its markers intact: ``populate(resume=True)`` loads only what is missing) or a
live one with nothing left over (``populate`` says it is live).  Never the state between,
where a resume would load every source again (a pipeline with unique-key sources could
then never go live).  Each case kills a child at the n-th durable write of the store,
reopens, resumes and compares with an uninterrupted run and with a plain-Python oracle.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_population_pipeline import data, reference

import joinstate
import population

CHILD = Path(__file__).with_name("go_live_child.py")
KINDS = ("pipeline", "join")
NEAR_THE_END = 3
"""Writes at the end of a run killed on both sides: the last source's done marker, the
switch to live and the planner's record after it."""


def run(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], check=False,
                          capture_output=True, text=True, timeout=300)


def last_json(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return doc


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per kind: the uninterrupted run's write count and final state, checked by oracle."""
    base = tmp_path_factory.mktemp("ref")
    out = {}
    d = data(seed=11, n=3000)
    for kind in KINDS:
        r = run({"kind": kind, "path": str(base / kind), "resume": False,
                 "kill": ["none", 0]})
        assert r.returncode == 0, r.stderr[-3000:]
        doc = last_json(r)
        assert doc["phase"] == "live" and doc["markers"] == []
        if kind == "pipeline":
            want = sorted([str(v) for v in k] for k in reference(d))
            assert [row[:4] for row in doc["state"]] == want
        else:
            for side, source in (("left", "customer"), ("right", "sales")):
                t = d[source]
                rows = sorted([*(str(v) for v in r), "1"] for r in
                              zip(*(t.column(c).to_pylist() for c in t.column_names),
                                  strict=True))
                assert doc["state"][side] == rows
        out[kind] = doc
    return out


def kill_then_resume(tmp_path: Path, kind: str, point: str, n: int,
                     want: dict[str, Any]) -> None:
    spec = {"kind": kind, "path": str(tmp_path / "s"), "resume": False, "kill": [point, n]}
    first = run(spec)
    assert first.returncode == -9, (kind, point, n, first.returncode, first.stderr[-2000:])
    second = run(dict(spec, resume=True, kill=["none", 0]))
    assert second.returncode == 0, (kind, point, n, second.stderr[-3000:])
    got = last_json(second)
    assert got["phase"] == "live", (kind, point, n, got["phase"])
    assert got["markers"] == [], (kind, point, n, got["markers"])
    assert got["state"] == want["state"], (kind, point, n)


def near_the_end(total: int) -> list[tuple[str, int]]:
    """Both sides of each of the last writes (the switch to live is among them)."""
    return [(p, n) for n in range(max(1, total - NEAR_THE_END + 1), total + 1)
            for p in ("write-before", "write")]


@pytest.mark.cover
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index", range(2 * NEAR_THE_END))
def test_kill_around_the_switch_to_live(tmp_path: Path, kind: str, index: int,
                                        uninterrupted: dict[str, dict[str, Any]]) -> None:
    want = uninterrupted[kind]
    point, n = near_the_end(int(want["writes"]))[index]
    kill_then_resume(tmp_path, kind, point, n, want)


@pytest.mark.parametrize("kind", KINDS)
def test_kill_at_seeded_earlier_writes(tmp_path: Path, kind: str,
                                       uninterrupted: dict[str, dict[str, Any]]) -> None:
    want = uninterrupted[kind]
    total = int(want["writes"])
    n = random.Random(f"{kind}-5").randrange(1, total - NEAR_THE_END + 1)
    for point in ("write-before", "write"):
        kill_then_resume(tmp_path / point, kind, point, n, want)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_kill_at_every_write(tmp_path: Path, kind: str,
                             uninterrupted: dict[str, dict[str, Any]]) -> None:
    want = uninterrupted[kind]
    for n in range(1, int(want["writes"]) + 1):
        for point in ("write-before", "write"):
            kill_then_resume(tmp_path / f"{point}-{n}", kind, point, n, want)


def test_populate_on_a_live_pipeline_says_so(tmp_path: Path) -> None:
    """After the switch, a resumed call changes nothing and names the state it found."""
    sys.path.insert(0, str(CHILD.parent))
    from go_live_child import build

    d = data(seed=11, n=3000)
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store)
        population.populate(p, sources=d, progress=False, batch_rows=700)
        before = p.read("per_year")
        with pytest.raises(population.PopulationError, match="already live"):
            population.populate(p, sources=d, progress=False, batch_rows=700, resume=True)
        assert p.read("per_year").equals(before)
