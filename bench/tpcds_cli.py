"""``joinstate bench tpcds``: TPC-DS q4 kept live, checked by DuckDB, reported with charts.

The command (:mod:`bench.commands.suites`) parses options and calls :func:`run`, which runs
the existing suites and hands their results to :mod:`bench.report`:

1. :func:`bench.q4.run_q4`: the q4 pipeline populated once per population strategy
   (fresh store each, with the driver's samples of RocksDB over time), then a pass with
   shared indexes and one without, each populated, then given change batches of every
   size (new sales, deleted sales, customer updates, a date_dim correction), every
   output checked against DuckDB computing q4 from scratch;
   with ``spark=True`` also Spark SQL computing q4 from scratch on the final tables
   (:mod:`bench.spark_sql`), checked against DuckDB;
2. with ``spark=True``, :func:`bench.q4spark.run`: the same definition on local Spark
   (``spark_io.SparkPipeline``), populated and given three change batches, each checked
   against DuckDB;
3. :func:`bench.report.write_report`: ``report.json``, ``report.md`` and PNG charts.

Every argument is checked before anything runs (a wrong strategy must not cost a
benchmark run first); a bad one raises :class:`BenchArgumentError` naming it.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING, Any

from bench.report import MissingDependencyError, ReportFiles, require_matplotlib, write_report
from joinstate.errors import JoinStateError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

__all__ = ["DEFAULT_CHUNK_ROWS", "DEFAULT_SIZES", "BenchArgumentError", "run", "run_and_report"]

DEFAULT_SIZES = (0.0001, 0.001, 0.01)
DEFAULT_CHUNK_ROWS = 50_000
"""Rows per population push.  Smaller than the pipeline driver's 200,000 so that a
population at SF0.01-0.1 spans several pushes, i.e. the timeline has points to draw
(the driver samples RocksDB between pushes)."""
CHECKS = ("each", "size", "end")


class BenchArgumentError(JoinStateError, ValueError):
    """An option of ``joinstate bench tpcds`` is out of range; the message names it."""


def check_arguments(sf: float, strategies: Sequence[str], sizes: Sequence[float],
                    repeat: int, spark: bool, shards: int, spark_share: float | None,
                    chunk_rows: int, check: str) -> None:
    """Raise BenchArgumentError for the first bad argument, MissingDependencyError if needed.

    Also checks, for ``spark=True``, that pyspark imports and Java can be found, so a
    run never fails after minutes of in-process work for want of them.
    """
    from population.driver import FACES
    pipeline_strategies = FACES["pipeline"].strategies

    if not sf > 0:
        raise BenchArgumentError(f"--sf {sf!r}: the scale factor must be > 0 (e.g. 0.01)")
    if not strategies:
        raise BenchArgumentError(
            f"--strategies is empty: give one or more of {', '.join(pipeline_strategies)}, "
            "comma-separated")
    bad = [s for s in strategies if s not in pipeline_strategies]
    if bad:
        raise BenchArgumentError(
            f"--strategies: {', '.join(map(repr, bad))} cannot populate a pipeline; choose "
            f"from {', '.join(pipeline_strategies)} (bulk SST ingestion is for single joins)")
    if len(set(strategies)) != len(strategies):
        raise BenchArgumentError(f"--strategies {','.join(strategies)}: a strategy is repeated")
    if not sizes:
        raise BenchArgumentError("--sizes is empty: give shares of the sales rows in (0, 1], "
                                 "e.g. 0.0001,0.001,0.01")
    out_of_range = [s for s in sizes if not 0 < s <= 1]
    if out_of_range:
        raise BenchArgumentError(
            f"--sizes: {', '.join(f'{s:g}' for s in out_of_range)} not in (0, 1]; a size is "
            "a share of all sales rows (0.001 = 0.1%)")
    if repeat < 1:
        raise BenchArgumentError(f"--repeat {repeat}: give at least 1 batch per size")
    if chunk_rows < 1:
        raise BenchArgumentError(f"--chunk-rows {chunk_rows}: give at least 1 row per push")
    if check not in CHECKS:
        raise BenchArgumentError(f"--check {check!r}: one of {', '.join(CHECKS)}")
    if shards < 1:
        raise BenchArgumentError(f"--shards {shards}: give at least 1 shard")
    if spark_share is not None and not 0 < spark_share <= 1:
        raise BenchArgumentError(f"--spark-share {spark_share:g}: not in (0, 1]")
    try:
        import duckdb  # noqa: F401 - only whether it imports
    except ImportError as exc:
        raise MissingDependencyError(
            f"the DuckDB reference needs duckdb ({exc}); pip install 'joinstate[bench]'"
        ) from exc
    require_matplotlib()
    if spark:
        try:
            import pyspark  # noqa: F401 - only whether it imports
        except ImportError as exc:
            raise MissingDependencyError(
                f"--spark needs pyspark ({exc}); pip install 'joinstate[spark]', or run "
                "with --no-spark") from exc
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise MissingDependencyError(
                "--spark needs Java 17 (no java on PATH and JAVA_HOME unset); install it, "
                "or run with --no-spark")


def default_spark_share(sizes: Sequence[float]) -> float:
    """The middle batch size (Spark runs one batch of each kind, at one size)."""
    ordered = sorted(sizes)
    return ordered[(len(ordered) - 1) // 2]


def run(sf: float = 0.01, strategies: Sequence[str] = ("symmetric", "asymmetric", "auto"),
        sizes: Sequence[float] = DEFAULT_SIZES, *, spark: bool = False, repeat: int = 3,
        shards: int = 2, spark_share: float | None = None, unshared: bool = True,
        seed: int = 0, chunk_rows: int = DEFAULT_CHUNK_ROWS, check: str = "each",
        recompute_runs: int = 3, workdir: Path | None = None, cache_dir: Path | None = None,
        spark_out: Path | None = None, say: Callable[[str], None] | None = None,
        ) -> dict[str, Any]:
    """Run the workload; return the results dict :func:`bench.report.write_report` takes.

    ``results["ok"]`` is whether every DuckDB check passed.  ``say`` gets a line before
    each long step (the command prints it).  ``spark_out`` is where
    :func:`bench.q4spark.run` writes its own ``q4-spark.{json,md}``.
    """
    from bench import q4

    strategies = list(strategies)
    sizes = [float(s) for s in sizes]
    check_arguments(sf, strategies, sizes, repeat, spark, shards, spark_share, chunk_rows,
                    check)
    tell = say or (lambda _line: None)
    share = spark_share if spark_share is not None else default_spark_share(sizes)
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "suite": "tpcds-q4", "sf": sf, "strategies": strategies, "sizes": sizes,
        "repeat": repeat, "spark_requested": spark, "shards": shards if spark else None,
        "spark_share": share if spark else None, "chunk_rows": chunk_rows, "seed": seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tell(f"q4 in this process, SF{sf:g}: population with {', '.join(strategies)}, then "
         f"{repeat} change batch(es) per size {', '.join(f'{s:g}' for s in sizes)}"
         f"{', shared and unshared indexes' if unshared else ''}; every answer checked "
         "against DuckDB")
    workdir_q4 = None if workdir is None else workdir / "in-process"
    results["q4"] = q4.run_q4(sf, sizes, repeat, None, unshared=unshared, seed=seed,
                              workdir=workdir_q4, cache_dir=cache_dir, chunk_rows=chunk_rows,
                              check_every=check, recompute_runs=recompute_runs,
                              strategies=strategies, spark_sql=spark)
    results["spark"] = None
    if spark:
        from bench import q4spark

        tell(f"q4 on local Spark, SF{sf:g}, {shards} shards, batches of {share:g} of the "
             "sales")
        kwargs: dict[str, Any] = {}
        if spark_out is not None:
            kwargs["out"] = spark_out
        results["spark"] = q4spark.run(
            sf, shards, share, seed, workdir=None if workdir is None else workdir / "spark",
            **kwargs)
        # The baseline a Spark user would otherwise pick, on the same generated data:
        # customer x store_sales in-process, through SparkJoin, and as Spark Structured
        # Streaming's own stream-stream join (RocksDB state store), each checked by DuckDB.
        from bench import spark_tpcds

        tell(f"customer x store_sales, SF{sf:g}: in-process vs SparkJoin vs Spark Structured "
             "Streaming's own join")
        results["baseline"] = spark_tpcds.run(sf, shards=shards, workdir=None if workdir is
                                              None else workdir / "baseline")
    results["seconds"] = round(time.perf_counter() - t0, 2)
    results["ok"] = bool(results["q4"].get("ok")) and (
        results["spark"] is None or bool(results["spark"].get("ok"))) and bool(
        results.get("baseline", {}).get("ok", True))
    return results


def run_and_report(out: Path, **kwargs: Any) -> tuple[dict[str, Any], ReportFiles]:
    """:func:`run`, then :func:`bench.report.write_report` into ``out``."""
    if out.exists() and not out.is_dir():
        raise BenchArgumentError(f"--out {out}: a file is in the way; give a directory")
    kwargs.setdefault("spark_out", out / "spark")
    results = run(**kwargs)
    return results, write_report(results, out)
