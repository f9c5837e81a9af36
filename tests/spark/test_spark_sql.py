"""SparkPipeline.from_sql: SQL compiled by the planner, run as sharded Spark stages.

The integrated output after population and a change must equal DuckDB's answer to the
same SQL on the current tables; SQL the planner refuses (and a final ORDER BY/LIMIT, which
a change stream cannot honour) fails before any Spark job or state exists.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import spark_io
from planner.sql import Source, UnsupportedSQLError
from spark_io.types import spark_schema

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
SALES = pa.schema([("k", pa.int64()), ("v", pa.int32()), ("d", pa.decimal128(7, 2))])
CUSTOMER = pa.schema([("ck", pa.int32()), ("name", pa.string())])
SOURCES = {"sales": Source(SALES), "customer": Source(CUSTOMER, "ck")}
SQL = """
    SELECT c.name, sum(s.d / 2) AS half, count(*) AS n, max(s.v) AS top
    FROM sales s JOIN customer c ON s.k = c.ck
    WHERE s.v > 0 OR s.v IS NULL
    GROUP BY c.name
"""


def frame(spark: SparkSession, schema: pa.Schema, rows: list[tuple[Row, int]]) -> DataFrame:
    return spark.createDataFrame([(*r, w) for r, w in rows],
                                 spark_schema(schema.append(pa.field("_weight", pa.int64()))))


def integrate(total: Counter[Row], out: DataFrame) -> None:
    cols = [c for c in out.columns if c != "_weight"]
    for r in out.collect():
        total[tuple(r[c] for c in cols)] += r["_weight"]


def apply_counted(spark: SparkSession, sp: Any, tables: dict[str, Counter[Row]],
                  total: Counter[Row], source: str, schema: pa.Schema,
                  rows: list[tuple[Row, int]], output: str) -> None:
    """Apply ``rows`` to ``source`` on Spark; count them into ``tables``, the output into
    ``total``."""
    for r, w in rows:
        tables[source][r] += w
    integrate(total, sp.apply(source, frame(spark, schema, rows))[output])


def duckdb_answer(tables: dict[str, Counter[Row]], sql: str = SQL,
                  schemas: dict[str, pa.Schema] | None = None) -> Counter[Row]:
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    try:
        for name, schema in (schemas or {"sales": SALES, "customer": CUSTOMER}).items():
            rows = list(tables[name].elements())
            cols = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
            con.register(name, pa.table([pa.array(list(c), f.type)
                                         for c, f in zip(cols, schema, strict=True)],
                                        schema=schema))
        return Counter(tuple(r) for r in con.execute(sql).fetchall())
    finally:
        con.close()


def test_from_sql_maintains_the_answer(spark: SparkSession, tmp_path: Path) -> None:
    sp = spark_io.SparkPipeline.from_sql(spark, SQL, SOURCES, state_dir=tmp_path / "state",
                                         shards=2, name="per_name")
    assert sp.outputs == ("per_name",)
    assert set(sp.sources) == {"sales", "customer"}
    d = Decimal
    customers = [((1, "ann"), 1), ((2, "bo"), 1), ((3, "ann"), 1)]
    sales = [((1, 5, d("1.25")), 1), ((1, 5, d("1.25")), 1), ((2, -1, d("3.00")), 1),
             ((3, None, d("0.50")), 1), ((None, 7, d("9.99")), 1), ((4, 2, None), 1)]
    tables = {"customer": Counter({r: w for r, w in customers}),
              "sales": Counter()}
    for r, w in sales:
        tables["sales"][r] += w
    total: Counter[Row] = Counter()
    outs = sp.populate({"customer": frame(spark, CUSTOMER, customers),
                        "sales": frame(spark, SALES, sales)})
    integrate(total, outs["per_name"])
    assert +total == duckdb_answer(tables)
    change = [((1, 5, d("1.25")), -1), ((2, 8, d("2.00")), 1), ((3, None, d("0.50")), -1)]
    apply_counted(spark, sp, tables, total, "sales", SALES, change, "per_name")
    rename = [((2, "bo"), -1), ((2, "cy"), 1)]
    apply_counted(spark, sp, tables, total, "customer", CUSTOMER, rename, "per_name")
    want = duckdb_answer(tables)
    assert all(w >= 0 for w in total.values())
    assert +total == want


@pytest.mark.parametrize(("sql", "match"), [
    ("SELECT name FROM customer ORDER BY name LIMIT 3 OFFSET 1", "OFFSET"),
    ("SELECT * FROM (SELECT k FROM sales ORDER BY k LIMIT 2) t", "inside a subquery"),
])
def test_from_sql_refuses_before_any_state(spark: SparkSession, tmp_path: Path, sql: str,
                                           match: str) -> None:
    with pytest.raises(UnsupportedSQLError, match=match):
        spark_io.SparkPipeline.from_sql(spark, sql, SOURCES, state_dir=tmp_path / "state")
    assert not (tmp_path / "state" / "_spark").exists()


WINDOW_SQL = """
    SELECT c.name, s.k, s.v, rank() OVER (PARTITION BY c.name ORDER BY s.v DESC) AS rk,
           sum(s.v) OVER () AS everything
    FROM sales s JOIN customer c ON s.k = c.ck
    ORDER BY c.name, rk, s.v NULLS FIRST, s.k
    LIMIT 4
