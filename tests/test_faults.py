"""Faults an adversarial user reproduced on the store: each must give the right answer or a
named error, and a failed operation must leave the state exactly as it was.

* threads: pushes from several threads into one join (or two joins of one store) while
  other threads read ``state()`` and ``stats()``: nothing lost, nothing torn;
* int64 weights: products, sums, counters and degrees that leave int64 raise
  :class:`~joinstate.WeightOverflowError` (never wrap, never a raw ``struct.error``);
* commit ids: a replay of an equal change set returns the recorded output, anything else
  under a used id raises :class:`~joinstate.CommitConflictError`;
* floats: ``-0.0`` is ``0.0`` and NaN is NaN, in keys and in row identity, over every
  probe path;
* damaged files: a flipped SST block, a flipped WAL record after a crash, a truncated
  MANIFEST, a deleted CURRENT, and paths that are not a store at all raise
  :class:`~joinstate.StateCorruptedError` / :class:`~joinstate.NotAStateStoreError`
  instead of opening with rows missing, and touch nothing;
* a full disk and a directory we may not write raise :class:`~joinstate.StateIOError`;
  the store stays closable and reopens at the last committed batch;
* ``close()`` from another thread while pushing and reading: ``StateClosedError``, and
  every batch is either wholly there or not at all.

State is compared through the public face only (``join.state``, ``join.rows``; see
``tests/faults.py``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest
import rocksdict as rd
from faults import (
    CRASH_SIDE_SCHEMA,
    Tmpfs,
    W,
    copy_store,
    crash_after_pushes,
    fingerprint,
    flip_bytes,
    open_as_nobody,
    snapshot,
    sst_files,
    table,
    truncate_half,
    unprivileged_reason,
    world_readable_tempdir,
    zset,
)
from faults import small_disk as mount_small_disk

import joinstate

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

BAG = pa.schema([("k", pa.int64()), ("v", pa.int64())])
OTHER = pa.schema([("k", pa.int64()), ("o", pa.string())])
BAG_SIDE = joinstate.Side(BAG, key=["k"])
OTHER_SIDE = joinstate.Side(OTHER, key=["k"])
PROBES = ["point", "scan", "auto"]


@contextlib.contextmanager
def fast_thread_switches(interval: float = 1e-5) -> Iterator[None]:
    """Switch Python threads every ``interval`` s (default 5 ms): races show up every run."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def run_threads(targets: list[Callable[[], None]], timeout: float = 120.0) -> list[BaseException]:
    """Run every target in its own thread; return the exceptions they raised."""
    errors: list[BaseException] = []
    lock = threading.Lock()

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                with lock:
                    errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


# =========================================================================== threads

THREADS, BATCHES, ROWS = 2, 75, 1000


def _batch(thread: int, b: int) -> pa.Table:
    v = np.arange((thread * BATCHES + b) * ROWS, (thread * BATCHES + b + 1) * ROWS)
    return pa.table({"k": v % 997, "v": v})


def _check_bag_state(join: joinstate.Join, total: int) -> None:
    state = join.state("left")
    assert state.num_rows == total, f"state() holds {state.num_rows} rows, {total} pushed"
    assert set(state.column(W).to_pylist()) == {1}
    assert sorted(state.column("v").to_pylist()) == list(range(total))
    assert join.rows("left") == total
    assert join.stats()["left"]["rows"] == total


class Readers:
    """Threads calling ``state()`` and ``stats()`` of some joins until stopped."""

    def __init__(self, joins: list[joinstate.Join]) -> None:
        self.joins = joins
        self.stop = threading.Event()
        self.seen: list[int] = []  # total left weight of every state() a reader got
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard(t), daemon=True)
                        for t in (self._read_state, self._read_stats)]

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                self.errors.append(exc)
        return run

    def _read_state(self) -> None:
        while not self.stop.is_set():
            for j in self.joins:
                self.seen.append(int(j.state("left").column(W).to_numpy().sum()))
            time.sleep(0.01)

    def _read_stats(self) -> None:
        while not self.stop.is_set():
            for j in self.joins:
                j.stats()
            time.sleep(0.01)

    def during(self, pushers: list[Callable[[], None]]) -> list[BaseException]:
        """Run ``pushers`` in threads while reading; returns the pushers' exceptions."""
        for t in self.threads:
            t.start()
        try:
            with fast_thread_switches():
                return run_threads(pushers)
        finally:
            self.stop.set()
            for t in self.threads:
                t.join(60)


def _pusher(join: joinstate.Join, thread: int) -> Callable[[], None]:
    def run() -> None:
        for b in range(BATCHES):
            join.push("left", _batch(thread, b))
    return run


