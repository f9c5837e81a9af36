"""SparkPipeline: a joinstate.Pipeline run on Spark, every stateful stage sharded by key.

The pipeline is TPC-DS q4 in miniature: store sales filtered, joined with date_dim then
with customer (two joins on different keys), web sales joined with customer, both
projected to one shape (a computed ``sale_type`` column, so the aggregate's key is a
projection's output), ``union_all``, ``group_by().aggregate()``, and a ``join_all`` of
four filtered legs of the aggregate, filtered and projected; plus an output that is a
union of two stages' outputs and one that is a filter of a source (a stateless tail).

Outputs integrated over populate and several applies must equal the in-process
``joinstate.Pipeline`` fed the same changes and DuckDB's recomputation from scratch
(``tests/pipeline_oracle.py``).  A Spark-free simulation of the stage plan (routing with
the same router, one store per stage and shard) checks more shapes quickly.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: pipeline_oracle

import pipeline_oracle as po
from distsim import Simulator
from pipeline_oracle import col, lit
from sparkdata import zset

import joinstate
import spark_io
from planner.distribute import plan_distribution
from spark_io.types import spark_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]

# ---- the q4 miniature ----------------------------------------------------------------------

CUSTOMER = po.Source("customer", pa.schema([
    ("c_sk", pa.int32()), ("c_id", pa.string()), ("c_name", pa.string())]), ["c_sk"])
DATE = po.Source("date_dim", pa.schema([("d_sk", pa.int32()), ("d_year", pa.int32())]),
                 ["d_sk"])
SS = po.Source("store_sales", pa.schema([
    ("ss_c_sk", pa.int64()), ("ss_d_sk", pa.int64()), ("ss_qty", pa.int32()),
    ("ss_net", pa.decimal128(7, 2))]))
WS = po.Source("web_sales", pa.schema([
    ("ws_c_sk", pa.int64()), ("ws_year", pa.int32()), ("ws_net", pa.decimal128(7, 2))]))


def q4_outputs() -> dict[str, po.Node]:
    j2 = (SS.filter(col("ss_qty") > 1).join(DATE, on=("ss_d_sk", "d_sk"))
          .join(CUSTOMER, on=("ss_c_sk", "c_sk")))
    s_rows = j2.select({"customer_id": "c_id", "name": "c_name", "year": "d_year",
                        "sale_type": lit("s"), "net": "ss_net"})
    w_rows = WS.join(CUSTOMER, on=("ws_c_sk", "c_sk")).select(
        {"customer_id": "c_id", "name": "c_name", "year": "ws_year", "sale_type": lit("w"),
         "net": "ws_net"})
    sales = s_rows.union_all(w_rows)
    yt = sales.group_by(["customer_id", "name", "year", "sale_type"],
                        year_total=("sum", "net"), n=("count", None))

    def leg(kind: str, year: int) -> po.Node:
        return yt.filter(col("sale_type").eq(kind) & col("year").eq(year))

    ja = po.JoinAll({"s1": leg("s", 2001), "s2": leg("s", 2002), "w1": leg("w", 2001),
                     "w2": leg("w", 2002)}, "customer_id")
    q4 = ja.filter((col("s2_year_total") > col("s1_year_total"))
                   & (col("w2_year_total") > col("w1_year_total"))).select(
        ["s1_customer_id", "s1_name", "s1_year_total", "s2_year_total"])
    return {"year_total": yt, "q4": q4, "sales": sales, "big": SS.filter(col("ss_qty") >= 8)}


def small_outputs() -> dict[str, po.Node]:
    """Two stages: a join, then an aggregate keyed differently."""
    joined = SS.filter(col("ss_qty") > 1).join(CUSTOMER, on=("ss_c_sk", "c_sk"))
    return {"per_customer": joined.group_by(["c_id"], total=("sum", "ss_net"),
                                            n=("count", None))}


def definition_of(outputs: Mapping[str, po.Node]) -> joinstate.Graph:
    """The described graph, as SparkPipeline takes it."""
    return po.build_graph(outputs)


def dec(rng: random.Random) -> Decimal:
    return Decimal(rng.randrange(-500, 20_000)) / 100


def customer(sk: int, tag: str = "") -> Row:
    return (sk, f"C{sk % 10:02d}", f"name{sk}{tag}")  # sk 0 and 10 share a customer id


def store_sale(rng: random.Random, sk: int | None = None) -> Row:
    c = rng.randrange(14) if sk is None else sk
    return (None if rng.random() < 0.04 else c, rng.randrange(7), rng.randrange(10),
            dec(rng))


def web_sale(rng: random.Random) -> Row:
    return (rng.randrange(14), rng.choice((2001, 2002, 2002, 2003)), dec(rng))


def snapshot(rng: random.Random) -> dict[str, Counter[Row]]:
    ss = [store_sale(rng) for _ in range(160)]
    ss += ss[:3]  # identical duplicates
    return {
        "customer": Counter(customer(sk) for sk in range(12)),
        "date_dim": Counter([(0, 2001), (1, 2001), (2, 2002), (3, 2002), (4, 2002),
                             (5, 2003)]),          # d_sk 6 is missing: sales that never join
        "store_sales": Counter(ss),
        "web_sales": Counter(web_sale(rng) for _ in range(80)),
    }


def changes(rng: random.Random, current: Mapping[str, Counter[Row]]
            ) -> list[tuple[str, list[tuple[Row, int]]]]:
    """Deletes, updates and inserts to every source, each legal after the previous ones."""
    ss = sorted(current["store_sales"], key=repr)
    ws = sorted(current["web_sales"], key=repr)
    cust = sorted(current["customer"], key=repr)
    moved, gone = rng.sample(cust, 2)
    used = {r[0] for r in cust}
    new = [sk for sk in range(16) if sk not in used][:2]
    dates = {r[0]: r[1] for r in current["date_dim"]}
    year = dates.get(5, 2003)
    date_change = [((5, year), -1), ((5, 2002 if year != 2002 else 2001), 1)]
    date_change.append(((6, dates[6]), -1) if 6 in dates else ((6, 2001), 1))
    return [
        ("store_sales", [(r, -1) for r in rng.sample(ss, 12)]
         + [(store_sale(rng), 1) for _ in range(15)] + [(store_sale(rng, 13), 2)]),
        ("customer", [(moved, -1), ((moved[0], moved[1], moved[2] + "-moved"), 1),
                      (gone, -1)] + [(customer(sk), 1) for sk in new]),
        ("web_sales", [(r, -1) for r in rng.sample(ws, 8)]
         + [(web_sale(rng), 1) for _ in range(10)]),
        ("date_dim", date_change),
    ]


# ---- helpers ---------------------------------------------------------------------------------


def table_of(source: po.Source, rows: list[tuple[Row, int]]) -> pa.Table:
    return po.make_delta(source.schema, rows)


def spark_frame(spark: SparkSession, source: po.Source, rows: list[tuple[Row, int]]
                ) -> DataFrame:
    """A DataFrame with the source's exact Spark types (and ``_weight``)."""
    schema = spark_schema(source.schema.append(pa.field("_weight", pa.int64())))
    return spark.createDataFrame([(*r, w) for r, w in rows], schema)