"""


def test_window_functions_and_a_final_limit_are_read_from_spark(
        spark: SparkSession, tmp_path: Path) -> None:
    """A window partitioned by a column and one over every row (shard 0), and the
    answer read with its ORDER BY and LIMIT; each equals DuckDB's."""
    sp = spark_io.SparkPipeline.from_sql(spark, WINDOW_SQL, SOURCES,
                                         state_dir=tmp_path / "state", shards=2, name="w")
    assert "window" in sp.explain()
    d = Decimal
    customers = [((1, "ann"), 1), ((2, "bo"), 1), ((3, "ann"), 1)]
    sales = [((1, 5, d("1.25")), 1), ((2, 9, d("3.00")), 1), ((3, None, d("0.50")), 1),
             ((3, 7, d("9.99")), 1), ((2, 2, None), 1), ((1, 1, d("1.00")), 1)]
    tables = {"customer": Counter(dict(customers)), "sales": Counter(dict(sales))}
    total: Counter[Row] = Counter()
    integrate(total, sp.populate({"customer": frame(spark, CUSTOMER, customers),
                                  "sales": frame(spark, SALES, sales)})["w"])

    def answers() -> tuple[Counter[Row], list[Row]]:
        duckdb = pytest.importorskip("duckdb")
        con = duckdb.connect()
        try:
            for name, schema in (("sales", SALES), ("customer", CUSTOMER)):
                rows = list(tables[name].elements())
                cols = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
                con.register(name, pa.table([pa.array(list(c), f.type)
                                             for c, f in zip(cols, schema, strict=True)],
                                            schema=schema))
            head, _, _ = WINDOW_SQL.partition("ORDER BY c.name, rk")
            whole = Counter(tuple(r) for r in con.execute(head).fetchall())
            return whole, [tuple(r) for r in con.execute(WINDOW_SQL).fetchall()]
        finally:
            con.close()

    whole, limited = answers()
    assert +total == whole and len(whole) == 6
    assert [tuple(r) for r in sp.read("w").collect()] == limited
    change = [((1, 5, d("1.25")), -1), ((2, 8, d("2.00")), 1)]
    for r, w in change:
        tables["sales"][r] += w
    integrate(total, sp.apply("sales", frame(spark, SALES, change))["w"])
    whole, limited = answers()
    assert +total == whole
    assert [tuple(r) for r in sp.read("w").collect()] == limited


HIDDEN_ORDER_SQL = """
    SELECT c.name FROM sales s JOIN customer c ON s.k = c.ck
    ORDER BY s.d DESC NULLS LAST, s.k LIMIT 3
"""


def test_read_orders_by_columns_that_are_not_selected(spark: SparkSession,
                                                      tmp_path: Path) -> None:
    """ORDER BY columns kept only to order the answer: every shard hands its first
    rows with them, the reader orders the shards' rows once more, then drops them."""
    sp = spark_io.SparkPipeline.from_sql(spark, HIDDEN_ORDER_SQL, SOURCES,
                                         state_dir=tmp_path / "state", shards=2, name="h")
    d = Decimal
    customers = [((1, "ann"), 1), ((2, "bo"), 1), ((3, "cy"), 1), ((4, "di"), 1)]
    sales = [((1, 5, d("1.25")), 1), ((2, 9, d("3.00")), 1), ((3, 1, d("0.50")), 1),
             ((4, 7, d("9.99")), 1), ((2, 2, None), 1), ((3, 4, d("2.50")), 1)]
    sp.populate({"customer": frame(spark, CUSTOMER, customers),
                 "sales": frame(spark, SALES, sales)})
    # By d descending, NULLs last: 9.99 di, 3.00 bo, 2.50 cy.
    assert [tuple(r) for r in sp.read("h").collect()] == [("di",), ("bo",), ("cy",)]
    assert sp.read("h").columns == ["name"]