def test_two_threads_push_to_one_bag_join(tmp_path: Path) -> None:
    """2 threads x 75 batches x 1000 rows into one bag side, with readers running."""
    total = THREADS * BATCHES * ROWS
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("c", left=BAG_SIDE, right=OTHER_SIDE)
        readers = Readers([join])
        errors = readers.during([_pusher(join, t) for t in range(THREADS)])
        assert not errors, f"pushes failed: {errors!r}"
        assert not readers.errors, f"state()/stats() during pushes failed: {readers.errors!r}"
        # A reader never sees part of a batch.
        assert all(s % ROWS == 0 and 0 <= s <= total for s in readers.seen), readers.seen
        _check_bag_state(join, total)
    with joinstate.StateStore(tmp_path) as store:
        _check_bag_state(store.join("c", left=BAG_SIDE, right=OTHER_SIDE), total)


def test_two_joins_of_one_store_pushed_concurrently(tmp_path: Path) -> None:
    """One thread per join, same store, with readers of both joins running."""
    with joinstate.StateStore(tmp_path) as store:
        joins = [store.join(name, left=BAG_SIDE, right=OTHER_SIDE) for name in ("a", "b")]
        readers = Readers(joins)
        errors = readers.during([_pusher(j, 0) for j in joins])
        assert not errors, f"pushes failed: {errors!r}"
        assert not readers.errors, f"state()/stats() during pushes failed: {readers.errors!r}"
        assert all(s % ROWS == 0 for s in readers.seen), readers.seen
        for j in joins:
            _check_bag_state(j, BATCHES * ROWS)
    with joinstate.StateStore(tmp_path) as store:
        for name in ("a", "b"):
            _check_bag_state(store.join(name, left=BAG_SIDE, right=OTHER_SIDE), BATCHES * ROWS)


def test_concurrent_pushes_to_both_sides_sum_to_the_join(tmp_path: Path) -> None:
    """Left and right pushed from two threads: the outputs still sum to the join."""
    batches, rows, keys = 30, 200, 500
    outputs: list[pa.Table] = []
    lock = threading.Lock()
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("both", left=BAG_SIDE, right=OTHER_SIDE)

        def left() -> None:
            for b in range(batches):
                v = np.arange(b * rows, (b + 1) * rows)
                out = join.push("left", pa.table({"k": v % keys, "v": v}))
                with lock:
                    outputs.append(out)

        def right() -> None:
            for b in range(batches):
                v = np.arange(b * rows, (b + 1) * rows)
                out = join.push("right", pa.table({"k": (v * 7) % keys,
                                                   "o": [f"o{i}" for i in v]}))
                with lock:
                    outputs.append(out)

        with fast_thread_switches():
            errors = run_threads([left, right])
        assert not errors, f"pushes failed: {errors!r}"
        total: Counter[tuple[Any, ...]] = Counter()
        for out in outputs:
            total.update(zset(out))
        got = Counter({r: w for r, w in total.items() if w})
        lrows = zset(join.state("left"))
        rrows = zset(join.state("right"))
    by_key: dict[int, list[tuple[Any, ...]]] = {}
    for r in rrows:
        by_key.setdefault(r[0], []).append(r)
    want: Counter[tuple[Any, ...]] = Counter()
    for lr, lw in lrows.items():
        for rr in by_key.get(lr[0], []):
            want[(*lr, *rr)] += lw * rrows[rr]
    assert sum(lrows.values()) == sum(rrows.values()) == batches * rows
    assert got == want


def test_close_while_pushing_and_reading(tmp_path: Path) -> None:
    """close() from another thread: the others get StateClosedError, nothing half-written."""
    store = joinstate.StateStore(tmp_path)
    join = store.join("c", left=BAG_SIDE, right=OTHER_SIDE)
    returned: list[int] = []
    errors: list[BaseException] = []
    started = threading.Event()

    def pusher() -> None:
        try:
            for b in range(10_000):
                join.push("left", _batch(0, b % BATCHES).set_column(1, "v", pa.array(
                    np.arange(b * ROWS, (b + 1) * ROWS))))
                returned.append(b)
                started.set()
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            while True:
                join.state("left")
                join.stats()
        except BaseException as exc:
            errors.append(exc)

    with fast_thread_switches():
        threads = [threading.Thread(target=pusher, daemon=True),
                   threading.Thread(target=reader, daemon=True)]
        for t in threads:
            t.start()
        assert started.wait(60)
        time.sleep(0.2)
        store.close()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 2
    assert all(isinstance(e, joinstate.StateClosedError) for e in errors), errors
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("c", left=BAG_SIDE, right=OTHER_SIDE)
        n = join.rows("left")
        assert n in (len(returned) * ROWS, (len(returned) + 1) * ROWS)  # +1: returned, not noted
        assert sorted(join.state("left").column("v").to_pylist()) == list(range(n))