class Twin:
    """The in-process joinstate.Pipeline fed the same changes, and the integrated inputs."""

    def __init__(self, path: Path, outputs: Mapping[str, po.Node]) -> None:
        self.outputs = dict(outputs)
        self.store = joinstate.StateStore(path)
        self.pipeline = po.build_pipeline(self.store, "twin", outputs)
        self.sources = po.sources_of(outputs)
        self.inputs: dict[str, Counter[Row]] = {s: Counter() for s in self.sources}
        self.integrated: dict[str, Counter[Row]] = {o: Counter() for o in outputs}

    def push(self, source: str, rows: list[tuple[Row, int]]) -> None:
        outs = self.pipeline.push(source, table_of(self.sources[source], rows))
        for o, t in outs.items():
            self.integrated[o] = po.zadd(self.integrated[o],
                                         po.zset_of(t, self.outputs[o].schema.names))
        self.inputs[source] = po.zadd(self.inputs[source], po.consolidate(rows))

    def close(self) -> None:
        self.store.close()


def integrate(total: dict[str, Counter[Row]], outs: Mapping[str, DataFrame],
              outputs: Mapping[str, po.Node]) -> None:
    for o, df in outs.items():
        total[o] = po.zadd(total[o], zset(df, outputs[o].schema.names))


