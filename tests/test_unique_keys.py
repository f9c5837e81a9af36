"""Further unique keys of a source (``also_unique``): declared, verified, planned on.

In-process: every way a push can break a declared key (a second holder across pushes, a
takeover in an update, two holders in one push, a NULL, the retraction of a row that
does not hold its value) is refused with nothing applied, checked by ``verify()`` and by
reading the view; updates that keep or move a value pass.  Planner: q4 with
``c_customer_id`` declared runs as one stage on two shards (hand-written and compiled
from SQL), two without, and ``explain()`` names the dependency it used.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import joinstate as js
from planner.distribute import plan_distribution
from planner.sql import Source, SQLError, compile, reopen
from planner.stats import given

if TYPE_CHECKING:
    from pathlib import Path

SCHEMA = pa.schema([("sk", pa.int64()), ("cid", pa.string()), ("name", pa.string())])
W = SCHEMA.append(pa.field("_weight", pa.int64()))


def rows(*items: tuple[Any, Any, Any, int]) -> pa.Table:
    return pa.table({"sk": [r[0] for r in items], "cid": [r[1] for r in items],
                     "name": [r[2] for r in items], "_weight": [r[3] for r in items]},
                    schema=W)


def graph(retractions: str = "checked") -> js.Graph:
    c = js.source("customer", SCHEMA, unique_key="sk", also_unique=["cid"],
                  retractions=retractions)
    return js.Graph().output("per_cid", c.group_by("cid").aggregate(n=("count", None)),
                             materialize=True)


@pytest.fixture
def pipe(tmp_path: Path) -> Any:
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "p", graph())
        p.push("customer", rows((1, "A", "x", 1), (2, "B", "y", 1), (3, "C", "z", 1)))
        yield p


def snapshot(p: Any) -> tuple[Any, Any]:
    return p.verify(), sorted(p.read("per_cid").to_pylist(), key=str)


@pytest.mark.parametrize("change", [
    pytest.param(rows((9, "A", "q", 1)), id="insert-taken-value"),
    pytest.param(rows((2, "B", "y", -1), (2, "A", "y", 1)), id="update-takes-a-value"),
    pytest.param(rows((7, "D", "x", 1), (8, "D", "y", 1)), id="two-holders-in-one-push"),
    pytest.param(rows((7, "D", "x", 2)), id="one-row-twice"),
    pytest.param(rows((7, None, "x", 1)), id="null-key"),
])
def test_a_broken_key_is_refused_and_nothing_applied(pipe: Any, change: pa.Table) -> None:
    before = snapshot(pipe)
    with pytest.raises(js.UniqueKeyViolationError) as err:
        pipe.push("customer", change)
    text = str(err.value)
    assert "source 'customer'" in text and "(cid)" in text
    assert snapshot(pipe) == before
    # still live: a valid change applies afterwards
    pipe.push("customer", rows((4, "D", "w", 1)))
    assert {"cid": "D", "n": 1} in pipe.read("per_cid").to_pylist()


def test_the_value_is_named(pipe: Any) -> None:
    with pytest.raises(js.UniqueKeyViolationError, match="'A'"):
        pipe.push("customer", rows((9, "A", "q", 1)))
    with pytest.raises(js.UniqueKeyViolationError, match="NULL in column 'cid'"):
        pipe.push("customer", rows((9, None, "q", 1)))


def test_updates_that_keep_or_move_values_pass(pipe: Any) -> None:
    # the same value, other columns changed; a value handed from one row to another;
    # two rows swapping their values in one push
    pipe.push("customer", rows((1, "A", "x", -1), (1, "A", "x2", 1)))
    pipe.push("customer", rows((3, "C", "z", -1), (3, "E", "z", 1), (5, "C", "v", 1)))
    pipe.push("customer", rows((1, "A", "x2", -1), (2, "B", "y", -1), (1, "B", "x2", 1),
                               (2, "A", "y", 1)))
    pipe.verify()
    got = sorted((r["cid"], r["n"]) for r in pipe.read("per_cid").to_pylist())
    assert got == [("A", 1), ("B", 1), ("C", 1), ("E", 1)]
    with pytest.raises(js.UniqueKeyViolationError):  # C is held by row 5 now
        pipe.push("customer", rows((6, "C", "t", 1)))


def test_a_retraction_of_a_row_not_holding_its_value(tmp_path: Path) -> None:
    # An unchecked source trusts its retractions: the check still refuses one whose row
    # is not the holder of its value.
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "p", graph("unchecked"))
        p.push("customer", rows((1, "A", "x", 1)))
        before = p.verify()
        with pytest.raises(js.OverRetractionError, match="not the row holding its value"):
            p.push("customer", rows((2, "A", "x", -1)))
        with pytest.raises(js.OverRetractionError):
            p.push("customer", rows((5, "Z", "x", -1)))
        assert p.verify() == before
    # a checked source refuses it itself, first
    with js.StateStore(tmp_path / "c") as store:
        p = js.Pipeline(store, "p", graph())
        p.push("customer", rows((1, "A", "x", 1)))
        with pytest.raises(js.OverRetractionError):
            p.push("customer", rows((1, "A", "other", -1)))


def test_without_a_primary_key_the_whole_row_identifies_the_holder(tmp_path: Path) -> None:
    c = js.source("customer", SCHEMA, also_unique=["cid"], retractions="unchecked")
    g = js.Graph().output("n", c.group_by("cid").aggregate(n=("count", None)))
    assert g.checks[0].identity == ("sk", "cid", "name")
    with js.StateStore(tmp_path / "s") as store:
        p = js.Pipeline(store, "p", g)
        p.push("customer", rows((1, "A", "x", 1)))
        before = p.verify()
        with pytest.raises(js.OverRetractionError, match="not the row holding its value"):
            p.push("customer", rows((1, "A", "y", -1)))
        with pytest.raises(js.UniqueKeyViolationError):
            p.push("customer", rows((1, "A", "y", 1)))
        assert p.verify() == before
        p.push("customer", rows((1, "A", "x", -1), (1, "A", "y", 1)))


@pytest.mark.parametrize(("keys", "match"), [
    (["nope"], "also_unique column 'nope' is not in the schema"),
    (["sk"], "declared twice"),
    (["cid", ("cid",)], "declared twice"),
    ([("cid", "cid")], "names a column twice"),
    ("cid", "must be a list of keys"),
    ([[]], "non-empty list"),
])
def test_declarations_are_checked(keys: Any, match: str) -> None:
    with pytest.raises(js.SchemaMismatchError, match=match):
        js.source("customer", SCHEMA, unique_key="sk", also_unique=keys)


def test_a_definition_without_further_keys_is_unchanged() -> None:
    c = js.source("customer", SCHEMA, unique_key="sk")
    spec = js.Graph().output("o", c.group_by("cid").aggregate(n=("count", None))).spec()
    assert all("also_unique" not in n and n["kind"] != "unique" for n in spec["nodes"])
    declared = graph().spec()
    assert declared["nodes"][0]["also_unique"] == [["cid"]]
    assert declared["nodes"][-1] == {"kind": "unique", "inputs": [0], "key": ["cid"],
                                     "source": "customer", "identity": ["sk"], "columns": [
                                         "sk: int64", "cid: string", "name: string"]}


def test_sql_sources_declare_and_reopen(tmp_path: Path) -> None:
    sql = "SELECT cid, count(*) AS n FROM customer GROUP BY cid"
    with pytest.raises(SQLError, match="'nope' is not in the schema"):
        Source(SCHEMA, unique_key="sk", also_unique=["nope"])
    with js.StateStore(tmp_path / "s") as store:
        p = compile(sql, {"customer": Source(SCHEMA, "sk", also_unique=["cid"])},
                    store=store, name="v")
        assert [n.kind for n in p.graph.checks] == ["unique"]
        p.push("customer", rows((1, "A", "x", 1)))
        with pytest.raises(js.UniqueKeyViolationError):
            p.push("customer", rows((2, "A", "y", 1)))
        spec = p.graph.spec()
    with js.StateStore(tmp_path / "s") as store:
        again = reopen(store, "v")
        assert again.graph.spec() == spec
        with pytest.raises(js.UniqueKeyViolationError):
            again.push("customer", rows((2, "A", "y", 1)))


# ---- the planner: one stage for q4 ----------------------------------------------------------

Q4_SF1 = {"customer": given("customer", 100_000), "date_dim": given("date_dim", 73_049),
          "store_sales": given("store_sales", 2_880_404),
          "catalog_sales": given("catalog_sales", 1_441_548),
          "web_sales": given("web_sales", 719_384)}


def test_q4_is_one_stage_with_the_key_verified_two_without() -> None:
    from bench import q4

    one = plan_distribution(q4.define_q4(), Q4_SF1, shards=2, name="q4")
    two = plan_distribution(q4.define_q4(verified_keys=False), Q4_SF1, shards=2, name="q4")
    assert (len(one.stages), len(two.stages)) == (1, 2)
    assert not one.exchanges
    text = one.explain()
    assert "c_customer_id is a verified unique key of source customer" in text
    assert "delivered to it a second time, routed by c_customer_id" in text
    assert [d.partitioning.describe() for d in one.stages[0].deliveries
            if d.source == "customer"] == ["hash(c_customer_sk)", "hash(c_customer_id)"]


def _q4_sql_sources(also: bool) -> dict[str, Any]:
    from bench import q4

    return {t: Source(q4.SCHEMAS[t], q4.UNIQUE_KEYS.get(t, [None])[0],
                      also_unique=q4.ALSO_UNIQUE.get(t, ()) if also else ())
            for t in q4.TABLES}


def test_q4_compiled_from_sql_is_one_stage_with_the_key_verified() -> None:
    from bench import tpcds
    from planner.sql import define

    sql = tpcds.query(4)
    for also, stages in ((True, 1), (False, 2)):
        g, _ = define(sql, _q4_sql_sources(also), name="q4")
        plan = plan_distribution(g, Q4_SF1, shards=2, name="q4")
        assert len(plan.stages) == stages, plan.explain()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
