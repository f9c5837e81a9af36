"""Undo capture without re-reading what a writer already knows its keys held.

A bag index appends entries under its batch number and a source's row record appends
under its push number, so those keys are new by construction; an aggregate reads its
groups to fold a change in.  They declare that to the transaction
(``put_many(..., prior=...)``) and the undo capture records it instead of reading the
keys again.  The rollback must still restore the exact bytes of the store.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from faults import dump_store as dump

import joinstate
from joinstate import transaction as T
from joinstate.names import META_CF, undo_prefix
from joinstate.transaction import ABSENT, Transaction, apply_undo

if TYPE_CHECKING:
    from pathlib import Path

SALES = pa.schema([("c", pa.int64()), ("amt", pa.int64())])
CUST = pa.schema([("c", pa.int64()), ("region", pa.string())])




def build(store: joinstate.StateStore) -> joinstate.Pipeline:
    sales = joinstate.source("sales", schema=SALES)  # checked: keeps a row record
    cust = joinstate.source("customer", schema=CUST, unique_key=["c"])
    joined = sales.join(cust, on="c")
    graph = (joinstate.Graph()
             .output("per_region", joined.group_by(["region"]).aggregate(
                 total=("sum", pc.field("amt")), n=("count", None)))
             .output("per_customer", sales.group_by(["c"]).aggregate(n=("count", None))))
    return joinstate.Pipeline(store, "p", graph)


def sales(rows: list[tuple[int, int]], weights: list[int]) -> pa.Table:
    return pa.table({"c": pa.array([r[0] for r in rows], pa.int64()),
                     "amt": pa.array([r[1] for r in rows], pa.int64()),
                     "_weight": pa.array(weights, pa.int64())})


class UndoReads:
    """The keys the undo capture reads, per column family."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keys: dict[str, list[bytes]] = {}
        real = T._rocks.multi_get  # noqa: SLF001

        def multi_get(cf: Any, keys: list[bytes], path: Any, what: str) -> Any:
            if "undo capture" in what:
                family = what.split("'")[1]
                self.keys.setdefault(family, []).extend(keys)
            return real(cf, keys, path, what)

        monkeypatch.setattr(T._rocks, "multi_get", multi_get)  # noqa: SLF001


@pytest.mark.parametrize("entries", ["map", "seek"])
def test_a_push_reads_nothing_but_its_counters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: str) -> None:
    """Inserts and retractions of a bag index, its source's record, its aggregates."""
    path = tmp_path / "s"
    with joinstate.StateStore(path) as store:
        p = build(store)
        p.push("customer", pa.table({"c": [1, 2, 3], "region": ["a", "b", "a"]}))
        p.push("sales", sales([(1, 10), (2, 20), (4, 5), (1, 7)], [1, 2, 1, 1]))
    # "seek": no saved entry map and none built, so retractions read their entries.
    options = joinstate.StoreOptions(unique_filter_max_rows=0) if entries == "seek" else None
    with joinstate.StateStore(path, options=options) as store:
        if entries == "seek":
            store.discard_derived()
        p = build(store)
        reads = UndoReads(monkeypatch)
        with store.capturing_undo(undo_prefix("op"), b""):
            p.push("sales", sales([(1, 7), (3, 8), (2, 20), (1, 10), (5, 1)],
                                  [1, 2, -1, -1, 1]))
    # Index entries and row-record values are appended under fresh numbers; retracted
    # entries were found in the entry map or read; the aggregates' groups were read to
    # fold the change in: only counters and commit records are read again.
    assert set(reads.keys) == {META_CF}, sorted(reads.keys)
    with joinstate.StateStore(path) as store:
        apply_undo(store, "op")
        p = build(store)
        # Both (2, 20) rows are back: retracting them empties region b.
        out = p.push("sales", sales([(2, 20)], [-2]))["per_region"].to_pylist()
        assert out == [{"region": "b", "total": 40, "n": 2, "_weight": -1}]


@pytest.mark.parametrize("seed", range(6))
def test_rollback_restores_the_exact_bytes(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "s"
    held: dict[tuple[int, int], int] = {}

    def change() -> pa.Table:
        rows: list[tuple[int, int]] = []
        weights: list[int] = []
        for row in rng.sample(sorted(held), min(len(held), rng.randrange(5))):
            rows.append(row)
            weights.append(-rng.randrange(1, held[row] + 1))
        for _ in range(rng.randrange(1, 9)):
            row = (rng.randrange(8), rng.randrange(4))
            if row not in rows:
                rows.append(row)
                weights.append(rng.randrange(1, 3))
        for row, w in zip(rows, weights, strict=True):
            held[row] = held.get(row, 0) + w
            if not held[row]:
                del held[row]
        return sales(rows, weights)

    with joinstate.StateStore(path) as store:
        p = build(store)
        p.push("customer", pa.table({"c": list(range(6)), "region": list("abcabc")}))
        for _ in range(4):
            p.push("sales", change())
    before = dump(path)
    # Odd seeds: retractions read their entries (no entry map), even: by the map.
    options = joinstate.StoreOptions(unique_filter_max_rows=0) if seed % 2 else None
    with joinstate.StateStore(path, options=options) as store:
        if seed % 2:
            store.discard_derived()
        p = build(store)
        with store.capturing_undo(undo_prefix("op"), b""):
            for i in range(rng.randrange(2, 5)):
                p.push("sales", change(), commit_id=f"op-{i}")
            p.push("customer", pa.table({"c": [1, 6], "region": ["b", "z"],
                                         "_weight": [-1, 1]}))
    assert dump(path) != before
    with joinstate.StateStore(path) as store:
        assert apply_undo(store, "op") >= 3
    assert dump(path) == before


def test_a_declared_block_takes_no_undeclared_put(tmp_path: Path) -> None:
    """A single put after a declared block is read, not taken for one of its keys."""
    path = tmp_path / "s"
    with joinstate.StateStore(path) as store:
        txn = Transaction(store)
        txn.put(META_CF, b"zz-old", b"old")
        txn.commit()
    before = dump(path)
    with joinstate.StateStore(path) as store:
        with store.capturing_undo(undo_prefix("op"), b""):
            txn = Transaction(store)
            txn.put_many(META_CF, [b"zz-new"], [b"1"], prior=ABSENT)
            txn.put(META_CF, b"zz-old", b"new")
            txn.commit()
        assert store.meta_get(b"zz-old") == b"new"
    with joinstate.StateStore(path) as store:
        apply_undo(store, "op")
    assert dump(path) == before


def test_prior_values_must_match_the_keys(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        txn = Transaction(store)
        with pytest.raises(joinstate.JoinStateError, match="1 prior values"):
            txn.put_many(META_CF, [b"a", b"b"], [b"1", b"2"], prior=[None])
