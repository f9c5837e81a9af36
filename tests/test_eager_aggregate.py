"""Eager aggregation: a GROUP BY over joins aggregated before the joins that only bring
group keys (``planner._sqleager``).

These tests pin: the compiler peels the last joins when the estimates say the partial
groups are few, and says so in ``explain``; the answers equal DuckDB's on random
changes (deletes, duplicates, NULL keys and measures, renamed and deleted dimension
rows) with and without peeling; what is never peeled (a float sum, an aggregate or a
mixed key reading a peeled input); a view keeps the plan it was compiled with, and a
view recorded before eager aggregation keeps its unpeeled plan; a dimension change
reaches the partial groups, not the fact rows.
"""

from __future__ import annotations

import random
from decimal import Decimal

import pyarrow as pa
import pytest

duckdb = pytest.importorskip("duckdb")

import joinstate  # noqa: E402
import planner  # noqa: E402
from joinstate.testing import consolidate  # noqa: E402
from planner.sql import Source, compile, define, plan  # noqa: E402
from planner.views import ViewRecord, record_view, stored_view  # noqa: E402

FACT = pa.schema([("f_id", pa.int64()), ("a_id", pa.int32()), ("b_id", pa.int64()),
                  ("day", pa.int32()), ("qty", pa.int32()), ("amt", pa.decimal128(7, 2)),
                  ("w", pa.float64())])
DIM_A = pa.schema([("a_id", pa.int32()), ("a_name", pa.string()), ("a_grp", pa.int32())])
DIM_B = pa.schema([("b_id", pa.int64()), ("b_name", pa.string())])
DAY = pa.schema([("d_id", pa.int32()), ("d_month", pa.int32())])

SQL = """
SELECT a.a_name, b.b_name, count(*) AS n, sum(f.qty) AS q, sum(f.amt) AS s,
       min(f.amt) AS lo, max(f.qty) AS hi, avg(f.qty) AS mean, count(f.amt) AS namt
FROM fact f, dim_a a, dim_b b, day d
WHERE f.a_id = a.a_id AND f.b_id = b.b_id AND f.day = d.d_id AND d.d_month = 2
  AND a.a_grp < 3
GROUP BY a.a_name, b.b_name
"""
"""``day`` filters (it is joined first); ``dim_a`` and ``dim_b`` only bring group keys:
both can be peeled."""


def sources() -> dict[str, Source]:
    return {"fact": Source(FACT), "dim_a": Source(DIM_A, "a_id"),
            "dim_b": Source(DIM_B, "b_id"), "day": Source(DAY, "d_id")}


