"""An aggregate without group keys has exactly one row, always (SQL, DuckDB).

``SELECT count(*), sum(x) FROM t`` reads ``(0, NULL)`` before the first push and after
deletes empty ``t``.  The row exists from the pipeline's creation: a materialized output
shows it at once, and its change set is returned with the first push that carries a row,
so the outputs integrated from the first push equal the view after every push (the Z-set
contract).  Checked in-process through the oracle of tests/pipeline_oracle.py (with a
filter and a join downstream of the global aggregate), through SQL against DuckDB (WHERE,
HAVING, a join over a global subquery), across a reopen before the first push, with
commit-id replay, and through in-process population.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pipeline_oracle import ChangeGen, Node, PipelineHarness, Source, col, lit, zset_of
from test_planner_sql import TABLES, SQLHarness

import joinstate
import population

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

T = pa.schema([("k", pa.int64()), ("x", pa.int64())])
U = pa.schema([("u", pa.int64())])
Row = tuple[Any, ...]


def delta(schema: pa.Schema, rows: list[Row], weights: list[int] | None = None) -> pa.Table:
    cols = {f.name: pa.array([r[i] for r in rows], f.type) for i, f in enumerate(schema)}
    cols["_weight"] = pa.array([1] * len(rows) if weights is None else weights, pa.int64())
    return pa.table(cols)


def build(store: joinstate.StateStore, name: str = "g") -> joinstate.Pipeline:
    t = joinstate.source("t", T)
    u = joinstate.source("u", U)  # feeds nothing: a push to it still delivers what is owed
    g = t.group_by([]).aggregate(n=("count", None), s=("sum", "x"), hi=("max", "x"))
    graph = (joinstate.Graph(sources=[u]).output("g", g, materialize=True)
             .output("busy", g.filter(pc.field("n") > 1), materialize=True))
    return joinstate.Pipeline(store, name, graph)


def rows(p: joinstate.Pipeline, output: str) -> list[Row]:
    return [tuple(r.values()) for r in p.read(output).to_pylist()]


class Integral:
    """Every output's change sets, summed."""

    def __init__(self) -> None:
        self.total: dict[str, Counter[Row]] = {}

    def add(self, outs: dict[str, pa.Table]) -> None:
        for name, table in outs.items():
            acc = self.total.setdefault(name, Counter())
            names = [c for c in table.column_names if c != "_weight"]
            acc.update(zset_of(table, names))
            self.total[name] = Counter({r: w for r, w in acc.items() if w})

    def of(self, name: str) -> Counter[Row]:
        return self.total.get(name, Counter())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[joinstate.StateStore]:
    with joinstate.StateStore(tmp_path / "state") as s:
        yield s


def test_the_row_is_there_before_the_first_push(store: joinstate.StateStore) -> None:
    p = build(store)
    p.compile()
    assert rows(p, "g") == [(0, None, None)]
    assert rows(p, "busy") == []


def test_integrated_outputs_equal_the_view_through_emptying_and_refilling(
        store: joinstate.StateStore) -> None:
    p = build(store)
    seen = Integral()

    def push(source: str, d: pa.Table) -> dict[str, pa.Table]:
        outs = p.push(source, d)
        seen.add(outs)
        for name in ("g", "busy"):
            assert +seen.of(name) == Counter(rows(p, name)), name
        return outs

    out = push("t", delta(T, [(1, 10), (2, 20)]))
    # the owed +(0, NULL, NULL) and this push's -(0, NULL, NULL) cancel
    assert out["g"].to_pylist() == [{"n": 2, "s": 30, "hi": 20, "_weight": 1}]
    assert rows(p, "busy") == [(2, 30, 20)]
    push("t", delta(T, [(1, 10), (2, 20)], [-1, -1]))  # empty again
    assert rows(p, "g") == [(0, None, None)]
    push("t", delta(T, [(3, None)]))  # refilled, with a NULL
    assert rows(p, "g") == [(1, None, None)]
    push("t", delta(T, [(3, None), (4, 5)], [-1, 1]))
    assert rows(p, "g") == [(1, 5, 5)]


def test_the_first_push_anywhere_delivers_the_row(store: joinstate.StateStore) -> None:
    p = build(store)
    seen = Integral()
    empty = p.push("t", T.empty_table())
    assert all(t.num_rows == 0 for t in empty.values())  # no row: nothing owed is paid
    seen.add(p.push("u", delta(U, [(7,)])))  # u feeds nothing, yet brings the row
    assert seen.of("g") == Counter({(0, None, None): 1})
    seen.add(p.push("t", delta(T, [(1, 4)])))
    assert seen.of("g") == Counter({(1, 4, 4): 1})