RETURNS = pa.schema([("rk", pa.int64()), ("amt", pa.int32())])
TWO_FACTS = {"sales": Source(SALES), "returns": Source(RETURNS),
             "customer": Source(CUSTOMER, "ck")}
TWO_FACTS_SQL = """
    SELECT c.name, count(*) AS n, sum(r.amt) AS t
    FROM sales s JOIN returns r ON s.k = r.rk JOIN customer c ON s.v = c.ck
    GROUP BY c.name
"""
TWO_FACTS_ROWS = {"sales": 10, "returns": 1000, "customer": 100}


def test_a_state_planned_by_the_earlier_join_order_rule_reattaches_from_sql(
        spark: SparkSession, tmp_path: Path) -> None:
    """A state created when the join-order rule rooted a join group at its largest input
    (``returns`` here, by the row counts given) is laid out in that order: ``from_sql``
    of the same SQL re-attaches to it and keeps it exact, where the rule of today roots
    the group at ``sales`` (it refers to ``customer`` by its key).  Other SQL on that
    state is still refused, naming the difference."""
    from joinstate import JoinSpecMismatchError
    from planner.sql import counts_only, define

    def planned(rule: str) -> Any:
        return define(TWO_FACTS_SQL, TWO_FACTS, name="agg", materialize=True,
                      stats=counts_only(TWO_FACTS_ROWS), join_rule=rule)

    (old, old_plan), (_, new_plan) = planned("rows"), planned("references")
    assert old_plan.join_orders[0][0] == "r" and new_plan.join_orders[0][0] == "s"
    state = tmp_path / "state"
    first = spark_io.SparkPipeline(spark, old, state, 2, name="agg")
    customers = [((1, "ann"), 1), ((2, "bo"), 1), ((3, "ann"), 1)]
    sales = [((1, 1, Decimal("1.00")), 1), ((1, 2, None), 1), ((2, 3, Decimal("2.00")), 1),
             ((None, 1, Decimal("3.00")), 1), ((3, None, None), 1), ((3, 2, None), 1)]
    returns = [((1, 10), 1), ((1, 20), 1), ((2, 30), 1), ((3, 40), 1)]
    tables: dict[str, Counter[Row]] = {
        "customer": Counter(dict(customers)), "sales": Counter(dict(sales)),
        "returns": Counter(dict(returns))}
    schemas = {"customer": CUSTOMER, "sales": SALES, "returns": RETURNS}
    total: Counter[Row] = Counter()
    integrate(total, first.populate({s: frame(spark, schemas[s], rows) for s, rows in
                                     (("customer", customers), ("sales", sales),
                                      ("returns", returns))})["agg"])

    again = spark_io.SparkPipeline.from_sql(spark, TWO_FACTS_SQL, TWO_FACTS, state_dir=state,
                                            shards=2, name="agg", stats=TWO_FACTS_ROWS)
    assert again.graph.spec() == old.spec()
    change = [((1, 20), -1), ((3, 50), 1), ((2, 30), 1)]
    apply_counted(spark, again, tables, total, "returns", RETURNS, change, "agg")
    rename = [((2, "bo"), -1), ((2, "cy"), 1)]
    apply_counted(spark, again, tables, total, "customer", CUSTOMER, rename, "agg")

    assert all(w >= 0 for w in total.values())
    assert +total == duckdb_answer(tables, TWO_FACTS_SQL, schemas)

    other = TWO_FACTS_SQL.replace("sum(r.amt)", "max(r.amt)")
    with pytest.raises(JoinSpecMismatchError, match="different definition"):
        spark_io.SparkPipeline.from_sql(spark, other, TWO_FACTS, state_dir=state, shards=2,
                                        name="agg", stats=TWO_FACTS_ROWS)


