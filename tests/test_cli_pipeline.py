"""The ``joinstate`` command and pipelines: ``inspect`` lists them, ``apply --pipeline``.

``inspect`` reads a pipeline from the store alone (its stored JSON definition, counters
and RocksDB properties); ``apply`` into a pipeline source needs the Python definition,
given as ``--pipeline module:function`` or ``file.py:function``.  The definitions live in
this module, so both forms name it.  Outputs are checked against a plain-Python oracle of
the pipeline (a join and a per-name sum) on the inputs before and after the change.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from cli_runner import assert_one_line_error, run

import joinstate
from joinstate.testing import zset

CUSTOMERS = pa.schema([("c_id", pa.int64()), ("c_name", pa.string())])
ORDERS = pa.schema([("o_id", pa.int64()), ("o_customer", pa.int64()),
                    ("o_amount", pa.int64())])
N_CUSTOMERS = 20
N_ORDERS = 200
THIS = Path(__file__).resolve()
MODULE = THIS.stem  # importable: pytest puts tests/ on sys.path


def define() -> joinstate.Graph:
    """Orders joined to customers; per customer name the total amount and the count."""
    customers = joinstate.source("customers", CUSTOMERS, unique_key="c_id")
    orders = joinstate.source("orders", ORDERS)
    joined = orders.join(customers, on=("o_customer", "c_id"))
    return (joinstate.Graph()
            .output("per_name", joined.group_by(["c_name"]).aggregate(
                total=("sum", "o_amount"), n=("count", None)))
            .output("big", joined.filter(pc.field("o_amount") >= 100).select(["o_id", "c_name"])))


def define_other() -> joinstate.Graph:
    """Like :func:`define` without the ``big`` output: another definition."""
    customers = joinstate.source("customers", CUSTOMERS, unique_key="c_id")
    orders = joinstate.source("orders", ORDERS)
    joined = orders.join(customers, on=("o_customer", "c_id"))
    return joinstate.Graph().output("per_name", joined.group_by(["c_name"]).aggregate(
        total=("sum", "o_amount"), n=("count", None)))


def define_raises() -> joinstate.Graph:
    raise RuntimeError("boom in the definition")


def define_on_a_pipeline(p: joinstate.Pipeline) -> None:
    """A definition written for the old builder API (it took the pipeline to build on)."""
    p.compile()


def define_nothing() -> None:
    """Returns no graph."""


NOT_CALLABLE = 42


def customers() -> pa.Table:
    ids = list(range(N_CUSTOMERS))
    return pa.table({"c_id": ids, "c_name": [f"n{i % 6}" for i in ids]}, schema=CUSTOMERS)


def orders() -> pa.Table:
    ids = list(range(N_ORDERS))
    return pa.table({"o_id": ids, "o_customer": [i % 25 for i in ids], "o_amount": ids},
                    schema=ORDERS)


def per_name(cust: pa.Table, ords: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """The oracle of ``per_name``: (name, total, n) -> 1 for each matched name."""
    names = dict(zip(cust["c_id"].to_pylist(), cust["c_name"].to_pylist(), strict=True))
    total: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for o in ords:
        if o["o_customer"] in names:
            total[names[o["o_customer"]]] += o["o_amount"]
            count[names[o["o_customer"]]] += 1
    return Counter({(n, total[n], count[n]): 1 for n in count})


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store holding the live pipeline 'shop' (and nothing else)."""
    path = tmp_path / "state"
    with joinstate.StateStore(path) as st:
        p = joinstate.Pipeline(st, "shop", define())
        p.push("customers", customers())
        p.push("orders", orders(), commit_id="initial")
        p.set_phase("live")
    return path


def state_rows(path: Path) -> dict[str, int]:
    with joinstate.StateStore(path, read_only=True) as st:
        facts = joinstate.inspect.describe(st, "shop")
    return {ix["stream"]: ix["rows"] for ix in facts["indexes"]}


# ---- inspect -------------------------------------------------------------------------


