"""Every deliberate error of the public API: its type, its message, and that it changes nothing.

A caller catches the whole family with ``except joinstate.JoinStateError``, and the
message must name the culprit (the column, option or value) so a schema drift upstream
can be fixed from the log line alone.  For failures inside a push, the contract is
stronger: the batch is atomic, so after an :class:`~joinstate.OverRetractionError`,
:class:`~joinstate.UniqueKeyViolationError` or a schema error, *nothing* of the batch (not
even its legal rows) may show in ``join.state`` or in the output of later pushes.

That is checked by running every failing scenario twice: once with the failing batch and
once on a twin store that never saw it.  Both must then give the same state, the same
output for later pushes into either side (which would differ if a legal insert, a legal
retraction or a degree change of the failed batch had leaked), and the same state after a
reopen from disk.  This covers every storage layout (``key``: unique key = join key;
``unique``: unique key not in the join key; ``bag``: no unique key), NULL-key rows, and
join types that keep degree counters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import joinstate
from joinstate.testing import zset

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

W = joinstate.WEIGHT
Row = tuple[Any, ...]

TESTED = pa.schema([("k", pa.int64()), ("id", pa.int64()), ("n", pa.int16()),
                    ("v", pa.string())])
OTHER_SCHEMA = pa.schema([("k", pa.int64()), ("o", pa.string())])
OTHER = joinstate.Side(OTHER_SCHEMA, key=["k"])

LAYOUTS: dict[str, joinstate.Side] = {
    "key": joinstate.Side(TESTED, key=["k"], unique_key=["k"]),
    "unique": joinstate.Side(TESTED, key=["k"], unique_key=["id"]),
    "bag": joinstate.Side(TESTED, key=["k"]),
}

# (k, id, n, v): keys 1 and 2 plus a NULL-key row.
SEED: list[Row] = [(1, 1, 10, "a"), (2, 2, 20, "b"), (None, 3, 30, "n")]
OTHER_SEED: list[Row] = [(1, "o1"), (2, "o2"), (7, "o7"), (None, "onull")]


def delta(schema: pa.Schema, rows: list[Row], weights: list[int] | None = None) -> pa.Table:
    cols = {f.name: pa.array([r[i] for r in rows], f.type) for i, f in enumerate(schema)}
    if weights is not None:
        cols[W] = pa.array(weights, pa.int64())
    return pa.table(cols)


def snapshot(join: joinstate.Join) -> tuple[Counter[Row], Counter[Row]]:
    return zset(join.state("left")), zset(join.state("right"))


def check_error(exc: BaseException, kind: type[Exception], *culprits: str) -> None:
    assert isinstance(exc, kind), repr(exc)
    assert isinstance(exc, joinstate.JoinStateError)
    msg = str(exc)
    for c in culprits:
        assert c in msg, f"{c!r} not named in: {msg}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[joinstate.StateStore]:
    with joinstate.StateStore(tmp_path / "store") as s:
        yield s


# --------------------------------------------------------------------------- atomicity


@dataclass
class Scenario:
    """A tested side in one layout, on the left or the right of a join of type ``how``."""

    layout: str
    tested: str  # "left" or "right"
    how: str

    @property
    def other(self) -> str:
        return "right" if self.tested == "left" else "left"

    def open(self, path: Path) -> tuple[joinstate.StateStore, joinstate.Join]:
        store = joinstate.StateStore(path)
        side = LAYOUTS[self.layout]
        sides = {self.tested: side, self.other: OTHER}
        join = store.join("j", left=sides["left"], right=sides["right"], how=self.how)  # type: ignore[arg-type]
        return store, join

    def seed(self, join: joinstate.Join) -> None:
        join.push(self.tested, delta(TESTED, SEED))  # type: ignore[arg-type]
        join.push(self.other, delta(OTHER_SCHEMA, OTHER_SEED))  # type: ignore[arg-type]

    def follow_up(self, join: joinstate.Join) -> list[Counter[Row]]:
        """Later pushes whose outputs reveal any leaked part of the failed batches.

        Re-inserting key 7 and re-retracting row 2 would raise if the failed batch's
        legal insert or retraction had been applied; the other-side pushes probe keys 1,
        2, 7 and 5 (and retract an other-side row, which emits degree transitions).
        """
        outs = [zset(join.push(self.other, delta(  # type: ignore[arg-type]
            OTHER_SCHEMA, [(1, "p1"), (2, "p2"), (7, "p7"), (5, "p5"), (None, "pn")])))]
        outs.append(zset(join.push(self.tested, delta(  # type: ignore[arg-type]
            TESTED, [(7, 7, 70, "new"), (2, 2, 20, "b")], [1, -1]))))
        outs.append(zset(join.push(self.other, delta(  # type: ignore[arg-type]
            OTHER_SCHEMA, [(2, "o2"), (7, "o7")], [-1, -1]))))
        return outs


SCENARIOS = [
    Scenario(layout, tested, how)
    for layout, tested in (("key", "left"), ("unique", "right"), ("bag", "left"),
                           ("bag", "right"))
    for how in ("inner", "full")
]

# The legal part of every failing batch: a new key, a retraction of a present row.
LEGAL: list[tuple[Row, int]] = [((7, 7, 70, "new"), 1), ((2, 2, 20, "b"), -1)]


def assert_batch_left_no_trace(
    tmp_path: Path, sc: Scenario, bad: list[tuple[Row, int]],
    kind: type[joinstate.JoinStateError], *culprits: str,
) -> None:
    """Push LEGAL + ``bad`` (expecting ``kind``) and compare everything with a twin store."""
    failing = LEGAL + bad
    store, join = sc.open(tmp_path / "failed")
    twin_store, twin = sc.open(tmp_path / "twin")
    try:
        for j in (join, twin):
            sc.seed(j)
        before = snapshot(join)
        with pytest.raises(joinstate.JoinStateError) as info:
            join.push(sc.tested, delta(  # type: ignore[arg-type]
                TESTED, [r for r, _ in failing], [w for _, w in failing]))
        check_error(info.value, kind, *culprits)
        # Drop the traceback: its frames may pin RocksDB objects, which is tested on its
        # own (test_close_releases_the_lock_while_a_push_error_is_kept).
        del info
        assert snapshot(join) == before == snapshot(twin)
        assert join.stats()[sc.tested]["rows"] == twin.stats()[sc.tested]["rows"]
        assert sc.follow_up(join) == sc.follow_up(twin)
        after = snapshot(join)
        assert after == snapshot(twin)
    finally:
        store.close()
        twin_store.close()
    store, join = sc.open(tmp_path / "failed")
    with store:
        assert snapshot(join) == after


OVER_RETRACTIONS: dict[str, list[tuple[Row, int]]] = {
    "absent_row": [((5, 5, 50, "zz"), -1)],
    "present_once_retracted_twice": [((1, 1, 10, "a"), -2)],
    "same_key_other_values": [((1, 1, 10, "DIFFERENT"), -1)],
    "null_key_absent": [((None, 9, 90, "q"), -1)],
    "null_key_present_once_retracted_twice": [((None, 3, 30, "n"), -2)],
}


@pytest.mark.parametrize("case", list(OVER_RETRACTIONS))
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: f"{s.layout}-{s.tested}-{s.how}")
def test_over_retraction_applies_nothing(tmp_path: Path, sc: Scenario, case: str) -> None:
    assert_batch_left_no_trace(
        tmp_path, sc, OVER_RETRACTIONS[case], joinstate.OverRetractionError, "'k'"
    )


def test_over_retraction_is_a_value_error(store: joinstate.StateStore) -> None:
    join = store.join("j", left=LAYOUTS["bag"], right=OTHER)
    with pytest.raises(ValueError, match="multiplicity"):
        join.push("left", delta(TESTED, [(1, 1, 1, "x")], [-1]))


UNIQUE_VIOLATIONS: dict[str, list[tuple[Row, int]]] = {
    # key layout: a second row under join key 1; unique layout: same k and id, other v.
    "second_row_for_existing_key": [((1, 1, 11, "other"), 1)],
    "weight_two": [((8, 8, 80, "twice"), 2)],
    "two_new_rows_one_key": [((8, 8, 80, "x"), 1), ((8, 8, 81, "y"), 1)],
    "existing_row_inserted_again": [((1, 1, 10, "a"), 1)],
}


@pytest.mark.parametrize("case", list(UNIQUE_VIOLATIONS))
@pytest.mark.parametrize(
    "sc", [s for s in SCENARIOS if s.layout != "bag"],
    ids=lambda s: f"{s.layout}-{s.tested}-{s.how}",
)
def test_unique_key_violation_applies_nothing(tmp_path: Path, sc: Scenario, case: str) -> None:
    column = "'k'" if sc.layout == "key" else "'id'"
    assert_batch_left_no_trace(
        tmp_path, sc, UNIQUE_VIOLATIONS[case], joinstate.UniqueKeyViolationError, column
    )


IN_BATCH_CROSS_KEY_DUPLICATES: dict[str, list[tuple[Row, int]]] = {
    "two_rows_one_id_two_keys_in_one_batch": [((5, 8, 80, "x"), 1), ((6, 8, 80, "x"), 1)],
    "one_id_under_a_key_and_a_null_key": [((None, 8, 80, "x"), 1), ((5, 8, 81, "y"), 1)],
}


@pytest.mark.parametrize("case", list(IN_BATCH_CROSS_KEY_DUPLICATES))
def test_unique_key_violation_across_join_keys_in_one_batch(tmp_path: Path, case: str) -> None:
    """Inside one batch a unique key not contained in the join key is checked across keys.

    The batch is at hand, so the check is a vectorised group-by and costs no read.
    """
    assert_batch_left_no_trace(
        tmp_path, Scenario("unique", "right", "inner"), IN_BATCH_CROSS_KEY_DUPLICATES[case],
        joinstate.UniqueKeyViolationError, "'id'",
    )


CROSS_BATCH_DUPLICATES: dict[str, list[tuple[Row, int]]] = {
    # id 1 is stored under join key 1; the same id under join key 5.
    "existing_id_under_another_key": [((5, 1, 10, "a"), 1)],
    # id 3 is stored with a NULL join key (in the .nulls family).
    "existing_null_key_id_under_a_key": [((5, 3, 30, "n"), 1)],
    "existing_id_again_with_null_key": [((None, 1, 10, "a"), 1)],
}


@pytest.mark.parametrize("case", list(CROSS_BATCH_DUPLICATES))
def test_cross_batch_duplicate_under_another_join_key_keeps_bag_semantics(
    tmp_path: Path, case: str
) -> None:
    """Documented limit (``Side`` docstring): across batches, a unique key re-used under
    *another* join key is not detected, since that needs a second index and a read per
    insert.  What must still hold is the join's invariant: the rows are kept as a bag and
    the output equals the join of the summed inputs.
    """
    sc = Scenario("unique", "right", "inner")
    store, join = sc.open(tmp_path / "s")
    with store:
        sc.seed(join)
        before = zset(join.state("right"))
        rows = CROSS_BATCH_DUPLICATES[case]
        join.push("right", delta(TESTED, [r for r, _ in rows], [w for _, w in rows]))
        expected = before.copy()
        for r, w in rows:
            expected[r] += w
        assert zset(join.state("right")) == expected
        # A left push probing key 5 sees exactly the rows stored under 5.
        out = zset(join.push("left", delta(OTHER_SCHEMA, [(5, "p5")])))
        stored_under_5 = sum(w for r, w in expected.items() if r[0] == 5)
        assert sum(out.values()) == stored_under_5


@pytest.mark.parametrize("layout", ["key", "unique"])
def test_update_in_one_batch_is_not_a_violation(store: joinstate.StateStore, layout: str) -> None:
    """The legal counterpart: retract the old row and insert the new one together."""
    join = store.join("j", left=LAYOUTS[layout], right=OTHER)
    join.push("left", delta(TESTED, SEED))
    join.push("left", delta(TESTED, [(1, 1, 10, "a"), (1, 1, 11, "new")], [-1, 1]))
    assert zset(join.state("left")) == Counter(
        {(1, 1, 11, "new"): 1, (2, 2, 20, "b"): 1, (None, 3, 30, "n"): 1}
    )


def test_null_in_unique_key_outside_join_key_applies_nothing(tmp_path: Path) -> None:
    sc = Scenario("unique", "right", "full")
    assert_batch_left_no_trace(
        tmp_path, sc, [((4, None, 40, "no id"), 1)], joinstate.SchemaMismatchError, "'id'"
    )


def test_null_unique_key_inside_join_key_is_accepted(store: joinstate.StateStore) -> None:
    """With unique key == join key, a NULL key is a non-matching row, not an error."""
    join = store.join("j", left=LAYOUTS["key"], right=OTHER)
    join.push("left", delta(TESTED, [(None, 1, 1, "x"), (None, 2, 2, "y")]))
    assert join.stats()["left"]["null_key_rows"] == 2
    assert join.push("right", delta(OTHER_SCHEMA, [(None, "z")])).num_rows == 0


# --------------------------------------------------------------------------- delta schema


def pushed_left(store: joinstate.StateStore, table: pa.Table) -> BaseException:
    """Push ``table`` into a fresh join's left side, expect a failure, check no trace."""
    join = store.join("j", left=LAYOUTS["bag"], right=OTHER)
    join.push("left", delta(TESTED, [(1, 1, 1, "seed")]))
    before = snapshot(join)
    with pytest.raises(joinstate.JoinStateError) as info:
        join.push("left", table)
    assert snapshot(join) == before
    return info.value