def busy(report: Any) -> int:
    """Tasks of an operation that had rows to push (a stage shard without any is idle)."""
    return sum(1 for j in report.jobs for s in j.shards if not s.detail.get("idle"))


def check(got: Mapping[str, Counter[Row]], twin: Twin, where: str) -> None:
    want = po.evaluate(twin.outputs, twin.inputs)
    for o in twin.outputs:
        assert twin.integrated[o] == want[o], (
            f"{where}: in-process pipeline vs DuckDB on {o}:\n"
            f"{po.diff_text(twin.integrated[o], want[o])}")
        assert got[o] == want[o], (
            f"{where}: SparkPipeline vs DuckDB on {o}:\n{po.diff_text(got[o], want[o])}")


# ---- a Spark-free run of the stage plan ------------------------------------------------------


class Simulated:
    """The distributed plan executed in process (:class:`distsim.Simulator`: the stage
    code a Spark task runs, one store per (stage, shard), records routed as the shuffle
    would), one push at a time."""

    def __init__(self, path: Path, graph: joinstate.Graph, shards: int) -> None:
        self.plan = plan_distribution(graph, {}, shards=shards, name="sim")
        self.sim = Simulator(self.plan, path)

    def push(self, source: str, delta: pa.Table) -> dict[str, pa.Table]:
        return self.sim.apply({source: delta})

    def close(self) -> None:
        self.sim.close()


def simulate(tmp_path: Path, outputs: Mapping[str, po.Node],
             pushes: list[tuple[str, list[tuple[Row, int]]]], shards: int = 3) -> None:
    twin = Twin(tmp_path / "twin", outputs)
    sim = Simulated(tmp_path / "sim", definition_of(outputs), shards)
    got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
    try:
        for i, (source, rows) in enumerate(pushes):
            twin.push(source, rows)
            outs = sim.push(source, table_of(twin.sources[source], rows))
            for o, t in outs.items():
                if t.num_rows:
                    got[o] = po.zadd(got[o], po.zset_of(t, outputs[o].schema.names))
            check(got, twin, f"push {i} ({source})")
    finally:
        sim.close()
        twin.close()


def test_distributed_plan_of_q4_shape() -> None:
    """With sizes, the miniature plans as q4 does: the date dimension copied, every sales
    join and the union in stage 0 (each sales table hashed by its customer key), the
    union exchanged by customer_id so that the aggregate, the filters and the delta join
    run in stage 1 where it lands."""
    from planner.partitioning import Replicated
    from planner.stats import given

    stats = {"store_sales": given("store_sales", 1_000_000),
             "web_sales": given("web_sales", 500_000), "date_dim": given("date_dim", 2_000),
             "customer": given("customer", 50_000)}
    plan = plan_distribution(definition_of(q4_outputs()), stats, shards=2, name="q4")
    assert isinstance(plan.sources["date_dim"], Replicated)
    assert plan.sources["store_sales"].describe() == "hash(ss_c_sk)"
    assert len(plan.stages) == 2
    (x,) = plan.exchanges.values()
    assert plan.graph.nodes[x.producer].kind == "union"
    assert x.partitioning is not None and x.partitioning.describe() == "hash(customer_id)"
    kinds = [{plan.graph.nodes[i].kind for i in st.nodes} for st in plan.stages]
    assert {"join", "union"} <= kinds[0] and not {"agg", "joinall"} & kinds[0]
    assert {"agg", "joinall"} <= kinds[1] and "join" not in kinds[1]


