"""A further unique key on Spark: verified across shards, and what lets a view run as one stage.

``customer`` is hashed by its primary key ``sk`` (its join with ``sales``); the group by
``cid`` and a delta join on ``cid`` run where those rows lie because ``cid`` is declared
unique (``also_unique``).  That is only sound if it is verified where equal values meet:
the source is delivered a second time, routed by ``cid``, to the check.  Two customers
whose ``sk`` hash to different shards but who share a ``cid`` must be refused, at
population and at apply, with every shard left as it was; a correct change applies
afterwards; random batches give the in-process pipeline's answers.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import joinstate as js
import spark_io
from planner.partitioning import route
from spark_io.types import spark_schema

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

CUSTOMER = pa.schema([("sk", pa.int64()), ("cid", pa.string()), ("name", pa.string())])
SALES = pa.schema([("s_sk", pa.int64()), ("amt", pa.int64())])
SCHEMAS = {"customer": CUSTOMER, "sales": SALES}
OUTPUTS = ("per_cid", "pairs")


def graph() -> js.Graph:
    customer = js.source("customer", CUSTOMER, unique_key="sk", also_unique=["cid"])
    sales = js.source("sales", SALES)
    per = (sales.join(customer, on=("s_sk", "sk")).group_by(["cid", "name"])
           .aggregate(total=("sum", "amt"), n=("count", None)))
    big = per.filter(pc.field("total") > 5).select(["cid", "total"])
    every = per.select(["cid", "n"])
    pairs = js.join_all({"big": big, "all": every}, on="cid")
    return (js.Graph().output("per_cid", per, materialize=True)
            .output("pairs", pairs, materialize=True))


def frame(spark: SparkSession, source: str, rows: list[tuple[Any, ...]], w: list[int]
          ) -> DataFrame:
    schema = SCHEMAS[source].append(pa.field("_weight", pa.int64()))
    return spark.createDataFrame([(*r, x) for r, x in zip(rows, w, strict=True)],
                                 spark_schema(schema))


def table(source: str, rows: list[tuple[Any, ...]], w: list[int]) -> pa.Table:
    cols: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMAS[source]]
    return pa.table({**{f.name: pa.array(c, f.type) for f, c in zip(SCHEMAS[source], cols,
                                                                      strict=True)},
                     "_weight": pa.array(w, pa.int64())})


def content(t: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r.values()) for r in t.to_pylist())


def read(sp: spark_io.SparkPipeline) -> dict[str, Counter[tuple[Any, ...]]]:
    return {o: content(sp.read(o).toArrow()) for o in OUTPUTS}


def shard_pair(sp: spark_io.SparkPipeline) -> tuple[int, int]:
    """Two customer keys that the plan puts on different shards."""
    p = sp.plan.sources["customer"]
    sks = list(range(1000, 1040))
    shards = route(p, pa.table({"sk": pa.array(sks, pa.int64()), "cid": ["x"] * len(sks),
                                "name": ["x"] * len(sks)}), 2)
    assert shards is not None
    a = sks[int(shards.tolist().index(0))]
    b = sks[int(shards.tolist().index(1))]
    return a, b


BASE_CUSTOMERS = [(i, f"C{i}", f"n{i}") for i in range(1, 21)]
BASE_SALES = [(i % 20 + 1, i % 7) for i in range(80)]


def test_the_view_is_one_stage_with_the_check_in_it(spark: SparkSession, tmp_path: Path
                                                     ) -> None:
    sp = spark_io.SparkPipeline(spark, graph(), tmp_path / "state", shards=2, name="v")
    assert len(sp.plan.stages) == 1
    text = sp.explain()
    assert "cid is a verified unique key of source customer" in text
    assert "routed by cid" in text


def test_a_cross_shard_duplicate_is_refused_at_population(spark: SparkSession,
                                                          tmp_path: Path) -> None:
    sp = spark_io.SparkPipeline(spark, graph(), tmp_path / "state", shards=2, name="v")
    a, b = shard_pair(sp)
    bad = [*BASE_CUSTOMERS, (a, "DUP", "a"), (b, "DUP", "b")]
    with pytest.raises(js.UniqueKeyViolationError, match=r"'DUP'"):
        sp.populate({"customer": frame(spark, "customer", bad, [1] * len(bad)),
                     "sales": frame(spark, "sales", BASE_SALES, [1] * len(BASE_SALES))})
    good = [*BASE_CUSTOMERS, (a, "DUP", "a"), (b, "OK", "b")]
    sp.populate({"customer": frame(spark, "customer", good, [1] * len(good)),
                 "sales": frame(spark, "sales", BASE_SALES, [1] * len(BASE_SALES))})
    with js.StateStore(tmp_path / "twin") as store:
        twin = js.Pipeline(store, "v", graph())
        twin.push("customer", table("customer", good, [1] * len(good)))
        twin.push("sales", table("sales", BASE_SALES, [1] * len(BASE_SALES)))
        assert read(sp) == {o: content(twin.read(o)) for o in OUTPUTS}


class Twin:
    """The Spark pipeline and the in-process one, fed the same changes."""

    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.spark = spark
        self.sp = spark_io.SparkPipeline(spark, graph(), root / "state", shards=2, name="v")
        self.store = js.StateStore(root / "twin")
        self.pipe = js.Pipeline(self.store, "v", graph())
        self.customers = {r[0]: r for r in BASE_CUSTOMERS}
        self.sales: Counter[tuple[Any, ...]] = Counter(BASE_SALES)
        self.sp.populate({
            "customer": frame(spark, "customer", BASE_CUSTOMERS, [1] * len(BASE_CUSTOMERS)),
            "sales": frame(spark, "sales", BASE_SALES, [1] * len(BASE_SALES))})
        self.pipe.push("customer", table("customer", BASE_CUSTOMERS, [1] * 20))
        self.pipe.push("sales", table("sales", BASE_SALES, [1] * len(BASE_SALES)))

    def apply(self, changes: dict[str, tuple[list[tuple[Any, ...]], list[int]]]) -> None:
        self.sp.apply({s: frame(self.spark, s, r, w) for s, (r, w) in changes.items()})
        for s in ("customer", "sales"):  # the in-process pipeline: customers first
            if s in changes:
                self.pipe.push(s, table(s, *changes[s]))

    def check(self) -> None:
        assert read(self.sp) == {o: content(self.pipe.read(o)) for o in OUTPUTS}

    def close(self) -> None:
        self.store.close()


def test_a_cross_shard_duplicate_is_refused_at_apply(spark: SparkSession, tmp_path: Path
                                                     ) -> None:
    t = Twin(spark, tmp_path)
    try:
        before = read(t.sp)
        a, b = shard_pair(t.sp)
        t.apply({"customer": ([(a, "X", "a")], [1])})  # a holds X
        t.check()
        before = read(t.sp)
        attempts: list[dict[str, tuple[list[tuple[Any, ...]], list[int]]]] = [
            {"customer": ([(b, "X", "b")], [1])},  # a second holder on the other shard
            {"customer": ([(5, "C5", "n5"), (5, "X", "n5")], [-1, 1])},  # an update takes X
            {"customer": ([(b, "Y", "b"), (b + 100, "Y", "c")], [1, 1]),  # one push, two
             "sales": ([(a, 9)], [1])},
        ]
        for change in attempts:
            with pytest.raises(js.UniqueKeyViolationError, match="customer"):
                t.sp.apply({s: frame(spark, s, r, w) for s, (r, w) in change.items()})
            assert read(t.sp) == before
        # a correct change applies afterwards: X handed from a to b in one operation
        t.apply({"customer": ([(a, "X", "a"), (a, "Z", "a"), (b, "X", "b")], [-1, 1, 1]),
                 "sales": ([(a, 7), (b, 8)], [1, 1])})
        t.check()
    finally:
        t.close()


def test_random_batches_equal_the_in_process_pipeline(spark: SparkSession, tmp_path: Path
                                                      ) -> None:
    rng = random.Random(7)
    t = Twin(spark, tmp_path)
    fresh = 100
    try:
        for _ in range(4):
            rows: list[tuple[Any, ...]] = []
            w: list[int] = []
            # some customers swap or take new values (a value moves between shards)
            picked = rng.sample(sorted(t.customers), 4)
            cids = [t.customers[k][1] for k in picked]
            rng.shuffle(cids)
            for k, c in zip(picked, cids, strict=True):
                old = t.customers[k]
                if rng.random() < 0.3:
                    fresh += 1
                    c = f"N{fresh}"
                new = (k, c, old[2] + "'")
                rows += [old, new]
                w += [-1, 1]
                t.customers[k] = new
            fresh += 1
            sk = 1000 + fresh
            rows.append((sk, f"N{fresh}", "new"))
            w.append(1)
            t.customers[sk] = rows[-1]
            srows: list[tuple[Any, ...]] = []
            sw: list[int] = []
            for s in rng.sample(sorted(t.sales), 3):
                srows.append(s)
                sw.append(-1)
                t.sales[s] -= 1
                if not t.sales[s]:
                    del t.sales[s]
            for _ in range(5):
                s = (rng.choice(sorted(t.customers)), rng.randrange(10))
                srows.append(s)
                sw.append(1)
                t.sales[s] += 1
            t.apply({"customer": (rows, w), "sales": (srows, sw)})
            t.check()
    finally:
        t.close()