GOOD = {"k": pa.array([1, 2], pa.int64()), "id": pa.array([1, 2], pa.int64()),
        "n": pa.array([1, 2], pa.int16()), "v": pa.array(["x", "y"])}


def good_with(**changes: Any) -> pa.Table:
    cols = {**GOOD, **changes}
    return pa.table({k: v for k, v in cols.items() if v is not None})


BAD_DELTAS: dict[str, tuple[Callable[[], pa.Table], tuple[str, ...]]] = {
    "missing_column": (lambda: good_with(v=None), ("'v'", "missing")),
    "unknown_column": (lambda: good_with(extra=pa.array([1, 2])), ("'extra'",)),
    "string_into_int64": (lambda: good_with(k=pa.array(["1", "2"])), ("'k'", "string")),
    "float_into_int": (lambda: good_with(n=pa.array([1.0, 2.0])), ("'n'", "double")),
    "float_into_int64_key": (lambda: good_with(k=pa.array([1.0, 2.0])), ("'k'",)),
    "int64_overflowing_int16": (
        lambda: good_with(n=pa.array([1, 40_000], pa.int64())), ("'n'", "40000")),
    "negative_overflowing_int16": (
        lambda: good_with(n=pa.array([-32_769, 0], pa.int64())), ("'n'",)),
    "uint64_overflowing_int64": (
        lambda: good_with(k=pa.array([1, 2**63], pa.uint64())), ("'k'", "int64")),
    "int_into_string": (lambda: good_with(v=pa.array([1, 2])), ("'v'",)),
    "weight_float": (lambda: good_with(_weight=pa.array([1.0, 1.0])), ("'_weight'",)),
    "weight_null": (lambda: good_with(_weight=pa.array([1, None], pa.int64())), ("'_weight'",)),
    "weight_uint64": (lambda: good_with(_weight=pa.array([1, 1], pa.uint64())), ("'_weight'",)),
    "weight_string": (lambda: good_with(_weight=pa.array(["1", "1"])), ("'_weight'",)),
    "duplicate_columns": (
        lambda: pa.Table.from_arrays([*GOOD.values(), pa.array(["z", "w"])],
                                     names=[*GOOD, "v"]), ("'v'", "duplicate")),
    "not_a_table": (lambda: {"k": [1]}, ("dict",)),
}