def test_simulated_stages_match_in_process_and_duckdb(tmp_path: Path) -> None:
    rng = random.Random(4)
    snap = snapshot(rng)
    pushes = [(s, [(r, w) for r, w in snap[s].items()])
              for s in ("date_dim", "customer", "store_sales", "web_sales")]
    current = {s: Counter(c) for s, c in snap.items()}
    for _ in range(2):
        for source, rows in changes(rng, current):
            pushes.append((source, rows))
            current[source] = po.zadd(current[source], po.consolidate(rows))
    simulate(tmp_path, q4_outputs(), pushes)


def test_simulated_self_join_on_different_keys_and_computed_keys(tmp_path: Path) -> None:
    """A source reaching one join keyed by two columns (one source copy per key), and a
    join key computed by a projection (the projection becomes a stage input)."""
    edges = po.Source("edges", pa.schema([("a", pa.int32()), ("b", pa.int64()),
                                          ("w", pa.int64())]))
    hop = edges.join(edges.filter(col("w") > 0), on=("b", "a"))
    scaled = edges.select({"k": col("a") * 2, "w": "w"})
    doubled = scaled.join(edges.select({"k2": col("b") + col("b"), "w": "w"}),
                          on=("k", "k2"))
    agg = hop.group_by(["a"], total=("sum", "w"), n=("count", None))
    outputs = {"hop": hop, "doubled": doubled, "agg": agg,
               "both": hop.select({"x": "w", "y": "b"}).union_all(
                   doubled.select({"x": "w", "y": "k2"}))}
    rng = random.Random(9)
    rows = [((rng.randrange(6), rng.randrange(6), rng.randrange(-2, 5)), 1) for _ in range(40)]
    pushes = [("edges", rows[:25]), ("edges", rows[25:]),
              ("edges", [(r, -1) for r, _ in rows[:10]])]
    simulate(tmp_path, outputs, pushes)
    plan = plan_distribution(definition_of(outputs), {}, shards=3, name="g")
    # edges reaches the self-join twice, routed by each side's key
    assert [(d.name, d.partitioning.describe()) for d in plan.stages[0].deliveries] == [
        ("edges", "hash(b)"), ("edges-2", "hash(a)")]
    # the computed keys are exchanged by their values to the join on them
    computed = sorted(e.partitioning.describe() for e in plan.exchanges.values()
                      if plan.graph.nodes[e.producer].kind == "project"
                      and e.partitioning is not None)
    assert computed == ["hash(k)", "hash(k2)"]


