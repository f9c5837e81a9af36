"""Partial aggregation in distributed plans (``planner/rules/partition_partial.py``).

An exact aggregate (sums of integers or decimals, counts) whose input must move is
summed where its input lies first, and only the partial rows cross the exchange.  The
plans run in the in-process simulator (``tests/distsim.py``, the code a Spark task runs)
beside one pipeline over the whole graph, through inserts, deletes of whole groups,
NULL values and NULL group keys: the outputs must be equal after every operation.
"""

from __future__ import annotations

import decimal
import random
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from distsim import Simulator, attach

import joinstate
import joinstate.graph as jg
from joinstate.testing import assert_zset_equal, integrate
from planner.distribute import DistributionSettings, from_decisions, plan_distribution
from planner.rules.partition_partial import split_graph
from planner.stats import given

if TYPE_CHECKING:
    from pathlib import Path

    from planner.distribute import DistributedPlan

I64 = pa.int64()
DEC = pa.decimal128(7, 2)
FACT = pa.schema([("f_id", I64), ("f_cust", I64), ("f_qty", I64), ("f_price", DEC),
                  ("f_score", pa.float64())])
CUST = pa.schema([("c_id", I64), ("c_city", pa.string()), ("c_tier", I64)])
STATS = {"fact": given("fact", 3_000_000), "cust": given("cust", 2_000_000)}


def sources() -> tuple[jg.Stream, jg.Stream]:
    return (jg.source("fact", FACT, unique_key="f_id"),
            jg.source("cust", CUST, unique_key="c_id"))


def joined() -> jg.Stream:
    fact, cust = sources()
    return fact.join(cust, on=("f_cust", "c_id"))


def plan_of(graph: jg.Graph, **kw: Any) -> DistributedPlan:
    return plan_distribution(graph, {k: v for k, v in STATS.items() if k in graph.sources},
                             shards=3, **kw)


def splits(plan: DistributedPlan) -> dict[str, list[str]]:
    return {d.subject: d.choice for d in plan.decisions if d.topic == "partial"}


def per_city() -> jg.Graph:
    q = joined().group_by(["c_city", "c_tier"]).aggregate(
        qty=("sum", "f_qty"), price=("sum", "f_price"), n=("count", None),
        priced=("count", "f_price"))
    return jg.Graph().output("q", q, materialize=True)


def test_an_exact_aggregate_is_summed_where_its_input_lies() -> None:
    plan = plan_of(per_city())
    assert splits(plan) == {"agg3": ["f_cust"]}
    (x,) = plan.exchanges.values()
    # The partial rows move (group key and partial sums; the final aggregate does not
    # read the shard key), not the joined rows.
    assert x.columns == ("c_city", "c_tier", "qty", "price", "n", "priced")
    assert x.partitioning is not None
    assert x.partitioning.describe() == "hash(c_city, c_tier)"
    assert "summed where their input lies" in plan.explain()
    off = plan_of(per_city(), settings=DistributionSettings(3, partial_aggregates=False))
    assert splits(off) == {}
    (y,) = off.exchanges.values()
    assert "f_id" not in y.columns and "f_qty" in y.columns


@pytest.mark.parametrize("func", ["min", "max"])
def test_aggregates_that_do_not_decompose_exactly_are_not_split(func: str) -> None:
    q = joined().group_by("c_city").aggregate(v=(func, "f_qty"), n=("count", None))
    assert splits(plan_of(jg.Graph().output("q", q))) == {}


def test_a_floating_point_sum_is_not_split() -> None:
    q = joined().group_by("c_city").aggregate(s=("sum", "f_score"))
    assert splits(plan_of(jg.Graph().output("q", q))) == {}


def test_no_split_when_each_input_row_is_its_own_partial_group() -> None:
    fact, _ = sources()
    per_cust = fact.group_by("f_cust").aggregate(s=("sum", "f_qty"))
    q = per_cust.group_by("s").aggregate(n=("count", None))
    plan = plan_distribution(jg.Graph().output("q", q), {"fact": given("fact", 10_000)},
                             shards=2)
    assert splits(plan) == {}