# =========================================================================== weights

I64_MAX = 2**63 - 1


def _weights_join(store: joinstate.StateStore, how: str = "inner") -> joinstate.Join:
    return store.join("w", left=BAG_SIDE, right=OTHER_SIDE, how=how)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["inner", "full"])
@pytest.mark.parametrize(
    ("first", "w_first", "w_second"),
    [("left", 3, 2**62), ("right", 3, 2**62), ("left", 2**40, 2**40), ("right", 2**40, 2**40),
     ("left", 1, I64_MAX)],
    ids=["3x2^62", "3x2^62-rev", "2^40x2^40", "2^40x2^40-rev", "1xmax-fits"],
)
def test_output_weight_overflow(
    tmp_path: Path, how: str, first: str, w_first: int, w_second: int
) -> None:
    """weight(left) * weight(right) past int64 raises; it never wraps (2^40 x 2^40 is not 0)."""
    with joinstate.StateStore(tmp_path) as store:
        join = _weights_join(store, how)
        rows = {"left": table(BAG, [(1, 10)], [w_first if first == "left" else w_second]),
                "right": table(OTHER, [(1, "a")], [w_first if first == "right" else w_second])}
        second = "right" if first == "left" else "left"
        join.push(first, rows[first])  # type: ignore[arg-type]
        before = snapshot(join)
        if w_first * w_second <= I64_MAX:  # the control: fits, must be exact
            out = join.push(second, rows[second])  # type: ignore[arg-type]
            matched = Counter({r: w for r, w in zset(out).items() if None not in r})
            assert matched == Counter({(1, 10, 1, "a"): w_first * w_second})
            return
        with pytest.raises(joinstate.WeightOverflowError):
            join.push(second, rows[second])  # type: ignore[arg-type]
        assert snapshot(join) == before


def test_counter_wrap_raises_on_the_second_push(tmp_path: Path) -> None:
    """One bag row pushed twice with weight 2^62: the second push would wrap the counters."""
    row = table(BAG, [(1, 10)], [2**62])
    with joinstate.StateStore(tmp_path) as store:
        join = _weights_join(store)
        join.push("left", row)
        before = snapshot(join)
        assert before["left"] == (Counter({(1, 10): 2**62}), 2**62)
        with pytest.raises(joinstate.WeightOverflowError):
            join.push("left", row)
        assert snapshot(join) == before
        join.push("left", table(BAG, [(1, 10)], [-(2**62)]))
        assert snapshot(join)["left"] == (Counter(), 0)


def test_same_row_across_batches_with_huge_weights(tmp_path: Path) -> None:
    """Entries of one row summed at retraction time, counters near the top: no raw errors."""
    with joinstate.StateStore(tmp_path) as store:
        join = _weights_join(store)
        for _ in range(3):
            join.push("left", table(BAG, [(1, 10)], [2**61]))
        join.push("left", table(BAG, [(1, 10)], [-1]))  # reads and consolidates 3 entries
        assert snapshot(join)["left"] == (Counter({(1, 10): 3 * 2**61 - 1}), 3 * 2**61 - 1)
        before = snapshot(join)
        for w in (2**61 + 1, 2**62, I64_MAX):
            with pytest.raises(joinstate.WeightOverflowError):
                join.push("left", table(BAG, [(1, 10)], [w]))
            with pytest.raises(joinstate.WeightOverflowError):  # another row, same counters
                join.push("left", table(BAG, [(2, 20)], [w]))
            assert snapshot(join) == before
        join.push("left", table(BAG, [(1, 10)], [2**61]))  # exactly int64 max: fits
        assert join.rows("left") == I64_MAX
    with joinstate.StateStore(tmp_path) as store:
        join = _weights_join(store)
        assert snapshot(join)["left"] == (Counter({(1, 10): I64_MAX}), I64_MAX)


@pytest.mark.parametrize(
    ("rows", "weights"),
    [([(1, 10), (1, 10)], [2**62, 2**62]),
     ([(1, 10), (2, 20)], [2**62, 2**62]),
     ([(1, 10), (1, 11), (1, 12)], [I64_MAX, 1, 1])],
    ids=["one-row-twice", "two-rows", "three-rows-one-key"],
)
def test_one_batch_summing_past_int64(
    tmp_path: Path, rows: list[tuple[int, int]], weights: list[int]
) -> None:
    """Consolidation and counters of a single batch: past int64 raises, nothing applied."""
    with joinstate.StateStore(tmp_path) as store:
        join = _weights_join(store)
        join.push("right", table(OTHER, [(1, "a")]))
        before = snapshot(join)
        with pytest.raises(joinstate.WeightOverflowError):
            join.push("left", table(BAG, rows, weights))
        assert snapshot(join) == before


