"""Derived in-memory state (entry map, unique key set, probe cache) never changes answers.

The entry map (bag retractions decided without reading), the unique key set (blind writes of new
keys) and the probe cache are all *derived* from the stored index.  Each has a fast path
and a fallback: the map may be complete, saved and loaded, missing (seeks), stale on disk
(ignored), garbage (ignored), or wrong in memory (caught by ``verify()``, which rebuilds
it); the key set may exist from the start, be built later, or be absent (reads).  Random
change streams with deletes, duplicates and NULL keys run through every combination,
closing and reopening the store between batches, and the integrated output must equal the
oracle's join of the integrated inputs at every step.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest

import joinstate
from tests.oracle import join_oracle, zset_add, zset_from_table

if TYPE_CHECKING:
    from pathlib import Path

LEFT = pa.schema([("k", pa.int64()), ("u", pa.int64()), ("a", pa.string())])
RIGHT = pa.schema([("k", pa.int64()), ("v", pa.int64())])
LCOLS, RCOLS = ["k", "u", "a"], ["k", "v"]


class Model:
    """Integrated content of one side, and random valid deltas against it."""

    def __init__(self, rng: random.Random, unique: bool, cols: list[str]) -> None:
        self.rng, self.unique, self.cols = rng, unique, cols
        self.rows: Counter[tuple[Any, ...]] = Counter()
        self.next_u = 0

    def delta(self, n: int) -> pa.Table:
        rows: list[tuple[Any, ...]] = []
        weights: list[int] = []
        present = [r for r, w in self.rows.items() for _ in range(w)]
        self.rng.shuffle(present)
        retract = present[: self.rng.randint(0, min(len(present), n // 2))]
        for r in retract:
            rows.append(r)
            weights.append(-1)
        for _ in range(n - len(retract)):
            key = self.rng.choice([None, *range(12)])
            if len(self.cols) == 3:
                self.next_u += 1
                row = (key, self.next_u, self.rng.choice(["x", "y", None]))
            else:
                row = (key, self.rng.randint(0, 3))
            copies = 1 if self.unique else self.rng.choice([1, 1, 2])
            if not self.unique and present and self.rng.random() < 0.2:
                row = self.rng.choice(present)  # another copy of a stored row
            rows.append(row)
            weights.append(copies)
        cols = list(zip(*rows, strict=True)) if rows else [[] for _ in self.cols]
        schema = LEFT if len(self.cols) == 3 else RIGHT
        table = pa.table({c: pa.array(list(v), schema.field(c).type)
                          for c, v in zip(self.cols, cols, strict=True)})
        table = table.append_column("_weight", pa.array(weights, pa.int64()))
        for r, w in zip(rows, weights, strict=True):
            self.rows[r] += w
        self.rows = Counter({r: w for r, w in self.rows.items() if w})
        return table


def _open(path: Path, unique_left: bool, how: str, options: joinstate.StoreOptions
          ) -> tuple[joinstate.StateStore, joinstate.Join]:
    store = joinstate.StateStore(path, options)
    left = joinstate.Side(LEFT, ["k"], ["u"] if unique_left else None)
    right = joinstate.Side(RIGHT, ["k"])
    return store, store.join("j", left=left, right=right, how=how)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["inner", "left", "full"])
@pytest.mark.parametrize("unique_left", [False, True])
@pytest.mark.parametrize("between", ["keep", "drop-derived", "stale-derived", "garbage-derived"])
def test_reopen_with_every_kind_of_derived_state(tmp_path: Path, how: str, unique_left: bool,
                                                 between: str) -> None:
    rng = random.Random(f"{how}-{unique_left}-{between}")
    options = joinstate.StoreOptions(probe="point")  # RocksDB reads, not the probe cache
    models = {"left": Model(rng, unique_left, LCOLS), "right": Model(rng, False, RCOLS)}
    total: Counter[tuple[Any, ...]] = Counter()
    path = tmp_path / "s"
    saved: dict[str, bytes] = {}
    store, join = _open(path, unique_left, how, options)
    try:
        for step in range(24):
            side = "left" if step % 2 == 0 else "right"
            out = join.push(side, models[side].delta(rng.randint(1, 40)))  # type: ignore[arg-type]
            total = zset_add(total, zset_from_table(out, out.schema.names[:-1]))
            want = join_oracle(models["left"].rows, models["right"].rows, [0], [0], how, 3, 2)
            assert total == want, f"step {step}"
            if step % 6 == 5:
                store.close()
                derived = path / "derived"
                files = sorted(derived.glob("*.npz")) if derived.exists() else []
                restored = False
                if between == "drop-derived":
                    shutil.rmtree(derived, ignore_errors=True)
                elif between == "stale-derived":
                    # Put back the files of an earlier close: their stamps no longer match.
                    current = {f.name: f.read_bytes() for f in files}
                    for f in files:
                        if f.name in saved:
                            f.write_bytes(saved[f.name])
                            restored = True
                    saved.update(current)
                elif between == "garbage-derived":
                    for f in files:
                        f.write_bytes(b"not an npz file")
                store, join = _open(path, unique_left, how, options)
                loaded = join.right.layout.emap is not None  # the bag side's entry map
                fresh = between == "keep" or (between == "stale-derived" and not restored)
                assert loaded == (fresh or join.rows("right") == 0), between
        assert store.verify()["joins"]["j"]["left"]["rows"] >= 0
    finally:
        store.close()


def test_a_wrong_entry_map_is_caught_by_verify(tmp_path: Path) -> None:
    """The map decides retractions without reading, so verify() compares it with the index.

    A map that lost entries in memory (a bug, here simulated) is rebuilt by verify(),
    which raises, and retractions are exact again afterwards.
    """
    side = joinstate.Side(RIGHT, ["k"])
    with joinstate.StateStore(tmp_path / "s") as store:
        join = store.join("j", left=side, right=side)
        rows = pa.table({"k": np.arange(200) % 7, "v": np.arange(200)})
        join.push("right", rows)
        join.push("right", rows.slice(0, 50))  # second copies: two entries per row
        store.verify()  # the map agrees with the index
        emap = join.right.layout.emap  # the core's own object: this test pokes at it
        assert emap is not None
        emap.settle()
        emap.runs.pop()  # the map forgets the entries of its last run
        with pytest.raises(joinstate.StateCorruptedError, match="entry map"):
            store.verify()
        store.verify()  # rebuilt from the index
        gone = rows.slice(0, 80).append_column("_weight", pa.array(np.full(80, -1, np.int64)))
        join.push("right", gone)
        state = zset_from_table(join.state("right"), ["k", "v"])
        expected = Counter({(k, v): 1 + (v < 50) - (v < 80) for k, v in
                            zip((np.arange(200) % 7).tolist(), range(200), strict=True)})
        assert state == Counter({r: w for r, w in expected.items() if w})
        with pytest.raises(joinstate.OverRetractionError):
            join.push("right", gone.slice(60, 20))  # rows 60..79 are gone now
        assert zset_from_table(join.state("right"), ["k", "v"]) == state
        assert store.verify()["joins"]["j"]["right"]["rows"] == sum(state.values())


def test_unique_key_set_absent_built_and_colliding(tmp_path: Path, monkeypatch: Any) -> None:
    """Duplicates are caught whether the key set exists, is built later, or collides."""
    left = joinstate.Side(LEFT, ["k"], ["u"])
    right = joinstate.Side(RIGHT, ["k"])
    path = tmp_path / "s"
    batch = pa.table({"k": [1, 2, 3], "u": [10, 20, 30], "a": ["p", "q", "r"]})
    with joinstate.StateStore(path) as store:
        store.join("j", left=left, right=right).push("left", batch)
    with joinstate.StateStore(path) as store:  # reopened: no key set until it pays
        join = store.join("j")
        assert join.left.layout.keyset is None
        with pytest.raises(joinstate.UniqueKeyViolationError):
            join.push("left", batch.slice(1, 1))
        join.push("left", pa.table({"k": [4], "u": [40], "a": ["s"]}))
        # Every hash collides: the set answers "maybe" for all, reads decide.
        import joinstate.layouts.unique as layouts

        monkeypatch.setattr(layouts, "hash64", lambda data, seed=None: np.zeros(len(data),
                                                                               np.uint64))
        join.left.layout.init_keyset(0)  # a fresh, empty (exact) set
        join.push("left", pa.table({"k": [5, 6], "u": [50, 60], "a": ["t", "u"]}))
        with pytest.raises(joinstate.UniqueKeyViolationError):
            join.push("left", pa.table({"k": [5], "u": [50], "a": ["t2"]}))
        assert join.rows("left") == 6


def test_probe_cache_is_rebuilt_at_reopen_only_if_it_was_in_use(tmp_path: Path) -> None:
    left = joinstate.Side(RIGHT, ["k"], ["k"])
    right = joinstate.Side(RIGHT, ["k"])
    path = tmp_path / "s"
    dim = pa.table({"k": np.arange(500), "v": np.arange(500) * 2})
    probe = pa.table({"k": np.arange(0, 1000, 3), "v": np.zeros(334, np.int64)})
    with joinstate.StateStore(path, joinstate.StoreOptions(probe="scan")) as store:
        join = store.join("j", left=left, right=right)
        join.push("left", dim)
        join.push("right", probe)
        assert join.left.cache is not None
    with joinstate.StateStore(path) as store:  # probe="auto": the decision is kept
        join = store.join("j")
        assert join.left.cache is not None
        out = join.push("right", probe)
        assert out.num_rows == len(range(0, 500, 3))
    with joinstate.StateStore(path) as store:
        join = store.join("j")
        join.left.cache = None  # not in use when this store closes
    with joinstate.StateStore(path) as store:
        assert store.join("j").left.cache is None