@pytest.mark.parametrize("case", list(BAD_DELTAS))
def test_bad_delta_is_rejected_naming_the_column(store: joinstate.StateStore, case: str) -> None:
    make, culprits = BAD_DELTAS[case]
    exc = pushed_left(store, make())
    check_error(exc, joinstate.SchemaMismatchError, "left", *culprits)
    assert isinstance(exc, ValueError)


def test_declared_not_null_column_rejects_nulls(store: joinstate.StateStore) -> None:
    schema = pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.string(), nullable=False)])
    join = store.join("j", left=joinstate.Side(schema, key=["k"]), right=OTHER)
    with pytest.raises(joinstate.SchemaMismatchError) as info:
        join.push("left", pa.table({"k": [1, 2], "v": ["a", None]}))
    check_error(info.value, joinstate.SchemaMismatchError, "'v'", "not-null")
    assert join.state("left").num_rows == 0


def test_safe_casts_are_accepted(store: joinstate.StateStore) -> None:
    """int32 into int64, int64 literals that fit into int16, string into large_string ..."""
    join = store.join("j", left=LAYOUTS["bag"], right=OTHER)
    join.push("left", pa.table({
        "k": pa.array([1, 2], pa.int32()), "id": pa.array([1, 2], pa.uint8()),
        "n": pa.array([-32_768, 32_767], pa.int64()),
        "v": pa.array(["x", "y"], pa.large_string()),
        W: pa.array([1, 2], pa.int8()),
    }))
    join.push("left", pa.table({
        "v": pa.array(["x"]).dictionary_encode(), "n": pa.array([5], pa.int8()),
        "id": pa.array([3], pa.int16()), "k": pa.array([None], pa.int64()),
    }))  # any column order, dictionary-encoded strings, no _weight column
    state = join.state("left")
    assert state.schema.field("k").type == pa.int64()
    assert state.schema.field("n").type == pa.int16()
    assert zset(state) == Counter(
        {(1, 1, -32_768, "x"): 1, (2, 2, 32_767, "y"): 2, (None, 3, 5, "x"): 1}
    )