def tables(rng: random.Random, rows: int = 3000) -> dict[str, pa.Table]:
    def maybe(v: object, p: float = 0.03) -> object:
        return None if rng.random() < p else v

    fact = pa.table({
        "f_id": list(range(rows)),
        "a_id": [maybe(rng.randrange(6)) for _ in range(rows)],
        "b_id": [maybe(rng.randrange(5)) for _ in range(rows)],
        "day": [maybe(rng.randrange(90)) for _ in range(rows)],
        "qty": [maybe(rng.randrange(1, 50)) for _ in range(rows)],
        "amt": [maybe(Decimal(rng.randrange(1, 10_000)) / 100) for _ in range(rows)],
        "w": [rng.random() for _ in range(rows)]}, schema=FACT)
    dim_a = pa.table({"a_id": list(range(6)), "a_name": [f"a{i % 4}" for i in range(6)],
                      "a_grp": [i % 5 for i in range(6)]}, schema=DIM_A)
    dim_b = pa.table({"b_id": list(range(5)), "b_name": ["x", "y", "x", None, "z"]},
                     schema=DIM_B)
    day = pa.table({"d_id": list(range(90)), "d_month": [i // 30 + 1 for i in range(90)]},
                   schema=DAY)
    return {"fact": fact, "dim_a": dim_a, "dim_b": dim_b, "day": day}


def _duck(sql: str, data: dict[str, pa.Table]) -> list[tuple[object, ...]]:
    con = duckdb.connect()
    try:
        for n, t in data.items():
            con.register(n, t)
        return sorted((tuple(_norm(v) for v in r) for r in con.execute(sql).fetchall()),
                      key=repr)
    finally:
        con.close()


def _norm(v: object) -> object:
    if isinstance(v, float):
        return round(v, 9)
    if isinstance(v, Decimal):
        return v.normalize()
    return v


def _rows(t: pa.Table, cols: list[str]) -> list[tuple[object, ...]]:
    return sorted((tuple(_norm(v) for v in r) for r in zip(
        *[t.column(c).to_pylist() for c in cols], strict=True)), key=repr)


def _weighted(t: pa.Table, w: int) -> pa.Table:
    return t.append_column("_weight", pa.array([w] * t.num_rows, pa.int64()))


def test_the_last_joins_that_only_bring_group_keys_are_peeled() -> None:
    data = tables(random.Random(1))
    p = plan(SQL, sources(), name="v", stats=data)
    assert p.peels == (2,)
    (d,) = [d for d in p.decisions if d.topic == "eager_aggregate"]
    assert sorted(d.choice) == ["a", "b"] and d.figures["joins"] == 2
    assert "partial groups" in d.reason and "which only group keys read" in d.reason
    assert "eager_aggregate" in p.explain()
    # without row counts or data nothing says the partial groups are few
    assert plan(SQL, sources(), name="v").peels == (0,)
    # row counts alone are enough
    counts = {n: t.num_rows for n, t in data.items()}
    assert plan(SQL, sources(), name="v", stats=counts).peels == (2,)
    # too many groups for the rows: 6 x 5 dimension rows against 60 facts
    small = {**counts, "fact": 60}
    assert plan(SQL, sources(), name="v", stats=small).peels == (0,)


@pytest.mark.parametrize("sql", [
    SQL.replace("sum(f.qty) AS q", "sum(f.w) AS q"),  # a float sum rounds differently
    SQL.replace("max(f.qty) AS hi", "max(f.qty + a.a_grp) AS hi"),  # reads a peeled input
], ids=["float-sum", "aggregate-reads-dimension"])
def test_what_is_not_peeled(sql: str) -> None:
    data = tables(random.Random(2))
    p = plan(sql, sources(), name="v", stats=data)
    if "a.a_grp" in sql:  # dim_b (joined last, read by keys only) can still be peeled
        assert p.peels in ((0,), (1,))
        assert not any(d.topic == "eager_aggregate" and "a" in d.choice for d in p.decisions)
    else:
        assert p.peels == (0,)


def test_a_key_mixing_a_peeled_input_with_the_facts_is_not_peeled() -> None:
    data = tables(random.Random(3))
    mixed = SQL.replace("GROUP BY a.a_name, b.b_name",
                        "GROUP BY a.a_name, b.b_name || CAST(f.qty AS VARCHAR)").replace(
        "SELECT a.a_name, b.b_name,", "SELECT a.a_name, b.b_name || CAST(f.qty AS VARCHAR) AS k,")
    p = plan(mixed, sources(), name="v", stats=data)
    assert not any(d.topic == "eager_aggregate" and "b" in d.choice for d in p.decisions)


COLS = ["a_name", "b_name", "n", "q", "s", "lo", "hi", "mean", "namt"]


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_peeled_and_unpeeled_match_duckdb_under_random_changes(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    data = tables(rng, rows=500)
    answers = []
    for peeled in (True, False):
        cur = dict(data)
        r = random.Random(seed * 31)
        with joinstate.StateStore(tmp_path / f"s{peeled}") as store:
            counts = {**{n: t.num_rows for n, t in cur.items()}, "fact": 10_000}
            p = compile(SQL, sources(), store=store, name="v",
                        stats=counts if peeled else None)
            view = stored_view(store, "v")
            assert view is not None and view.peels == ((2,) if peeled else ())
            out = [p.push(s, _weighted(cur[s], 1))["v"] for s in ("day", "dim_a", "dim_b",
                                                                    "fact")]
            for step in range(16):
                s = r.choice(["fact", "fact", "dim_a", "dim_b", "day"])
                t = cur[s]
                picks = r.sample(range(t.num_rows), k=min(4, t.num_rows))
                gone = t.take(picks)
                if s == "dim_a":
                    new = gone.set_column(1, "a_name", pa.array(
                        [r.choice(["a0", "a9", None]) for _ in picks]))
                    new = new.set_column(2, "a_grp", pa.array(
                        [r.randrange(5) for _ in picks], pa.int32()))
                elif s == "dim_b":
                    new = gone.set_column(1, "b_name", pa.array(
                        [r.choice(["x", "q", None]) for _ in picks]))
                    if step % 4 == 0:
                        new = new.slice(0, 2)  # and two dimension rows deleted
                elif s == "day":
                    new = gone.set_column(1, "d_month", pa.array(
                        [r.choice([1, 2]) for _ in picks], pa.int32()))
                else:  # some deleted, one re-inserted twice (duplicates), a NULL key
                    new = pa.concat_tables([gone.take([0, 0]), gone.slice(1, 1).set_column(
                        1, "a_id", pa.array([None], pa.int32()))])
                keep = [i for i in range(t.num_rows) if i not in set(picks)]
                out.append(p.push(s, pa.concat_tables([_weighted(gone, -1),
                                                       _weighted(new, 1)]))["v"])
                cur[s] = pa.concat_tables([t.take(keep), new])
                got = consolidate(pa.concat_tables(out).select([*COLS, "_weight"]))
                assert all(w == 1 for w in got.column("_weight").to_pylist()), step
                assert _rows(got, COLS) == _duck(SQL, cur), (peeled, step)
            answers.append(_rows(got, COLS))
    assert answers[0] == answers[1] and answers[0]


def test_a_dimension_change_reaches_the_partial_groups_not_the_facts(tmp_path) -> None:
    data = tables(random.Random(8), rows=4000)
    counts = {n: t.num_rows for n, t in data.items()}
    runs = {}
    for peels in (None, ()):
        with joinstate.StateStore(tmp_path / f"s{peels}") as store:
            graph, sql_plan = define(SQL, sources(), name="v", stats=counts, peels=peels)
            p = joinstate.Pipeline(store, "v", graph)
            for s in ("day", "dim_a", "dim_b", "fact"):
                p.push(s, _weighted(data[s], 1))
            rename = data["dim_b"].slice(0, 1)
            new = rename.set_column(1, "b_name", pa.array(["renamed"]))
            import population

            report = population.apply_changes(
                p, {"dim_b": pa.concat_tables([_weighted(rename, -1), _weighted(new, 1)])},
                strategy="incremental")
            runs[bool(sql_plan.peels[0])] = max(r.rows_in for r in
                                                report.operator_runs.values())
    # peeled: the partial groups of one b_id (at most 6 a_id values);
    # unpeeled: every joined fact row of that b_id in month 2 (~4000 / 5 / 3)
    assert runs[True] <= 12 < 100 < runs[False]


GUARDED_SQL = """
SELECT b.b_name, count(*) AS n,
       sum(CASE WHEN a.a_name = 'a1' THEN f.amt ELSE NULL END) AS s1,
       sum(CASE WHEN a.a_grp < 2 THEN f.qty ELSE 0 END) AS s2,
       count(CASE WHEN a.a_name IS NULL OR a.a_name = 'a0' THEN f.amt END) AS c1,
       min(CASE WHEN a.a_grp = 1 THEN f.amt END) AS lo,
       max(CASE WHEN a.a_name <> 'a2' THEN f.qty END) AS hi
FROM fact f, dim_a a, dim_b b, day d
WHERE f.a_id = a.a_id AND f.b_id = b.b_id AND f.day = d.d_id AND d.d_month = 2
GROUP BY b.b_name
"""
"""``dim_a`` is read only in the aggregates' CASE conditions (TPC-DS q43's shape:
``SUM(CASE WHEN d_day_name = 'Sunday' THEN ss_sales_price END)``)."""


def test_an_input_read_only_in_case_conditions_is_peeled(tmp_path) -> None:
    data = tables(random.Random(10), rows=4000)
    counts = {n: t.num_rows for n, t in data.items()}
    p = plan(GUARDED_SQL, sources(), name="v", stats=counts)
    assert p.peels == (2,)
    (d,) = [d for d in p.decisions if d.topic == "eager_aggregate"]
    assert sorted(d.choice) == ["a", "b"]
    assert "CASE conditions in aggregates" in d.reason
    # not a guard: the ELSE is a value, the value reads the dimension, two WHENs,
    # a float sum, a guarded x / c (summed exactly and divided after)
    for agg in ("sum(CASE WHEN a.a_grp < 2 THEN f.qty ELSE 1 END)",
                "sum(CASE WHEN a.a_grp < 2 THEN f.qty + a.a_grp END)",
                "sum(CASE WHEN a.a_grp < 2 THEN f.qty WHEN a.a_grp < 4 THEN 0 END)",
                "sum(CASE WHEN a.a_grp < 2 THEN f.w END)",
                "sum(CASE WHEN a.a_grp < 2 THEN f.qty / 4 END)",
                "min(CASE WHEN a.a_grp < 2 THEN f.qty ELSE 0 END)"):
        sql = GUARDED_SQL.replace("count(*) AS n,", f"count(*) AS n, {agg} AS x,")
        assert not any(d.topic == "eager_aggregate" and "a" in d.choice
                       for d in plan(sql, sources(), name="v", stats=counts).decisions), agg
    # a change to the dimension reaches the partial groups, not the facts
    runs = {}
    for peels in (None, ()):
        with joinstate.StateStore(tmp_path / f"s{peels}") as store:
            graph, sql_plan = define(GUARDED_SQL, sources(), name="v", stats=counts,
                                     peels=peels)
            pipe = joinstate.Pipeline(store, "v", graph)
            out = [pipe.push(s, _weighted(data[s], 1))["v"]
                   for s in ("day", "dim_a", "dim_b", "fact")]
            gone = data["dim_a"].slice(0, 2)
            new = gone.set_column(1, "a_name", pa.array(["a1", None])).set_column(
                2, "a_grp", pa.array([1, 4], pa.int32()))
            import population

            report = population.apply_changes(
                pipe, {"dim_a": pa.concat_tables([_weighted(gone, -1), _weighted(new, 1)])},
                strategy="incremental")
            assert isinstance(report.output, dict)
            out.append(report.output["v"])
            runs[bool(sql_plan.peels[0])] = max(r.rows_in for r in
                                                report.operator_runs.values())
            cur = {**data, "dim_a": pa.concat_tables([data["dim_a"].slice(2), new])}
            cols = ["b_name", "n", "s1", "s2", "c1", "lo", "hi"]
            got = consolidate(pa.concat_tables(
                [t.select([*cols, "_weight"]) for t in out]))
            assert _rows(got, cols) == _duck(GUARDED_SQL, cur), peels
    # peeled: the partial groups of two a_id values (at most 5 b_id each);
    # unpeeled: every joined fact row of them in month 2 (~4000 / 6 / 3 each)
    assert runs[True] <= 20 < 200 < runs[False]


def test_a_view_keeps_its_peels_and_an_older_view_keeps_none(tmp_path) -> None:
    data = tables(random.Random(9))
    counts = {n: t.num_rows for n, t in data.items()}
    with joinstate.StateStore(tmp_path / "new") as store:
        compile(SQL, sources(), store=store, name="v", stats=counts)
        assert stored_view(store, "v").peels == (2,)
    with joinstate.StateStore(tmp_path / "new") as store:
        # no counts now: the rule would peel nothing, the recorded plan is kept
        compile(SQL, sources(), store=store, name="v")
    with joinstate.StateStore(tmp_path / "new") as store:
        planner.reopen(store, "v")
        assert stored_view(store, "v").peels == (2,)
    with joinstate.StateStore(tmp_path / "old") as store:
        graph, old_plan = define(SQL, sources(), name="v", stats=counts, peels=())
        assert old_plan.peels == (0,)
        joinstate.Pipeline(store, "v", graph).compile()
        keyed = {n: (s.schema, s.unique_key) for n, s in sources().items()}
        # a record as written before eager aggregation: join orders, no peels
        record_view(store, "v", ViewRecord(SQL, keyed, counts,
                                           join_orders=old_plan.join_orders))
    with joinstate.StateStore(tmp_path / "old") as store:
        compile(SQL, sources(), store=store, name="v", stats=counts)  # no mismatch
        assert stored_view(store, "v").peels == ()
    with joinstate.StateStore(tmp_path / "old") as store:
        planner.reopen(store, "v")


D3 = pa.schema([("k3", pa.int32()), ("n3", pa.int32()), ("flag", pa.int32())])
RFACT = pa.schema([("f_id", pa.int64()), ("a_id", pa.int32()), ("b_id", pa.int64()),
                   ("k3", pa.int32()), ("x", pa.int32()), ("y", pa.decimal128(9, 2)),
                   ("z", pa.string())])
_AGGS = ["count(*)", "sum(f.x)", "sum(f.y)", "min(f.y)", "max(f.z)", "avg(f.x)",
         "count(f.y)", "max(f.x)", "min(f.z)"]
_KEYS = {"a": ["a.a_name", "a.a_grp"], "b": ["b.b_name"], "c": ["c.n3"]}
_JOIN = {"a": "f.a_id = a.a_id", "b": "f.b_id = b.b_id", "c": "f.k3 = c.k3"}
_FROM = {"a": "dim_a a", "b": "dim_b b", "c": "d3 c"}
_FILTER = {"a": "a.a_grp < 4", "b": "b.b_name IS NOT NULL", "c": "c.flag = 1"}
_GUARDED = {"a": ["sum(CASE WHEN a.a_name = 'a1' THEN f.x END)",
                  "count(CASE WHEN a.a_grp < 2 THEN f.y END)",
                  "sum(CASE WHEN a.a_name IS NULL OR a.a_grp = 3 THEN f.y ELSE 0 END)",
                  "count(CASE WHEN a.a_name <> 'a0' THEN 1 END)",
                  "sum(CASE WHEN a.a_name IN ('a1', 'a3') THEN 1 ELSE 0 END)",
                  "count(CASE WHEN a.a_grp = 2 THEN NULL END)"],
            "b": ["min(CASE WHEN b.b_name = 'x' THEN f.y END)",
                  "max(CASE WHEN b.b_name <> 'y' THEN f.z ELSE NULL END)"],
            "c": ["sum(CASE WHEN c.flag = 1 THEN f.x ELSE 0 END)",
                  "max(CASE WHEN c.n3 = 2 THEN f.y END)",
                  "sum(CASE WHEN c.n3 + c.flag > 1 THEN f.x * 2 - 1 END)"]}
"""Aggregates a dimension is read in only as a CASE guard (peelable)."""


def _random_query(r: random.Random, guarded: bool = False) -> tuple[str, list[str]]:
    """A GROUP BY over the facts and 1-3 dimensions: keys from the dimensions (and at
    times a fact column), 1-4 aggregates, at times a dimension filter and a HAVING.

    ``guarded``: keys from only some of the dimensions, and 1-3 aggregates more that
    read a dimension only in a CASE condition.
    """
    dims = sorted(r.sample(["a", "b", "c"], r.randint(1, 3)))
    keyed = sorted(r.sample(dims, r.randint(1, len(dims)))) if guarded else dims
    keys = sorted({r.choice(_KEYS[d]) for d in keyed for _ in range(r.randint(1, 2))})
    if r.random() < 0.3:
        keys.append("f.z")
    aggs = r.sample(_AGGS, r.randint(1, 4))
    if guarded:
        pool = [g for d in dims for g in _GUARDED[d]]
        aggs += r.sample(pool, min(len(pool), r.randint(1, 3)))
    where = [_JOIN[d] for d in dims] + [_FILTER[d] for d in dims if r.random() < 0.4]
    names = [f"k{i}" for i in range(len(keys))] + [f"v{i}" for i in range(len(aggs))]
    select = [f"{k} AS k{i}" for i, k in enumerate(keys)] + [
        f"{a} AS v{i}" for i, a in enumerate(aggs)]
    sql = (f"SELECT {', '.join(select)} FROM fact f, {', '.join(_FROM[d] for d in dims)} "
           f"WHERE {' AND '.join(where)} GROUP BY {', '.join(keys)}")
    if r.random() < 0.25:
        sql += " HAVING count(*) > 1"
    return sql, names


def _random_tables(r: random.Random, rows: int) -> dict[str, pa.Table]:
    def maybe(v: object) -> object:
        return None if r.random() < 0.05 else v

    fact = pa.table({
        "f_id": list(range(rows)), "a_id": [maybe(r.randrange(6)) for _ in range(rows)],
        "b_id": [maybe(r.randrange(5)) for _ in range(rows)],
        "k3": [maybe(r.randrange(4)) for _ in range(rows)],
        "x": [maybe(r.randrange(-20, 50)) for _ in range(rows)],
        "y": [maybe(Decimal(r.randrange(-500, 10_000)) / 100) for _ in range(rows)],
        "z": [maybe(r.choice("pqrs")) for _ in range(rows)]}, schema=RFACT)
    base = tables(r, rows=1)
    d3 = pa.table({"k3": list(range(4)), "n3": [i % 3 for i in range(4)],
                   "flag": [i % 2 for i in range(4)]}, schema=D3)
    return {"fact": fact, "dim_a": base["dim_a"], "dim_b": base["dim_b"], "d3": d3}


def _random_sources() -> dict[str, Source]:
    return {"fact": Source(RFACT), "dim_a": Source(DIM_A, "a_id"),
            "dim_b": Source(DIM_B, "b_id"), "d3": Source(D3, "k3")}


def _random_change(r: random.Random, s: str, t: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Rows to delete and rows to insert into source ``s`` (``t``: its rows now)."""
    picks = r.sample(range(t.num_rows), k=min(r.randint(1, 5), t.num_rows))
    gone = t.take(picks)
    if s == "fact":
        new = pa.concat_tables([gone.take(pa.array([0] * r.randint(0, 2), pa.int64())),
                                gone.slice(1, 1)])
        if new.num_rows:
            new = new.set_column(1, "a_id", pa.array(
                [r.choice([None, 0, 5]) for _ in range(new.num_rows)], pa.int32()))
        return gone, new
    col, values = {"dim_a": (1, ["a0", "a7", None]), "dim_b": (1, ["x", "w", None]),
                   "d3": (2, [0, 1])}[s]
    new = gone.set_column(col, t.schema.field(col), pa.array(
        [r.choice(values) for _ in picks], t.schema.field(col).type))
    if r.random() < 0.2:
        new = new.slice(0, new.num_rows - 1)  # a dimension row deleted
    return gone, new


@pytest.mark.parametrize("guarded", [False, True], ids=["keys", "guards"])
@pytest.mark.parametrize("seed", [
    *range(8), *(pytest.param(s, marks=pytest.mark.slow) for s in range(8, 60))])
def test_random_grouped_joins_match_duckdb_peeled_or_not(tmp_path, seed: int,
                                                         guarded: bool) -> None:
    """Random GROUP BYs over a fact table and 1-3 dimensions, compiled from row counts
    that make the compiler peel what it can, and without; random changes to every
    source (deletes, duplicates, NULL keys, renamed and deleted dimension rows), DuckDB
    after every push.  ``guards``: some dimensions read only in CASE conditions of
    aggregates."""
    r = random.Random(seed)
    sql, names = _random_query(r, guarded)
    data = _random_tables(r, 300)
    counts = {**{n: t.num_rows for n, t in data.items()}, "fact": 1_000_000}
    peeled = plan(sql, _random_sources(), name="v", stats=counts).peels
    answers = []
    for stats in (counts, None):
        cur = dict(data)
        rc = random.Random(seed * 7 + 1)
        with joinstate.StateStore(tmp_path / f"s{stats is None}") as store:
            p = compile(sql, _random_sources(), store=store, name="v", stats=stats)
            read = [s for s in ("dim_a", "dim_b", "d3", "fact") if s in p.sources]
            out = [p.push(s, _weighted(cur[s], 1))["v"] for s in read]
            for step in range(10):
                s = rc.choice(["fact", *read])
                gone, new = _random_change(rc, s, cur[s])
                out.append(p.push(s, pa.concat_tables([_weighted(gone, -1),
                                                       _weighted(new, 1)]))["v"])
                rows = cur[s].to_pylist()
                for row in gone.to_pylist():  # one copy of each deleted row
                    rows.remove(row)
                cur[s] = pa.concat_tables([pa.Table.from_pylist(rows, schema=cur[s].schema),
                                           new])
                got = consolidate(pa.concat_tables(out).select([*names, "_weight"]))
                assert all(w == 1 for w in got.column("_weight").to_pylist()), (sql, step)
                assert _rows(got, names) == _duck(sql, cur), (sql, step, peeled)
            answers.append(_rows(got, names))
    assert answers[0] == answers[1]