def test_inspect_lists_a_pipeline_without_its_definition(store: Path) -> None:
    result = run("inspect", store)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "pipeline shop (phase live, indexes shared)" in out
    assert "sources: customers (unique c_id), orders" in out
    assert "outputs: big, per_name" in out
    assert "index customers [c_id]" in out and "index orders [o_customer]" in out
    assert "aggregate agg" in out and "auto-compaction" in out
    assert "recorded commit ids: 1" in out

    data = json.loads(run("inspect", store, "--json").output)
    (only,) = data["stores"]
    assert only["joins"] == []
    (p,) = only["pipelines"]
    assert p["name"] == "shop" and p["phase"] == "live" and p["share_indexes"] is True
    assert [s["name"] for s in p["sources"]] == ["customers", "orders"]
    assert sorted(p["outputs"]) == ["big", "per_name"]
    rows = {ix["stream"]: ix["rows"] for ix in p["indexes"]}
    assert rows == {"customers": N_CUSTOMERS, "orders": N_ORDERS}
    (agg,) = p["aggregates"]
    matched_names = {f"n{c % 6}" for c in range(N_CUSTOMERS)}
    assert agg["groups"] == len(matched_names)
    for part in [*p["indexes"], agg]:
        assert part["auto_compaction"] == "on" and isinstance(part["l0_files"], int)
        assert part["bytes"] > 0
    assert p["commit_ids"] == 1 and p["population_progress"] == {}


def test_inspect_shows_joins_and_pipelines_together(store: Path) -> None:
    side = joinstate.Side(CUSTOMERS, key=["c_id"], unique_key=["c_id"])
    right = joinstate.Side(ORDERS, key=["o_customer"])
    with joinstate.StateStore(store) as st:
        join = st.join("j", left=side, right=right)
        join.push("left", customers())
        join.push("right", orders())
    result = run("inspect", store)
    assert result.exit_code == 0, result.output
    assert "join j (inner, phase population)" in result.output
    assert "pipeline shop" in result.output
    data = json.loads(run("inspect", store, "--json").output)
    (j,) = data["stores"][0]["joins"]
    # the existing join fields, unchanged, and the new summary beside them
    for key in ("name", "how", "phase", "population_progress", "commit_ids", "sides", "stats"):
        assert key in j
    assert j["sides"]["right"]["rows"] == N_ORDERS
    assert j["summary"].splitlines()[1].split() == [
        "side", "layout", "rows", "entries", "distinct", "keys", "bytes", "L0", "files",
        "auto-compaction"]
    assert [p["name"] for p in data["stores"][0]["pipelines"]] == ["shop"]