def test_timestamp_zones_cast_by_instant_but_naive_is_rejected(
    store: joinstate.StateStore,
) -> None:
    """A tz-aware value in another zone is the same instant (exact cast); a naive one is not."""
    schema = pa.schema([("k", pa.int64()), ("t", pa.timestamp("us", tz="UTC"))])
    join = store.join("j", left=joinstate.Side(schema, key=["k"]), right=OTHER)
    join.push("left", pa.table({
        "k": [1], "t": pa.array([1_500_000], pa.timestamp("ms", tz="Asia/Kolkata"))}))
    state = join.state("left")
    assert state.schema.field("t").type == pa.timestamp("us", tz="UTC")
    assert state.column("t").cast(pa.int64()).to_pylist() == [1_500_000_000]
    with pytest.raises(joinstate.SchemaMismatchError) as info:
        join.push("left", pa.table({"k": [2], "t": pa.array([1], pa.timestamp("us"))}))
    check_error(info.value, joinstate.SchemaMismatchError, "'t'")
    # ns into us: allowed only while no digit is lost (Arrow's value-checked cast).
    join.push("left", pa.table({
        "k": [3], "t": pa.array([2_000_000_000], pa.timestamp("ns", tz="UTC"))}))
    with pytest.raises(joinstate.SchemaMismatchError) as info:
        join.push("left", pa.table({
            "k": [4], "t": pa.array([2_000_000_001], pa.timestamp("ns", tz="UTC"))}))
    check_error(info.value, joinstate.SchemaMismatchError, "'t'")
    assert sorted(join.state("left").column("k").to_pylist()) == [1, 3]