CUST2 = pa.schema([("ck", pa.int32()), ("addr", pa.int32()), ("name", pa.string())])
ADDR = pa.schema([("ak", pa.int32()), ("zip", pa.int32()), ("city", pa.string())])
ITEM = pa.schema([("ik", pa.int32()), ("cat", pa.string())])
SALES3 = pa.schema([("k", pa.int64()), ("v", pa.int32()), ("ik", pa.int32()),
                    ("d", pa.decimal128(7, 2))])
ADDR_SQL = """
    SELECT a.city, c.name, i.cat, count(*) AS n, sum(s.d) AS t
    FROM sales s JOIN customer c ON s.k = c.ck JOIN addr a ON c.addr = a.ak AND a.zip = s.v
    JOIN item i ON s.ik = i.ik
    GROUP BY a.city, c.name, i.cat
"""
ADDR_SOURCES = {"sales": Source(SALES3), "customer": Source(CUST2, "ck"),
                "addr": Source(ADDR, "ak"), "item": Source(ITEM, "ik")}
ADDR_ROWS = {"sales": 1000, "customer": 5000, "addr": 50, "item": 10}


def test_a_state_planned_when_lookups_were_judged_on_all_their_joins_reattaches(
        spark: SparkSession, tmp_path: Path) -> None:
    """Three rules, three plans: by rows the group was rooted at ``customer``; by
    references at ``sales``, but ``customer`` was no lookup (it also joins an address on
    a key that is not its own), so the smaller ``addr`` came first, joined on the zip
    alone; today ``customer`` is a lookup of the sales, then ``addr`` one of the
    customers.  A state created with the middle rule's order re-attaches from the same
    SQL (the rule before it would not plan it) and stays exact; other SQL is refused."""
    from joinstate import JoinSpecMismatchError
    from planner.sql import counts_only, define

    def planned(rule: str) -> Any:
        return define(ADDR_SQL, ADDR_SOURCES, name="v", materialize=True,
                      stats=counts_only(ADDR_ROWS), join_rule=rule)

    orders = {r: planned(r)[1].join_orders for r in ("rows", "references", "steps")}
    assert orders == {"rows": (("c", "a", "s", "i"),), "references": (("s", "i", "a", "c"),),
                      "steps": (("s", "i", "c", "a"),)}
    old = planned("references")[0]
    state = tmp_path / "state"
    first = spark_io.SparkPipeline(spark, old, state, 2, name="v")
    d = Decimal
    customers = [((1, 10, "ann"), 1), ((2, 11, "bo"), 1), ((3, 10, "cy"), 1),
                 ((4, None, "di"), 1)]
    addrs = [((10, 7, "oslo"), 1), ((11, 8, "rome"), 1), ((12, 7, "bern"), 1)]
    items = [((1, "toy"), 1), ((2, "pen"), 1)]
    sales = [((1, 7, 1, d("1.00")), 1), ((1, 8, 2, d("2.00")), 1), ((2, 8, 1, d("3.00")), 1),
             ((3, 7, 2, None), 1), ((3, 7, 1, d("4.00")), 1), ((4, 7, 1, d("5.00")), 1),
             ((None, 7, 1, d("6.00")), 1), ((2, None, 2, d("7.00")), 1),
             ((3, 7, None, d("9.00")), 1)]
    tables: dict[str, Counter[Row]] = {
        "customer": Counter(dict(customers)), "addr": Counter(dict(addrs)),
        "item": Counter(dict(items)), "sales": Counter(dict(sales))}
    schemas = {"customer": CUST2, "addr": ADDR, "item": ITEM, "sales": SALES3}
    total: Counter[Row] = Counter()
    integrate(total, first.populate({s: frame(spark, schemas[s], rows) for s, rows in
                                     (("customer", customers), ("addr", addrs),
                                      ("item", items), ("sales", sales))})["v"])

    again = spark_io.SparkPipeline.from_sql(spark, ADDR_SQL, ADDR_SOURCES, state_dir=state,
                                            shards=2, name="v", stats=ADDR_ROWS)
    assert again.graph.spec() == old.spec()
    apply_counted(spark, again, tables, total, "addr", ADDR,
                  [((10, 7, "oslo"), -1), ((10, 8, "oslo"), 1), ((12, 7, "bern"), -1)], "v")
    apply_counted(spark, again, tables, total, "customer", CUST2,
                  [((3, 10, "cy"), -1), ((3, 11, "cy"), 1), ((4, None, "di"), -1),
                   ((4, 10, "di"), 1)], "v")
    apply_counted(spark, again, tables, total, "item", ITEM,
                  [((2, "pen"), -1), ((2, "ink"), 1)], "v")
    apply_counted(spark, again, tables, total, "sales", SALES3,
                  [((1, 7, 1, d("1.00")), -1), ((3, 8, 2, d("8.00")), 1),
                   ((3, 8, 2, d("8.00")), 1)], "v")
    assert all(w >= 0 for w in total.values())
    assert +total == duckdb_answer(tables, ADDR_SQL, schemas)
    assert len(total) >= 3

    other = ADDR_SQL.replace("sum(s.d)", "max(s.d)")
    with pytest.raises(JoinSpecMismatchError, match="different definition"):
        spark_io.SparkPipeline.from_sql(spark, other, ADDR_SOURCES, state_dir=state, shards=2,
                                        name="v", stats=ADDR_ROWS)


