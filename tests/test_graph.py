"""The graph a pipeline maintains: store-less, immutable, picklable, numbered in creation order;
and its physical plan, computed without a store."""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import joinstate
from bench import q4
from joinstate.graph import Graph, JoinNode, needed_columns
from joinstate.physical import PhysicalPlan
from joinstate.streams import Stream

if TYPE_CHECKING:
    from pathlib import Path

S = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("name", pa.string())])
T = pa.schema([("k", pa.int64()), ("w", pa.float64())])


def small() -> tuple[joinstate.Stream, joinstate.Stream, joinstate.Graph]:
    s = joinstate.source("s", S)
    t = joinstate.source("t", T, unique_key="k")
    joined = s.join(t, on="k", how="left")
    per = joined.group_by("name").aggregate(total=("sum", "v"), n=("count", None))
    return joined, per, Graph().output("per", per, materialize=True).output("joined", joined)


def test_nodes_are_numbered_in_creation_order_whatever_the_output_order() -> None:
    joined, per, g = small()
    h = Graph().output("joined", joined).output("per", per, materialize=True)
    assert [n.label for n in g.nodes] == ["s", "t", "join2", "agg3", "agg4"]
    assert [n.id for n in g.nodes] == list(range(5))
    assert g.spec()["nodes"] == h.spec()["nodes"]
    assert g.outputs["per"].label == "agg3" and g.materialized["per"].node.label == "agg4"
    for n in g.nodes:
        assert all(i.id < n.id for i in n.inputs)


def test_a_graph_is_immutable() -> None:
    joined, _, g = small()
    with pytest.raises(AttributeError, match="immutable"):
        g.outputs = {}
    bigger = g.output("again", joined.filter(pc.field("v") > 1))
    assert list(g.outputs) == ["per", "joined"]
    assert list(bigger.outputs) == ["per", "joined", "again"]
    with pytest.raises(joinstate.SchemaMismatchError, match="already has an output 'per'"):
        g.output("per", joined)


def test_it_pickles_to_the_same_definition() -> None:
    _, _, g = small()
    again = pickle.loads(pickle.dumps(g))
    assert again.spec() == g.spec()
    assert again.explain() == g.explain()
    assert list(again.sources) == ["s", "t"]


def test_nodes_built_on_unpickled_ones_are_numbered_after_their_inputs() -> None:
    """Sequence numbers restart in another process: a node made there may have a smaller
    one than the (unpickled) node it reads; its number still follows its input's."""
    _, per, _ = small()
    shipped = pickle.loads(pickle.dumps(per))
    late = shipped.filter(pc.field("n") > 1)
    early = replace(late.node, seq=-1)  # as if created before everything else
    g = Graph().output("o", Stream(early))
    ids = {n.label: n.id for n in g.nodes}
    assert ids["filter4"] == max(ids.values())
    for n in g.nodes:
        assert all(i.id < n.id for i in n.inputs)


def test_sources_of_one_name_merge_when_equal_and_are_refused_when_not() -> None:
    a = joinstate.source("s", S).filter(pc.field("v") > 0)
    b = joinstate.source("s", S).filter(pc.field("v") < 0)
    g = Graph().output("u", a.union_all(b))
    assert list(g.sources) == ["s"] and len(g.nodes) == 4
    c = joinstate.source("s", S, retractions="unchecked")
    with pytest.raises(joinstate.SchemaMismatchError, match="two different sources are named"):
        Graph().output("u", a.union_all(c))


def test_spark_join_type_names_are_accepted() -> None:
    s, t = joinstate.source("s", S), joinstate.source("t", T)
    for name, how in (("leftouter", "left"), ("OUTER", "full"), ("semi", "left_semi"),
                      ("leftanti", "left_anti"), ("right_outer", "right")):
        node = s.join(t, on="k", how=name).node
        assert isinstance(node, JoinNode) and node.how == how
    with pytest.raises(joinstate.SchemaMismatchError, match="not a join type"):
        s.join(t, on="k", how="cross")


def test_extra_sources_and_bad_arguments() -> None:
    s, t = joinstate.source("s", S), joinstate.source("t", T)
    g = Graph({"o": s.select(["k"])}, sources=[t])
    assert list(g.sources) == ["s", "t"]
    assert [n["kind"] for n in g.spec()["nodes"]] == ["source", "project"]  # t feeds nothing
    with pytest.raises(joinstate.SchemaMismatchError, match="is not a source"):
        Graph({"o": s}, sources=[s.select(["k"])])
    with pytest.raises(joinstate.SchemaMismatchError, match=r"must be a joinstate\.Stream"):
        Graph().output("o", "s")  # type: ignore[arg-type]
    with pytest.raises(joinstate.SchemaMismatchError, match=r"schema must be a pyarrow\.Schema"):
        joinstate.source("x", {"k": "int64"})


def test_needed_columns_and_explain_need_no_store() -> None:
    s = joinstate.source("s", S).filter(pc.field("v") > 0)
    legs = {"a": s.filter(pc.field("v") == 1).select(["k", "name"]),
            "b": s.filter(pc.field("v") == 2).select(["k"])}
    g = Graph().output("j", joinstate.join_all(legs, on="k").select(["a_name"]))
    need = needed_columns(g)
    assert need[g.sources["s"].id] == ["k", "v", "name"]
    text = g.explain()
    assert "delta join on a.k = b.k" in text
    assert "filter1 where (v > 0)" in text and "filter1 (shown above)" in text


def test_the_physical_plan_needs_no_store(tmp_path: Path) -> None:
    graph = q4.define_q4()
    plan = PhysicalPlan.of(graph, True)
    assert len(plan.indexes) == 9
    union = [ip for ip in plan.indexes if ip.base.kind == "union"]
    assert len(union) == 1 and len(union[0].readers) == 6
    legs = [r for (nid, _), r in plan.readers.items() if r.plan is union[0]]
    assert all(r.chain[0][0] == "filter" for r in legs)  # each leg filters what it probes
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "q4", graph)
        for src in graph.sources:
            assert sorted(ip.cf("q4") for ip in plan.written_by(src)) == sorted(
                i.column_family for i in p.written_indexes(src))
            assert sorted(ip.cf("q4") for ip in plan.probed_by(src)) == sorted(
                i.column_family for i in p.probed_indexes(src))
    unshared = PhysicalPlan.of(graph, False)
    assert len(unshared.indexes) > len(plan.indexes)
    with pytest.raises(joinstate.SchemaMismatchError, match="share_indexes names"):
        PhysicalPlan.of(graph, {"nope": False})


def test_the_pipeline_explains_its_graph_too(tmp_path: Path) -> None:
    _, _, g = small()
    with joinstate.StateStore(tmp_path / "s") as store:
        p = joinstate.Pipeline(store, "p", g)
        text = p.explain()
    assert "index ix.p~t[k]" in text and "aggregate agg3" in text
    assert "output per (materialized)" in text
    with pytest.raises(joinstate.SchemaMismatchError, match=r"must be a joinstate\.Graph"):
        joinstate.Pipeline(store, "p", g.outputs)  # type: ignore[arg-type]