# --------------------------------------------------------------------------- join spec


def test_reserved_weight_column_in_side(store: joinstate.StateStore) -> None:
    side = joinstate.Side(pa.schema([("k", pa.int64()), (W, pa.int64())]), key=["k"])
    for left, right, label in ((side, OTHER, "left"), (OTHER, side, "right")):
        with pytest.raises(joinstate.JoinStateError) as info:
            store.join("j", left=left, right=right)
        check_error(info.value, joinstate.SchemaMismatchError, "'_weight'", label)
    assert store.joins() == []


BAD_SIDES: dict[str, tuple[Callable[[], joinstate.Side], tuple[str, ...]]] = {
    "key_unknown": (lambda: joinstate.Side(TESTED, key=["nope"]), ("'nope'",)),
    "key_one_unknown": (lambda: joinstate.Side(TESTED, key=["k", "kk"]), ("'kk'",)),
    "key_empty": (lambda: joinstate.Side(TESTED, key=[]), ("key",)),
    "key_twice": (lambda: joinstate.Side(TESTED, key=["k", "k"]), ("'k'",)),
    "unique_key_unknown": (
        lambda: joinstate.Side(TESTED, key=["k"], unique_key=["uid"]), ("'uid'", "unique_key")),
    "unique_key_empty": (lambda: joinstate.Side(TESTED, key=["k"], unique_key=[]),
                         ("unique_key",)),
    "duplicate_schema_names": (
        lambda: joinstate.Side(pa.schema([("k", pa.int64()), ("v", pa.int8()),
                                          ("v", pa.string())]), key=["k"]), ("'v'", "duplicate")),
    "schema_not_a_schema": (lambda: joinstate.Side({"k": pa.int64()}, key=["k"]),
                            ("pyarrow.Schema", "dict")),
}


