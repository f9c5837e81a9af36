"""TPC-DS query 4 maintained on local Spark (``spark_io.SparkPipeline``), checked by DuckDB.

``./dev q4`` (``python -m bench q4spark``) is the end-to-end run of the pipeline layer
on Spark: TPC-DS data from DuckDB's generator (cached Parquet, small scale factor by
default), q4's pipeline (:func:`bench.q4.define_q4`) populated through Spark's
``mapInArrow`` workers, then sales that put some customers into the answer and three
change batches (new sales in all three channels; deleted sales; customer updates and a
date_dim correction), each applied with ``SparkPipeline.apply``.  After population and
after every batch, the outputs integrated so far (``year_total`` and the final answer)
are compared with DuckDB computing q4 from scratch on the changed tables.  The report
(JSON + markdown) goes to ``bench-results/q4-spark.*``; the command prints where.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench import q4

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["RESULTS", "run"]

RESULTS = Path("bench-results")


def _frame(spark: Any, table: pa.Table, folder: Path, name: str) -> Any:
    """``table`` as a Spark DataFrame, through Parquet (exact decimal and integer types)."""
    path = folder / f"{name}.parquet"
    pq.write_table(table, path)
    return spark.read.parquet(str(path))


def _collect(outs: Mapping[str, Any]) -> dict[str, pa.Table]:
    return {name: df.toArrow() for name, df in outs.items()}


def run(sf: float = 0.01, shards: int = 2, share: float = 0.001, seed: int = 0,
        out: Path = RESULTS, workdir: Path | None = None) -> dict[str, Any]:
    """Populate q4 on Spark, apply three change batches, check each against DuckDB."""
    import spark_io  # the spark extra

    tmp = Path(workdir or tempfile.mkdtemp(prefix="joinstate-q4spark-"))
    shutil.rmtree(tmp / "state", ignore_errors=True)
    (tmp / "in").mkdir(parents=True, exist_ok=True)
    tables = q4.load(sf)
    res: dict[str, Any] = {"suite": "q4-spark", "sf": sf, "shards": shards, "share": share,
                           "seed": seed, "rows": {n: t.num_rows for n, t in tables.items()},
                           "steps": []}
    ref = q4.Reference()
    spark = spark_io.local_session("joinstate-q4")
    integrated = q4.Integrated()
    n_frame = 0

    def step(label: str, t0: float, pushes: int, current: Mapping[str, pa.Table]) -> None:
        seconds = time.perf_counter() - t0
        c = q4.check(integrated, ref, current, label)
        res["steps"].append({"step": label, "seconds": round(seconds, 3), "applies": pushes,
                             "ok": c["ok"], "q4_rows": c["q4"]["want_rows"],
                             "year_total_rows": c["year_total"]["want_rows"]})
        print(f"{label}: {seconds:.1f} s, {pushes} Spark operation(s); year_total "
              f"{c['year_total']['want_rows']:,} rows, answer {c['q4']['want_rows']} rows: "
              f"{'matches DuckDB' if c['ok'] else 'DIFFERS FROM DuckDB'}", flush=True)

    try:
        sp = spark_io.SparkPipeline(spark, q4.define_q4(), tmp / "state", shards=shards,
                                    name="q4")
        res["stages"] = [s.get("name", str(s)) for s in sp.stages]
        frames = {n: _frame(spark, t, tmp / "in", n) for n, t in tables.items()}
        t0 = time.perf_counter()
        integrated.add(_collect(sp.populate(frames)))
        step("population", t0, len(frames), tables)
        work = q4.Workload(tables, seed)

        def apply_all(label: str, pushes: list[tuple[str, pa.Table]]) -> None:
            nonlocal n_frame
            t = time.perf_counter()
            for source, delta in pushes:
                n_frame += 1
                df = _frame(spark, delta, tmp / "in", f"delta-{n_frame}")
                integrated.add(_collect(sp.apply(source, df)))
                work.apply(source, delta)
            step(label, t, len(pushes), work.tables)

        qualify = max(3, round(0.001 * tables["customer"].num_rows))
        apply_all(f"qualifying sales ({qualify} customers)", work.qualifying_sales(qualify))
        apply_all(f"batch 1: new sales in three channels ({share:.2%})",
                  work.batch("insert", share))
        apply_all(f"batch 2: deleted sales ({share:.2%})", work.batch("delete", share))
        apply_all("batch 3: customer updates and a date_dim correction",
                  work.batch("customer", share) + work.batch("date", share))
    finally:
        ref.close()
        spark.stop()
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    res["ok"] = all(s["ok"] for s in res["steps"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "q4-spark.json").write_text(json.dumps(res, indent=1))
    md = [f"# TPC-DS q4 on local Spark: SF{sf:g}, {shards} shards", "",
          ", ".join(f"{n} {r:,}" for n, r in res["rows"].items()) + " rows", "",
          "| step | seconds | Spark operations | year_total rows | answer rows | vs DuckDB |",
          "|---|---|---|---|---|---|"]
    md += [f"| {s['step']} | {s['seconds']:.1f} | {s['applies']} | {s['year_total_rows']:,} | "
           f"{s['q4_rows']} | {'OK' if s['ok'] else 'DIFFERS'} |" for s in res["steps"]]
    (out / "q4-spark.md").write_text("\n".join(md) + "\n")
    return res
