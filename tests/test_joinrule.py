"""The join rule on its own: predicates, a nested-loop oracle, and the incremental identity.

``JoinRule.join`` must be the SQL join of two weighted row sets (checked here against a
plain-Python nested loop); ``JoinRule.push`` -- a change to one input against the other,
with the degree crossings -- must equal ``join(after) - join(before)``: the identity
every incremental path (Join.push, the pipeline's join operator, population's
recompute) relies on.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import joinstate
from joinstate.joinrule import (
    Crossings,
    Entries,
    JoinRule,
    is_semi,
    preserves,
    tracks_degree,
)
from joinstate.testing import zset

HOWS = ("inner", "left", "right", "full", "left_semi", "left_anti")
LEFT = pa.schema([("k", pa.int64()), ("a", pa.string())])
RIGHT = pa.schema([("k", pa.int64()), ("b", pa.string())])


def rule(how: str, label: str = "") -> JoinRule:
    side_l, side_r = joinstate.Side(LEFT, ["k"]), joinstate.Side(RIGHT, ["k"])
    out = joinstate.output_schema(side_l, side_r, how)
    return JoinRule.of_sides(how, LEFT, RIGHT, out, label)


def test_predicates_are_sql_join_semantics() -> None:
    # (left preserved, right preserved, left tracks degree, right tracks degree, semi)
    want = {
        "inner": (False, False, False, False, False),
        "left": (True, False, False, True, False),
        "right": (False, True, True, False, False),
        "full": (True, True, True, True, False),
        "left_semi": (False, False, False, True, True),
        "left_anti": (True, False, False, True, True),
    }
    for how, facts in want.items():
        got = (preserves(how, 0), preserves(how, 1), tracks_degree(how, 0),
               tracks_degree(how, 1), is_semi(how))
        assert got == facts, how


def rows_of(rng: np.random.Generator, n: int, tag: str) -> list[tuple[int | None, str, int]]:
    """``n`` (key, value, weight) rows; some NULL keys, repeated keys, weights 1..3."""
    out: list[tuple[int | None, str, int]] = []
    for i in range(n):
        k = None if rng.random() < 0.15 else int(rng.integers(0, 4))
        out.append((k, f"{tag}{i % 3}", int(rng.integers(1, 4))))
    return out


def oracle(how: str, left: list[tuple[Any, str, int]], right: list[tuple[Any, str, int]]
           ) -> Counter[tuple[Any, ...]]:
    """The SQL join of two bags (rows with multiplicities), by nested loops."""
    out: Counter[tuple[Any, ...]] = Counter()
    for lk, la, lw in left:
        partners = [(rk, rb, rw) for rk, rb, rw in right if lk is not None and rk == lk]
        if how == "left_semi":
            if partners:
                out[(lk, la)] += lw
            continue
        if how == "left_anti":
            if not partners:
                out[(lk, la)] += lw
            continue
        for rk, rb, rw in partners:
            out[(lk, la, rk, rb)] += lw * rw
        if not partners and how in ("left", "full"):
            out[(lk, la, None, None)] += lw
    if how in ("right", "full"):
        for rk, rb, rw in right:
            if not any(lk is not None and lk == rk for lk, _, _ in left):
                out[(None, None, rk, rb)] += rw
    return Counter({r: w for r, w in out.items() if w})


def entries(rows: list[tuple[Any, str, int]], schema: pa.Schema, groups: dict[Any, int]
            ) -> Entries:
    table = pa.table({schema.names[0]: [r[0] for r in rows], schema.names[1]: [r[1] for r in rows]},
                     schema=schema)
    q = np.array([groups.get(r[0], -1) for r in rows], dtype=np.int64)
    w = np.array([r[2] for r in rows], dtype=np.int64)
    keep = np.flatnonzero(q >= 0)  # Entries hold rows of some key group only
    return Entries(table.take(pa.array(keep)), w[keep], q[keep])


def key_groups(*parts: list[tuple[Any, str, int]]) -> dict[Any, int]:
    keys = sorted({r[0] for p in parts for r in p if r[0] is not None})
    return {k: i for i, k in enumerate(keys)}


def as_rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return zset(table, [n for n in table.column_names if n != "_weight"])


@pytest.mark.parametrize("how", HOWS)
def test_join_of_two_row_sets_is_the_sql_join(how: str) -> None:
    rng = np.random.default_rng(7)
    r = rule(how)
    for _ in range(40):
        left = rows_of(rng, int(rng.integers(0, 7)), "x")
        right = rows_of(rng, int(rng.integers(0, 7)), "y")
        # NULL-key rows are never in Entries (they never match): the pipeline adds
        # them on their own, as null_keyed does.
        groups = key_groups(left, right)
        parts = r.join(entries(left, LEFT, groups), entries(right, RIGHT, groups), len(groups))
        for pos, rows, schema in ((0, left, LEFT), (1, right, RIGHT)):
            nulls = [x for x in rows if x[0] is None]
            table = pa.table({schema.names[0]: [x[0] for x in nulls],
                              schema.names[1]: [x[1] for x in nulls]}, schema=schema)
            parts += r.null_keyed(table, np.array([x[2] for x in nulls], np.int64), pos)
        assert as_rows(r.table(parts)) == oracle(how, left, right), (how, left, right)


class _Other:
    """An in-memory OtherSide that records which reads the rule asked for."""

    def __init__(self, e: Entries, n: int) -> None:
        self.e, self.n = e, n
        self.asked: list[str] = []

    def entries(self) -> Entries:
        self.asked.append("entries")
        return self.e

    def degrees(self) -> np.ndarray:
        self.asked.append("degrees")
        out = np.zeros(self.n, np.int64)
        np.add.at(out, self.e.q, self.e.w)
        return out

    def entries_at(self, groups: np.ndarray) -> Entries:
        self.asked.append("entries_at")
        keep = np.flatnonzero(np.isin(self.e.q, groups))
        return Entries(self.e.rows.take(pa.array(keep)), self.e.w[keep], self.e.q[keep])


def degree(rows: list[tuple[Any, str, int]], groups: dict[Any, int]) -> np.ndarray:
    out = np.zeros(len(groups), np.int64)
    for k, _, w in rows:
        if k in groups:
            out[groups[k]] += w
    return out


def consolidated(rows: list[tuple[Any, str, int]]) -> list[tuple[Any, str, int]]:
    c: Counter[tuple[Any, str]] = Counter()
    for k, v, w in rows:
        c[(k, v)] += w
    return [(k, v, w) for (k, v), w in c.items() if w]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("pos", [0, 1])
def test_push_is_join_after_minus_join_before(how: str, pos: int) -> None:
    """ΔS ⋈ O plus the preserved and crossing terms equals J(S + Δ, O) - J(S, O)."""
    rng = np.random.default_rng(11 + pos)
    r = rule(how)
    schemas = (LEFT, RIGHT)
    for _ in range(60):
        mine = rows_of(rng, int(rng.integers(0, 6)), "x" if pos == 0 else "y")
        theirs = rows_of(rng, int(rng.integers(0, 6)), "y" if pos == 0 else "x")
        # A change: inserts, and retractions of stored rows (never below zero).
        change = rows_of(rng, int(rng.integers(1, 5)), "x" if pos == 0 else "y")
        for k, v, w in mine:
            if rng.random() < 0.5:
                change.append((k, v, -int(rng.integers(1, w + 1))))
        after = consolidated(mine + change)
        groups = key_groups(change)
        n = len(groups)
        group = np.array([groups.get(k, -1) for k, _, _ in change], dtype=np.int64)
        d_rows = pa.table({"k": [x[0] for x in change], "v": [x[1] for x in change]})
        d_rows = d_rows.rename_columns(schemas[pos].names).cast(schemas[pos])
        wt = np.array([x[2] for x in change], dtype=np.int64)
        crossings = None
        if tracks_degree(how, pos):
            crossings = Crossings.of(degree(mine, groups), degree(after, groups))
        other = _Other(entries(theirs, schemas[1 - pos], groups), n)
        got = as_rows(r.table(r.push(pos, d_rows, wt, group, n, other, crossings)))
        sides_before = (mine, theirs) if pos == 0 else (theirs, mine)
        sides_after = (after, theirs) if pos == 0 else (theirs, after)
        want = oracle(how, *sides_after)
        want.subtract(oracle(how, *sides_before))
        assert got == Counter({k: v for k, v in want.items() if v}), (how, pos, mine,
                                                                        theirs, change)
        if is_semi(how) and pos == 0:
            assert other.asked == ["degrees"]  # a semi join's left push reads no rows


def test_weights_are_checked_exact_or_named() -> None:
    r = rule("inner", "join 'j'")
    one = pa.table({"k": [1], "a": ["x"]}).cast(LEFT)
    right = Entries(pa.table({"k": [1], "b": ["y"]}).cast(RIGHT),
                    np.array([2**31 + 1], np.int64), np.zeros(1, np.int64))
    # A product between 2**62 and 2**63 is computed exactly.
    (rows, w), = r.pairs(one, np.array([2**31 + 5], np.int64), np.zeros(1, np.int64), right,
                         1, 0)
    assert w.tolist() == [(2**31 + 1) * (2**31 + 5)]
    big = Entries(right.rows, np.array([2**40], np.int64), right.q)
    with pytest.raises(joinstate.WeightOverflowError, match="join 'j': the weight of a joined"):
        r.pairs(one, np.array([2**40], np.int64), np.zeros(1, np.int64), big, 1, 0)
    assert rows.num_rows == 1
