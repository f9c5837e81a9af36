"""Undo capture: a transaction can record the prior bytes of everything it writes.

Random pushes into joins (bag and unique layouts) and a pipeline, committed while
:meth:`joinstate.db.Database.capturing_undo` is in force, are undone by
:func:`joinstate.transaction.apply_undo`; the store must then hold exactly the bytes it
held before, in every column family, counters and commit records included.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from faults import dump_store as dump

import joinstate
from joinstate.names import undo_prefix
from joinstate.transaction import (
    Transaction,
    apply_undo,
    drop_undo,
    undo_tags,
)

LEFT = pa.schema([("k", pa.int64()), ("name", pa.string())])
if TYPE_CHECKING:
    from pathlib import Path

RIGHT = pa.schema([("k", pa.int32()), ("t", pa.int64()), ("v", pa.float64())])




def delta(schema: pa.Schema, rows: list[tuple[Any, ...]], weights: list[int]) -> pa.Table:
    cols = {f.name: pa.array([r[i] for r in rows], f.type) for i, f in enumerate(schema)}
    cols["_weight"] = pa.array(weights, pa.int64())
    return pa.table(cols)


class Model:
    """The rows each side holds (a multiset), to draw legal random changes from."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.left: dict[tuple[Any, ...], int] = {}
        self.right: dict[tuple[Any, ...], int] = {}

    def change(self, side: str, unique: bool = False) -> pa.Table:
        """Deletes of held rows and inserts; ``unique``: each row at most once."""
        rng = self.rng
        held = self.left if side == "left" else self.right
        rows: list[tuple[Any, ...]] = []
        weights: list[int] = []
        for row in rng.sample(sorted(held, key=repr), min(len(held), rng.randrange(4))):
            rows.append(row)
            weights.append(-rng.randrange(1, held[row] + 1))
        for _ in range(rng.randrange(1, 8)):
            k = rng.choice([None, *range(12)])
            row = (k, f"n{rng.randrange(10**6)}") if side == "left" else (
                k, rng.randrange(10**6), rng.choice([0.5, -0.0, 2.25]))
            if row in held or row in rows:
                continue
            rows.append(row)
            weights.append(1 if unique else rng.randrange(1, 3))
        for row, w in zip(rows, weights, strict=True):
            held[row] = held.get(row, 0) + w
            if not held[row]:
                del held[row]
        return delta(LEFT if side == "left" else RIGHT, rows, weights)


def join_of(store: joinstate.StateStore, unique: bool) -> joinstate.Join:
    left = joinstate.Side(LEFT, key=["k"], unique_key=["name"] if unique else None)
    return store.join("j", left=left, right=joinstate.Side(RIGHT, key=["k"]), how="full")