def test_inspect_shows_a_pipeline_population_in_progress(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with joinstate.StateStore(path) as st:
        p = joinstate.Pipeline(st, "shop", define())
        marker = json.dumps({"batches": 1, "rows": N_CUSTOMERS, "digest": "x",
                             "done": True}).encode()
        p.push("customers", customers(), progress=marker)
    result = run("inspect", path)
    assert result.exit_code == 0, result.output
    assert "pipeline shop (phase population" in result.output
    assert (f"population progress: customers 1 batches, {N_CUSTOMERS} rows, done; orders "
            "nothing loaded") in result.output


def test_summaries_are_small_tables(store: Path) -> None:
    with joinstate.StateStore(store) as st:
        p = joinstate.Pipeline(st, "shop", define())
        lines = p.summary().splitlines()
        stats = p.stats()
    assert lines[0] == "pipeline shop (phase live, indexes shared)"
    assert lines[3].split() == ["state", "rows", "entries", "bytes", "L0", "files",
                                "auto-compaction"]
    body = {" ".join(line.split()[:3]): line.split() for line in lines[4:]}
    assert body["index customers [c_id]"][3:5] == [f"{N_CUSTOMERS}", f"{N_CUSTOMERS}"]
    assert body["index orders [o_customer]"][3] == f"{N_ORDERS}"
    assert {ix["stream"] for ix in stats["indexes"]} == {"customers", "orders"}


# ---- apply --pipeline ------------------------------------------------------------------


@pytest.mark.parametrize("form", ["module", "file"])
def test_apply_into_a_pipeline_source(store: Path, tmp_path: Path, form: str) -> None:
    spec = f"{MODULE}:define" if form == "module" else f"{THIS}:define"
    new = {"o_id": 1000, "o_customer": 3, "o_amount": 500}
    gone = {"o_id": 5, "o_customer": 5, "o_amount": 5}
    changes = tmp_path / "changes.parquet"
    pq.write_table(pa.Table.from_pylist([{**new, "_weight": 1}, {**gone, "_weight": -1}],
                                        schema=ORDERS.append(pa.field("_weight", pa.int64()))),
                   changes)
    out_dir = tmp_path / "out"
    result = run("apply", store, "shop", "orders", changes, "--pipeline", spec,
                 "--output", out_dir, "--commit-id", "c1")
    assert result.exit_code == 0, result.output
    assert "applied 1 inserted and 1 deleted rows to source orders of pipeline shop" \
        in result.output
    before = orders().to_pylist()
    after = [o for o in before if o["o_id"] != 5] + [new]
    old, now = per_name(customers(), before), per_name(customers(), after)
    want = {k: now[k] - old[k] for k in old.keys() | now.keys() if now[k] != old[k]}
    assert len(want) == 4  # n3 and n5 each: -old total, +new total
    assert zset(pq.read_table(out_dir / "per_name.parquet")) == want
    big = zset(pq.read_table(out_dir / "big.parquet"))
    assert big == Counter({(1000, "n3"): 1})  # o_id 5 was below 100: never in 'big'
    assert state_rows(store)["orders"] == N_ORDERS  # one in, one out

    again = run("apply", store, "shop", "orders", changes, "--pipeline", spec,
                "--commit-id", "c1")
    assert again.exit_code == 0, again.output
    assert "already applied" in again.output
    assert state_rows(store)["orders"] == N_ORDERS


def test_apply_previews_pipeline_outputs_and_writes_change_rows(store: Path,
                                                                tmp_path: Path) -> None:
    changes = tmp_path / "c.parquet"
    pq.write_table(pa.table({"o_id": [2000], "o_customer": [4], "o_amount": [150]},
                            schema=ORDERS), changes)
    result = run("apply", store, "shop", "orders", changes, "--pipeline", f"{MODULE}:define")
    assert result.exit_code == 0, result.output
    assert "output big:" in result.output and "2000" in result.output
    out_dir = tmp_path / "cdf"
    pq.write_table(pa.table({"o_id": [2000], "o_customer": [4], "o_amount": [150],
                             "_change_type": ["delete"]}), changes)
    result = run("apply", store, "shop", "orders", changes, "--pipeline", f"{MODULE}:define",
                 "-o", out_dir, "--cdf")
    assert result.exit_code == 0, result.output
    assert pq.read_table(out_dir / "big.parquet").to_pylist() == [
        {"o_id": 2000, "c_name": "n4", "_change_type": "delete"}]


@pytest.mark.parametrize(("spec", "needles"), [
    ("nocolon", ["module:function"]),
    ("no_such_module_xyz:define", ["cannot import", "no_such_module_xyz"]),
    (f"{MODULE}:nothere", ["has no 'nothere'"]),
    (f"{MODULE}:NOT_CALLABLE", ["'NOT_CALLABLE' is a int", "not a function"]),
    (f"{MODULE}:define_raises", ["raised RuntimeError: boom in the definition"]),
    (f"{MODULE}:define_other", ["does not define the pipeline stored", "created with"]),
    (f"{MODULE}:define_on_a_pipeline", ["no argument", "return a joinstate.Graph"]),
    (f"{MODULE}:define_nothing", ["returned NoneType, not a joinstate.Graph"]),
    ("missing_defs.py:define", ["missing_defs.py does not exist"]),
])
def test_bad_pipeline_definitions(store: Path, tmp_path: Path, spec: str,
                                  needles: list[str]) -> None:
    changes = tmp_path / "c.parquet"
    pq.write_table(orders().slice(0, 1), changes)
    before = state_rows(store)
    result = run("apply", store, "shop", "orders", changes, "--pipeline", spec)
    assert_one_line_error(result, 2, "--pipeline", *needles)
    assert state_rows(store) == before


def test_apply_pipeline_usage_errors(store: Path, tmp_path: Path) -> None:
    changes = tmp_path / "c.parquet"
    pq.write_table(orders().slice(0, 1), changes)
    spec = f"{MODULE}:define"
    assert_one_line_error(run("apply", store, "shop", "orders", changes), 2,
                          "is a pipeline", "--pipeline module:function")
    assert_one_line_error(run("apply", store, "nope", "orders", changes, "--pipeline", spec),
                          2, "no pipeline 'nope'", "shop")
    assert_one_line_error(run("apply", store, "shop", "returns", changes, "--pipeline", spec),
                          2, "no source 'returns'", "customers, orders")
    assert_one_line_error(run("apply", store, "shop", "customers", changes, "--pipeline",
                              spec), 2, "column")
    a_file = tmp_path / "out.txt"
    a_file.write_text("x")
    assert_one_line_error(run("apply", store, "shop", "orders", changes, "--pipeline", spec,
                              "--output", a_file), 2, "--output", "directory")
    deleted = tmp_path / "d.parquet"
    pq.write_table(pa.table({"o_id": [9999], "o_customer": [1], "o_amount": [1],
                             "_weight": [-1]}), deleted)
    before = state_rows(store)
    assert_one_line_error(run("apply", store, "shop", "orders", deleted, "--pipeline", spec),
                          2, "orders")
    assert state_rows(store) == before  # atomic: nothing of the refused batch applied


def test_apply_pipeline_flag_on_a_join(tmp_path: Path) -> None:
    path = tmp_path / "state"
    side = joinstate.Side(CUSTOMERS, key=["c_id"], unique_key=["c_id"])
    with joinstate.StateStore(path) as st:
        st.join("j", left=side, right=joinstate.Side(ORDERS, key=["o_customer"]))
    changes = tmp_path / "c.parquet"
    pq.write_table(customers().slice(0, 1), changes)
    assert_one_line_error(run("apply", path, "j", "left", changes, "--pipeline",
                              f"{MODULE}:define"), 2, "is a join", "drop --pipeline")
    assert_one_line_error(run("apply", path, "j", "orders", changes), 2, "SIDE 'orders'",
                          "left and right")


def test_locked_store_inspects_and_refuses_apply(store: Path, tmp_path: Path) -> None:
    changes = tmp_path / "c.parquet"
    pq.write_table(orders().slice(0, 1).set_column(0, "o_id", pa.array([5000])), changes)
    with joinstate.StateStore(store) as held:
        p = joinstate.Pipeline(held, "shop", define())
        p.push("customers", pa.table({"c_id": [99], "c_name": ["w"]}, schema=CUSTOMERS))
        result = run("inspect", store, "--json")
        assert result.exit_code == 0, result.output
        (facts,) = json.loads(result.output)["stores"][0]["pipelines"]
        rows = {ix["stream"]: ix["rows"] for ix in facts["indexes"]}
        assert rows["customers"] == N_CUSTOMERS + 1  # the writer's committed push
        assert_one_line_error(run("apply", store, "shop", "orders", changes, "--pipeline",
                                  f"{MODULE}:define"), 2, "already open")


def test_corrupted_store_exits_1_for_inspect_and_apply(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with joinstate.StateStore(path) as st:
        p = joinstate.Pipeline(st, "shop", define())
        p.push("customers", customers())
        n = 20_000
        p.push("orders", pa.table({"o_id": list(range(n)), "o_customer": [i % 25 for i in
                                                                           range(n)],
                                   "o_amount": list(range(n))}, schema=ORDERS))
        st.flush()
    ssts = sorted(path.glob("*.sst"))
    assert ssts
    os.remove(ssts[-1])
    assert_one_line_error(run("inspect", path), 1, "state corrupted")
    changes = tmp_path / "c.parquet"
    pq.write_table(orders().slice(0, 1), changes)
    assert_one_line_error(run("apply", path, "shop", "orders", changes, "--pipeline",
                              f"{MODULE}:define"), 1, "state corrupted")


def test_apply_help_explains_pipeline() -> None:
    result = run("apply", "--help")
    assert result.exit_code == 0
    for text in ("--pipeline", "MODULE:FUNCTION", "joinstate.Graph",
                 "--pipeline bench.q4:define_q4", "Examples"):
        assert text in result.output


def test_spark_pipeline_directory_lists_every_stage_and_shard(tmp_path: Path) -> None:
    """spark_io.SparkPipeline keeps <state_dir>/<stage>/shard-NNNNN stores."""
    for stage in ("stage0", "stage1"):
        for shard in range(2):
            with joinstate.StateStore(tmp_path / stage / f"shard-{shard:05d}") as st:
                p = joinstate.Pipeline(st, "shop", define())
                p.push("customers", customers().slice(shard * 10, 10))
    (tmp_path / "_spark").mkdir()
    (tmp_path / "_spark" / "pipeline-shop.json").write_text("{}")
    result = run("inspect", tmp_path)
    assert result.exit_code == 0, result.output
    assert "stage stage1 shard 1 " in result.output
    data = json.loads(run("inspect", tmp_path, "--json").output)
    assert [(s["stage"], s["shard"]) for s in data["stores"]] == [
        ("stage0", 0), ("stage0", 1), ("stage1", 0), ("stage1", 1)]
    rows = [{ix["stream"]: ix["rows"] for ix in s["pipelines"][0]["indexes"]}["customers"]
            for s in data["stores"]]
    assert rows == [10, 10, 10, 10]
    verified = run("verify", tmp_path)
    assert verified.exit_code == 0 and "4 store(s)" in verified.output