def test_what_is_owed_survives_a_reopen_and_a_replay(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with joinstate.StateStore(path) as store:
        build(store).compile()
    with joinstate.StateStore(path) as store:
        p = build(store)
        assert rows(p, "g") == [(0, None, None)]
        first = p.push("t", delta(T, [(1, 3)]), commit_id="first")
        again = p.push("t", delta(T, [(1, 3)]), commit_id="first")
        assert first["g"].equals(again["g"])
        assert zset_of(first["g"], ["n", "s", "hi"]) == Counter({(1, 3, 3): 1})
    with joinstate.StateStore(path) as store:
        p = build(store)
        out = p.push("t", delta(T, [(2, 1)]))["g"]
        assert zset_of(out, ["n", "s", "hi"]) == Counter({(1, 3, 3): -1, (2, 4, 3): 1})


def test_a_failed_first_push_keeps_what_is_owed(store: joinstate.StateStore) -> None:
    p = build(store)
    with pytest.raises(joinstate.OverRetractionError):
        p.push("t", delta(T, [(1, 1)], [-1]))
    out = p.push("t", delta(T, [(1, 1)]))["g"]
    assert zset_of(out, ["n", "s", "hi"]) == Counter({(1, 1, 1): 1})


def test_population_delivers_the_row(store: joinstate.StateStore) -> None:
    p = build(store)
    seen = Integral()
    population.populate(p, sources={"u": U.empty_table(), "t": delta(T, [(1, 2), (2, 3)])
                                    .drop_columns(["_weight"])},
                        progress=False, batch_rows=1, sink=seen.add)
    assert +seen.of("g") == Counter(rows(p, "g")) == Counter({(2, 5, 3): 1})


# ---- differential: downstream operators over a global aggregate --------------------------

S = Source("S", pa.schema([("k", pa.int64()), ("v", pa.int64())]))
K = Source("K", pa.schema([("key", pa.int64()), ("label", pa.string())]))
G = S.group_by([], n=("count", None), s=("sum", "v"), lo=("min", "v"))
SHAPES: dict[str, dict[str, Node]] = {
    "global": {"g": G},
    "filtered": {"f": G.filter(col("n") > 1)},
    "joined": {"j": K.join(G.with_columns({"one": lit(1)}), on=("key", "one"))},
    "of_a_filter": {"h": S.filter(col("v") > 2).group_by([], n=("count", None),
                                                         s=("sum", "v"))},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_global_aggregates_against_the_oracle(tmp_path: Path, shape: str) -> None:
    rng = random.Random(len(shape))
    gens = {"S": ChangeGen(S, {"k": lambda r: r.choice([1, 2, None]),
                               "v": lambda r: r.choice([None, 1, 3, 8])}),
            "K": ChangeGen(K, {"key": lambda r: r.choice([0, 1, 2]),
                               "label": lambda r: r.choice(["a", "b"])})}
    with joinstate.StateStore(tmp_path / "s") as store:
        h = PipelineHarness(store, f"glob_{shape}", SHAPES[shape])
        if "K" in h.sources:  # meets the global row while S is still empty
            h.push("K", [((1, "a"), 1), ((0, "b"), 1)])
        for i in range(30):
            source = rng.choice(sorted(h.sources))
            if source == "S" and i % 7 == 6:  # empty S now and then
                entries = [(r, -w) for r, w in sorted(h.inputs["S"].items(), key=repr)]
                if entries:
                    h.push("S", entries)
                    continue
            h.push(source, gens[source].delta(rng, h.inputs[source]))


# ---- SQL, against DuckDB ------------------------------------------------------------------


def s_row(k: int | None, v: int | None) -> tuple[Any, ...]:
    return (k, 0, v, 0, None, None, None, None, None)


@pytest.mark.parametrize("sql", [
    "SELECT count(*) AS n, sum(v) AS sv FROM s",
    "SELECT count(*) AS n, sum(v) AS sv, min(t) AS mt, avg(d) AS ad FROM s WHERE v > 2",
    "SELECT count(v) AS nv, max(w) AS mw FROM s HAVING count(*) > 1",
    "SELECT x.n, c.name FROM (SELECT count(*) AS n FROM s) AS x JOIN c ON x.n = c.ck",
])
def test_sql_global_aggregates(store: joinstate.StateStore, sql: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    h = SQLHarness(store, sql)
    try:
        want, _ = h.duck(h.unordered_sql())  # empty tables
        assert h.p.read("q").num_rows == want.num_rows
        assert [tuple(r.values()) for r in h.p.read("q").to_pylist()] == \
            [tuple(r.values()) for r in want.to_pylist()]
        if "JOIN c" in sql:
            h.push("c", [((0, "zero", 1, None), 1), ((2, "two", 1, None), 1)])
            h.check()
        h.push("s", [(s_row(1, 3), 1), (s_row(2, 5), 1)])
        h.check()
        h.push("s", [(s_row(1, 3), -1), (s_row(2, 5), -1)])  # emptied
        h.check()
        h.push("s", [(s_row(None, None), 2)])  # refilled with NULLs
        h.check()
        h.run(seed=11, pushes=10)
    finally:
        h.close()
    assert duckdb is not None and TABLES


def test_a_definition_failing_on_the_first_row_is_refused_whole(
        store: joinstate.StateStore) -> None:
    """An expression that fails on the row over no input refuses the pipeline's creation."""

    def define(expr: pc.Expression) -> joinstate.Pipeline:
        g = joinstate.source("t", T).group_by([]).aggregate(n=("count", None))
        graph = joinstate.Graph().output("q", g.select({"q": expr}), materialize=True)
        return joinstate.Pipeline(store, "div", graph)

    with pytest.raises(joinstate.ExpressionError, match="global aggregate"):
        define(pc.divide(pc.scalar(100), pc.field("n"))).compile()  # 100 / 0
    assert store.meta_get(b"pipeline\x00div") is None
    p = define(pc.divide(pc.field("n"), pc.scalar(2)))
    p.compile()  # the refused object holds nothing: a corrected definition is accepted
    assert rows(p, "q") == [(0,)]
