"""Materialized outputs: ``p.read(name)`` equals the integrated change sets, through
deletes, duplicates, NULLs and reopens; ``order_by``/``limit`` apply when read."""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import joinstate
from joinstate.errors import SchemaMismatchError

if TYPE_CHECKING:
    from pathlib import Path

A = pa.schema([("k", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
B = pa.schema([("k2", pa.int64()), ("y", pa.decimal128(7, 2))])


def build(store: joinstate.StateStore, **kw: Any) -> joinstate.Pipeline:
    a = joinstate.source("a", A)
    b = joinstate.source("b", B)
    j = a.join(b, on=("k", "k2"), how="left").select(["k", "x", "s", "y"])
    return joinstate.Pipeline(store, "m", joinstate.Graph().output("r", j, materialize=True,
                                                                   **kw))


def rows(t: pa.Table) -> Counter[tuple[Any, ...]]:
    cols = [c for c in t.column_names if c != joinstate.WEIGHT]
    out: Counter[tuple[Any, ...]] = Counter()
    ws = t.column(joinstate.WEIGHT).to_pylist() if joinstate.WEIGHT in t.column_names \
        else [1] * t.num_rows
    for r, w in zip(zip(*(t.column(c).to_pylist() for c in cols), strict=True), ws,
                    strict=True):
        out[r] += w
    return Counter({k: v for k, v in out.items() if v})


def delta(rng: random.Random, held: Counter[tuple[Any, ...]], schema: pa.Schema,
          gen: Any) -> pa.Table:
    out: list[tuple[tuple[Any, ...], int]] = []
    for _ in range(rng.randint(1, 6)):
        if held and rng.random() < 0.4:
            r = rng.choice(sorted(held, key=repr))
            out.append((r, -1))
            held[r] -= 1
            if not held[r]:
                del held[r]
        else:
            r = gen()
            out.append((r, 1))
            held[r] += 1
    cols = list(zip(*(r for r, _ in out), strict=True))
    return pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(cols, schema,
                                                                      strict=True)]
                                + [pa.array([w for _, w in out], pa.int64())],
                                names=[*schema.names, joinstate.WEIGHT])


@pytest.mark.parametrize("seed", range(4))
def test_read_equals_integrated_output(tmp_path: Path, seed: int) -> None:
    from decimal import Decimal

    rng = random.Random(seed)
    held = {"a": Counter(), "b": Counter()}
    gens = {
        "a": lambda: (rng.choice([None, 1, 2, 3]), rng.choice([None, 0.5, -0.0, 2.0]),
                      rng.choice(["p", None])),
        "b": lambda: (rng.choice([None, 1, 2, 3]), rng.choice([None, Decimal("1.50")])),
    }
    integrated: Counter[tuple[Any, ...]] = Counter()
    path = tmp_path / "s"
    for round_ in range(3):
        with joinstate.StateStore(path) as store:
            p = build(store)
            for _ in range(8):
                src = rng.choice(["a", "b"])
                d = delta(rng, held[src], A if src == "a" else B, gens[src])
                out = p.push(src, d)["r"]
                integrated.update(rows(out))
                integrated = +Counter({k: v for k, v in integrated.items() if v})
                got = rows(p.read("r"))
                # -0.0 and 0.0 are one row: compare on the values' Python equality
                assert got == integrated, (seed, round_)


def test_order_by_and_limit_apply_when_read(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        p = build(store, order_by=[("x", "descending"), ("k", "ascending")], limit=3)
        p.push("a", pa.table({"k": [1, 2, 3, 4, None], "x": [1.0, None, 3.0, 3.0, 9.0],
                              "s": ["a", "b", "c", "d", "e"],
                              joinstate.WEIGHT: [1, 1, 1, 1, 1]}, schema=A.append(
                                  pa.field(joinstate.WEIGHT, pa.int64()))))
        got = p.read("r")
        assert got.column_names == ["k", "x", "s", "y"]
        assert got.column("x").to_pylist() == [9.0, 3.0, 3.0]
        assert got.column("k").to_pylist() == [None, 3, 4]


def test_reading_an_output_that_is_not_materialized_names_the_remedy(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "m", joinstate.Graph({"r": joinstate.source("a", A)}))
        with pytest.raises(SchemaMismatchError, match="materialize=True"):
            p.read("r")


@pytest.mark.parametrize(("kw", "needle"), [
    ({"order_by": [("x", "descending")]}, "pass materialize=True"),
    ({"materialize": True, "order_by": [("nope", "ascending")]}, "'nope'"),
    ({"materialize": True, "order_by": [("x", "down")]}, "'ascending' | 'descending'"),
    ({"materialize": True, "order_by": "x"}, "list of"),
    ({"materialize": True, "limit": -1}, "limit=-1"),
])
def test_bad_materialize_arguments_are_named(kw: dict[str, Any], needle: str) -> None:
    a = joinstate.source("a", A)
    with pytest.raises(SchemaMismatchError, match=needle.replace("|", r"\|")
                       .replace("(", r"\(")):
        joinstate.Graph().output("r", a, **kw)


def test_shared_index_keeps_only_rows_and_columns_some_reader_needs(tmp_path: Path) -> None:
    """Legs filtered from one stream share its index: the index holds the rows some leg
    passes, and a column only one leg reads is stored only on that leg's rows -- while
    every leg still sees exactly its rows (checked against a plain evaluation)."""
    schema = pa.schema([("k", pa.int64()), ("t", pa.string()), ("y", pa.int64()),
                        ("name", pa.string()), ("v", pa.float64())])
    rng = random.Random(7)
    with joinstate.StateStore(tmp_path / "s") as store:
        s = joinstate.source("s", schema)
        a = s.filter((pc.field("t") == "a") & (pc.field("y") == 1)).select(["k", "name", "v"])
        b = s.filter((pc.field("t") == "b") & (pc.field("y") == 2)).select(["k", "v"])
        p = joinstate.Pipeline(store, "legs", joinstate.Graph().output(
            "j", joinstate.join_all({"a": a, "b": b}, on="k"), materialize=True))
        held: Counter[tuple[Any, ...]] = Counter()
        for _ in range(12):
            out = []
            for _ in range(rng.randint(1, 20)):
                if held and rng.random() < 0.3:
                    r = rng.choice(sorted(held, key=repr))
                    held[r] -= 1
                    if not held[r]:
                        del held[r]
                    out.append((r, -1))
                else:
                    r = (rng.choice([None, 1, 2, 3]), rng.choice(["a", "b", "c", None]),
                         rng.choice([1, 2, 3]), rng.choice(["n1", "n2", None]),
                         rng.choice([0.5, 1.5]))
                    held[r] += 1
                    out.append((r, 1))
            cols = list(zip(*(r for r, _ in out), strict=True))
            p.push("s", pa.Table.from_arrays(
                [pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)]
                + [pa.array([w for _, w in out], pa.int64())],
                names=[*schema.names, joinstate.WEIGHT]))
            want: Counter[tuple[Any, ...]] = Counter()
            for ra, na in held.items():
                for rb, nb in held.items():
                    if (ra[1], ra[2]) == ("a", 1) and (rb[1], rb[2]) == ("b", 2) \
                            and ra[0] is not None and ra[0] == rb[0]:
                        want[(ra[0], ra[3], ra[4], rb[0], rb[4])] += na * nb
            assert rows(p.read("j")) == want
        (info,) = [i for i in p.indexes() if "source" in i.name or "~s[" in i.name]
        # NULL-key rows are counted too (kept aside in the index's NULL-key family)
        passing = sum(n for r, n in held.items() if (r[1], r[2]) in (("a", 1), ("b", 2)))
        assert info.rows == passing
        text = p.explain()
        assert "keeps rows where" in text
        assert "['name'] only where" in text


def test_sharing_can_be_turned_off_per_stream(tmp_path: Path) -> None:
    """``share_indexes={stream: False}``: that stream's readers get their own indexes,
    the others stay shared; the outputs do not change."""
    def define() -> joinstate.Graph:
        a = joinstate.source("a", A)
        b = joinstate.source("b", B)
        j1 = a.join(b, on=("k", "k2")).select(["k", "x"])
        j2 = a.filter(pc.field("s") == "p").join(b, on=("k", "k2")).select(["k", "y"])
        return (joinstate.Graph().output("r1", j1, materialize=True)
                .output("r2", j2, materialize=True))

    got = {}
    for share in (True, {"a": False}, False):
        with joinstate.StateStore(tmp_path / repr(share)) as store:
            p = joinstate.Pipeline(store, "m", define(), share_indexes=share)
            p.push("a", pa.table({"k": [1, 2, 2], "x": [1.0, 2.0, 3.0], "s": ["p", "q", "p"],
                                  joinstate.WEIGHT: [1, 1, 1]}))
            p.push("b", pa.table({"k2": [1, 2], "y": [None, None], joinstate.WEIGHT: [1, 1]},
                                 schema=B.append(pa.field(joinstate.WEIGHT, pa.int64()))))
            got[repr(share)] = (rows(p.read("r1")), rows(p.read("r2")))
            names = [i.name for i in p.indexes()]
            n_b = sum(n.startswith(("ix.m~b[", "ix.m~b~")) for n in names)
            n_a = len(names) - n_b
            if share is True:
                assert (n_a, n_b) == (1, 1), names
            elif share is False:
                assert (n_a, n_b) == (2, 2), names
            else:
                assert (n_a, n_b) == (2, 1), names
                assert "shared except ['a']" in p.explain()
    assert len(set(map(repr, got.values()))) == 1


def test_sharing_names_must_exist(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "m", joinstate.Graph({"r": joinstate.source("a", A)}),
                               share_indexes={"nope": False})
        with pytest.raises(SchemaMismatchError, match="'nope'"):
            p.compile()
    with pytest.raises(SchemaMismatchError, match="share_indexes"):
        joinstate.Pipeline(joinstate.StateStore(tmp_path / "t"), "m",
                           joinstate.Graph({"r": joinstate.source("a", A)}),
                           share_indexes={"a": "yes"})  # type: ignore[dict-item]


def test_nulls_first_per_key_when_read(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "m", joinstate.Graph().output(
            "r", joinstate.source("a", A), materialize=True,
            order_by=[("x", "ascending", "at_start"), ("k", "descending")]))
        p.push("a", pa.table({"k": [1, 2, None, 4], "x": [2.0, None, 1.0, None],
                              "s": ["a", "b", "c", "d"], joinstate.WEIGHT: [1, 1, 1, 1]},
                             schema=A.append(pa.field(joinstate.WEIGHT, pa.int64()))))
        got = p.read("r")
        assert got.column("x").to_pylist() == [None, None, 1.0, 2.0]
        assert got.column("k").to_pylist() == [4, 2, None, 1]


def test_an_expression_failing_on_pushed_rows_is_named_and_applies_nothing(
        tmp_path: Path) -> None:
    """int64 overflow inside a projection: ExpressionError naming the operator."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    with joinstate.StateStore(tmp_path / "s") as store:
        s = joinstate.source("s", schema)
        doubled = s.select({"k": "k", "v2": pc.multiply_checked(pc.field("v"), 2)})
        p = joinstate.Pipeline(store, "m", joinstate.Graph().output(
            "r", doubled.group_by("k").aggregate(t=("sum", "v2")), materialize=True))
        p.push("s", pa.table({"k": [1], "v": [5], joinstate.WEIGHT: [1]}))
        with pytest.raises(joinstate.ExpressionError, match=r"project\d+.*multiply_checked"):
            p.push("s", pa.table({"k": [1, 2], "v": [1, 2**62], joinstate.WEIGHT: [1, 1]}))
        assert rows(p.read("r")) == Counter({(1, 10): 1})