EAGER_SQL = """
    SELECT i.cat, count(*) AS n, sum(s.d) AS t, max(s.v) AS top
    FROM sales s JOIN item i ON s.ik = i.ik
    GROUP BY i.cat
"""
EAGER_SOURCES = {"sales": Source(SALES3), "item": Source(ITEM, "ik")}
EAGER_ROWS = {"sales": 100_000, "item": 10}


def test_an_aggregate_peeled_of_its_last_join_on_spark_and_a_state_made_before(
        spark: SparkSession, tmp_path: Path) -> None:
    """From these counts the sales are aggregated by item before ``item`` is joined
    (eager aggregation): exact on Spark under changes to both sides.  A state created
    before eager aggregation (nothing peeled) re-attaches from the same SQL."""
    from planner.sql import counts_only, define

    peeled, peeled_plan = define(EAGER_SQL, EAGER_SOURCES, name="e", materialize=True,
                                 stats=counts_only(EAGER_ROWS))
    unpeeled, _ = define(EAGER_SQL, EAGER_SOURCES, name="e", materialize=True,
                         stats=counts_only(EAGER_ROWS), peels=())
    assert peeled_plan.peels == (1,) and peeled.spec() != unpeeled.spec()
    d = Decimal
    items = [((1, "toy"), 1), ((2, "pen"), 1), ((3, "toy"), 1)]
    sales = [((1, 7, 1, d("1.00")), 1), ((2, 8, 2, d("2.00")), 1), ((3, 9, 1, None), 1),
             ((4, 1, 3, d("4.00")), 1), ((5, 2, None, d("5.00")), 1), ((5, 2, 3, d("6.00")), 1)]
    schemas = {"item": ITEM, "sales": SALES3}
    for label, graph in (("fresh", None), ("before", unpeeled)):
        state = tmp_path / label
        tables: dict[str, Counter[Row]] = {"item": Counter(dict(items)),
                                           "sales": Counter(dict(sales))}
        total: Counter[Row] = Counter()
        if graph is not None:
            first = spark_io.SparkPipeline(spark, graph, state, 2, name="e")
            integrate(total, first.populate({s: frame(spark, schemas[s], rows) for s, rows in
                                             (("item", items), ("sales", sales))})["e"])
        sp = spark_io.SparkPipeline.from_sql(spark, EAGER_SQL, EAGER_SOURCES, state_dir=state,
                                             shards=2, name="e", stats=EAGER_ROWS)
        assert sp.graph.spec() == (peeled if graph is None else unpeeled).spec(), label
        if graph is None:
            integrate(total, sp.populate({s: frame(spark, schemas[s], rows) for s, rows in
                                          (("item", items), ("sales", sales))})["e"])
        apply_counted(spark, sp, tables, total, "item", ITEM,
                      [((2, "pen"), -1), ((2, "toy"), 1), ((3, "toy"), -1)], "e")
        apply_counted(spark, sp, tables, total, "sales", SALES3,
                      [((1, 7, 1, d("1.00")), -1), ((6, 3, 2, d("9.50")), 1),
                       ((6, 3, 2, d("9.50")), 1), ((7, 4, 3, d("1.25")), 1)], "e")
        assert all(w >= 0 for w in total.values()), label
        assert +total == duckdb_answer(tables, EAGER_SQL, schemas), label
        assert len(+total) == 1  # every item is a toy now
