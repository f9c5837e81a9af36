"""bench/report.py: markdown and PNG charts from a results dict, and the samples they draw.

The results are synthetic (tests/bench_results.py, round numbers chosen by hand), so the
expected figures below are arithmetic on those numbers, not outputs of the code under
test.  The last tests check the samples the pipeline population driver records.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from bench_results import FAMILIES, actions, samples, synthetic_results

import joinstate
import population
from bench import report

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == PNG, path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# ---- pure helpers -------------------------------------------------------------------


def test_state_groups_put_a_family_with_its_index_or_aggregate() -> None:
    groups = report.state_groups([*FAMILIES, "agg[q4~agg5].minmax", "ix.j~x[k].deg"])
    assert groups == {
        "ix.q4~store_sales[ss_sold_date_sk]": FAMILIES[0:2],
        "ix.q4~customer[c_customer_sk]": FAMILIES[2:4],
        "agg[q4~agg5]": ["agg[q4~agg5]", "agg[q4~agg5].minmax"],
        "ix.j~x[k]": ["ix.j~x[k].deg"],
    }


def test_state_labels_drop_the_pipeline_name() -> None:
    assert report.state_label("ix.q4~store_sales[ss_sold_date_sk]") == \
        "index store_sales [ss_sold_date_sk]"
    assert report.state_label("ix.q4~union17~joinall30-0[customer_id]") == \
        "index union17~joinall30-0 [customer_id]"
    assert report.state_label("agg[q4~agg5]") == "aggregate agg5"
    assert report.state_label("ix.sales.left[k]") == "ix.sales.left[k]"


def test_input_rates_between_samples() -> None:
    # 100 rows in 0.5 s, then 1,000 in 1 s, then 1,000 in 0.5 s
    assert report.input_rates(samples()) == [
        (0.0, 0.5, "customer", 200.0),
        (0.5, 1.5, "store_sales", 1000.0),
        (1.5, 2.0, "store_sales", 2000.0),
    ]
    assert report.input_rates(samples()[:1]) == []


def test_compaction_off_spans_and_manual_compactions() -> None:
    acts = actions()
    assert report.compaction_off_spans(acts, FAMILIES[0], end=2.0) == [(0.5, 1.8)]
    assert report.compaction_off_spans(acts[:1], FAMILIES[0], end=2.0) == [(0.5, 2.0)]
    assert report.compaction_off_spans(acts, FAMILIES[2], end=2.0) == []
    assert report.manual_compactions(acts, FAMILIES[2:4]) == [0.5]
    assert report.manual_compactions(acts, FAMILIES[0:2]) == []


def test_spark_figures_and_check_counts() -> None:
    res = synthetic_results()
    assert report.spark_batches(res["spark"]) == (0.001, 1500.0)  # the faster of 2.0, 1.5 s
    assert report.spark_population_s(res["spark"]) == 30.0
    assert report.spark_batches(None) == (None, None)
    assert report.check_counts(res) == (8, 8)  # 2 checks x 2 passes + 4 Spark steps
    failed = synthetic_results(failed=True)
    assert report.check_counts(failed) == (7, 8)
    res["spark"]["error"] = "RuntimeError: executor lost"  # stopped: one more failure
    assert report.check_counts(res) == (8, 9)
    assert report.failures(res) == [
        "SparkPipeline stopped with an error: RuntimeError: executor lost"]
    (line,) = report.failures(failed)
    assert "pass shared" in line and "0.01 #1 customer" in line and "year_total differs" in line


# ---- charts and markdown ------------------------------------------------------------


def test_write_report_writes_json_markdown_and_every_chart(tmp_path: Path) -> None:
    res = synthetic_results()
    files = report.write_report(res, tmp_path / "out")
    assert json.loads(files.json.read_text()) == res
    assert set(files.charts) == {
        "population-timeline-symmetric", "population-timeline-auto-asymmetric",
        "population-time", "incremental", "sharing", "scale"}
    md = files.markdown.read_text()
    for path in files.charts.values():
        assert path.parent == tmp_path / "out"
        width, height = png_size(path)
        assert width > 300 and height > 200 and path.stat().st_size > 5_000
        assert f"]({path.name})" in md  # referenced relative to report.md
    assert "**Every answer matched DuckDB** (8 of 8 checks" in md
    # change batches: shared 110 / 220 ms, unshared 220 / 440 ms, DuckDB 20 ms
    assert "| 0.1% | 1,000 | 110 | 220 | 20.0 | 0.18x |" in md
    assert "| 1% | 10,000 | 220 | 440 | 20.0 | 0.09x |" in md
    assert "at 0.1%, the fastest: 1,500 ms" in md  # SparkPipeline's faster batch
    # population: auto's fastest of 2.0 / 2.5 s at 1,050 rows/s against symmetric's 525
    assert ("| auto->asymmetric | 2.00 | 2.0, 2.5 | 0.5 | 1,050 | 2.00x | 3 | 100.0 MiB | "
            "20.0 MiB |") in md
    assert "| symmetric | 4.00 | 5.0, 4.0 | 1.0 | 525 | 1.00x |" in md
    assert "| Spark, 2 shards (auto) | 30.0 |" in md
    # the recorded runs, with their date and commit
    assert "| 10 | 0.01% | 10,000 | 500 | 3,000 | 50,000 | 2026-01-02, `bbb2222`, quiet |" in md
    # sharing: customer-update medians 33 and 66 ms in the shared pass
    assert "| shared | 23 | 10.0 MiB | 30.0 MiB | 25.0 MiB | 2.50 | 0.1%: 33.0, 1%: 66.0 |" \
        in md
    assert "| batch 2: the four kinds at once (1,000 rows) | 1.5 | 1 | 12 | 3 | OK |" in md


def test_timeline_has_one_panel_per_index_and_aggregate() -> None:
    entry = synthetic_results()["q4"]["population_strategies"][0]
    fig = report.timeline_figure(entry, "t")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[2:] == ["index store_sales [ss_sold_date_sk]",  # largest first
                          "index customer [c_customer_sk]", "aggregate agg5"]
    assert len(fig.axes) == 2 + 2 * 3  # rate, stalls, then each panel with its MiB axis


def test_report_without_spark_unshared_or_samples(tmp_path: Path) -> None:
    res = synthetic_results(spark=False, unshared=False, with_samples=False, recorded=False)
    files = report.write_report(res, tmp_path)
    assert set(files.charts) == {"population-time", "incremental"}
    md = files.markdown.read_text()
    assert "Local Spark" not in md and "Shared vs unshared" not in md
    assert "no Spark run" in md
    assert "(5 of 5 checks" not in md and "(2 of 2 checks" in md


def test_a_failed_check_is_the_first_thing_the_report_says() -> None:
    md = report.to_markdown(synthetic_results(failed=True), {})
    verdict = md.index("**CHECK FAILED**")
    assert verdict < md.index("## Population")
    assert "1 of 8 DuckDB checks differ" in md and "0.01 #1 customer" in md


def test_report_redraws_from_its_json() -> None:
    res = synthetic_results()
    charts = {"incremental": Path("incremental.png")}
    saved = json.loads(json.dumps(res, default=str))
    assert report.to_markdown(saved, charts) == report.to_markdown(res, charts)


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(report.MissingDependencyError, match=r"joinstate\[bench\]"):
        report.require_matplotlib()
    assert issubclass(report.MissingDependencyError, joinstate.JoinStateError)


# ---- the samples the timelines draw (population/pipeline.py) ------------------------


def _pipeline(store: joinstate.StateStore) -> joinstate.Pipeline:
    customers = joinstate.source(
        "customers", pa.schema([("c_id", pa.int64()), ("c_name", pa.string())]),
        unique_key="c_id")
    orders = joinstate.source(
        "orders", pa.schema([("o_customer", pa.int64()), ("o_amount", pa.int64())]))
    joined = orders.join(customers, on=("o_customer", "c_id"))
    graph = joinstate.Graph().output(
        "per_name", joined.group_by(["c_name"]).aggregate(total=("sum", "o_amount")))
    return joinstate.Pipeline(store, "orders", graph)


def test_pipeline_population_records_samples(tmp_path: Path) -> None:
    customers = pa.table({"c_id": list(range(50)), "c_name": [f"n{i % 7}" for i in range(50)]})
    orders = pa.table({"o_customer": [i % 60 for i in range(3000)],
                       "o_amount": list(range(3000))})
    with joinstate.StateStore(tmp_path / "s") as store:
        p = _pipeline(store)
        rep = population.populate(p, sources={"customers": customers, "orders": orders},
                                  strategy="asymmetric", batch_rows=500, progress=False)
        families = set(p.column_families())
    s = rep.samples
    assert s[0]["source"] == "" and s[0]["rows"] == 0 and s[0]["t"] >= 0
    assert [x["t"] for x in s] == sorted(x["t"] for x in s)
    assert [x["rows"] for x in s] == sorted(x["rows"] for x in s)
    # each source ends with a sample of the rows loaded so far, smallest source first
    last = {x["source"]: x["rows"] for x in s}
    assert last == {"": 0, "customers": 50, "orders": 3050}
    assert s[-1]["source"] == "orders"
    for x in s:
        assert set(x["l0"]) == set(x["pending"]) == set(x["bytes"]) == families
        assert x["stall_micros"] >= 0
    assert sum(s[-1]["bytes"].values()) > sum(s[0]["bytes"].values())
    assert rep.to_dict()["samples"] == s  # rides along in the JSON report


def test_one_batch_per_size_draws_despite_rounded_times(tmp_path: Path) -> None:
    # run_q4 stores each run's ms rounded to 3 decimals, the median unrounded: with one
    # run the stored minimum can exceed the median by a rounding step.
    res = synthetic_results(spark=False, unshared=False)
    for size in res["q4"]["passes"][0]["sizes"]:
        size["batch"].update(ms=[100.0004], median_ms=100.00036, max_ms=100.00036)
    path = report.incremental_times(res, tmp_path / "i.png")
    assert png_size(path)[0] > 300


def test_structured_streaming_baseline_sits_beside_joinstate(tmp_path: Path) -> None:
    """With a baseline run (``--spark``), report.md shows the three ways side by side."""
    res = synthetic_results()
    micro = {"idle_s": 0.05, "empty_s": 0.25, "empty_sink_s": 0.1, "rows": 600,
             "small_s": 0.5, "small_sink_s": 0.3, "ok": True}
    res["baseline"] = {
        "sf": 0.01, "shards": 2, "cores": 2, "rows_in": 30_000, "want": [27_000, 1],
        "load_average_start": [1.0, 1.0, 1.0], "load_average_end": [1.5, 1.0, 1.0],
        "in_process": {"s": 2.0, "ok": True},
        "spark_join": [{"shards": 2, "read": "files", "jobs": [{"side": "both", "s": 0.9}],
                        "setup_s": 1.2, "s": 1.0, "ok": True, "micro": micro}],
        "structured_streaming": {"s": 8.0, "ok": True, "micro": {
            "idle_s": 0.05, "empty_s": 1.0, "small_s": 1.25, "ok": True}},
        "ok": True,
    }
    md = report.write_report(res, tmp_path / "out").markdown.read_text()
    assert "## Spark Structured Streaming beside joinstate" in md
    # 30,000 rows: 15,000 rows/s in-process, 30,000 through SparkJoin, 3,750 in Spark's join
    assert "| in-process, one writer | 2.0 | 15,000 | 1.00x |" in md
    assert "| 1.0 | 30,000 | 0.50x |" in md
    assert "| Spark Structured Streaming join (RocksDB) | 8.0 | 3,750 | 4.00x |" in md
    assert "SparkJoin is 8.0x faster than Spark's own join." in md


# ---- what the report says: wins, losses and why -------------------------------------


def test_findings_say_why_a_batch_loses_and_where_it_wins() -> None:
    res = synthetic_results()  # batches 110 and 220 ms, DuckDB's recompute 20 ms
    found = report.findings(res)
    text = "\n".join(found)
    assert "every batch size is slower" in text
    assert "**Why a batch loses here, and where it wins**" in text
    # the fit over (1,000 rows, 110 ms) and (10,000 rows, 220 ms): 97.8 ms + 12.2 µs/row
    assert "~98 ms plus ~12 µs per changed row" in text
    # the recorded run where incremental beats DuckDB the most: SF10, 3,000 / 500 ms
    assert "a 10,000-row change at SF10 took 500 ms against DuckDB's 3,000 ms (6.0x" in text
    # populations: symmetric 4.0-5.0 s, auto 2.0-2.5 s: no overlap
    assert "fastest auto (2.0 s; its runs 2.0-2.5 s)" in text
    assert "slower than its slowest (2 alternated runs each)" in text
    md = report.to_markdown(res, {})
    assert md.index("## Where joinstate wins and where it loses") < md.index("## Population")

    res["q4"]["duckdb_recompute"]["answer"]["median_ms"] = 1000.0
    res["q4"]["population_strategies"][0]["runs_s"] = [2.2, 4.0]  # symmetric overlaps auto
    text = "\n".join(report.findings(res))
    assert "every batch size is faster" in text and "Why a batch loses" not in text
    assert "symmetric overlaps its range over 2 alternated runs" in text


def test_findings_compare_spark_pipeline_with_in_process() -> None:
    text = "\n".join(report.findings(synthetic_results()))
    # Spark populated in 30 s against auto's 2.0 s; its 0.1% batches took 4,000 ms
    assert "population 30.0 s against 2.0 s in-process (15.00x)" in text
    assert "a 0.1% change 1.5 s against 110 ms in-process" in text


def test_timeline_panels_are_named_in_sql_terms(tmp_path: Path) -> None:
    from bench import labels, q4

    with joinstate.StateStore(tmp_path / "s") as store:
        p = q4.build_q4(store)
        families = p.column_families()
    named = labels.state_labels(q4.define_q4(), "q4", families)
    assert set(named) == set(families)  # every family of the pipeline has a label
    assert named["ix.q4~join3[ss_customer_sk]"] == "store_sales ⋈ date_dim by ss_customer_sk"
    assert named["ix.q4~union17[customer_id]"] == "year_total by customer_id"
    assert named["ix.q4~customer[c_customer_sk].nulls"] == "customer by c_customer_sk"
    assert named["agg[q4~agg5]"] == ("aggregate: store_sales ⋈ date_dim ⋈ customer grouped "
                                     "by c_customer_id, …, d_year (8 columns)")
    assert named["rows[q4~web_sales]"] == "web_sales: row record"
    assert not any(re.search(r"\b(join|agg|union|project|filter)\d+", v) for v in named.values())
    assert labels.state_labels(q4.define_q4(), "other", families) == {}

    entry = synthetic_results()["q4"]["population_strategies"][0]
    entry["labels"] = {"ix.q4~store_sales[ss_sold_date_sk]": "store_sales by ss_sold_date_sk",
                       "agg[q4~agg5]": "aggregate: sales grouped by c_customer_id"}
    fig = report.timeline_figure(entry, "t")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[2:] == ["store_sales by ss_sold_date_sk", "index customer [c_customer_sk]",
                          "aggregate: sales grouped by c_customer_id"]


def test_unshared_labels_name_the_reader(tmp_path: Path) -> None:
    from bench import labels, q4

    with joinstate.StateStore(tmp_path / "s") as store:
        families = q4.build_q4(store, share_indexes=False).column_families()
    named = labels.state_labels(q4.define_q4(), "q4", families)
    assert named["ix.q4~project19~joinall30-0[customer_id]"] == \
        "year_total (filtered) by customer_id, for leg t_s_firstyear"
    assert named["ix.q4~customer~join4-1[c_customer_sk]"] == \
        "customer by c_customer_sk, for the right side of store_sales ⋈ date_dim ⋈ customer"