def test_simulated_outer_and_anti_joins_with_null_keys(tmp_path: Path) -> None:
    """NULL keys go to shard 0: a preserved side's NULL-key rows come out exactly once."""
    left = po.Source("l", pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    right = po.Source("r", pa.schema([("rk", pa.int32()), ("x", pa.string())]))
    full = left.join(right, on=("k", "rk"), how="full")
    anti = left.join(right, on=("k", "rk"), how="left_anti")
    per = full.group_by(["x"], n=("count", None), total=("sum", "v"))
    outputs = {"full": full, "anti": anti, "per": per}
    rng = random.Random(3)

    def lrow() -> Row:
        return (None if rng.random() < 0.2 else rng.randrange(5), rng.randrange(100))

    def rrow() -> Row:
        return (None if rng.random() < 0.2 else rng.randrange(6), rng.choice("abc"))

    ls = [(lrow(), 1) for _ in range(20)]
    rs = [(rrow(), 1) for _ in range(12)]
    pushes = [("l", ls[:12]), ("r", rs), ("l", ls[12:]), ("r", [(r, -1) for r, _ in rs[:5]]),
              ("l", [(r, -1) for r, _ in ls[:6]])]
    simulate(tmp_path, outputs, pushes)


# ---- on Spark ------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["driver", "spark"])
def test_spark_pipeline_matches_in_process_and_duckdb(
        spark: SparkSession, tmp_path: Path, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``route``: small stage inputs cut by shard on the driver (the default), or every
    stage input routed by Spark's shuffle (the path of large changes)."""
    if route == "spark":
        monkeypatch.setattr(spark_io.routing, "COLLECT_MAX_ROWS", 0)
    outputs = q4_outputs()
    rng = random.Random(11)
    snap = snapshot(rng)
    twin = Twin(tmp_path / "twin", outputs)
    sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "state", shards=2,
                                name="q4")
    assert sp.outputs == tuple(outputs)
    assert "joinall16" in sp.explain()
    got: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
    timings: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        frames = {s: spark_frame(spark, twin.sources[s], list(snap[s].items())) for s in snap}
        order = ["date_dim", "customer", "web_sales", "store_sales"]
        outs = sp.populate(frames, order=order)
        timings["populate"] = time.perf_counter() - t0
        assert sp.last_report is not None and sp.last_report.kind == "populate"
        # one Spark job: a report per stage, each of that one job
        assert [j.side for j in sp.last_report.jobs] == [
            f"stage{k}" for k in range(len(sp.plan.stages))]
        assert len({j.seconds for j in sp.last_report.jobs}) == 1
        for s in ("date_dim", "customer", "store_sales", "web_sales"):
            twin.push(s, list(snap[s].items()))
        integrate(got, outs, outputs)
        check(got, twin, "after populate")
        current = {s: Counter(c) for s, c in snap.items()}
        for n, (source, rows) in enumerate(changes(rng, current)):
            t0 = time.perf_counter()
            outs = sp.apply(source, spark_frame(spark, twin.sources[source], rows))
            timings[f"apply {source}"] = time.perf_counter() - t0
            twin.push(source, rows)
            integrate(got, outs, outputs)
            check(got, twin, f"after apply {n} ({source})")
        # re-attached (same definition and shards), the same op_id twice: the recorded
        # outputs the second time, nothing applied twice
        sp = spark_io.SparkPipeline(spark, definition_of(q4_outputs()), tmp_path / "state",
                                    shards=2, name="q4")
        rows = [(web_sale(rng), 1) for _ in range(5)]
        first = sp.apply("web_sales", spark_frame(spark, WS, rows), op_id="again")
        twin.push("web_sales", rows)
        integrate(got, first, outputs)
        again = sp.apply("web_sales", spark_frame(spark, WS, rows), op_id="again")
        assert sp.last_report is not None and sp.last_report.replayed_shards > 0
        assert sp.last_report.replayed_shards == busy(sp.last_report) > 0
        for o in ("year_total", "q4"):
            assert zset(again[o], outputs[o].schema.names) == zset(
                first[o], outputs[o].schema.names)
        check(got, twin, "after a repeated op_id")
        # an empty change: no stage is reached, so no operation job runs for it
        outs = sp.apply("web_sales", spark_frame(spark, WS, []))
        assert sp.last_report is not None
        assert len(sp.last_report.jobs) == 0
        integrate(got, outs, outputs)
        check(got, twin, "after an empty apply")
    finally:
        twin.close()
    print("timings:", {k: round(v, 2) for k, v in timings.items()})


def run_query(spark: SparkSession, sink: Callable[[DataFrame, int], None], src: Path,
              checkpoint: Path) -> None:
    schema = spark_schema(SS.schema.append(pa.field("_weight", pa.int64())))
    stream = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
              .option("recursiveFileLookup", "true").parquet(str(src)))
    query = (stream.writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None


def read_outputs(spark: SparkSession, sp: spark_io.SparkPipeline, out: Path,
                 outputs: Mapping[str, po.Node]) -> dict[str, Counter[Row]]:
    return {o: zset(spark.read.schema(sp.output_schema(o)).parquet(str(out / o)),
                    outputs[o].schema.names) for o in outputs}


def test_foreach_batch_sink_applies_a_replayed_batch_once(spark: SparkSession, tmp_path: Path
                                                          ) -> None:
    outputs = small_outputs()
    rng = random.Random(5)
    snap = snapshot(rng)
    twin = Twin(tmp_path / "twin", outputs)
    sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "state", shards=2)
    try:
        initial: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
        populate = {s: spark_frame(spark, twin.sources[s], list(snap[s].items()))
                    for s in ("customer", "store_sales")}
        integrate(initial, sp.populate(populate), outputs)
        assert sp.last_report is not None and sp.last_report.kind == "populate"
        assert [j.side for j in sp.last_report.jobs] == [
            f"stage{k}" for k in range(len(sp.plan.stages))]
        for s in ("customer", "store_sales"):
            twin.push(s, list(snap[s].items()))
        src, out, ckpt = tmp_path / "src", tmp_path / "out", tmp_path / "ckpt"
        ss = sorted(snap["store_sales"], key=repr)
        batches = [
            [(r, -1) for r in ss[:6]] + [(store_sale(rng), 1) for _ in range(8)],
            [(store_sale(rng, 2), 1) for _ in range(6)] + [(r, -1) for r in ss[6:9]],
        ]
        for n, b in enumerate(batches):
            spark_frame(spark, SS, b).coalesce(1).write.parquet(str(src / f"batch-{n:03d}"))
            twin.push("store_sales", b)
        sink = sp.foreach_batch_sink("store_sales", out, sink_id="sales")
        run_query(spark, sink, src, ckpt)
        assert sorted(p.name for p in (out / "per_customer").iterdir()) == [
            "batch_id=0", "batch_id=1"]
        got = read_outputs(spark, sp, out, outputs)
        check({o: po.zadd(initial[o], got[o]) for o in outputs}, twin, "after two batches")

        # The commit of batch 1 is lost (a crash after the sink ran): Spark replays it.
        for name in ("1", ".1.crc"):
            (ckpt / "commits" / name).unlink(missing_ok=True)
        run_query(spark, sp.foreach_batch_sink("store_sales", out, sink_id="sales"), src,
                  ckpt)
        report = sp.last_report
        assert report is not None and report.operation == "stream-sales-1"
        assert report.replayed_shards == busy(report) > 0
        assert read_outputs(spark, sp, out, outputs) == got

        # Called again by hand with the same batch id: the recorded outputs again.
        sink(spark_frame(spark, SS, batches[1]), 1)
        assert sp.last_report is not None
        assert sp.last_report.replayed_shards == busy(sp.last_report) > 0
        # Another change under a batch id already used is refused.
        with pytest.raises(joinstate.CommitConflictError):
            sink(spark_frame(spark, SS, batches[0]), 1)
    finally:
        twin.close()


def test_errors_name_the_source_and_column(spark: SparkSession, tmp_path: Path) -> None:
    outputs = q4_outputs()
    sp = spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "state", shards=2)
    with pytest.raises(joinstate.SchemaMismatchError, match="no source 'nope'"):
        sp.apply("nope", spark_frame(spark, SS, []))
    bad = spark_frame(spark, SS, []).drop("ss_qty")
    with pytest.raises(joinstate.SchemaMismatchError, match=r"source 'store_sales'.*ss_qty"):
        sp.apply("store_sales", bad)
    with pytest.raises(joinstate.SchemaMismatchError, match=r"must be a joinstate\.Graph"):
        spark_io.SparkPipeline(spark, "q4", tmp_path / "state")  # type: ignore[arg-type]
    with pytest.raises(joinstate.JoinSpecMismatchError, match="shards"):
        spark_io.SparkPipeline(spark, definition_of(outputs), tmp_path / "state", shards=3)
    # an over-retraction inside a stage task reaches the driver as the core's error
    with pytest.raises(joinstate.OverRetractionError):
        sp.apply("date_dim", spark_frame(spark, DATE, [((1, 2001), -1)]))
