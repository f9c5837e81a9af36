"""joinstate.to_changes / from_changes: weighted change sets <-> change-data-feed rows."""

from __future__ import annotations

import math
import tempfile
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import joinstate
from joinstate.testing import zset

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("x", pa.float64())])


def _canon(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return 0.0 if v == 0 else v
    return v


def _table(rows: list[tuple[Any, ...]], weights: list[int]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[], [], []]
    return pa.table({
        "k": pa.array(cols[0], pa.int64()), "s": pa.array(cols[1], pa.string()),
        "x": pa.array(cols[2], pa.float64()), "_weight": pa.array(weights, pa.int64()),
    })


def test_to_changes_one_row_per_copy_in_input_order() -> None:
    t = _table([(1, "a", 1.0), (2, "b", None), (3, None, 2.5)], [2, -1, 0])
    c = joinstate.to_changes(t)
    assert c.column_names == ["k", "s", "x", "_change_type"]
    assert c.schema.field("_change_type").type == pa.string()
    assert c.to_pylist() == [
        {"k": 1, "s": "a", "x": 1.0, "_change_type": "insert"},
        {"k": 1, "s": "a", "x": 1.0, "_change_type": "insert"},
        {"k": 2, "s": "b", "x": None, "_change_type": "delete"},
    ]


def test_to_changes_without_weight_is_all_inserts_and_takes_record_batches() -> None:
    batch = pa.record_batch({"k": pa.array([5, 6], pa.int32())})
    c = joinstate.to_changes(batch)
    assert c.to_pylist() == [{"k": 5, "_change_type": "insert"},
                             {"k": 6, "_change_type": "insert"}]
    assert c.schema.field("k").type == pa.int32()


def test_from_changes_consolidates_in_order_of_first_appearance() -> None:
    c = pa.table({
        "k": [2, 1, 2, 3, 3, 1],
        "_change_type": ["insert", "delete", "insert", "insert", "delete", "delete"],
    })
    out = joinstate.from_changes(c)
    assert out.to_pylist() == [{"k": 2, "_weight": 2}, {"k": 1, "_weight": -2}]
    assert out.schema.field("_weight").type == pa.int64()
    assert not out.schema.field("_weight").nullable


def test_from_changes_reads_a_delta_change_data_feed() -> None:
    """Delta's update pre/post images count -1/+1; its commit columns are dropped."""
    c = pa.table({
        "id": [1, 1, 2],
        "name": ["Ann", "Anne", "Bo"],
        "_change_type": pa.array(["update_preimage", "update_postimage", "insert"]
                                 ).dictionary_encode(),
        "_commit_version": [3, 3, 4],
        "_commit_timestamp": pa.array([0, 0, 1], pa.timestamp("ms")),
    })
    out = joinstate.from_changes(c)
    assert out.to_pylist() == [
        {"id": 1, "name": "Ann", "_weight": -1},
        {"id": 1, "name": "Anne", "_weight": 1},
        {"id": 2, "name": "Bo", "_weight": 1},
    ]


def test_from_changes_floats_and_nulls_compare_as_the_store_does() -> None:
    nan_a = float("nan")
    c = pa.table({
        "x": pa.array([0.0, -0.0, nan_a, float("-nan"), None, None], pa.float64()),
        "_change_type": ["insert"] * 6,
    })
    out = joinstate.from_changes(c).to_pylist()
    assert len(out) == 3
    assert out[0] == {"x": 0.0, "_weight": 2}
    assert math.copysign(1.0, out[0]["x"]) == 1.0
    assert math.isnan(out[1]["x"]) and out[1]["_weight"] == 2
    assert out[2] == {"x": None, "_weight": 2}


def test_from_changes_empty_and_column_less() -> None:
    empty = pa.table({"k": pa.array([], pa.int64()), "_change_type": pa.array([], pa.string())})
    out = joinstate.from_changes(empty)
    assert out.num_rows == 0 and out.column_names == ["k", "_weight"]
    only = pa.table({"_change_type": ["insert", "insert", "delete"]})
    assert joinstate.from_changes(only).to_pylist() == [{"_weight": 1}]


@pytest.mark.parametrize(("table", "match"), [
    (pa.table({"k": [1]}), "no '_change_type' column"),
    (pa.table({"k": [1], "_change_type": ["upsert"]}), "'upsert' is not one of"),
    (pa.table({"k": [1], "_change_type": pa.array([None], pa.string())}), "None is not one"),
    (pa.table({"k": [1], "_change_type": ["insert"], "_weight": [1]}), "both"),
    (pa.table({"k": [1], "_change_type": [1]}), "must be strings"),
])
def test_from_changes_errors_name_the_problem(table: pa.Table, match: str) -> None:
    with pytest.raises(joinstate.SchemaMismatchError, match=match):
        joinstate.from_changes(table)


def test_to_changes_errors() -> None:
    with pytest.raises(joinstate.SchemaMismatchError, match="NULL weights"):
        joinstate.to_changes(pa.table({"k": [1], "_weight": pa.array([None], pa.int64())}))
    with pytest.raises(joinstate.SchemaMismatchError, match="must be int64"):
        joinstate.to_changes(pa.table({"k": [1], "_weight": [1.5]}))
    with pytest.raises(joinstate.SchemaMismatchError, match="already has"):
        joinstate.to_changes(pa.table({"k": [1], "_change_type": ["insert"]}))
    with pytest.raises(joinstate.WeightOverflowError):
        joinstate.to_changes(pa.table({"k": [1], "_weight": [-(2**63)]}))
    with pytest.raises(joinstate.SchemaMismatchError, match="Table or RecordBatch"):
        joinstate.to_changes([1, 2])  # type: ignore[arg-type]


def test_a_join_output_round_trips() -> None:
    """A real output change set: to_changes then from_changes gives it back."""
    left = joinstate.Side(pa.schema([("k", pa.int64()), ("a", pa.string())]), key=["k"])
    right = joinstate.Side(pa.schema([("rk", pa.int64()), ("b", pa.float64())]), key=["rk"])
    with tempfile.TemporaryDirectory() as d, joinstate.StateStore(d + "/s") as store:
        join = store.join("j", left=left, right=right, how="left")
        join.push("left", pa.table({"k": [1, 1, 2], "a": ["x", "x", None]}))
        out = join.push("right", pa.table({"rk": [1, 2, 2], "b": [0.5, 1.5, 1.5]}))
    back = joinstate.from_changes(joinstate.to_changes(out))
    assert back.schema == out.schema
    assert zset(back) == zset(out)


ROWS = st.tuples(
    st.integers(-3, 3),
    st.one_of(st.none(), st.sampled_from(["a", "b", ""])),
    st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, float("nan")])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ROWS, st.integers(-3, 3)), max_size=30))
def test_round_trips(items: list[tuple[tuple[Any, ...], int]]) -> None:
    t = _table([r for r, _ in items], [w for _, w in items])
    changes = joinstate.to_changes(t)
    assert changes.num_rows == sum(abs(w) for _, w in items)
    assert zset(changes) == zset(t)
    back = joinstate.from_changes(changes)
    assert zset(back) == zset(t)
    assert back.num_rows == len(zset(t))  # consolidated: one row per distinct row
    assert 0 not in back.column("_weight").to_pylist()
    # and the other way round: the net changes survive
    again = joinstate.to_changes(back)
    assert zset(again) == zset(changes)
    def rows(t: pa.Table) -> list[tuple[Any, ...]]:
        return [tuple(_canon(v) for v in r.values()) for r in t.to_pylist()]

    assert rows(joinstate.from_changes(again)) == rows(back)
