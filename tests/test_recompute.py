"""The recompute path of a change batch against the join's own push.

``population.recompute`` (driven through ``population.apply_batch``) must give exactly
what ``Join.push`` gives: the same output as a Z-set, listed consolidated; the same state
and counters; the same error class with nothing applied for a refused batch; the same
exactly-once behaviour for commit ids.  Two stores receive the same random change
streams (the differential suite's cases and batch generators: inserts, deletes,
duplicates, NULL keys, updates, illegal batches, a reopen halfway), one through
``push``, the other through ``apply_batch`` with a random mix of strategies, for every
``how``; the integrated output is also checked against the plain-Python oracle.

Also here: the core additions the path builds on (``Join.scan``, ``Join.apply(output=)``)
and the executor's API (``population.apply``/``apply_batch``: decisions, cost records,
pipelines).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from oracle import JOIN_TYPES, join_oracle, zset_add
from test_differential import CASES, JoinCase, SideCase, SideModel, build_delta, one_of

import joinstate
from joinstate.testing import zset
from planner.batch import recorded
from population.apply import apply, apply_batch
from population.errors import PopulationError
from population.recompute import recompute

if TYPE_CHECKING:
    from pathlib import Path

SIDES = ("left", "right")

FLOAT_KEYS = JoinCase(
    # Float keys: -0.0 joins 0.0 and NaN joins NaN (as in Spark), NULL never joins.
    name="float_keys",
    left=SideCase(
        schema=pa.schema([("f", pa.float64()), ("a", pa.string())]),
        key=("f",), values={"f": one_of(0.0, -0.0, math.nan, 1.5, None), "a": one_of("x", "y")},
    ),
    right=SideCase(
        schema=pa.schema([("g", pa.float32()), ("b", pa.int64())]),
        key=("g",), values={"g": one_of(0.0, -0.0, math.nan, 1.5, None), "b": one_of(1, 2, 3)},
    ),
)


def canonical(v: Any) -> Any:
    """A value as the join compares it: -0.0 is 0.0, every NaN is one NaN."""
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else v + 0.0
    return v


def distinct_rows(table: pa.Table, columns: list[str]) -> bool:
    rows = list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))
    return len({tuple(canonical(v) for v in r) for r in rows}) == len(rows)


class Twin:
    """Two stores fed the same batches: ``a`` through push, ``b`` through apply_batch."""

    def __init__(self, tmp: Path, case: JoinCase, how: str) -> None:
        self.tmp, self.case, self.how = tmp, case, how
        self.stores: dict[str, joinstate.StateStore] = {}
        self.joins: dict[str, joinstate.Join] = {}
        self.open()
        self.columns = [n for n in self.joins["a"].output_schema.names if n != "_weight"]
        self.models = {"left": SideModel(case.left), "right": SideModel(case.right)}
        self.output: Counter[tuple[Any, ...]] = Counter()

    def open(self) -> None:
        for name in ("a", "b"):
            store = joinstate.StateStore(self.tmp / name)
            self.stores[name] = store
            self.joins[name] = store.join("j", left=self.case.left.side(),
                                          right=self.case.right.side(), how=self.how)

    def close(self) -> None:
        for store in self.stores.values():
            store.close()

    def reopen(self) -> None:
        self.close()
        self.open()

    def push(self, rng: random.Random, side: str, entries: list[Any], strategy: str,
             legal: bool) -> None:
        case = self.case.left if side == "left" else self.case.right
        delta = build_delta(rng, case.schema, entries)
        errors: list[type[BaseException] | None] = []
        outs: list[pa.Table] = []
        for name in ("a", "b"):
            try:
                out = (self.joins[name].push(side, delta) if name == "a"  # type: ignore[arg-type]
                       else apply_batch(self.joins[name], side, delta,
                                        strategy=strategy).output)  # type: ignore[arg-type]
            except joinstate.JoinStateError as exc:
                errors.append(type(exc))
            else:
                errors.append(None)
                assert isinstance(out, pa.Table)
                outs.append(out)
        assert errors[0] is errors[1], f"push raised {errors[0]}, {strategy} raised {errors[1]}"
        if legal:
            assert errors[0] is None, f"a legal batch was refused: {errors[0]}"
        if errors[0] is not None:
            return
        a, b = outs
        assert b.schema == a.schema
        assert distinct_rows(b, self.columns), "the output lists a row twice"
        assert 0 not in b.column("_weight").to_pylist()
        assert zset(b, self.columns) == zset(a, self.columns), f"{strategy} output differs"
        self.models[side].apply(entries)
        self.output = zset_add(self.output, zset(b, self.columns))

    def check_state(self) -> None:
        a, b = self.joins["a"], self.joins["b"]
        for side in SIDES:
            names = (self.case.left if side == "left" else self.case.right).names
            assert zset(b.state(side), names) == zset(a.state(side), names), side
            ia, ib = a.index(side), b.index(side)  # type: ignore[arg-type]
            assert (ib.rows, ib.entries) == (ia.rows, ia.entries), side
        assert b.verify() == a.verify()

    def check_oracle(self) -> None:
        want = join_oracle(self.models["left"].state, self.models["right"].state,
                           self.case.left.key_idx, self.case.right.key_idx, self.how,
                           len(self.case.left.names), len(self.case.right.names))
        assert self.output == want


def run_stream(twin: Twin, rng: random.Random, steps: int) -> None:
    for step in range(steps):
        if step == steps // 2:
            twin.reopen()
        side = rng.choice(SIDES)
        strategy = rng.choice(("recompute",) * 6 + ("incremental",) * 2 + ("auto",) * 2)
        if rng.random() < 0.15:
            twin.push(rng, side, twin.models[side].illegal_batch(rng), strategy, legal=False)
        else:
            twin.push(rng, side, twin.models[side].legal_batch(rng), strategy, legal=True)
        if step % 10 == 9:
            twin.check_state()
    twin.check_state()


@pytest.mark.parametrize("how", JOIN_TYPES)
@pytest.mark.parametrize("case", [*CASES, FLOAT_KEYS], ids=lambda c: c.name)
def test_recompute_equals_push(tmp_path: Path, case: JoinCase, how: str) -> None:
    twin = Twin(tmp_path, case, how)
    try:
        run_stream(twin, random.Random(f"{case.name}-{how}"), steps=40)
        if case is not FLOAT_KEYS:  # the oracle compares floats with Python's ==
            twin.check_oracle()
    finally:
        twin.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("how", JOIN_TYPES)
def test_recompute_equals_push_many_seeds(tmp_path: Path, how: str, seed: int) -> None:
    for case in (*CASES, FLOAT_KEYS):
        twin = Twin(tmp_path / f"{case.name}-{seed}", case, how)
        try:
            run_stream(twin, random.Random(f"{case.name}-{how}-{seed}"), steps=60)
        finally:
            twin.close()


# ---- errors: the class push raises, nothing applied --------------------------------------

BAG = pa.schema([("k", pa.int64()), ("v", pa.string())])


def bag_join(store: joinstate.StateStore, how: str = "inner",
             left_unique: bool = False) -> joinstate.Join:
    return store.join("j", left=joinstate.Side(BAG, ["k"], ["k"] if left_unique else None),
                      right=joinstate.Side(BAG, ["k"]), how=how)


def weighted(k: list[int | None], v: list[str], w: list[int]) -> pa.Table:
    return pa.table({"k": pa.array(k, pa.int64()), "v": v, "_weight": pa.array(w, pa.int64())})


def snapshot(join: joinstate.Join) -> tuple[Any, ...]:
    return tuple((sorted(map(str, join.state(s).to_pylist())), join.index(s).rows,
                  join.index(s).entries) for s in SIDES)


@pytest.mark.parametrize(("setup", "side", "bad", "error"), [
    # over-retraction: a phantom row, and more copies than stored
    ([("right", [1], ["a"], [1])], "right", ([1], ["b"], [-1]), joinstate.OverRetractionError),
    ([("right", [1], ["a"], [2])], "right", ([1], ["a"], [-3]), joinstate.OverRetractionError),
    ([("right", [None], ["a"], [1])], "right", ([None], ["a"], [-2]),
     joinstate.OverRetractionError),
    # unique key: a second row under a stored key, a second copy, two in one batch
    ([("left", [1], ["a"], [1])], "left", ([1], ["b"], [1]), joinstate.UniqueKeyViolationError),
    ([("left", [1], ["a"], [1])], "left", ([1], ["a"], [1]), joinstate.UniqueKeyViolationError),
    ([], "left", ([2, 2], ["a", "b"], [1, 1]), joinstate.UniqueKeyViolationError),
    # weights: a row's multiplicity (the rows counter) beyond int64, a joined pair's
    # weight beyond int64, a batch whose own rows sum beyond int64
    ([("right", [1], ["a"], [2**62])], "right", ([1], ["a"], [2**62]),
     joinstate.WeightOverflowError),
    ([("right", [1], ["a"], [2**40])], "left", ([1], ["x"], [2**40]),
     joinstate.UniqueKeyViolationError),
    ([("left", [1], ["x"], [1]), ("right", [1], ["a"], [2**62])], "right",
     ([1], ["b"], [2**62]), joinstate.WeightOverflowError),
    ([], "right", ([3, 3], ["a", "a"], [2**62, 2**62]), joinstate.WeightOverflowError),
])
def test_refused_batches_raise_what_push_raises(
    tmp_path: Path, setup: list[Any], side: str, bad: tuple[Any, ...],
    error: type[Exception],
) -> None:
    for how in ("inner", "full", "left_anti"):
        store_path = tmp_path / how
        with joinstate.StateStore(store_path / "a") as sa, \
                joinstate.StateStore(store_path / "b") as sb:
            ja, jb = bag_join(sa, how, left_unique=True), bag_join(sb, how, left_unique=True)
            for s, k, v, w in setup:
                ja.push(s, weighted(k, v, w))
                jb.push(s, weighted(k, v, w))
            before = snapshot(jb)
            with pytest.raises(error) as pushed:
                ja.push(side, weighted(*bad))  # type: ignore[arg-type]
            with pytest.raises(error) as recomputed:
                apply(jb, side, weighted(*bad), strategy="recompute", commit_id="c1")
            assert type(recomputed.value) is type(pushed.value)
            assert snapshot(jb) == before
            assert not jb.committed("c1")
            jb.verify()


def test_pair_weight_overflow_raises_like_push(tmp_path: Path) -> None:
    """A joined pair's weight beyond int64 (2**40 x 2**40) on a bag-to-bag join."""
    with joinstate.StateStore(tmp_path / "a") as sa, joinstate.StateStore(tmp_path / "b") as sb:
        ja, jb = bag_join(sa), bag_join(sb)
        for j in (ja, jb):
            j.push("right", weighted([1], ["a"], [2**40]))
        before = snapshot(jb)
        with pytest.raises(joinstate.WeightOverflowError):
            ja.push("left", weighted([1], ["x"], [2**40]))
        with pytest.raises(joinstate.WeightOverflowError):
            recompute(jb, "left", weighted([1], ["x"], [2**40]))
        assert snapshot(jb) == before


