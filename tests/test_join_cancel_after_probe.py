"""A change that has fanned out reaches the next join: only rows that pair are hashed.

A dimension row whose column the answer reads changes (a date moves to another year):
every fact row of that date reaches the next join twice, retracted and inserted, and
most of their keys are not in the filtered dimension that join reads.  That dimension's
index is held in memory with one row per key, so looking the keys up costs a hash
probe each; consolidating the whole change first would encode and hash every row to
find the few that cancel.  These tests pin that only the rows whose key found a partner
are consolidated there, that rows cancelling among those still cancel (the answer is
exact), and that a change cancelling before a join whose other index holds many rows
per key still reads nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import joinstate
import population
from joinstate.ops import base

if TYPE_CHECKING:
    from pathlib import Path

DATE = pa.schema([("d", pa.int64()), ("y", pa.int64()), ("note", pa.string())])
ITEM = pa.schema([("i", pa.int64()), ("manu", pa.int64()), ("brand", pa.string())])
FACT = pa.schema([("fd", pa.int64()), ("fi", pa.int64()), ("amt", pa.int64())])
ITEMS, KEPT = 100, 5  # items 0..4 pass the filter
PER_DATE = 600


def _pipeline(store: joinstate.StateStore) -> joinstate.Pipeline:
    date = joinstate.source("date", DATE, unique_key=["d"]).select(["d", "y"])
    item = joinstate.source("item", ITEM, unique_key=["i"])
    kept = item.filter(pc.field("manu") == 1).select(["i", "brand"])
    fact = joinstate.source("fact", FACT)
    joined = fact.join(date, on=("fd", "d")).join(kept, on=("fi", "i"))
    graph = joinstate.Graph().output(
        "by_year", joined.group_by(["y", "brand"]).aggregate(total=("sum", "amt")),
        materialize=True)
    return joinstate.Pipeline(store, "fan", graph)


def _rows(schema: pa.Schema, rows: list[tuple[Any, ...]], w: int) -> pa.Table:
    cols = list(zip(*rows, strict=True))
    return pa.table({**{f.name: pa.array(c, f.type) for f, c in zip(schema, cols, strict=True)},
                     joinstate.WEIGHT: pa.array([w] * len(rows), pa.int64())})


def _answer(dates: dict[int, int], facts: list[tuple[int, int, int]]) -> Counter[Any]:
    out: Counter[Any] = Counter()
    for fd, fi, amt in facts:
        if fi < KEPT and fd in dates:
            out[(dates[fd], f"b{fi}")] += amt
    return out


def _state(p: joinstate.Pipeline) -> Counter[Any]:
    t = p.read("by_year")
    return Counter({(y, b): v for y, b, v in zip(t["y"].to_pylist(), t["brand"].to_pylist(),
                                                  t["total"].to_pylist(), strict=True)
                    if v})


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(what, rows) of every consolidation an operator makes of its input rows."""
    seen: list[tuple[str, int]] = []
    real = base.consolidate

    def spy(rh: Any, enc: Any, w: np.ndarray, what: str) -> Any:
        seen.append((what, len(w)))
        return real(rh, enc, w, what)

    monkeypatch.setattr(base, "consolidate", spy)
    return seen


