"""A global aggregate's first row reaches the outputs when population pushes no row.

A pipeline starts from empty sources, where ``count(*)`` already reads 0: that row is
owed to the outputs until a push carries a row.  A population whose inputs are all empty
(or not given) makes no such push, so going live hands the row over, in the same write
as the switch: through the sink (with ``population.resume.GO_LIVE``), before anything is
written, and never again after it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from test_pipeline_global import Integral, T, U, build, delta, rows

import joinstate
import population
from population.resume import GO_LIVE

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

EMPTY_ROW = (0, None, None)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[joinstate.StateStore]:
    with joinstate.StateStore(tmp_path / "state") as s:
        yield s


@pytest.mark.parametrize("given", ["empty tables", "no sources"])
def test_empty_population_delivers_the_row(store: joinstate.StateStore, given: str) -> None:
    p = build(store)
    seen = Integral()
    batches: list[population.OutputBatch] = []

    def sink(outs: dict[str, pa.Table], batch: population.OutputBatch) -> None:
        seen.add(outs)
        batches.append(batch)

    sources = ({"t": T.empty_table(), "u": U.empty_table()} if given == "empty tables"
               else {})
    report = population.populate(p, sources=sources, progress=False, sink=sink)
    assert p.phase == "live"
    assert +seen.of("g") == Counter(rows(p, "g")) == Counter({EMPTY_ROW: 1})
    assert batches == [GO_LIVE]
    assert report.output_rows["g"] == 1
    # Handed over once: the first push after it returns its own change only.
    out = p.push("t", delta(T, [(1, 5)]))
    seen.add(out)
    assert +seen.of("g") == Counter(rows(p, "g")) == Counter({(1, 5, 5): 1})


def test_a_failed_hand_over_writes_nothing_and_a_resume_delivers_it(
        store: joinstate.StateStore) -> None:
    p = build(store)
    delivered: list[dict[str, pa.Table]] = []

    def failing(outs: dict[str, pa.Table], batch: population.OutputBatch) -> None:
        if batch == GO_LIVE:
            raise RuntimeError("sink down")
        delivered.append(outs)  # pragma: no cover - no input batch carries a row

    with pytest.raises(RuntimeError, match="sink down"):
        population.populate(p, sources={"t": T.empty_table()}, progress=False, sink=failing)
    assert p.phase == "population"  # the switch and the hand-over are one write
    assert p.progress("t") is not None
    seen = Integral()
    population.populate(p, sources={"t": T.empty_table()}, progress=False, resume=True,
                        sink=seen.add)
    assert p.phase == "live" and p.progress("t") is None
    assert +seen.of("g") == Counter({EMPTY_ROW: 1})


def test_go_live_returns_what_is_owed_once(store: joinstate.StateStore) -> None:
    p = build(store)
    owed = p.go_live()
    assert set(owed) == {"g", "busy"}
    got = Integral()
    got.add(owed)
    assert +got.of("g") == Counter({EMPTY_ROW: 1}) and not got.of("busy")
    assert p.go_live() == {}  # nothing is owed twice
    assert p.push("u", delta(U, [(1,)]))["g"].num_rows == 0


def test_a_join_owes_nothing(store: joinstate.StateStore) -> None:
    side = joinstate.Side(pa.schema([("k", pa.int64())]), key=["k"])
    j = store.join("j", left=side, right=side)
    handed: list[dict[str, pa.Table]] = []
    assert j.go_live(before_commit=handed.append) == {}
    assert handed == [{}] and j.phase == "live"
