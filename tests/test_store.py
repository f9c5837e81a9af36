"""The state store's lifecycle: persistence, locking, re-attaching, commits, phases, stats.

A store is one RocksDB directory that outlives the process that wrote it, so the tests
here close and reopen it on purpose and check that what a join promised survives:

* state and catalog persist across close/reopen (context manager or explicit ``close``),
  also with the WAL off after an explicit ``flush``;
* re-attaching a join needs the same spec; any difference raises
  :class:`~joinstate.JoinSpecMismatchError` naming it, and changes nothing;
* a store can be open once: a second open, in another process or in this one, raises
  :class:`~joinstate.StateLockedError` naming the path, and ``close`` releases the lock;
* ``commit_id`` makes a push exactly-once, across reopen; ``phase`` persists;
* ``recreate_empty`` switches an empty index's memtable and refuses a non-empty one;
* ``stats`` counts what was pushed (rows = total multiplicity, distinct non-NULL keys ...);
* two joins in one store do not see each other.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import joinstate
from joinstate.testing import zset

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

W = joinstate.WEIGHT
Row = tuple[Any, ...]
REPO = Path(__file__).resolve().parents[1]

LEFT_SCHEMA = pa.schema([("k", pa.int16()), ("v", pa.string())])
RIGHT_SCHEMA = pa.schema([("k", pa.int64()), ("r", pa.string())])
LEFT = joinstate.Side(LEFT_SCHEMA, key=["k"])
RIGHT = joinstate.Side(RIGHT_SCHEMA, key=["k"], unique_key=["k"])


def left_delta(
    rows: Sequence[tuple[int | None, str]], weights: list[int] | None = None
) -> pa.Table:
    cols: dict[str, Any] = {"k": pa.array([r[0] for r in rows], pa.int16()),
                            "v": pa.array([r[1] for r in rows])}
    if weights is not None:
        cols[W] = pa.array(weights, pa.int64())
    return pa.table(cols)


def right_delta(
    rows: Sequence[tuple[int | None, str]], weights: list[int] | None = None
) -> pa.Table:
    cols: dict[str, Any] = {"k": pa.array([r[0] for r in rows], pa.int64()),
                            "r": pa.array([r[1] for r in rows])}
    if weights is not None:
        cols[W] = pa.array(weights, pa.int64())
    return pa.table(cols)


LEFT_ROWS = [(1, "a"), (1, "b"), (2, "c"), (None, "n")]
RIGHT_ROWS = [(1, "x"), (3, "z")]


def populate(join: joinstate.Join) -> None:
    join.push("left", left_delta(LEFT_ROWS, [1, 2, 1, 1]))
    join.push("right", right_delta(RIGHT_ROWS))


EXPECTED_LEFT = Counter({(1, "a"): 1, (1, "b"): 2, (2, "c"): 1, (None, "n"): 1})
EXPECTED_RIGHT = Counter({(1, "x"): 1, (3, "z"): 1})


def check_persisted(join: joinstate.Join) -> None:
    """State is what :func:`populate` pushed, and new pushes probe it correctly."""
    assert zset(join.state("left")) == EXPECTED_LEFT
    assert zset(join.state("right")) == EXPECTED_RIGHT
    out = join.push("right", right_delta([(2, "y")]))
    assert zset(out) == Counter({(2, "c", 2, "y"): 1})
    out = join.push("left", left_delta([(3, "d"), (None, "m")]))
    assert zset(out) == Counter({(3, "d", 3, "z"): 1})


# --------------------------------------------------------------------------- persistence


def test_persistence_with_context_manager(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        populate(store.join("j", left=LEFT, right=RIGHT))
    assert store.closed
    with joinstate.StateStore(tmp_path) as store:
        assert store.joins() == ["j"]
        check_persisted(store.join("j", left=LEFT, right=RIGHT))


def test_persistence_with_explicit_close(tmp_path: Path) -> None:
    store = joinstate.StateStore(str(tmp_path))  # a str path works too
    populate(store.join("j", left=LEFT, right=RIGHT))
    store.close()
    store = joinstate.StateStore(tmp_path)
    try:
        join = store.join("j", left=LEFT, right=RIGHT)
        check_persisted(join)
        assert join.stats()["left"]["rows"] == sum([1, 2, 1, 1]) + 2
    finally:
        store.close()


def test_reattach_in_the_same_session_keeps_state(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        populate(store.join("j", left=LEFT, right=RIGHT))
        again = store.join("j", left=joinstate.Side(LEFT_SCHEMA, key=("k",)),
                           right=joinstate.Side(RIGHT_SCHEMA, key="k", unique_key="k"))
        check_persisted(again)


def test_without_wal_flush_then_reopen_keeps_data(tmp_path: Path) -> None:
    options = joinstate.StoreOptions(wal=False)
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        populate(join)
        stats = join.stats()
        store.flush()
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        after = join.stats()
        for side in ("left", "right"):
            for field in ("rows", "null_key_rows", "entries", "distinct_keys"):
                assert after[side][field] == stats[side][field], (side, field)
        check_persisted(join)


def test_two_joins_in_one_store_are_independent(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        a = store.join("a", left=LEFT, right=RIGHT)
        b = store.join("b", left=LEFT, right=RIGHT, how="left")
        populate(a)
        assert b.state("left").num_rows == 0 and b.state("right").num_rows == 0
        assert b.stats()["left"]["rows"] == 0
        out = b.push("right", right_delta([(1, "only b")]))
        assert out.num_rows == 0  # a's left rows are not b's
        out = b.push("left", left_delta([(1, "b1"), (5, "b5")]))
        assert zset(out) == Counter({(1, "b1", 1, "only b"): 1, (5, "b5", None, None): 1})
        assert zset(a.state("right")) == EXPECTED_RIGHT
        assert zset(a.state("left")) == EXPECTED_LEFT
    with joinstate.StateStore(tmp_path) as store:
        assert sorted(store.joins()) == ["a", "b"]
        cfs = store.column_families()
        for name in ("a", "b"):
            for side in ("left", "right"):
                assert store.join(name).index(side).column_family in cfs
        b = store.join("b", left=LEFT, right=RIGHT, how="left")
        assert zset(b.state("left")) == Counter({(1, "b1"): 1, (5, "b5"): 1})
        check_persisted(store.join("a", left=LEFT, right=RIGHT))


# --------------------------------------------------------------------------- spec mismatch


def nullable_v(nullable: bool) -> joinstate.Side:
    return joinstate.Side(
        pa.schema([pa.field("k", pa.int16()), pa.field("v", pa.string(), nullable=nullable)]),
        key=["k"],
    )


MISMATCHES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "how": ({"how": "left"}, ("how", "'inner'", "'left'")),
    "suffixes": ({"suffixes": ("_l", "_r")}, ("suffixes", "_l")),
    "left_unique_key": (
        {"left": joinstate.Side(LEFT_SCHEMA, key=["k"], unique_key=["v"])},
        ("left.unique_key", "'v'")),
    "right_unique_key_dropped": (
        {"right": joinstate.Side(RIGHT_SCHEMA, key=["k"])}, ("right.unique_key",)),
    "left_column_type": (
        {"left": joinstate.Side(pa.schema([("k", pa.int16()), ("v", pa.large_string())]),
                                key=["k"])}, ("left.columns", "v: large_string")),
    "left_key_type": (
        {"left": joinstate.Side(pa.schema([("k", pa.int32()), ("v", pa.string())]),
                                key=["k"])}, ("left.columns", "k: int32")),
    "right_extra_column": (
        {"right": joinstate.Side(RIGHT_SCHEMA.append(pa.field("extra", pa.int8())), key=["k"],
                                 unique_key=["k"])}, ("right.columns", "extra")),
    "left_key_column": (
        {"left": joinstate.Side(pa.schema([("k", pa.int16()), ("v", pa.int64())]), key=["v"])},
        ("left.key", "'v'")),
    "left_nullability": ({"left": nullable_v(False)}, ("left", "v: string")),
}


@pytest.mark.parametrize("reopen", [False, True], ids=["same_session", "after_reopen"])
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_different_spec_raises_naming_the_difference(
    tmp_path: Path, case: str, reopen: bool
) -> None:
    changes, culprits = MISMATCHES[case]
    spec: dict[str, Any] = {"left": LEFT, "right": RIGHT, "how": "inner",
                            "suffixes": ("", "_right"), **changes}
    store = joinstate.StateStore(tmp_path)
    try:
        populate(store.join("j", left=LEFT, right=RIGHT))
        if reopen:
            store.close()
            store = joinstate.StateStore(tmp_path)
        with pytest.raises(joinstate.JoinStateError) as info:
            store.join("j", **spec)
        assert isinstance(info.value, joinstate.JoinSpecMismatchError)
        msg = str(info.value)
        assert "'j'" in msg
        for c in culprits:
            assert c in msg, f"{c!r} not in: {msg}"
        del info
        # The stored spec and state are untouched; a new name takes the new spec.
        check_persisted(store.join("j", left=LEFT, right=RIGHT))
        store.join("j2", **spec)
    finally:
        store.close()
    with joinstate.StateStore(tmp_path) as store:
        assert sorted(store.joins()) == ["j", "j2"]


# --------------------------------------------------------------------------- locking


OPEN_IN_CHILD = """
import sys
import joinstate
try:
    store = joinstate.StateStore(sys.argv[1])