def test_large_weights_that_fit_give_push_exact_result(tmp_path: Path) -> None:
    """Products between 2**62 and 2**63 are beyond the vectorised path's safe bound:
    the batch goes the exact way and the output is push's, to the last unit."""
    with joinstate.StateStore(tmp_path / "a") as sa, joinstate.StateStore(tmp_path / "b") as sb:
        ja, jb = bag_join(sa, "full"), bag_join(sb, "full")
        for j in (ja, jb):
            j.push("right", weighted([1, 2], ["a", "b"], [2**31 + 1, 3]))
        want = ja.push("left", weighted([1, 2], ["x", "y"], [2**31 + 5, 2]))
        got = recompute(jb, "left", weighted([1, 2], ["x", "y"], [2**31 + 5, 2]))
        cols = want.column_names[:-1]
        assert zset(got, cols) == zset(want, cols)
        assert (2**31 + 1) * (2**31 + 5) in got.column("_weight").to_pylist()
        assert snapshot(jb) == snapshot(ja)


# ---- exactly once ------------------------------------------------------------------------


def test_commit_id_exactly_once_across_paths(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = bag_join(store, "left")
        join.push("right", weighted([1, 1, 2], ["a", "b", "c"], [1, 1, 1]))
        delta = weighted([1, 2, None], ["x", "y", "z"], [1, 1, 1])
        first = apply_batch(join, "left", delta, strategy="recompute", commit_id="b1")
        assert not first.replayed
        after = snapshot(join)
        cols = first.output.column_names[:-1]  # type: ignore[union-attr]
        for strategy in ("recompute", "incremental", "auto"):
            again = apply_batch(join, "left", delta, strategy=strategy,  # type: ignore[arg-type]
                                commit_id="b1")
            assert again.replayed
            assert zset(again.output, cols) == zset(first.output, cols)  # type: ignore[arg-type]
            assert snapshot(join) == after
        assert zset(join.push("left", delta, commit_id="b1"), cols) == \
            zset(first.output, cols)  # type: ignore[arg-type]
        other = weighted([3], ["w"], [1])
        with pytest.raises(joinstate.CommitConflictError):
            recompute(join, "left", other, commit_id="b1")
        with pytest.raises(joinstate.CommitConflictError):
            recompute(join, "right", delta, commit_id="b1")
        assert snapshot(join) == after
        # An id first committed by push is replayed by the recompute path.
        pushed = join.push("right", other, commit_id="b2")
        assert zset(recompute(join, "right", other, commit_id="b2"), cols) == zset(pushed, cols)
        assert join.rows("right") == 4


def test_empty_and_cancelling_batches(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = bag_join(store, "full")
        join.push("right", weighted([1], ["a"], [1]))
        before = snapshot(join)
        assert recompute(join, "left", weighted([], [], [])).num_rows == 0
        out = recompute(join, "left", weighted([5, 5], ["x", "x"], [1, -1]), commit_id="z")
        assert out.num_rows == 0 and join.committed("z")
        assert snapshot(join) == before


# ---- the core additions ------------------------------------------------------------------


def test_scan_keys_compare_as_the_join_compares(tmp_path: Path) -> None:
    left = joinstate.Side(pa.schema([("k", pa.int16()), ("f", pa.float64())]), ["k", "f"])
    right = joinstate.Side(pa.schema([("k", pa.int64()), ("f", pa.float32())]), ["k", "f"])
    with joinstate.StateStore(tmp_path / "s") as store:
        join = store.join("j", left=left, right=right)
        join.push("left", pa.table({"k": pa.array([7, 7, 1, None], pa.int16()),
                                    "f": [-0.0, math.nan, 2.0, 1.0]}))
        join.push("right", pa.table({"k": [7, 7, 65537], "f": pa.array(
            [0.0, math.nan, 2.0], pa.float32())}))
        ls, rs = join.scan("left"), join.scan("right")
        lkeys, rkeys = (
            {(k, str(f)): key for k, f, key in zip(*(t.column(c).to_pylist()
                                                     for c in ("k", "f", "_key")), strict=True)}
            for t in (ls, rs))
        assert lkeys[(7, "0.0")] == rkeys[(7, "0.0")]  # -0.0 stored as 0.0, equal keys
        assert lkeys[(7, "nan")] == rkeys[(7, "nan")]
        assert rkeys[(65537, "2.0")] != lkeys[(1, "2.0")]  # no wrap to int16
        assert lkeys[(None, "1.0")] is None  # a NULL key column: never matches
        assert ls.schema.field("_key").type == pa.large_binary()
        assert "_unique" not in ls.schema.names
        batch = join.prepare("left", pa.table({"k": pa.array([7], pa.int16()), "f": [0.0]}))
        assert join.scan("left", batch).column("_key").to_pylist() == [lkeys[(7, "0.0")]]
        with pytest.raises(joinstate.SchemaMismatchError, match="prepared for the left side"):
            join.scan("right", batch)


def test_scan_consolidates_to_state(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = bag_join(store, left_unique=True)
        join.push("right", weighted([1, 1, None], ["a", "b", "n"], [2, 1, 1]))
        join.push("right", weighted([1, 1, None], ["a", "b", "n"], [1, -1, 2]))
        join.push("left", weighted([1, None], ["x", "y"], [1, 1]))
        rs = join.scan("right")
        assert rs.num_rows > join.state("right").num_rows  # one entry per inserting batch
        g = rs.group_by("_row").aggregate([("_weight", "sum"), ("k", "min"), ("v", "min")])
        got = sorted(zip(g.column("k_min").to_pylist(), g.column("v_min").to_pylist(),
                         g.column("_weight_sum").to_pylist(), strict=True), key=str)
        st = join.state("right")
        want = sorted(zip(st.column("k").to_pylist(), st.column("v").to_pylist(),
                          st.column("_weight").to_pylist(), strict=True), key=str)
        assert got == want
        assert join.scan("left").column("_unique").to_pylist()[0] is not None
        assert pc.sum(join.scan("left").column("_weight")).as_py() == join.rows("left")


def test_apply_with_output_checks_its_shape(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = bag_join(store)
        batch = join.prepare("left", weighted([1], ["x"], [1]))
        bad_names = pa.table({"k": pa.array([], pa.int64()), "_weight": pa.array([], pa.int64())})
        with pytest.raises(joinstate.SchemaMismatchError, match="has columns"):
            join.apply("left", batch, output=bad_names)
        wrong = join.output_schema.empty_table().cast(pa.schema(
            [pa.field(f.name, pa.int32() if f.name == "k" else f.type)
             for f in join.output_schema]))
        with pytest.raises(joinstate.SchemaMismatchError, match="column 'k' is int32"):
            join.apply("left", batch, output=wrong)
        empty = join.prepare("left", weighted([1, 1], ["x", "x"], [1, -1]))
        row = pa.Table.from_pylist([{"k": 1, "v": "x", "k_right": 1, "v_right": "a",
                                     "_weight": 1}], schema=join.output_schema)
        with pytest.raises(joinstate.SchemaMismatchError, match="consolidates to nothing"):
            join.apply("left", empty, output=row, commit_id="e")
        assert join.rows("left") == 0 and not join.committed("e")
        # A given output is what is recorded and returned, state staged as a push.
        got = join.apply("left", batch, output=row, commit_id="g")
        assert got.to_pylist() == row.to_pylist()
        assert join.rows("left") == 1
        assert join.push("left", weighted([1], ["x"], [1]), commit_id="g").to_pylist() == \
            row.to_pylist()


# ---- the executor ------------------------------------------------------------------------


def test_apply_decides_records_and_explains(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = bag_join(store, left_unique=True)
        join.push("left", weighted(list(range(100)), ["c"] * 100, [1] * 100))
        rep = apply_batch(join, "right", weighted([1, 2, None], ["a", "b", "n"], [1, 1, 1]))
        assert rep.strategy == rep.decision.choice == "incremental"  # 3 rows vs a 100-row scan
        assert rep.decision.figures["batch_rows"] == 3
        assert rep.decision.figures["scanned_rows"] == 100
        assert rep.decision.figures["state_rows"] == 0
        assert "incremental" in rep.explain() and "ms" in rep.explain()
        runs = recorded(join, "right", "incremental")
        assert [(o.batch_rows, o.scanned_rows) for o in runs] == [(3, 0)]
        assert runs[0].ms == pytest.approx(rep.ms, abs=1e-3)
        forced = apply_batch(join, "right", weighted([3], ["c"], [1]), strategy="recompute",
                             commit_id="r")
        assert forced.strategy == "recompute" and forced.decision.choice == "recompute"
        assert "fixed by the caller" in forced.decision.reason
        assert [(o.batch_rows, o.scanned_rows) for o in recorded(join, "right", "recompute")] \
            == [(1, 100)]
        assert set(forced.phases) == {"scan_ms", "compute_ms", "write_ms"}
        assert sum(forced.phases.values()) <= forced.ms
        assert recorded(join, "right", "recompute")[0].scan_ms == \
            pytest.approx(forced.phases["scan_ms"], abs=1e-3)
        assert rep.phases == {}
        apply_batch(join, "right", weighted([3], ["c"], [1]), commit_id="r")  # a replay
        apply_batch(join, "right", weighted([], [], []))  # nothing to measure
        assert len(recorded(join, "right", "incremental")) == 1
        assert len(recorded(join, "right", "recompute")) == 1


def test_apply_refuses_bad_arguments(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        join = bag_join(store)
        with pytest.raises(PopulationError, match="strategy='fast' must be one of"):
            apply(join, "left", weighted([1], ["x"], [1]), strategy="fast")  # type: ignore[arg-type]
        with pytest.raises(PopulationError,
                           match=r"joinstate\.Join or a joinstate\.Pipeline.*got str"):
            apply("j", "left", weighted([1], ["x"], [1]))  # type: ignore[arg-type]
        with pytest.raises(joinstate.JoinStateError, match="'middle' is not an input of join"):
            apply(join, "middle", weighted([1], ["x"], [1]))
        assert join.rows("left") == 0


def test_apply_to_a_pipeline_is_incremental(tmp_path: Path) -> None:
    def build(store: joinstate.StateStore) -> joinstate.Pipeline:
        a = joinstate.source("a", BAG)
        b = joinstate.source("b", BAG)
        graph = joinstate.Graph().output("out", a.join(b, on=("k", "k"), suffixes=("", "_b")))
        return joinstate.Pipeline(store, "p", graph)

    with joinstate.StateStore(tmp_path / "x") as sx, joinstate.StateStore(tmp_path / "y") as sy:
        px, py = build(sx), build(sy)
        py.push("b", weighted([1, 1], ["p", "q"], [1, 1]))
        px.push("b", weighted([1, 1], ["p", "q"], [1, 1]))
        delta = weighted([1, 2], ["x", "y"], [1, 1])
        rep = apply_batch(px, "a", delta, commit_id="c")
        assert rep.strategy == "incremental"  # a two-row batch: the planner keeps probing
        assert [d.choice for d in rep.operators] == ["incremental"]
        want = py.push("a", delta)
        assert isinstance(rep.output, dict)
        cols = want["out"].column_names[:-1]
        assert zset(rep.output["out"], cols) == zset(want["out"], cols)
        assert len(recorded(px, "a", "incremental")) == 1
        again = weighted([3], ["z"], [1])
        got = apply(px, "a", again, strategy="recompute")  # the join reads b by a scan
        want = py.push("a", again)
        assert isinstance(got, dict)
        assert zset(got["out"], cols) == zset(want["out"], cols)
        with pytest.raises(joinstate.JoinStateError, match="not an input of pipeline"):
            apply(px, "zz", delta)