@pytest.mark.parametrize("case", list(BAD_SIDES))
def test_bad_side_declaration(case: str) -> None:
    make, culprits = BAD_SIDES[case]
    with pytest.raises(joinstate.JoinStateError) as info:
        make()
    check_error(info.value, joinstate.SchemaMismatchError, *culprits)


UNSUPPORTED = [pa.list_(pa.int64()), pa.struct([("a", pa.int64())]), pa.float16(),
               pa.dictionary(pa.int32(), pa.string()), pa.map_(pa.string(), pa.int64()),
               pa.decimal256(40, 2), pa.null()]


@pytest.mark.parametrize("type_", UNSUPPORTED, ids=str)
@pytest.mark.parametrize("label", ["left", "right"])
def test_unsupported_column_type(store: joinstate.StateStore, type_: pa.DataType,
                                 label: str) -> None:
    side = joinstate.Side(pa.schema([("k", pa.int64()), ("odd", type_)]), key=["k"])
    sides = {"left": OTHER, "right": OTHER, label: side}
    with pytest.raises(joinstate.JoinStateError) as info:
        store.join("j", left=sides["left"], right=sides["right"])
    check_error(info.value, joinstate.SchemaMismatchError, "'odd'", label)
    assert store.joins() == []


@pytest.mark.parametrize("how", ["cross", "outer", "", "INNER"])
def test_bad_how(store: joinstate.StateStore, how: str) -> None:
    with pytest.raises(joinstate.JoinStateError) as info:
        store.join("j", left=OTHER, right=OTHER, how=how)  # type: ignore[arg-type]
    check_error(info.value, joinstate.SchemaMismatchError, "how", repr(how))


@pytest.mark.parametrize("suffixes", [("_l",), ("a", "b", "c"), ("a", 1), "ab", None])
def test_bad_suffixes(store: joinstate.StateStore, suffixes: Any) -> None:
    with pytest.raises(joinstate.JoinStateError) as info:
        store.join("j", left=OTHER, right=OTHER, suffixes=suffixes)
    check_error(info.value, joinstate.SchemaMismatchError, "suffixes", repr(suffixes))