except joinstate.StateLockedError as exc:
    print(exc)
    sys.exit(3)
store.close()
print("opened")
"""


def open_in_child(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", OPEN_IN_CHILD, str(path)], capture_output=True, text=True,
        check=False, timeout=120, cwd=REPO,
    )


def test_open_in_another_process_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "locked store"
    with joinstate.StateStore(path) as store:
        populate(store.join("j", left=LEFT, right=RIGHT))
        child = open_in_child(path)
        assert child.returncode == 3, (child.stdout, child.stderr)
        assert str(path) in child.stdout
        # The holder is unaffected.
        check_persisted(store.join("j", left=LEFT, right=RIGHT))
    child = open_in_child(path)
    assert child.returncode == 0, (child.stdout, child.stderr)
    assert child.stdout.strip() == "opened"


def test_open_twice_in_one_process_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "store"
    first = joinstate.StateStore(path)
    try:
        populate(first.join("j", left=LEFT, right=RIGHT))
        for _ in range(2):
            with pytest.raises(joinstate.JoinStateError) as info:
                joinstate.StateStore(path)
            assert isinstance(info.value, joinstate.StateLockedError)
            assert str(path) in str(info.value)
        del info
        check_persisted(first.join("j", left=LEFT, right=RIGHT))
    finally:
        first.close()
    with joinstate.StateStore(path) as second:  # close() released the lock
        join = second.join("j", left=LEFT, right=RIGHT)
        assert join.stats()["left"]["rows"] == 5 + 2


def test_close_and_reopen_repeatedly(tmp_path: Path) -> None:
    for i in range(5):
        with joinstate.StateStore(tmp_path) as store:
            join = store.join("j", left=LEFT, right=RIGHT)
            join.push("left", left_delta([(i, str(i))]))
            for side in ("left", "right"):  # iterators and CF objects are created here
                join.state(side)
            join.stats()
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        assert zset(join.state("left")) == Counter({(i, str(i)): 1 for i in range(5)})


# --------------------------------------------------------------------------- commits, phase


def test_commit_id_applies_once_and_survives_reopen(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        join.push("right", right_delta(RIGHT_ROWS))
        assert not join.committed("x")
        first = join.push("left", left_delta([(1, "a"), (3, "c")]), commit_id="x")
        assert zset(first) == Counter({(1, "a", 1, "x"): 1, (3, "c", 3, "z"): 1})
        assert join.committed("x") and not join.committed("y")
        second = join.push("left", left_delta([(1, "a"), (3, "c")]), commit_id="x")
        assert second.schema == first.schema
        assert zset(second) == zset(first)
        assert zset(join.state("left")) == Counter({(1, "a"): 1, (3, "c"): 1})
        assert join.stats()["left"]["rows"] == 2
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        assert join.committed("x")
        # A retry after a restart with the same change returns the recorded output; the
        # same id with a different change is a conflict and applies nothing.
        third = join.push("left", left_delta([(3, "c"), (1, "a")]), commit_id="x")
        assert zset(third) == zset(first)
        with pytest.raises(joinstate.CommitConflictError, match="'x'"):
            join.push("left", left_delta([(1, "zzz")]), commit_id="x")
        with pytest.raises(joinstate.CommitConflictError, match="'x'"):
            join.push("right", right_delta([(1, "a")]), commit_id="x")
        assert zset(join.state("left")) == Counter({(1, "a"): 1, (3, "c"): 1})
        # Another id applies.
        out = join.push("left", left_delta([(1, "a")]), commit_id="y")
        assert zset(out) == Counter({(1, "a", 1, "x"): 1})
        assert zset(join.state("left")) == Counter({(1, "a"): 2, (3, "c"): 1})
        # Forgetting ids makes them apply again.
        assert join.forget_commits(keep=lambda cid: cid == "y") == 1
        assert not join.committed("x") and join.committed("y")
        join.push("left", left_delta([(3, "c")], [-1]), commit_id="x")
        assert zset(join.state("left")) == Counter({(1, "a"): 2})


def test_failed_push_with_commit_id_is_not_recorded(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        with pytest.raises(joinstate.OverRetractionError):
            join.push("left", left_delta([(1, "a")], [-1]), commit_id="c1")
        assert not join.committed("c1")
        join.push("left", left_delta([(1, "a")]), commit_id="c1")
        assert zset(join.state("left")) == Counter({(1, "a"): 1})


def test_phase_defaults_to_population_and_persists(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        other = store.join("other", left=LEFT, right=RIGHT)
        assert join.phase == "population"
        join.set_phase("live")
        assert join.phase == "live"
        assert other.phase == "population"
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        assert join.phase == "live"
        assert store.join("other", left=LEFT, right=RIGHT).phase == "population"
        join.set_phase("population")
    with joinstate.StateStore(tmp_path) as store:
        assert store.join("j", left=LEFT, right=RIGHT).phase == "population"


# --------------------------------------------------------------------------- recreate_empty


def test_recreate_empty_switches_memtable_of_an_empty_index(tmp_path: Path) -> None:
    options = joinstate.StoreOptions(probe_cache_max_rows=0)  # probe RocksDB, not a cache
    hash_skip = joinstate.IndexOptions(memtable="hash_skip_list", hash_bucket_count=1024)
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        for side in ("left", "right"):
            store.recreate_empty(join.index(side).column_family, hash_skip)
        store.recreate_empty(join.index("left").data_column_families[1], hash_skip)
        n = 400
        join.push("left", left_delta([(i % 100, f"v{i}") for i in range(n)]))
        join.push("right", right_delta([(i, f"r{i}") for i in range(0, 200, 2)]))
        out = join.push("left", left_delta([(4, "new"), (5, "odd"), (None, "null")]))
        assert zset(out) == Counter({(4, "new", 4, "r4"): 1})
        out = join.push("right", right_delta([(7, "r7"), (151, "r151")]))
        assert zset(out) == Counter({(7, f"v{i}", 7, "r7"): 1 for i in range(7, n, 100)})
        assert join.state("left").num_rows == n + 3
        assert zset(join.state("right"))[(151, "r151")] == 1
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        assert join.state("left").num_rows == n + 3
        out = join.push("left", left_delta([(151, "late")]))
        assert zset(out) == Counter({(151, "late", 151, "r151"): 1})


@pytest.mark.parametrize("flushed", [False, True], ids=["memtable", "flushed"])
@pytest.mark.parametrize("memtable", ["skiplist", "vector", "hash_skip_list", "hash_link_list"])
def test_recreate_empty_refuses_a_non_empty_index(
    tmp_path: Path, memtable: str, flushed: bool
) -> None:
    """Whatever memtable the index has, data in it (flushed or not) is never dropped."""
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        for idx in (join.index("left"), join.index("right")):
            store.recreate_empty(idx.column_family, joinstate.IndexOptions(memtable=memtable))  # type: ignore[arg-type]
        populate(join)
        join.push("left", left_delta([(2, "c")], [-1]))  # a delete does not empty the index
        if flushed:
            store.flush()
        for cf in (join.index("left").column_family, join.index("right").column_family,
                   join.index("left").data_column_families[1]):
            with pytest.raises(joinstate.JoinStateError) as info:
                store.recreate_empty(cf, joinstate.IndexOptions(memtable="vector"))
            assert repr(cf) in str(info.value)
            del info
        want = EXPECTED_LEFT - Counter({(2, "c"): 1})
        assert zset(join.state("left")) == want
        assert zset(join.state("right")) == EXPECTED_RIGHT


# --------------------------------------------------------------------------- stats


PROPERTY_NAMES = ("num-files-at-level0", "estimate-num-keys", "total-sst-files-size",
                  "cur-size-all-mem-tables")


@pytest.mark.parametrize("how", ["inner", "left", "right", "full", "left_anti"])
@pytest.mark.parametrize("right_unique", [None, ["k"], ["r"]], ids=["bag", "key", "unique"])
def test_stats_count_what_was_pushed(
    tmp_path: Path, how: str, right_unique: list[str] | None
) -> None:
    right = joinstate.Side(RIGHT_SCHEMA, key=["k"], unique_key=right_unique)
    left_rows = [(1, "a"), (1, "b"), (2, "c"), (None, "n1"), (None, "n2"), (7, "d")]
    left_w = [1, 3, 2, 1, 2, 1]
    right_rows = [(1, "x"), (2, "y"), (4, "z"), (None, "rn"), (9, "w")]
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=right, how=how)  # type: ignore[arg-type]
        join.push("left", left_delta(left_rows, left_w))
        join.push("right", right_delta(right_rows))
        # Retract key 7 entirely on the left and key 9 on the right, half of (1, "b").
        join.push("left", left_delta([(7, "d"), (1, "b")], [-1, -2]))
        join.push("right", right_delta([(9, "w")], [-1]))
        stats = join.stats()
        assert stats["join"] == "j" and stats["how"] == how
        left, right_stats = stats["left"], stats["right"]
        assert left["layout"] == "bag"
        assert right_stats["layout"] == right.layout
        assert left["rows"] == 1 + 1 + 2 + 1 + 2
        assert left["null_key_rows"] == 3
        assert left["distinct_keys"] == 2  # keys 1 and 2; 7 was retracted
        assert right_stats["rows"] == 4
        assert right_stats["null_key_rows"] == 1
        assert right_stats["distinct_keys"] == 3  # 1, 2, 4
        if right.layout != "bag":
            assert right_stats["entries"] == 3
        assert left["entries"] >= 3  # (1,a), (1,b), (2,c): maybe more unconsolidated entries
        for label, side_stats in (("left", left), ("right", right_stats)):
            idx = join.index(label)  # type: ignore[arg-type]
            assert set(side_stats["rocksdb"]) == set(idx.column_families)
            assert set(idx.data_column_families) <= set(side_stats["rocksdb"])
            for props in side_stats["rocksdb"].values():
                for name in PROPERTY_NAMES:
                    assert name in props
                    assert props[name] is None or isinstance(props[name], int)
            assert isinstance(side_stats["bytes"], int) and side_stats["bytes"] > 0
            assert side_stats["rocksdb"][idx.column_family]["estimate-num-keys"] >= 1
        store.flush()
        flushed = join.stats()
        for label in ("left", "right"):
            idx = join.index(label)  # type: ignore[arg-type]
            assert flushed[label]["rocksdb"][idx.column_family]["total-sst-files-size"] > 0
            for field in ("rows", "null_key_rows", "distinct_keys", "entries"):
                assert flushed[label][field] == stats[label][field]
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=right, how=how)  # type: ignore[arg-type]
        again = join.stats()
        for label in ("left", "right"):
            for field in ("rows", "null_key_rows", "distinct_keys", "entries"):
                assert again[label][field] == stats[label][field], (label, field)


def test_stats_of_an_empty_join(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        stats = store.join("j", left=LEFT, right=RIGHT).stats()
        for label in ("left", "right"):
            for field in ("rows", "null_key_rows", "entries", "distinct_keys"):
                assert stats[label][field] == 0, (label, field)


def test_statistics_dump(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        populate(store.join("j", left=LEFT, right=RIGHT))
        dump = store.statistics()
        assert dump is not None and "rocksdb." in dump
    with joinstate.StateStore(tmp_path, joinstate.StoreOptions(statistics=False)) as store:
        assert store.statistics() is None


@pytest.fixture
def populated(tmp_path: Path) -> Iterator[joinstate.Join]:
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=LEFT, right=RIGHT)
        populate(join)
        yield join


def test_stats_distinct_keys_follow_int_width_equality(populated: joinstate.Join) -> None:
    """Left keys are int16, right keys int64: key 1 on both sides is one key per side."""
    populated.push("left", left_delta([(1, "again"), (3, "new")]))
    stats = populated.stats()
    assert stats["left"]["distinct_keys"] == 3  # 1, 2, 3
    assert stats["right"]["distinct_keys"] == 2  # 1, 3
    assert stats["left"]["rows"] == 5 + 2


# --------------------------------------------------------------------------- read-only


def _ro_join(store: joinstate.StateStore) -> joinstate.Join:
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    return store.join("ro", left=joinstate.Side(schema, ["k"], ["k"]),
                      right=joinstate.Side(schema, ["k"]), how="left")


def test_read_only_store_reads_while_a_writer_holds_the_lock(tmp_path: Path) -> None:
    """Inspection of a live store: no LOCK taken, the writer's committed pushes visible."""
    path = tmp_path / "s"
    with joinstate.StateStore(path) as writer:
        join = _ro_join(writer)
        join.push("left", pa.table({"k": [1, 2], "v": ["a", "b"]}))
        first = join.push("right", pa.table({"k": [1, 1], "v": ["x", "y"]}), commit_id="c1")
        with joinstate.StateStore(path, read_only=True) as reader:
            seen = _ro_join(reader)
            assert seen.state("left").equals(join.state("left"))
            assert seen.state("right").equals(join.state("right"))
            assert seen.stats()["right"]["rows"] == 2
            assert seen.committed("c1")
            # An exactly-once replay needs no write, so it works read-only too.
            assert seen.push("right", pa.table({"k": [1, 1], "v": ["x", "y"]}),
                             commit_id="c1").equals(first)
            for attempt in (
                lambda: seen.push("left", pa.table({"k": [3], "v": ["c"]})),
                lambda: seen.set_phase("live"),
                lambda: seen.forget_commits(),
            ):
                with pytest.raises(joinstate.StateReadOnlyError, match="read-only") as info:
                    attempt()
                assert str(path) in str(info.value)
                assert isinstance(info.value, PermissionError)
        # The writer is unaffected and keeps writing.
        join.push("left", pa.table({"k": [3], "v": ["c"]}))
        assert join.rows("left") == 3


def test_read_only_refuses_what_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(joinstate.NotAStateStoreError, match="read-only"):
        joinstate.StateStore(tmp_path / "nothing", read_only=True)
    with joinstate.StateStore(tmp_path / "s") as store:
        _ro_join(store)
    with joinstate.StateStore(tmp_path / "s", read_only=True) as reader:
        schema = pa.schema([("k", pa.int64())])
        with pytest.raises(joinstate.JoinSpecMismatchError, match=r"'other'.*'ro'"):
            reader.join("other", left=joinstate.Side(schema, ["k"]),
                        right=joinstate.Side(schema, ["k"]))
