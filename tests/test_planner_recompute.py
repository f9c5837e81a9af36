"""Golden tests of the batch rule: statistics (and recorded runs) in, decision out.

Every expected figure below was worked out by hand from the cost model in the rule's
docstring with its default constants (incremental 2 ms + 1.4 µs per batch row + 0.38 µs
per further partner row; recompute 2 ms + 0.65 µs per scanned row + 1.35 µs per batch
row; recompute chosen only when at least 20% cheaper, 50% when a measured per-row cost
is extrapolated beyond 4x the largest batch it was measured on), and, for recorded runs,
from the medians and Theil-Sen lines it describes.  The arithmetic is in each case's comment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import joinstate
from planner.batch import decide_batch, partners_per_row, record_batch, recorded, scanned_rows
from planner.rule import Rule
from planner.rules.recompute import BatchContext, Observation, RecomputeRule

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Golden:
    name: str
    context: BatchContext
    choice: str
    incremental_ms: float
    recompute_ms: float
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def ctx(batch: int, scanned: int, partners: float = 1.0, inc: tuple[Observation, ...] = (),
        rc: tuple[Observation, ...] = ()) -> BatchContext:
    return BatchContext("join j, left side", batch_rows=batch, scanned_rows=scanned,
                        state_rows=123, partners_per_row=partners, incremental=inc, recompute=rc)


GOLDEN = [
    # 2 + 1.4 * 1 = 3.4 against 2 + 0.65 * 100 + 1.35 * 1 = 68.35
    Golden("small batch, large scan", ctx(1_000, 100_000), "incremental", 3.4, 68.35,
           {"incremental_cost_from": "default", "recompute_cost_from": "default"},
           "incremental, 20x cheaper"),
    # 2 + 1.4 * 1000 = 1402 against 2 + 0.65 * 1 + 1.35 * 1000 = 1352.65: 3.5% cheaper,
    # short of the 20% margin (1402 * 0.8 = 1121.6)
    Golden("batch dwarfs the scan, within the margin", ctx(1_000_000, 1_000), "incremental",
           1402.0, 1352.65, {}, "recompute is not 20% cheaper"),
    # inc µs = 1.4 + 0.38 * 27.8 = 11.964: 2 + 119.64 = 121.64;
    # 2 + 0.65 * 2880.404 + 1.35 * 10 = 1887.7626
    Golden("customer updates meeting 28.8 sales rows", ctx(10_000, 2_880_404, 28.8),
           "incremental", 121.64, 1887.7626, {"partners_per_row": 28.8}),
    # inc µs = 1.4 + 0.38 * 29 = 12.42: 2 + 2484 = 2486; 2 + 65 + 270 = 337
    Golden("many partners per row", ctx(200_000, 100_000, 30.0), "recompute", 2486.0, 337.0,
           {}, "recompute, 7.4x cheaper"),
    # two batch sizes: the line through (1e4, 52) and (1e5, 502): 450 / 9e4 = 0.005 ms =
    # 5 µs per row, fixed 52 - 50 = 2 ms; 2 + 5 * 200 = 1002 against the default 337
    Golden("measured incremental cost flips it",
           ctx(200_000, 100_000, inc=(Observation(10_000, 0, 52.0),
                                      Observation(100_000, 0, 502.0))),
           "recompute", 1002.0, 337.0,
           {"incremental_us_per_batch_row": 5.0, "incremental_fixed_ms": 2.0,
            "incremental_cost_from": "fitted on 2 run(s)", "recompute_cost_from": "default"}),
    # the fixed cost is learned: the line through (1e3, 12) and (1e4, 30): 18 / 9000 ms =
    # 2 µs per row, fixed 12 - 2 = 10 ms; B = 5000: 10 + 2 * 5 = 20
    Golden("fixed cost learned", ctx(5_000, 100_000, inc=(Observation(1_000, 0, 12.0),
                                                          Observation(10_000, 0, 30.0))),
           "incremental", 20.0, 2 + 65 + 6.75,
           {"incremental_fixed_ms": 10.0, "incremental_us_per_batch_row": 2.0}),
    # runs below 1000 rows set no slope: of (288, 12.4) and (2880, 12.4) only the second
    # counts, (12.4 - 2) / 2880 ms = 3.6111 µs per row; B = 28804: 2 + 104.0144
    Golden("small runs set no slope", ctx(28_804, 100_000, inc=(Observation(288, 0, 12.4),
                                                                Observation(2_880, 0, 12.4))),
           "incremental", 106.0144, 2 + 65 + 38.8854,
           {"incremental_us_per_batch_row": 3.6111, "incremental_cost_from": "median of 1 run(s)"}),
    # one run of 29 rows: mostly fixed costs, not extrapolated; the defaults (3.4) hold
    Golden("a tiny run is not extrapolated", ctx(1_000, 100_000,
                                                 inc=(Observation(29, 0, 12.7),)),
           "incremental", 3.4, 68.35, {"incremental_cost_from": "default"}),
    # scans timed apart: 50 ms / 1e5 rows = 0.5 µs; batch (53 - 50 - 2) / 1e3 and
    # (62 - 50 - 2) / 1e4 ms = 1 µs; inc 2 + 1.4 * 50 = 72, rc 2 + 0.5 * 100 + 1 * 50 = 102
    Golden("measured recompute, both coefficients",
           ctx(50_000, 100_000, rc=(Observation(1_000, 100_000, 53.0, 50.0),
                                    Observation(10_000, 100_000, 62.0, 50.0))),
           "incremental", 72.0, 102.0,
           {"recompute_us_per_scanned_row": 0.5, "recompute_us_per_batch_row": 1.0,
            "recompute_cost_from": "scan: median of 2 run(s), batch: of 2"}),
    # a 288-row run times the scan (55 ms / 1e5 = 0.55 µs) but sets no batch cost;
    # rc 2 + 55 + 1.35 * 1 = 58.35
    Golden("a small recompute run measures only the scan",
           ctx(1_000, 100_000, rc=(Observation(288, 100_000, 60.0, 55.0),)),
           "incremental", 3.4, 58.35,
           {"recompute_us_per_scanned_row": 0.55, "recompute_us_per_batch_row": 1.35,
            "recompute_cost_from": "scan: median of 1 run(s), batch default"}),
    # the median of three: one disturbed run (scan 300 ms) moves nothing:
    # scan 0.5 µs, batch median(1, 1, 1) = 1 µs
    Golden("one disturbed run",
           ctx(50_000, 100_000, rc=(Observation(1_000, 100_000, 53.0, 50.0),
                                    Observation(10_000, 100_000, 62.0, 50.0),
                                    Observation(5_000, 100_000, 307.0, 300.0))),
           "incremental", 72.0, 102.0,
           {"recompute_us_per_scanned_row": 0.5, "recompute_us_per_batch_row": 1.0}),
    # one batch size: y = 63.35 - 2 - 1.35 * 1 = 60 = s * 2e5: s = 0.3 µs;
    # rc = 2 + 0.3 * 200 + 1.35 = 63.35 against 3.4
    Golden("one batch size fits only the scan",
           ctx(1_000, 200_000, rc=(Observation(1_000, 200_000, 63.35),)),
           "incremental", 3.4, 63.35,
           {"recompute_us_per_scanned_row": 0.3, "recompute_us_per_batch_row": 1.35,
            "recompute_cost_from": "scan: median of 1 run(s), batch default"}),
    # a run faster than the fixed cost gives a negative per-row cost: discarded
    Golden("a negative fit is discarded", ctx(1_000, 100_000,
                                              inc=(Observation(5_000, 0, 1.0),)),
           "incremental", 3.4, 68.35, {"incremental_cost_from": "default"}),
    # measured 1.8 µs/row at this size ((182 - 2) / 1e5 ms): 2 + 180 = 182; rc
    # 2 + 0 + 135 = 137, under 182 * 0.8 = 145.6
    Golden("just past the margin", ctx(100_000, 0, inc=(Observation(100_000, 0, 182.0),)),
           "recompute", 182.0, 137.0, {"incremental_cost_from": "median of 1 run(s)",
                                       "margin": 0.2, "measured_up_to_batch_rows": 100_000}),
    # measured 1.6 µs/row: 2 + 160 = 162; 137 is 15.4% cheaper, not 20% (129.6)
    Golden("just short of the margin", ctx(100_000, 0, inc=(Observation(100_000, 0, 162.0),)),
           "incremental", 162.0, 137.0, {}, "recompute is not 20% cheaper"),
    # the same 1.8 µs/row measured on 1,000-row batches only: 100x extrapolated, so the
    # margin is 50% (182 * 0.5 = 91 < 137)
    Golden("extrapolated estimates need a wider margin",
           ctx(100_000, 0, inc=(Observation(1_000, 0, 3.8),)), "incremental", 182.0, 137.0,
           {"margin": 0.5, "measured_up_to_batch_rows": 1_000}, "extrapolated"),
    # 4x the measured size is not yet extrapolation: (25000, 47) gives 1.8 µs/row
    Golden("within 4x of the measured size",
           ctx(100_000, 0, inc=(Observation(25_000, 0, 47.0),)),
           "recompute", 182.0, 137.0, {"margin": 0.2}),
    Golden("an empty batch", ctx(0, 100_000), "incremental", 2.0, 67.0, {},
           "the batch is empty"),
]


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.name)
def test_golden(golden: Golden) -> None:
    (d,) = RecomputeRule().apply(golden.context)
    assert d.choice == golden.choice
    assert d.figures["incremental_ms"] == pytest.approx(golden.incremental_ms, abs=1e-3)
    assert d.figures["recompute_ms"] == pytest.approx(golden.recompute_ms, abs=1e-3)
    for key, want in golden.figures.items():
        assert d.figures[key] == (pytest.approx(want, abs=1e-4) if isinstance(want, float)
                                  else want), key
    assert golden.reason in d.reason
    assert d.topic == "batch_strategy" and d.rule == "recompute"
    assert d.subject == "join j, left side"
    assert d.figures["batch_rows"] == golden.context.batch_rows
    assert d.figures["state_rows"] == 123
    json.dumps(d.to_dict())  # figures are JSON-able


def test_unavailable_recompute_is_never_chosen() -> None:
    c = BatchContext("pipeline 'p', source 'a'", batch_rows=10_000_000, scanned_rows=0,
                     state_rows=0, recompute_available=False, unavailable="no path here")
    (d,) = RecomputeRule().apply(c)
    assert d.choice == "incremental"
    assert d.reason == "incremental: no path here"


def test_rule_follows_the_protocol() -> None:
    assert isinstance(RecomputeRule(), Rule)
    assert RecomputeRule.name == "recompute"


# ---- statistics gathered from a store ----------------------------------------------------

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def build(store: joinstate.StateStore, how: str) -> joinstate.Join:
    join = store.join("j", left=joinstate.Side(SCHEMA, ["k"], ["k"]),
                      right=joinstate.Side(SCHEMA, ["k"]), how=how)
    join.push("left", pa.table({"k": list(range(100)), "v": ["c"] * 100}))
    join.push("right", pa.table({"k": [i % 100 for i in range(300)] + [None],
                                 "v": ["s"] * 301}))
    return join


@pytest.mark.parametrize(("how", "side", "scanned", "partners"), [
    ("inner", "left", 301, 3.01),   # the right side's 301 rows, 301 / 100 keys of the left
    ("inner", "right", 100, 1.0),   # the left side; a bag side: one partner assumed
    ("left", "right", 401, 1.0),    # the left join keeps the right side's degrees
    ("full", "left", 401, 3.01),
    ("left_semi", "left", 301, 3.01),
])
def test_statistics_from_the_store(tmp_path: Path, how: str, side: str, scanned: int,
                                   partners: float) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = build(store, how)
        s: joinstate.SideName = "left" if side == "left" else "right"
        assert scanned_rows(join, s) == scanned
        assert partners_per_row(join, s) == pytest.approx(partners)
        delta = pa.table({"k": [1, 2], "v": ["x", "y"]})
        d = decide_batch(join, side, delta)
        assert d.figures["batch_rows"] == 2
        assert d.figures["scanned_rows"] == scanned
        assert d.figures["state_rows"] == join.rows(s)
        assert d.figures["partners_per_row"] == pytest.approx(partners, abs=1e-3)


def test_recorded_runs_are_kept_and_read_back(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = build(store, "inner")
        for i in range(20):
            record_batch(join, "right", "incremental", 1000 * (i + 1), 0, float(i))
        runs = recorded(join, "right", "incremental")
        assert len(runs) == 16  # the last KEEP
        assert runs[0] == Observation(5000, 0, 4.0) and runs[-1] == Observation(20000, 0, 19.0)
        assert recorded(join, "left", "incremental") == ()
        big = pa.table({"k": list(range(200_000)), "v": ["x"] * 200_000})
        before = decide_batch(join, "right", big)
        assert before.figures["incremental_cost_from"] == "median of 16 run(s)"
        record_batch(join, "right", "incremental", 100_000, 0, 2002.0)  # 20 µs per row
        one = decide_batch(join, "right", big)  # one run among 17 moves the median little
        assert one.figures["incremental_us_per_batch_row"] < 2.0
        for i in range(16):  # the history turns over: 20 µs per row from now on
            record_batch(join, "right", "incremental", 10_000 * (i + 1), 0,
                         3.0 + 0.02 * 10_000 * (i + 1))
        after = decide_batch(join, "right", big)
        assert after.figures["incremental_us_per_batch_row"] == pytest.approx(20.0)
        assert after.figures["incremental_fixed_ms"] == pytest.approx(3.0)
        assert after.choice == "recompute"  # 4,003 ms against 2 + 0.065 + 270 (100 rows scanned)
    with joinstate.StateStore(tmp_path / "s") as store:  # kept across a reopen
        assert len(recorded(store.join("j"), "right", "incremental")) == 16
    with joinstate.StateStore(tmp_path / "s", read_only=True) as store:
        join = store.join("j")
        record_batch(join, "right", "incremental", 1, 0, 1.0)  # skipped, no error
        assert len(recorded(join, "right", "incremental")) == 16


def test_unreadable_record_means_defaults(tmp_path: Path) -> None:
    from joinstate.names import batch_cost_key

    with joinstate.StateStore(tmp_path / "s") as store:
        join = build(store, "inner")
        store.meta_put(batch_cost_key("j", "right", "incremental"), b"{not json")
        assert recorded(join, "right", "incremental") == ()
        d = decide_batch(join, "right", pa.table({"k": [1], "v": ["x"]}))
        assert d.figures["incremental_cost_from"] == "default"
        record_batch(join, "right", "incremental", 10, 0, 1.0)  # replaces the bad record
        assert recorded(join, "right", "incremental") == (Observation(10, 0, 1.0),)


def test_dropping_a_join_forgets_what_was_measured_of_it(tmp_path: Path) -> None:
    """A join created again under a dropped join's name starts from the defaults."""
    with joinstate.StateStore(tmp_path / "s") as store:
        join = build(store, "inner")
        record_batch(join, "right", "incremental", 5000, 0, 1.0)
        assert recorded(join, "right", "incremental")
        store.drop_join("j")
        again = build(store, "inner")
        assert recorded(again, "right", "incremental") == ()