COLLISIONS: list[tuple[list[str], list[str], tuple[str, str], str]] = [
    (["k", "o"], ["k", "o"], ("", ""), "'k'"),
    (["k", "a"], ["k", "a", "a_right"], ("", "_right"), "'a_right'"),
    (["k", "k_l"], ["k"], ("_l", "_r"), "'k_l'"),
    (["k", "x_l"], ["k", "x"], ("_l", "_r"), ""),  # legal: k_l, x_l, k_r, x are distinct
    (["k", "_weigh"], ["k", "_weigh"], ("t", "_r"), "'_weight'"),
]


@pytest.mark.parametrize(("lnames", "rnames", "suffixes", "culprit"), COLLISIONS)
def test_colliding_output_names(
    store: joinstate.StateStore, lnames: list[str], rnames: list[str],
    suffixes: tuple[str, str], culprit: str,
) -> None:
    left = joinstate.Side(pa.schema([(n, pa.int64()) for n in lnames]), key=["k"])
    right = joinstate.Side(pa.schema([(n, pa.int64()) for n in rnames]), key=["k"])
    out_l = [n + suffixes[0] if n in rnames else n for n in lnames]
    out_r = [n + suffixes[1] if n in lnames else n for n in rnames]
    names = out_l + out_r
    if len(set(names)) == len(names) and W not in names:
        join = store.join("j", left=left, right=right, suffixes=suffixes)  # legal: works
        assert join.push("left", pa.table({n: [1] for n in lnames})).schema.names == [*names, W]
        return
    with pytest.raises(joinstate.JoinStateError) as info:
        store.join("j", left=left, right=right, suffixes=suffixes)
    check_error(info.value, joinstate.SchemaMismatchError, culprit, repr(suffixes))


def test_semi_join_ignores_right_names(store: joinstate.StateStore) -> None:
    """left_semi/left_anti output only left columns: equal names cannot collide."""
    join = store.join("j", left=OTHER, right=OTHER, how="left_semi", suffixes=("", ""))
    assert join.output_schema.names == ["k", "o", W]


@pytest.mark.parametrize("name", ["", "a b", "x/y", "é", "a" * 129, 7])
def test_bad_join_name(store: joinstate.StateStore, name: Any) -> None:
    with pytest.raises(joinstate.JoinStateError) as info:
        store.join(name, left=OTHER, right=OTHER)
    check_error(info.value, joinstate.SchemaMismatchError, "join name", repr(name))


def test_side_must_be_a_side(store: joinstate.StateStore) -> None:
    with pytest.raises(joinstate.JoinStateError) as info:
        store.join("j", left=OTHER, right=OTHER_SCHEMA)
    check_error(info.value, joinstate.SchemaMismatchError, "right", "Schema")


def test_store_options_must_be_store_options(tmp_path: Path) -> None:
    with pytest.raises(joinstate.JoinStateError) as info:
        joinstate.StateStore(tmp_path, options={"wal": False})  # type: ignore[arg-type]
    check_error(info.value, joinstate.SchemaMismatchError, "options", "dict")


# --------------------------------------------------------------------------- calls


@pytest.mark.parametrize("side", ["middle", "LEFT", "", None])
def test_bad_side_name(store: joinstate.StateStore, side: Any) -> None:
    join = store.join("j", left=OTHER, right=OTHER)
    table = delta(OTHER_SCHEMA, [(1, "x")])
    for call in (lambda: join.push(side, table), lambda: join.state(side),
                 lambda: join.shard_of(side, table, 2), lambda: join.index(side)):
        with pytest.raises(joinstate.JoinStateError) as info:
            call()
        check_error(info.value, joinstate.SchemaMismatchError, "side", repr(side))
    assert snapshot(join) == (Counter(), Counter())


@pytest.mark.parametrize("commit_id", ["", 5, b"x"])
def test_bad_commit_id(store: joinstate.StateStore, commit_id: Any) -> None:
    join = store.join("j", left=OTHER, right=OTHER)
    with pytest.raises(joinstate.JoinStateError) as info:
        join.push("left", delta(OTHER_SCHEMA, [(1, "x")]), commit_id=commit_id)
    check_error(info.value, joinstate.SchemaMismatchError, "commit_id", repr(commit_id))
    assert join.state("left").num_rows == 0


