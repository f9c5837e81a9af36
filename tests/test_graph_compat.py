"""Stores made before the graph was its own object re-attach: the stored definitions match.

``tests/data/pipeline_specs.json`` holds the definitions (the catalog bytes) that the
pipeline API stored before the renovation for TPC-DS q4 (both sharing settings), three
hand-written pipelines (a materialized output with order and limit; global aggregates
and a source no output reads; an unchecked source, per-stream sharing, every kind of
operator), the 30 random pipelines of tests/test_pipeline_random.py (both settings) and
50 TPC-DS queries compiled from SQL (by sha256, with the schemas and texts they were
compiled from).  Each is rebuilt here with the graph API and must store the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pipeline_oracle import build_graph
from test_pipeline_random import RandomPipeline

import joinstate
from bench import q4
from joinstate.definition import definition, definition_bytes
from joinstate.names import pipeline_spec_key
from joinstate.physical import LAYOUT

DATA = json.loads((Path(__file__).parent / "data" / "pipeline_specs.json").read_text())
SPECS: dict[str, str] = DATA["specs"]


def stored(graph: joinstate.Graph, share: Any = True) -> str:
    """The definition a store made then holds (index layout 1, recorded by omission):
    re-attaching to one computes the definition in the layout it records."""
    return definition_bytes(definition(graph, share, layout=1)).decode()


def test_q4_stores_what_it_stored() -> None:  # stored before c_customer_id was declared
    for share in (True, False):
        assert stored(q4.define_q4(verified_keys=False), share) == SPECS[f"q4/share={share}"]


def test_the_runtime_stores_that_definition(tmp_path: Path) -> None:
    """A new pipeline stores the same definition and the index layout it is kept in."""
    with joinstate.StateStore(tmp_path / "s") as store:
        joinstate.Pipeline(store, "q4", q4.define_q4(verified_keys=False)).compile()
        got = json.loads(store.meta_get(pipeline_spec_key("q4")) or b"")
    assert got == {**json.loads(SPECS["q4/share=True"]), "index_layout": LAYOUT}


def test_a_store_of_the_first_layout_reattaches_in_it(tmp_path: Path) -> None:
    """A store whose definition records no layout (made before layouts were) re-attaches
    with layout 1: its indexes keep what its readers' filters read."""
    with joinstate.StateStore(tmp_path / "s") as store:
        store.meta_put(pipeline_spec_key("q4"), SPECS["q4/share=True"].encode())
        p = joinstate.Pipeline(store, "q4", q4.define_q4(verified_keys=False))
        p.compile()
        assert p.physical.layout == 1
        assert store.meta_get(pipeline_spec_key("q4")) == SPECS["q4/share=True"].encode()


A = pa.schema([("k", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
B = pa.schema([("k2", pa.int64()), ("y", pa.decimal128(7, 2))])


def test_materialized_output_with_order_and_limit() -> None:
    a = joinstate.source("a", A)
    b = joinstate.source("b", B)
    j = a.join(b, on=("k", "k2"), how="left").select(["k", "x", "s", "y"])
    g = joinstate.Graph().output("r", j, materialize=True, limit=5, order_by=[
        ("x", "descending"), ("s", "ascending", "at_start")])
    assert stored(g) == SPECS["hand/materialize_order"]


def test_global_aggregates_and_a_source_no_output_reads() -> None:
    t = joinstate.source("t", pa.schema([("k", pa.int64()), ("x", pa.int64())]))
    u = joinstate.source("u", pa.schema([("u", pa.int64())]))
    g = t.group_by([]).aggregate(n=("count", None), s=("sum", "x"), hi=("max", "x"))
    graph = (joinstate.Graph(sources=[u]).output("g", g, materialize=True)
             .output("busy", g.filter(pc.field("n") > 1), materialize=True))
    assert stored(graph) == SPECS["hand/global_dead_source"]
    assert list(graph.sources) == ["t", "u"]


def test_unchecked_source_and_sharing_per_stream() -> None:
    sales = joinstate.source("sales", pa.schema([("sk", pa.int64()), ("ck", pa.int64()),
                                                 ("amt", pa.int64())]), retractions="unchecked")
    cust = joinstate.source("cust", pa.schema([("ck", pa.int64()), ("name", pa.string())]),
                            unique_key="ck")
    j = sales.join(cust, on="ck", how="full", suffixes=("_s", "_c"))
    semi = sales.join(cust.filter(pc.field("name") != "x"), on="ck", how="left_semi")
    agg = j.group_by(["ck_s"]).aggregate(t=("sum", pc.field("amt") * 2), m=("min", "name"))
    g = joinstate.Graph().output("agg", agg)
    g = g.output("semi", semi.with_columns({"amt2": pc.field("amt") + 1}), materialize=True,
                 limit=3)
    assert stored(g, {"sales": False}) == SPECS["hand/unchecked_mapping_sharing"]


@pytest.mark.parametrize("seed", range(30))
def test_random_pipelines(seed: int) -> None:
    graph = build_graph(RandomPipeline(seed).outputs)
    for share in (True, False):
        assert stored(graph, share) == SPECS[f"random/{seed}/share={share}"]


def test_tpcds_queries_compiled_from_sql() -> None:
    from planner.sql import Source, define

    sources = {n: Source(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(v["schema"]))),
                         v["unique_key"]) for n, v in DATA["sql_sources"].items()}
    differ = []
    for n, sql in sorted(DATA["sql_queries"].items(), key=lambda x: int(x[0])):
        # as views recorded before their join orders were kept re-attach: rooted by rows
        graph, _ = define(sql, sources, name=f"q{n}", join_rule="rows")
        got = hashlib.sha256(stored(graph).encode()).hexdigest()
        if got != DATA["sql_sha256"][n]:
            differ.append(n)
    assert differ == []