def test_most_negative_weight_is_refused(tmp_path: Path) -> None:
    """-2^63 cannot be negated: refused by name, nothing applied."""
    with joinstate.StateStore(tmp_path) as store:
        join = _weights_join(store)
        join.push("left", table(BAG, [(1, 10)], [5]))
        before = snapshot(join)
        with pytest.raises((joinstate.OverRetractionError, joinstate.WeightOverflowError)):
            join.push("left", table(BAG, [(1, 10)], [-(2**63)]))
        assert snapshot(join) == before


def test_degree_overflow_in_a_left_outer_join(tmp_path: Path) -> None:
    """The right side's per-key degree (kept for a left join) past int64 raises."""
    with joinstate.StateStore(tmp_path) as store:
        join = _weights_join(store, "left")
        join.push("right", table(OTHER, [(1, "a")], [2**62]))
        before = snapshot(join)
        with pytest.raises(joinstate.WeightOverflowError):
            join.push("right", table(OTHER, [(1, "b")], [2**62]))
        assert snapshot(join) == before
        # The degree is intact: the left row matches, it is not null-extended.
        out = join.push("left", table(BAG, [(1, 10)]))
        assert zset(out) == Counter({(1, 10, 1, "a"): 2**62})


# =========================================================================== commit ids

SAME = table(BAG, [(1, 10), (2, 20), (1, 10)])
REPLAYS = {
    "same": SAME,
    "reordered": table(BAG, [(1, 10), (1, 10), (2, 20)]).select(["v", "k"]),
    "split-differently": table(BAG, [(2, 20), (1, 10)], [1, 2]),
    "with-cancelling-rows": table(BAG, [(1, 10), (3, 30), (2, 20), (3, 30), (1, 10)],
                                  [1, 1, 1, -1, 1]),
}


def _commit_join(store: joinstate.StateStore) -> joinstate.Join:
    # Both sides share a schema, so the very same delta can be pushed to either side.
    join = store.join("cid", left=BAG_SIDE, right=BAG_SIDE)
    if join.rows("right") == 0:
        join.push("right", table(BAG, [(1, 100), (2, 200)]))
    return join


@pytest.mark.parametrize("replay", list(REPLAYS), ids=list(REPLAYS))
def test_commit_replay_of_an_equal_delta_returns_the_recorded_output(
    tmp_path: Path, replay: str
) -> None:
    with joinstate.StateStore(tmp_path) as store:
        join = _commit_join(store)
        out = join.push("left", SAME, commit_id="batch-17")
        assert zset(out) == Counter({(1, 10, 1, 100): 2, (2, 20, 2, 200): 1})
        before = snapshot(join)
        again = join.push("left", REPLAYS[replay], commit_id="batch-17")
        assert zset(again) == zset(out)
        assert snapshot(join) == before
    with joinstate.StateStore(tmp_path) as store:
        join = _commit_join(store)
        assert zset(join.push("left", REPLAYS[replay], commit_id="batch-17")) == zset(out)
        assert snapshot(join) == before


CONFLICTS: dict[str, tuple[str, pa.Table]] = {
    "other-weight": ("left", table(BAG, [(1, 10), (2, 20)], [3, 1])),
    "extra-row": ("left", table(BAG, [(1, 10), (2, 20), (1, 10), (4, 40)])),
    "fewer-rows": ("left", table(BAG, [(1, 10), (1, 10)])),
    "other-value": ("left", table(BAG, [(1, 10), (2, 21), (1, 10)])),
    "empty": ("left", table(BAG, [])),
    "other-side": ("right", SAME),
}


@pytest.mark.parametrize("conflict", list(CONFLICTS), ids=list(CONFLICTS))
def test_commit_id_reused_for_another_delta_conflicts(tmp_path: Path, conflict: str) -> None:
    side, delta = CONFLICTS[conflict]
    with joinstate.StateStore(tmp_path) as store:
        join = _commit_join(store)
        join.push("left", SAME, commit_id="batch-17")
        before = snapshot(join)
        with pytest.raises(joinstate.CommitConflictError, match="batch-17"):
            join.push(side, delta, commit_id="batch-17")  # type: ignore[arg-type]
        assert snapshot(join) == before
    with joinstate.StateStore(tmp_path) as store:  # the digest is persisted
        join = _commit_join(store)
        with pytest.raises(joinstate.CommitConflictError, match="batch-17"):
            join.push(side, delta, commit_id="batch-17")  # type: ignore[arg-type]
        assert snapshot(join) == before


# =========================================================================== floats

NEG_NAN = pa.array([0xFFF8000000000001], pa.uint64()).view(pa.float64())[0].as_py()