def test_bad_phase(store: joinstate.StateStore) -> None:
    join = store.join("j", left=OTHER, right=OTHER)
    with pytest.raises(joinstate.JoinStateError) as info:
        join.set_phase("done")  # type: ignore[arg-type]
    check_error(info.value, joinstate.SchemaMismatchError, "phase", "'done'")
    assert join.phase == "population"


# --------------------------------------------------------------------------- closed


def test_join_after_close_raises_state_closed(tmp_path: Path) -> None:
    store = joinstate.StateStore(tmp_path)
    join = store.join("j", left=OTHER, right=OTHER)
    join.push("left", delta(OTHER_SCHEMA, [(1, "x")]))
    store.close()
    store.close()  # idempotent
    assert store.closed
    table = delta(OTHER_SCHEMA, [(1, "y")])
    calls: list[Callable[[], Any]] = [
        lambda: join.push("right", table), lambda: join.push("left", table, commit_id="c"),
        lambda: join.prepare("left", table), lambda: join.state("left"), join.stats,
        lambda: join.phase, lambda: join.set_phase("live"), lambda: join.committed("c"),
        join.forget_commits, lambda: store.join("j", left=OTHER, right=OTHER),
        lambda: store.join("other", left=OTHER, right=OTHER), store.joins,
        store.column_families,
    ]
    for call in calls:
        with pytest.raises(joinstate.JoinStateError) as info:
            call()
        check_error(info.value, joinstate.StateClosedError, "closed")
        assert isinstance(info.value, RuntimeError)
    # A new store on the same path works, and the old join stays closed.
    with joinstate.StateStore(tmp_path) as again:
        fresh = again.join("j", left=OTHER, right=OTHER)
        assert zset(fresh.state("left")) == Counter({(1, "x"): 1})
        with pytest.raises(joinstate.StateClosedError):
            join.push("right", table)


def test_join_after_with_block_raises_state_closed(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path) as store:
        join = store.join("j", left=OTHER, right=OTHER)
    with pytest.raises(joinstate.StateClosedError) as info:
        join.push("left", delta(OTHER_SCHEMA, [(1, "x")]))
    check_error(info.value, joinstate.StateClosedError, "'j'")


def test_error_hierarchy() -> None:
    """Every public error is a JoinStateError and the closest builtin."""
    value_errors = [joinstate.OptionsError, joinstate.SchemaMismatchError,
                    joinstate.JoinSpecMismatchError, joinstate.OverRetractionError,
                    joinstate.UniqueKeyViolationError]
    runtime_errors = [joinstate.StateLockedError, joinstate.StateClosedError,
                      joinstate.StateCorruptedError]
    for e in value_errors:
        assert issubclass(e, joinstate.JoinStateError) and issubclass(e, ValueError)
    for e in runtime_errors:
        assert issubclass(e, joinstate.JoinStateError) and issubclass(e, RuntimeError)


def test_close_releases_the_lock_while_a_push_error_is_kept(tmp_path: Path) -> None:
    """A caller may keep a failed push's exception (a retry wrapper, a logger, a task's error
    report) and then close and reopen the store: the exception's traceback must not keep
    RocksDB open (the store promises not to rely on garbage collection for that).
    """
    store = joinstate.StateStore(tmp_path)
    join = store.join("j", left=LAYOUTS["bag"], right=OTHER)
    join.push("left", delta(TESTED, SEED))
    kept: list[BaseException] = []
    for bad in OVER_RETRACTIONS.values():
        try:
            join.push("left", delta(TESTED, [r for r, _ in bad], [w for _, w in bad]))
        except joinstate.OverRetractionError as exc:
            kept.append(exc)
    assert len(kept) == len(OVER_RETRACTIONS)
    store.close()
    with joinstate.StateStore(tmp_path) as again:
        join = again.join("j", left=LAYOUTS["bag"], right=OTHER)
        assert zset(join.state("left")) == Counter({r: 1 for r in SEED})