def test_rows_without_a_partner_are_not_hashed(tmp_path: Path,
                                               hashed: list[tuple[str, int]]) -> None:
    rng = np.random.default_rng(3)
    with joinstate.StateStore(tmp_path / "s", joinstate.StoreOptions(probe="scan")) as store:
        p = _pipeline(store)
        dates = {1: 2000, 2: 2001}
        p.push("date", _rows(DATE, [(d, y, "n") for d, y in dates.items()], 1))
        p.push("item", _rows(ITEM, [(i, 1 if i < KEPT else 2, f"b{i}")
                                    for i in range(ITEMS)], 1))
        fi = rng.integers(0, ITEMS, PER_DATE)
        amt = rng.integers(1, 100, PER_DATE)
        # date 2 holds a copy of date 1's sales: swapping their years changes nothing
        facts = [(d, int(a), int(b)) for d in (1, 2) for a, b in zip(fi, amt, strict=True)]
        p.push("fact", _rows(FACT, facts, 1))
        assert _state(p) == _answer(dates, facts)
        labels = sorted((n.label for n in p.graph.nodes if n.label.startswith("join")),
                        key=lambda s: int(s.removeprefix("join")))
        second = labels[-1]
        paired = 2 * int((fi < KEPT).sum())  # date 1's pairing rows, retracted and inserted

        # date 1 moves to 2002: every sale of it reaches the second join twice
        hashed.clear()
        rep = population.apply_batch(p, "date", pa.concat_tables([
            _rows(DATE, [(1, 2000, "n")], -1), _rows(DATE, [(1, 2002, "n")], 1)]),
            strategy="incremental")
        dates[1] = 2002
        at_second = [n for what, n in hashed if what.startswith(f"{second}:")]
        assert sum(at_second) <= paired, (at_second, paired)
        assert rep.operator_runs[second].rows_in == 2 * PER_DATE
        assert _state(p) == _answer(dates, facts)

        # the two dates swap years: the sales reach the second join as -X, +X pairs
        # (their dates differ, so nothing cancels before the first join) and cancel there
        rep = population.apply_batch(p, "date", pa.concat_tables([
            _rows(DATE, [(1, 2002, "n"), (2, 2001, "n")], -1),
            _rows(DATE, [(1, 2001, "n"), (2, 2002, "n")], 1)]), strategy="incremental")
        dates = {1: 2001, 2: 2002}
        assert rep.operator_runs[second].rows_out == 0
        assert rep.output["by_year"].num_rows == 0
        assert _state(p) == _answer(dates, facts)

        # a change the first join's inputs cancel reads nothing there (its other index
        # holds many rows per key: the keys of what cancels are not looked up)
        rep = population.apply_batch(p, "date", pa.concat_tables([
            _rows(DATE, [(1, 2001, "n")], -1), _rows(DATE, [(1, 2001, "m")], 1)]),
            strategy="incremental")
        first = rep.operator_runs[labels[0]]
        assert first.keys == 0 and first.rows_out == 0
        assert rep.output["by_year"].num_rows == 0
        p.verify()


def test_random_date_and_item_changes_match_an_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    with joinstate.StateStore(tmp_path / "s", joinstate.StoreOptions(probe="scan")) as store:
        p = _pipeline(store)
        dates = {d: 2000 + int(rng.integers(0, 3)) for d in range(6)}
        items = {i: (1 if rng.random() < 0.3 else 2) for i in range(20)}
        p.push("date", _rows(DATE, [(d, y, "n") for d, y in dates.items()], 1))
        p.push("item", _rows(ITEM, [(i, m, f"b{i}") for i, m in items.items()], 1))
        facts = [(int(rng.integers(0, 7)), int(rng.integers(0, 20)), int(rng.integers(1, 9)))
                 for _ in range(400)]
        p.push("fact", _rows(FACT, facts, 1))
        for _ in range(25):
            moved = [int(d) for d in rng.choice(list(dates), 3, replace=False)]
            old = [(d, dates[d], "n") for d in moved]
            for d in moved:
                dates[d] = 2000 + int(rng.integers(0, 3))
            population.apply_batch(p, "date", pa.concat_tables([
                _rows(DATE, old, -1), _rows(DATE, [(d, dates[d], "n") for d in moved], 1)]))
            i = int(rng.integers(0, 20))
            old_i = (i, items[i], f"b{i}")
            items[i] = 3 - items[i]
            population.apply_batch(p, "item", pa.concat_tables([
                _rows(ITEM, [old_i], -1), _rows(ITEM, [(i, items[i], f"b{i}")], 1)]))
            want: Counter[Any] = Counter()
            for fd, fi, amt in facts:
                if fd in dates and items[fi] == 1:
                    want[(dates[fd], f"b{fi}")] += amt
            assert _state(p) == want
        p.verify()