def _f(values: list[float], t: pa.DataType | None = None) -> pa.Array:
    arr = pa.array(values, pa.float64())
    return arr if t is None or t == pa.float64() else arr.cast(t)


def _sql(c: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """Exact row tuples (tests/faults.zset) under SQL float equality: -0.0 is 0.0."""
    out: Counter[tuple[Any, ...]] = Counter()
    for r, w in c.items():
        out[tuple("0x0.0p+0" if v == "-0x0.0p+0" else v for v in r)] += w
    return Counter({r: w for r, w in out.items() if w})


@pytest.mark.parametrize("probe", PROBES)
@pytest.mark.parametrize("right_type", [pa.float64(), pa.float32()], ids=str)
def test_float_keys_minus_zero_and_nan_match(
    tmp_path: Path, probe: str, right_type: pa.DataType
) -> None:
    """Left keys 0.0 / NaN match right keys -0.0 / another NaN, both push directions."""
    ls = pa.schema([("k", pa.float64()), ("lv", pa.int64())])
    rs = pa.schema([("k", right_type), ("rv", pa.int64())])
    options = joinstate.StoreOptions(probe=probe)  # type: ignore[arg-type]
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("f", left=joinstate.Side(ls, key=["k"]),
                          right=joinstate.Side(rs, key=["k"]))
        join.push("left", pa.table({"k": _f([0.0, float("nan"), 1.5]), "lv": [1, 2, 3]}))
        for i in range(6):  # repeated: the auto path moves to the probe cache on the way
            out = join.push("right", pa.table({
                "k": _f([-0.0, NEG_NAN, 1.5], right_type), "rv": [10 + i, 20 + i, 30 + i]}))
            pairs = sorted(zip(out.column("lv").to_pylist(), out.column("rv").to_pylist(),
                               strict=True))
            assert pairs == [(1, 10 + i), (2, 20 + i), (3, 30 + i)], (i, pairs)
        for i in range(6):  # and the other way round: right state probed by left pushes
            out = join.push("left", pa.table({"k": _f([-0.0, NEG_NAN]), "lv": [100, 200]}))
            assert sorted(out.column("lv").to_pylist()) == [100] * 6 + [200] * 6, i


FLOAT_ROWS = pa.schema([("k", pa.int64()), ("id", pa.int64()), ("f", pa.float64()),
                        ("g", pa.float32())])
FLOAT_KEYED = pa.schema([("f", pa.float64()), ("id", pa.int64()), ("k", pa.int64()),
                         ("g", pa.float32())])


@pytest.mark.parametrize("probe", PROBES)
@pytest.mark.parametrize("layout", ["bag", "key", "unique"])
@pytest.mark.parametrize("where", ["value", "key"])
@pytest.mark.parametrize(("ins", "ret"), [(-0.0, 0.0), (float("nan"), NEG_NAN)],
                         ids=["zero", "nan"])
def test_float_row_inserted_one_way_retracted_the_other(
    tmp_path: Path, probe: str, layout: str, where: str, ins: float, ret: float
) -> None:
    """Insert a row holding -0.0 (NaN), retract it spelled 0.0 (another NaN): it is gone."""
    schema = FLOAT_ROWS if where == "value" else FLOAT_KEYED
    key = ["k"] if where == "value" else ["f"]
    unique = {"bag": None, "key": key, "unique": ["id"]}[layout]
    side = joinstate.Side(schema, key=key, unique_key=unique)
    other = joinstate.Side(pa.schema([(key[0], schema.field(key[0]).type), ("o", pa.string())]),
                           key=key)

    def row(v: float, w: int) -> pa.Table:
        return pa.table({"k": pa.array([1], pa.int64()), "id": [7], "f": [v],
                         "g": pa.array([v], pa.float32()), W: [w]})

    options = joinstate.StoreOptions(probe=probe)  # type: ignore[arg-type]
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("fr", left=side, right=other)
        join.push("right", pa.table({key[0]: pa.array([1 if where == "value" else ins],
                                                      schema.field(key[0]).type), "o": ["x"]}))
        empty = snapshot(join)["left"]
        out1 = join.push("left", row(ins, 1))
        assert join.rows("left") == 1
        out2 = join.push("left", row(ret, -1))
        assert snapshot(join)["left"] == empty
        total = zset(out1)
        total.update(zset(out2))
        assert _sql(total) == Counter(), "the outputs of an insert and its retraction cancel"
        assert out1.num_rows == 1, "the row matched the right row (NaN = NaN as in Spark)"


# =========================================================================== corruption

CORRUPT_ROWS = 30_000
KEYED_SIDE = joinstate.Side(pa.schema([("k", pa.int64()), ("s", pa.string())]), key=["k"],
                            unique_key=["k"])
STRING_BAG = joinstate.Side(pa.schema([("k", pa.int64()), ("s", pa.string())]), key=["k"])
CORRUPT_JOINS = {"bag": STRING_BAG, "keyed": KEYED_SIDE}


def _corrupt_join(store: joinstate.StateStore, name: str) -> joinstate.Join:
    return store.join(name, left=CORRUPT_JOINS[name], right=OTHER_SIDE)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store: two joins whose left sides fill SST files of hundreds of blocks."""
    path = tmp_path_factory.mktemp("pristine") / "store"
    keys = np.arange(CORRUPT_ROWS)
    strings = [f"row {i:08d} " + "x" * 80 for i in range(CORRUPT_ROWS)]
    with joinstate.StateStore(path) as store:
        for name in CORRUPT_JOINS:
            _corrupt_join(store, name).push("left", pa.table({"k": keys, "s": strings}))
        store.flush()
    big = [p for p in sst_files(path) if p.stat().st_size > 1 << 20]
    assert len(big) >= 2, f"expected one big SST per left side: {sst_files(path)}"
    return path


@pytest.fixture
def corrupted(pristine: Path, tmp_path: Path) -> Path:
    """A copy of the pristine store with 64 bytes flipped in the middle of each big SST."""
    path = copy_store(pristine, tmp_path / "store")
    for sst in sst_files(path):
        if sst.stat().st_size > 1 << 20:
            flip_bytes(sst, 64)
    return path


@contextlib.contextmanager
def opened_or_refused(path: Path, options: joinstate.StoreOptions | None = None
                      ) -> Iterator[joinstate.StateStore | None]:
    """Open ``path``; yields None if opening already raised StateCorruptedError (fine)."""
    try:
        store = joinstate.StateStore(path, options)
    except joinstate.StateCorruptedError:
        yield None
        return
    with store:
        yield store


def test_clean_store_verifies_and_reads_completely(pristine: Path, tmp_path: Path) -> None:
    """The control: the undamaged copy opens, verifies and has every row."""
    path = copy_store(pristine, tmp_path / "store")
    with joinstate.StateStore(path) as store:
        store.verify()
        for name in CORRUPT_JOINS:
            join = _corrupt_join(store, name)
            assert join.state("left").num_rows == CORRUPT_ROWS
            assert join.rows("left") == CORRUPT_ROWS


@pytest.mark.parametrize("name", list(CORRUPT_JOINS))
def test_flipped_sst_block_fails_state(corrupted: Path, name: str) -> None:
    with pytest.raises(joinstate.StateCorruptedError), joinstate.StateStore(corrupted) as store:
        state = _corrupt_join(store, name).state("left")
        pytest.fail(f"state() returned {state.num_rows} of {CORRUPT_ROWS} rows")


@pytest.mark.parametrize("probe", ["point", "scan"])
@pytest.mark.parametrize("name", list(CORRUPT_JOINS))
def test_flipped_sst_block_fails_a_probing_push(corrupted: Path, name: str, probe: str) -> None:
    """A right push probing every left key hits the bad block: it raises, applies nothing."""
    probe_delta = pa.table({"k": np.arange(CORRUPT_ROWS), "o": ["p"] * CORRUPT_ROWS})
    options = joinstate.StoreOptions(probe=probe)  # type: ignore[arg-type]
    with opened_or_refused(corrupted, options) as store:
        if store is None:
            return
        join = _corrupt_join(store, name)
        with pytest.raises(joinstate.StateCorruptedError):
            out = join.push("right", probe_delta)
            pytest.fail(f"the push returned {out.num_rows} of {CORRUPT_ROWS} matches")
        assert join.rows("right") == 0
        assert join.state("right").num_rows == 0


def test_flipped_sst_block_fails_verify(corrupted: Path) -> None:
    with opened_or_refused(corrupted) as store:
        if store is None:
            return
        with pytest.raises(joinstate.StateCorruptedError):
            store.verify()


def test_truncated_manifest_is_refused_and_deletes_nothing(
    pristine: Path, tmp_path: Path
) -> None:
    """RocksDB would recover an older version from half a MANIFEST and delete the SSTs."""
    path = copy_store(pristine, tmp_path / "store")
    manifest = path / (path / "CURRENT").read_text().strip()
    truncate_half(manifest)
    ssts = {n: h for n, h in fingerprint(path).items() if n.endswith(".sst")}
    refused = (joinstate.StateCorruptedError, joinstate.NotAStateStoreError)
    with pytest.raises(refused), joinstate.StateStore(path) as store:
        rows = {n: _corrupt_join(store, n).rows("left") for n in CORRUPT_JOINS}
        pytest.fail(f"opened with rows {rows}")
    after = fingerprint(path)
    assert {n: after.get(n) for n in ssts} == ssts, "SST files were deleted or changed"


WAL_BATCHES, WAL_ROWS = 20, 1000


def _crash_join(store: joinstate.StateStore) -> joinstate.Join:
    side = joinstate.Side(CRASH_SIDE_SCHEMA, key=["k"])
    return store.join("crash", left=side, right=side)


def _wal(path: Path) -> Path:
    logs = sorted(path.glob("*.log"), key=lambda p: p.stat().st_size)
    assert logs and logs[-1].stat().st_size > 1 << 20, f"no WAL to damage: {list(path.iterdir())}"
    return logs[-1]


def test_flipped_wal_record_is_refused(tmp_path: Path) -> None:
    """A bad record in the middle of the WAL after a crash: refuse, not half the batches.

    RocksDB's default recovery (point in time) stops replaying at the bad record and opens
    with the batches before it, counters included, so ``verify()`` agrees.  With
    ``DBRecoveryMode.tolerate_corrupted_tail_records`` it reports ``Corruption: checksum
    mismatch`` instead (and still accepts a torn last record, see the next test).
    """
    path = tmp_path / "store"
    crash_after_pushes(path, WAL_BATCHES, WAL_ROWS)
    flip_bytes(_wal(path), 64)
    with pytest.raises(joinstate.StateCorruptedError), joinstate.StateStore(path) as store:
        join = _crash_join(store)
        store.verify()
        pytest.fail(f"opened with {join.rows('left')} of {WAL_BATCHES * WAL_ROWS} rows")


def test_torn_wal_tail_loses_only_the_torn_batch(tmp_path: Path) -> None:
    """The control: a crash that tore the last WAL record opens at a batch boundary."""
    path = tmp_path / "store"
    crash_after_pushes(path, WAL_BATCHES, WAL_ROWS)
    wal = _wal(path)
    with wal.open("r+b") as f:
        f.truncate(wal.stat().st_size - 50)
    with joinstate.StateStore(path) as store:
        join = _crash_join(store)
        store.verify()
        rows = join.rows("left")
        assert rows in ((WAL_BATCHES - 1) * WAL_ROWS, WAL_BATCHES * WAL_ROWS)
        assert sorted(join.state("left").column("k").to_pylist()) == list(range(rows))


# ---------------------------------------------------------------- not a store


@pytest.mark.parametrize("read_only", [False, True], ids=["rw", "ro"])
def test_missing_current_is_not_replaced_by_an_empty_db(
    pristine: Path, tmp_path: Path, read_only: bool
) -> None:
    path = copy_store(pristine, tmp_path / "store")
    (path / "CURRENT").unlink()
    before = fingerprint(path)
    with pytest.raises(joinstate.NotAStateStoreError, match=re.escape(str(path))):
        joinstate.StateStore(path, read_only=read_only).close()
    assert fingerprint(path) == before, "opening touched the damaged directory"
    assert not (path / "CURRENT").exists()
    assert sst_files(path)


def _not_a_store(kind: str, base: Path) -> Path:
    if kind == "regular-file":
        (base / "state").write_text("not a store\n")
        return base / "state"
    if kind == "under-a-file":
        (base / "state").write_text("not a store\n")
        return base / "state" / "sub"
    if kind == "foreign-directory":
        (base / "state").mkdir()
        (base / "state" / "notes.txt").write_text("my notes\n")
        return base / "state"
    if kind == "foreign-nested":
        (base / "state" / "inner").mkdir(parents=True)
        return base / "state"
    raw = kind == "plain-rocksdb-raw"
    db = rd.Rdict(str(base / "state"), rd.Options(raw_mode=raw))
    db[b"a" if raw else "a"] = b"1" if raw else 1
    db.close()
    return base / "state"


@pytest.mark.parametrize("read_only", [False, True], ids=["rw", "ro"])
@pytest.mark.parametrize("kind", ["regular-file", "under-a-file", "foreign-directory",
                                  "foreign-nested", "plain-rocksdb", "plain-rocksdb-raw"])
def test_not_a_state_store_is_refused_untouched(
    tmp_path: Path, kind: str, read_only: bool
) -> None:
    base = tmp_path / "base"
    base.mkdir()
    path = _not_a_store(kind, base)
    before = fingerprint(base)
    named = path.parent if kind == "under-a-file" else path
    with pytest.raises(joinstate.NotAStateStoreError, match=re.escape(str(named))):
        joinstate.StateStore(path, read_only=read_only).close()
    assert fingerprint(base) == before, "opening created or changed files"


def test_empty_directory_becomes_a_store(tmp_path: Path) -> None:
    """The control: an existing empty directory (e.g. a fresh mount point) is fine."""
    path = tmp_path / "empty"
    path.mkdir()
    with joinstate.StateStore(path) as store:
        store.join("e", left=BAG_SIDE, right=OTHER_SIDE).push("left", table(BAG, [(1, 1)]))
    with joinstate.StateStore(path) as store:
        assert store.join("e", left=BAG_SIDE, right=OTHER_SIDE).rows("left") == 1


# =========================================================================== disk full


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Tmpfs]:
    """A 4 MiB tmpfs; skipped (with the reason) where it cannot be mounted."""
    yield from mount_small_disk(tmp_path / "disk", "4m")


@pytest.mark.parametrize("write_buffer_mib", [64, 1], ids=["wal-fills", "flush-fills"])
def test_disk_full(small_disk: Tmpfs, write_buffer_mib: int) -> None:
    """Push until the disk is full: StateIOError, close() works, reopen has every commit."""
    path = small_disk.path / "store"
    options = joinstate.StoreOptions(write_buffer_size=write_buffer_mib << 20)
    store = joinstate.StateStore(path, options)
    join = store.join("d", left=joinstate.Side(OTHER, key=["k"]), right=BAG_SIDE)
    committed: list[pa.Table] = []
    failure: BaseException | None = None
    for b in range(500):
        ks = np.arange(b * 2000, (b + 1) * 2000)
        delta = pa.table({"k": ks, "o": [f"{i:010d}" + "x" * 90 for i in ks]})
        try:
            join.push("left", delta, commit_id=f"b{b}")
        except Exception as exc:
            failure = exc
            break
        committed.append(delta)
    assert failure is not None, "4 MiB never filled"
    assert isinstance(failure, joinstate.StateIOError), f"{type(failure)!r}: {failure}"
    assert "space" in str(failure).lower() or "disk" in str(failure).lower(), str(failure)
    with pytest.raises(joinstate.StateIOError):  # the disk is still full
        join.push("left", table(OTHER, [(10**9, "late")]))
    store.close()  # must not raise
    store.close()
    small_disk.resize("64m")
    want = zset(pa.concat_tables(committed))
    with joinstate.StateStore(path, options) as store:
        join = store.join("d", left=joinstate.Side(OTHER, key=["k"]), right=BAG_SIDE)
        assert join.rows("left") == len(committed) * 2000
        assert zset(join.state("left")) == want
        assert join.committed(f"b{len(committed) - 1}")
        assert not join.committed(f"b{len(committed)}")
        join.push("left", table(OTHER, [(10**9, "after")]))  # writable again
    with joinstate.StateStore(path, options) as store:  # and that survives too
        assert store.join("d", left=joinstate.Side(OTHER, key=["k"]), right=BAG_SIDE
                          ).rows("left") == len(committed) * 2000 + 1


# =========================================================================== permissions


def _small_store(path: Path) -> dict[str, Any]:
    with joinstate.StateStore(path) as store:
        join = store.join("p", left=BAG_SIDE, right=OTHER_SIDE)
        join.push("left", table(BAG, [(1, 10), (2, 20)]))
        return snapshot(join)


def _reopened_snapshot(path: Path) -> dict[str, Any]:
    with joinstate.StateStore(path) as store:
        return snapshot(store.join("p", left=BAG_SIDE, right=OTHER_SIDE))


@pytest.mark.parametrize("mode", [0o000, 0o555], ids=["chmod-000", "not-writable"])
def test_permission_denied_is_named(mode: int) -> None:
    """A store we may not read (or write) raises StateIOError naming the path."""
    reason = unprivileged_reason()
    if reason is not None:
        pytest.skip(reason)
    with world_readable_tempdir() as d:
        path = d / "store"
        before = _small_store(path)
        if mode == 0o555:
            for p in path.iterdir():
                p.chmod(0o444)
        path.chmod(mode)
        try:
            result = open_as_nobody(path)
        finally:
            path.chmod(0o755)
            for p in path.iterdir():
                p.chmod(0o644)
        assert not result["ok"], f"opened a store it may not {'read' if mode == 0 else 'write'}"
        assert "JoinStateError" in result["mro"], result
        assert result["type"] == "StateIOError", result
        assert str(path) in result["message"], result
        assert _reopened_snapshot(path) == before


def test_immutable_directory_is_named(tmp_path: Path) -> None:
    """chattr +i stops root too: opening must name the path, not report corruption."""
    path = tmp_path / "store"
    before = _small_store(path)
    if shutil.which("chattr") is None:
        pytest.skip("chattr(1) is not installed")
    r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot make {path} immutable here: {r.stderr.strip()}")
    try:
        with pytest.raises(joinstate.StateIOError, match=re.escape(str(path))):
            joinstate.StateStore(path).close()
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert _reopened_snapshot(path) == before