@pytest.mark.parametrize("seed", range(4))
def test_undo_restores_the_exact_bytes_of_a_join(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    model = Model(rng)
    path = tmp_path / "s"
    unique = seed % 2 == 1
    with joinstate.StateStore(path) as store:
        join = join_of(store, unique)
        for i in range(6):  # state before the operation, without capture
            side = rng.choice(["left", "right"])
            join.push(side, model.change(side, unique), commit_id=f"before-{i}")
    before = dump(path)
    with joinstate.StateStore(path) as store:
        join = join_of(store, unique)
        with store.capturing_undo(undo_prefix("op-1"), b"digest-1"):
            for i in range(rng.randrange(2, 6)):
                side = rng.choice(["left", "right"])
                join.push(side, model.change(side, unique), commit_id=f"op-1-{i}")
            join.forget_commits(keep=lambda c: c != "before-0")
        assert undo_tags(store) == {"op-1": b"digest-1"}
    assert dump(path) != before
    with joinstate.StateStore(path) as store:
        assert apply_undo(store, "op-1") >= 2
        assert undo_tags(store) == {}
    after = dump(path)
    assert after == before
    # The store works on: the join reopens and takes the pre-operation retractions again.
    with joinstate.StateStore(path) as store:
        join = join_of(store, unique)
        assert join.committed("before-0") and not join.committed("op-1-0")


def test_undo_of_a_pipeline_push_and_of_raw_transactions(tmp_path: Path) -> None:
    path = tmp_path / "p"
    sales = pa.schema([("c", pa.int64()), ("amt", pa.int64())])
    cust = pa.schema([("c", pa.int64()), ("region", pa.string())])

    def build(store: joinstate.StateStore) -> joinstate.Pipeline:
        s = joinstate.source("sales", schema=sales)
        c = joinstate.source("customer", schema=cust, unique_key=["c"])
        j = s.join(c, on="c")
        graph = joinstate.Graph().output("per_region", j.group_by(["region"]).aggregate(
            total=("sum", pc.field("amt")), n=("count", None)))
        return joinstate.Pipeline(store, "p", graph)

    with joinstate.StateStore(path) as store:
        p = build(store)
        p.push("customer", pa.table({"c": [1, 2, 3], "region": ["a", "b", "a"]}))
        p.push("sales", pa.table({"c": [1, 1, 2, 4], "amt": [10, 20, 30, 40]}))
    before = dump(path)
    with joinstate.StateStore(path) as store:
        p = build(store)
        with store.capturing_undo(undo_prefix("op"), b""):
            p.push("sales", pa.table({"c": [1, 3], "amt": [10, 5], "_weight": [-1, 2]}),
                   commit_id="x")
            p.push("customer", pa.table({"c": [2, 2], "region": ["b", "c"],
                                         "_weight": [-1, 1]}))
            # A raw transaction: a key absent before (undone by a delete), a key written
            # twice, a record, a counter.
            txn = Transaction(store)
            txn.put("__meta__", b"zz-new", b"1")
            txn.put("__meta__", b"zz-new", b"2")
            txn.record(b"zz-record", b"r")
            txn.add("__meta__", "rows", 5)
            txn.commit()
    with joinstate.StateStore(path) as store:
        apply_undo(store, "op")
    assert dump(path) == before
    with joinstate.StateStore(path) as store:
        p = build(store)
        outs = p.push("sales", pa.table({"c": [3], "amt": [7]}))
        got = sorted(outs["per_region"].to_pylist(), key=lambda r: r["_weight"])
        assert got == [{"region": "a", "total": 30, "n": 2, "_weight": -1},
                       {"region": "a", "total": 37, "n": 3, "_weight": 1}]


def test_undo_records_are_ordered_dropped_and_refused_with_a_sink(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with joinstate.StateStore(path) as store:
        with store.capturing_undo(undo_prefix("a"), b"A"):
            Transaction(store).commit()  # nothing staged: still a (empty) record
            txn = Transaction(store)
            txn.record(b"k", b"1")
            txn.commit()
        with store.capturing_undo(undo_prefix("b"), b"B"):
            txn = Transaction(store)
            txn.record(b"k", b"2")
            txn.commit()
        assert undo_tags(store) == {"a": b"A", "b": b"B"}
        assert drop_undo(store, "a") == 2
        assert undo_tags(store) == {"b": b"B"}
        assert store.meta_get(b"k") == b"2"
        apply_undo(store, "b")
        assert store.meta_get(b"k") == b"1"  # a's change stays: it was committed (dropped)

        def sink(blocks: Any, records: Any) -> None:
            raise AssertionError("not reached")

        with store.capturing_undo(undo_prefix("c"), b""):
            txn = Transaction(store)
            txn.record(b"k", b"3")
            with pytest.raises(joinstate.JoinStateError, match="undo"):
                txn.commit(sink)
        assert store.meta_get(b"k") == b"1"


def test_undo_capture_cost_per_written_key(tmp_path: Path) -> None:
    """Not a benchmark: a bound that catches an accidental per-key Python loop."""
    import time

    schema = pa.schema([("k", pa.int64()), ("t", pa.int64())])
    with joinstate.StateStore(tmp_path / "c") as store:
        join = store.join("c", left=joinstate.Side(schema, key=["k"]),
                          right=joinstate.Side(schema, key=["k"]))
        n = 20_000
        join.push("left", pa.table({"k": list(range(n)), "t": list(range(n))}))
        rows = pa.table({"k": list(range(n, 2 * n)), "t": list(range(n))})
        t0 = time.perf_counter()
        join.push("right", rows)
        plain = time.perf_counter() - t0
        rows2 = pa.table({"k": list(range(2 * n, 3 * n)), "t": list(range(n))})
        with store.capturing_undo(undo_prefix("x"), b""):
            t0 = time.perf_counter()
            join.push("right", rows2)
            captured = time.perf_counter() - t0
    assert captured < plain * 3 + 0.5, (plain, captured)