def test_the_recorded_plan_is_rebuilt_with_and_without_the_split() -> None:
    g = per_city()
    plan = plan_of(g)
    again = from_decisions(g, plan.to_dict()["decisions"], shards=3,
                           stats={k: v for k, v in STATS.items() if k in g.sources})
    assert again.explain() == plan.explain()
    assert [st.graph.spec() if st.graph else None for st in again.stages] == [
        st.graph.spec() if st.graph else None for st in plan.stages]
    # A plan recorded before partial aggregation existed has no such decision: rebuilt
    # as it was planned.
    old = plan_of(g, settings=DistributionSettings(3, partial_aggregates=False))
    rebuilt = from_decisions(g, old.to_dict()["decisions"], shards=3)
    assert [len(st.nodes) for st in rebuilt.stages] == [len(st.nodes) for st in old.stages]
    assert splits(rebuilt) == {}


def _rows(rng: random.Random, start: int, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(start, start + n):
        price = rng.choice([None, decimal.Decimal("0.00"), decimal.Decimal("-3.25"),
                            decimal.Decimal(f"{rng.randint(0, 99999)}.{rng.randint(0, 99):02d}")])
        out.append({"f_id": i, "f_cust": rng.choice([None, *range(12)]),
                    "f_qty": rng.choice([None, -2, 0, 1, 5, 10**12]), "f_price": price,
                    "f_score": 0.5})
    return out


def _change(schema: pa.Schema, rows: list[dict[str, Any]], weights: list[int]) -> pa.Table:
    t = pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
    return t.append_column("_weight", pa.array(weights, I64))


CUSTS = [{"c_id": i, "c_city": None if i == 3 else f"city{i % 4}", "c_tier": i % 2}
         for i in range(12)]


@pytest.mark.parametrize("seed", range(4))
def test_split_plans_equal_one_pipeline_through_deletes(tmp_path: Path, seed: int) -> None:
    graph = per_city()
    plan = plan_of(graph)
    assert splits(plan)
    rng = random.Random(seed)
    sim = Simulator(plan, tmp_path / "dist")
    store = joinstate.StateStore(str(tmp_path / "single"))
    try:
        single = attach(store, "single", graph)
        names = list(graph.outputs["q"].schema.names)
        got: list[pa.Table] = []
        want: list[pa.Table] = []
        held: list[dict[str, Any]] = []
        custs = list(CUSTS)
        nxt = 0
        for op in range(6):
            changes: dict[str, pa.Table] = {}
            if op == 0:
                changes["cust"] = _change(CUST, custs, [1] * len(custs))
            elif op == 3:  # a customer moves to another city: its groups move too
                old = custs[5]
                new = {**old, "c_city": "elsewhere"}
                custs[5] = new
                changes["cust"] = _change(CUST, [old, new], [-1, 1])
            new_rows = _rows(rng, nxt, rng.randint(20, 60))
            nxt += len(new_rows)
            gone = rng.sample(held, min(len(held), rng.randint(0, 25)))
            if op == 4:  # every row of one customer: its partial groups vanish
                gone = [r for r in held if r["f_cust"] == 1 and r not in gone] + gone
            for r in gone:
                held.remove(r)
            held += new_rows
            changes["fact"] = _change(FACT, new_rows + gone,
                                      [1] * len(new_rows) + [-1] * len(gone))
            for src in plan.order:
                if src in changes:
                    want.append(single.push(src, changes[src])["q"])
            got.append(sim.apply(changes)["q"])
            assert_zset_equal(integrate(got, names), integrate(want, names),
                              what=f"seed {seed}, operation {op}\n{plan.explain()}")
        assert_zset_equal(integrate([sim.read("q")]), integrate([single.read("q")]),
                          what=f"materialized q, seed {seed}")
    finally:
        sim.close()
        store.close()


def test_the_rewritten_graph_keeps_every_output_declaration() -> None:
    q = joined().group_by(["c_city", "c_tier"]).aggregate(qty=("sum", "f_qty"))
    shown = q.select(["c_city", "qty", "c_tier"])
    g = (jg.Graph().output("top", shown, materialize=True, order_by=[("c_tier", "descending")],
                           limit=3, hide=["c_tier"])
         .output("all", q))
    plan = plan_of(g)
    assert splits(plan) == {"agg3": ["f_cust"]}
    split = split_graph(g, {"agg3": ("f_cust",)})
    assert list(split.outputs) == ["top", "all"]
    for name in g.outputs:
        assert split.output_schema(name) == g.output_schema(name)
    m, m2 = g.materialized["top"], split.materialized["top"]
    assert (m2.order_by, m2.limit, m2.hidden) == (m.order_by, m.limit, m.hidden)
    assert [n.kind for n in split.nodes].count("agg") == [n.kind for n in g.nodes].count("agg") + 1
