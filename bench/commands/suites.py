"""``joinstate bench <suite>``: every benchmark suite, as a thin command over its module.

Each command parses its options (shared ones from :mod:`bench.commands.options`), calls
the suite's functions, writes the results under ``--out`` (``bench-results/`` by
default) and prints where.  A suite's module is imported when its command runs, so one
suite's optional dependencies (pyspark, duckdb, matplotlib) never burden another.  Exit
status: 0 if every check passed, 1 if a check failed (the results say where), 2 for a
usage error.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from bench import live as live_suite
from bench import population as population_suite
from bench import recompute as recompute_suite
from bench.commands.common import CONTEXT, EXIT_CHECK_FAILED, EXIT_OK, CliError, rich_console
from bench.commands.options import (
    RESULTS,
    batch_rows_option,
    cache_dir_option,
    listed,
    out_option,
    repeat_option,
    seed_option,
    sf_option,
    shards_option,
    sizes_option,
    strategies_option,
    workdir_option,
)
from population.driver import FACES

PIPELINE_STRATEGIES = FACES["pipeline"].strategies

if TYPE_CHECKING:
    from click import Command

__all__ = ["SUITES"]


def _floats(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{option} {text!r}: give numbers separated by commas, e.g. "
                       "0.0001,0.001,0.01") from None


def _check_failed(message: str) -> int:
    click.echo(f"CHECK FAILED{message}", err=True)
    return EXIT_CHECK_FAILED


# ---- tpcds: the main job ---------------------------------------------------------------


@click.command("tpcds", context_settings=CONTEXT,
               short_help="The main job: TPC-DS q4 kept live, checked, charted.")
@sf_option(0.01)
@click.option("--strategies", default="symmetric,asymmetric,auto", show_default=True,
              help="Population strategies to compare, comma-separated (symmetric, "
              "asymmetric, auto), each into a fresh store.")
@click.option("--rounds", type=int, default=2, show_default=True,
              help="Populations per strategy, the order reversed every other round (the "
              "report gives the fastest and the spread).")
@click.option("--sizes", default="0.0001,0.001,0.01", show_default=True,
              help="Change-batch sizes as shares of all sales rows, comma-separated.")
@click.option("--spark/--no-spark", default=False, show_default=True,
              help="Also run q4 on local Spark (spark_io.SparkPipeline); needs Java 17.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Report directory  [default: bench-results/tpcds-sf<SF>]")
@repeat_option(3)
@shards_option(2, "RocksDB shards per Spark stage (with --spark).")
@click.option("--spark-share", type=float, default=None,
              help="Spark's batch size (it runs one batch of each kind)  [default: the "
              "middle of --sizes]")
@click.option("--streaming/--no-streaming", default=False, show_default=True,
              help="With --spark: also customer x store_sales as Spark Structured "
              "Streaming's own join, beside in-process and SparkJoin.")
@click.option("--unshared/--no-unshared", default=False, show_default=True,
              help="Also run a pass with one index per operator input (shared vs unshared).")
@click.option("--chunk-rows", type=int, default=100_000, show_default=True,
              help="Rows per population push (the timeline has a sample per push).")
@click.option("--check", type=click.Choice(["each", "size", "end"]), default="each",
              show_default=True, help="Check against DuckDB after each batch kind, size, or "
              "only at the end (population is always checked).")
@click.option("--queries", default=None,
              help="Run these official TPC-DS queries instead (all, or numbers and ranges "
              "like 3,7,40-42): each compiled, populated, given three change batches and "
              "checked against DuckDB (bench/tpcds_all.py); --sf, --out, --seed, --workdir "
              "and --cache-dir apply.")
@click.option("--jobs", type=int, default=1, show_default=True,
              help="With --queries: queries run at once, one process each.")
@click.option("--paths", is_flag=True, default=False,
              help="With --queries: per query and --sizes share (default "
              "0.0001,0.001,0.01,0.1), one batch applied incrementally, by recompute and "
              "as the planner chooses, from the same populated state, --repeat times each "
              "(default 2), each checked and timed beside DuckDB (bench/tpcds_paths.py).")
@click.option("--push", "push", type=click.Choice(["batch", "source"]), default="batch",
              show_default=True,
              help="With --paths: apply each batch as one push of every source's change "
              "(batch), or one push per source, dimensions first, each timed (source).")
@seed_option()
@workdir_option("Keep the RocksDB directories here (default: a temporary directory).")
@cache_dir_option()
def tpcds(sf: float, strategies: str, rounds: int, sizes: str, spark: bool,
          out: Path | None, repeat: int, shards: int, spark_share: float | None,
          streaming: bool, unshared: bool, chunk_rows: int, check: str, queries: str | None,
          jobs: int, paths: bool, push: str, seed: int, workdir: Path | None,
          cache_dir: Path | None) -> int:
    """TPC-DS query 4 kept live by a pipeline, every answer checked against DuckDB.

    The q4 pipeline populated --rounds times per --strategies, the order reversed each
    round (samples of RocksDB over time), then --repeat change batches of each --sizes
    (new sales, deleted sales, customer updates, a date_dim correction), each checked
    against DuckDB computing q4 from scratch; with --spark, Spark SQL's recompute and q4
    on local Spark (bench.q4spark).  Writes report.json, report.md and PNG charts
    (population timelines, population time, change batches vs recompute, cost against
    scale with recorded runs) into --out and prints where (bench/tpcds_cli.py).  Exit
    status 0 if every answer matched DuckDB, 1 if one differed (the
    report says where), 2 for a usage error.

    \b
    Examples:
      joinstate bench tpcds
      joinstate bench tpcds --sf 1 --rounds 1 --repeat 2 --check size --spark  # ./dev tpcds
      joinstate bench tpcds --sf 0.1 --strategies auto --sizes 0.001 --repeat 1
    """
    if queries is not None and paths:
        given = click.get_current_context().get_parameter_source
        return _tpcds_paths(queries, sf, out, seed, workdir, cache_dir, jobs,
                            sizes if given("sizes") is ParameterSource.COMMANDLINE else None,
                            repeat if given("repeat") is ParameterSource.COMMANDLINE else None,
                            push)
    if paths:
        raise CliError("--paths needs --queries (which TPC-DS queries to time)")
    if push != "batch":
        raise CliError("--push needs --queries and --paths (it says how their batches are "
                       "applied)")
    if queries is not None:
        return _tpcds_queries(queries, sf, out, seed, workdir, cache_dir, jobs)
    from bench import tpcds_cli
    from bench.report import check_counts, failures

    strategy_list = [x.strip() for x in strategies.split(",") if x.strip()]
    size_list = _floats(sizes, "--sizes")
    out_dir = out if out is not None else RESULTS / f"tpcds-sf{sf:g}"
    tpcds_cli.check_arguments(sf, strategy_list, size_list, repeat, spark, shards,
                              spark_share, chunk_rows, check, rounds)
    # Arrow's query engine prints a C++ warning per unaligned input buffer (tables
    # decoded from IPC); it changes nothing here, so keep the terminal readable.
    os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")
    results, files = tpcds_cli.run_and_report(
        out_dir, sf=sf, strategies=strategy_list, rounds=rounds, sizes=size_list,
        spark=spark, repeat=repeat, shards=shards, spark_share=spark_share,
        streaming=streaming, unshared=unshared, seed=seed, chunk_rows=chunk_rows,
        check=check, workdir=workdir, cache_dir=cache_dir,
        steps=tpcds_cli.Steps(rich_console(stderr=True)))
    passed, total = check_counts(results)
    click.echo(f"report: {files.markdown} ({files.json.name} and {len(files.charts)} PNG "
               f"chart(s) beside it); {results['seconds']:.0f} s")
    if not results["ok"]:
        bad = failures(results)
        click.echo(f"error: CHECK FAILED: {len(bad)} of {total} answers differ from DuckDB's, "
                   f"first: {bad[0] if bad else '?'} (details in {files.markdown})", err=True)
        return EXIT_CHECK_FAILED
    click.echo(f"every answer matched DuckDB ({passed} checks)")
    return EXIT_OK


def _query_numbers(queries: str, jobs: int) -> list[int]:
    """The query numbers ``--queries`` names, with ``--jobs`` checked (CliError names either)."""
    from bench import tpcds_all

    try:
        numbers = tpcds_all.parse_queries(queries)
    except tpcds_all.QueryArgumentError as e:
        raise CliError(str(e)) from None
    if jobs < 1:
        raise CliError(f"--jobs {jobs}: give at least 1")
    return numbers


def _tpcds_queries(queries: str, sf: float, out: Path | None, seed: int,
                   workdir: Path | None, cache_dir: Path | None, jobs: int) -> int:
    """``tpcds --queries``: bench.tpcds_all over the named queries, report and exit status."""
    from bench import tpcds_all

    numbers = _query_numbers(queries, jobs)
    out_dir = out if out is not None else RESULTS / f"tpcds-queries-sf{sf:g}"
    err = rich_console(stderr=True)
    results = tpcds_all.run(
        numbers, sf, seed=seed, workdir=workdir, cache_dir=cache_dir, jobs=jobs,
        say=lambda line: err.print(line, soft_wrap=True, markup=False))
    files = tpcds_all.write_report(results, out_dir)
    s = results["summary"]
    click.echo(f"report: {files['markdown']} (report.json and the chart beside it); "
               f"{results['seconds']:.0f} s")
    click.echo(f"{s['compiled']} of {s['queries']} compiled; {s['matched_all']} matched "
               f"DuckDB after population and {tpcds_all.BATCHES} batches; {s['nonempty']} "
               f"non-empty; {s['nonempty_and_changed']} non-empty and changed")
    if not results["ok"]:
        bad = s["failed"] + s["errors"]
        parts = [f"{len(bad)} queries differ from DuckDB or failed to run: "
                 f"{', '.join(f'q{q}' for q in bad)}"] if bad else []
        if s["vacuous"]:
            parts.append(f"{len(s['vacuous'])} queries vacuous (their answer empty after "
                         f"population or changed by no batch): "
                         f"{', '.join(f'q{q}' for q in s['vacuous'])}")
        return _check_failed(f": {'; '.join(parts)} (details in {files['markdown']})")
    return EXIT_OK


def _tpcds_paths(queries: str, sf: float, out: Path | None, seed: int,
                 workdir: Path | None, cache_dir: Path | None, jobs: int, sizes: str | None,
                 repeat: int | None, push: str = "batch") -> int:
    """``tpcds --queries --paths``: bench.tpcds_paths over the named queries."""
    from bench import tpcds_paths

    numbers = _query_numbers(queries, jobs)
    size_list = _floats(sizes, "--sizes") if sizes is not None else tpcds_paths.DEFAULT_SIZES
    bad = [x for x in size_list if not 0 < x <= 1]
    if bad:
        raise CliError(f"--sizes {sizes}: {bad[0]:g} is not a share of a table; give shares "
                       "in (0, 1], e.g. 0.0001,0.001,0.01,0.1")
    if repeat is not None and repeat < 1:
        raise CliError(f"--repeat {repeat}: give at least 1")
    out_dir = out if out is not None else RESULTS / f"tpcds-paths-sf{sf:g}"
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / "paths.partial.jsonl"
    partial.unlink(missing_ok=True)
    err = rich_console(stderr=True)
    results = tpcds_paths.run(
        numbers, sf, sizes=size_list, seed=seed, repeat=repeat or tpcds_paths.REPEAT,
        workdir=workdir, cache_dir=cache_dir, jobs=jobs, partial=partial, push=push,
        say=lambda line: err.print(line, soft_wrap=True, markup=False))
    files = tpcds_paths.write_report(results, out_dir)
    s = results["summary"]
    click.echo(f"report: {files['markdown']} ({files['json'].name} beside it); "
               f"{results['seconds']:.0f} s")
    click.echo(f"{s['ran']} of {s['queries']} ran; choice within {tpcds_paths.TARGET}x of "
               f"the faster path at every size: {s['within_target_by_plan']} by plan, "
               f"{s['within_target_measured']} measured; smallest batch faster than DuckDB: "
               f"{s['smallest_beats_duckdb']}")
    if not results["ok"]:
        bad_q = s["failed"] + s["errors"] + s["vacuous"]
        return _check_failed(f": {len(bad_q)} queries differ from DuckDB, failed to run or "
                             f"were vacuous (empty, or unchanged by every batch): "
                             f"{', '.join(f'q{q}' for q in bad_q)} (details in "
                             f"{files['markdown']})")
    return EXIT_OK


# ---- the suites ----------------------------------------------------------------------


@click.command("core", context_settings=CONTEXT,
               short_help="Join push rates vs the raw RocksDB write ceiling.")
@click.option("--left-rows", type=int, default=100_000, show_default=True,
              help="Customer-like rows, unique on the key (the small side).")
@click.option("--right-rows", type=int, default=3_000_000, show_default=True,
              help="Sales-like rows over the same keys (the big side).")
@batch_rows_option()
@out_option()
@workdir_option()
def core(left_rows: int, right_rows: int, batch_rows: int, out: Path,
         workdir: Path | None) -> int:
    """Push rates of the join operator against the raw RocksDB WriteBatch ceiling.

    In one process: (a) left push into an empty join, (b) right push probing the full
    left side, (c) left push into a full right side, (e) (b) with the big side's unique
    key declared, (d) the raw rocksdict WriteBatch put rate for what (b) wrote.  Target:
    (b) >= 50% of (d).  Writes core.json and core.md into --out (details: bench/core.py).

    \b
    Examples:
      joinstate bench core
      joinstate bench core --left-rows 10000 --right-rows 100000 --out /tmp/core
    """
    from bench.core import run_core, to_markdown

    work = workdir or Path(tempfile.mkdtemp(prefix="joinstate-bench-"))
    try:
        r = run_core(left_rows, right_rows, batch_rows, work)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "core.json").write_text(json.dumps(asdict(r), indent=2))
    md = to_markdown(r)
    (out / "core.md").write_text(md + "\n")
    click.echo(md)
    return EXIT_OK


@click.command("demo", context_settings=CONTEXT,
               short_help="Customer x sales: populate, live changes, DuckDB check.")
@click.option("--customers", type=int, default=100_000, show_default=True,
              help="Customers (the small side, unique key).")
@click.option("--sales", type=int, default=1_000_000, show_default=True, help="Sales rows.")
@batch_rows_option()
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the RocksDB state goes (default: a temporary directory, removed "
              "after).")
@click.option("--spark", is_flag=True,
              help="Drive it from a local Spark session (spark_io.SparkJoin).")
@shards_option(4, "With --spark: RocksDB shards.")
def demo(customers: int, sales: int, batch_rows: int, state_dir: Path | None, spark: bool,
         shards: int) -> int:
    """Populate customer x sales, apply live changes, check the result with DuckDB.

    Population (customers, then sales, with the strategy the planner picks), a batch of
    customer updates and a batch of sales deletes; the sum of every output delta must
    equal DuckDB's join of the final inputs, and the store must reopen with the same
    state.  Exit status 1 if it does not (details: bench/demo.py).

    \b
    Examples:
      joinstate bench demo
      joinstate bench demo --customers 1000 --sales 10000 --spark --shards 2
    """
    from bench.demo import run_demo, run_spark_demo

    state = state_dir or Path(tempfile.mkdtemp(prefix="joinstate-demo-")) / "state"
    try:
        if spark:
            return run_spark_demo(state, customers, sales, batch_rows, shards)
        return run_demo(state, customers, sales, batch_rows)
    finally:
        if state_dir is None:
            shutil.rmtree(state.parent, ignore_errors=True)


@click.command("live", context_settings=CONTEXT,
               short_help="Live-phase batches on TPC-DS data vs DuckDB recompute.")
@sf_option(1.0)
@sizes_option(live_suite.SIZES)
@repeat_option(10, "Batches per size.")
@out_option()
@click.option("--no-point-pass", is_flag=True,
              help='Skip the second pass with StoreOptions(probe="point").')
@seed_option()
@workdir_option()
@cache_dir_option()
def live(sf: float, sizes: tuple[float, ...], repeat: int, out: Path, no_point_pass: bool,
         seed: int, workdir: Path | None, cache_dir: Path | None) -> int:
    """Live-phase batches on TPC-DS customer x store_sales, checked against DuckDB.

    Population, then for each --sizes (a share of the sales rows) and --repeat times:
    deleted sales, the same sales re-inserted, customer updates; DuckDB recomputing the
    join beside; the first batch after a reopen against the tenth; a second pass with
    point probes.  Writes live.json and live.md into --out (details: bench/live.py).

    \b
    Examples:
      joinstate bench live
      joinstate bench live --sf 0.1 --sizes 0.001 --repeat 3 --no-point-pass
    """
    res = live_suite.run_live(sf, sizes, repeat, out, point_pass=not no_point_pass,
                              seed=seed, workdir=workdir, cache_dir=cache_dir)
    click.echo(live_suite.to_markdown(res))
    click.echo(f"\nwrote {out / 'live.json'} and {out / 'live.md'}")
    if not res["ok"]:
        bad = [p["name"] for p in res["passes"] if not p["check"]["ok"]]
        return _check_failed(f" in pass(es) {bad}: the integrated output differs from "
                             "DuckDB's join of the final inputs")
    return EXIT_OK


@click.command("population", context_settings=CONTEXT,
               short_help="Population strategies x orders; small-side memtables.")
@click.option("--set", "sets", default="1,3", show_default=True,
              callback=listed(("1", "2", "3")),
              help="Data sets to run, comma-separated: 1 (100k x 3M), 2 (1M x 30M), 3 "
              "(small-side memtables).")
@click.option("--small", type=int, default=None,
              help="Small-side rows (overrides the set's size).")
@click.option("--large", type=int, default=None,
              help="Big-side rows (overrides the set's size).")
@strategies_option(population_suite.STRATEGIES, population_suite.STRATEGIES,
                   "Population strategies to compare, comma-separated.")
@click.option("--orders", default="small-first,interleaved,as-given", show_default=True,
              callback=listed(("small-first", "interleaved", "as-given")),
              help="Batch orders to compare, comma-separated.")
@batch_rows_option()
@click.option("--settle-timeout", type=float, default=600.0, show_default=True,
              help="Max seconds to wait for background compaction after populate.")
@click.option("--memtable-small", type=int, default=100_000, show_default=True,
              help="Set 3: small-side rows.")
@click.option("--memtable-big", type=int, default=500_000, show_default=True,
              help="Set 3: big-side rows.")
@click.option("--lookups", type=int, default=20_000, show_default=True,
              help="Set 3: point lookups per memtable.")
@click.option("--processes", type=int, default=1, show_default=True,
              help="Populate this many shards at once, one process each.")
@click.option("--big-unique", is_flag=True,
              help="Declare the big side's unique key "
              f"{population_suite.BIG_UNIQUE_KEY}.")
@out_option()
def population(sets: tuple[str, ...], small: int | None, large: int | None,
               strategies: tuple[str, ...], orders: tuple[str, ...], batch_rows: int,
               settle_timeout: float, memtable_small: int, memtable_big: int, lookups: int,
               processes: int, big_unique: bool, out: Path) -> int:
    """Population strategies x orders on synthetic data, and the small-side memtable.

    Every strategy in the same process on the same data, each in a fresh directory;
    speedups over symmetric with the same order; background compaction waited for
    (deferring compaction is not avoiding it); auto (the planner) against the fixed
    strategies.  Writes population-<stamp>.json and .md into --out (details:
    bench/population.py).

    \b
    Examples:
      joinstate bench population --set 1
      joinstate bench population --set 1 --small 10000 --large 100000 --orders small-first
    """
    return population_suite.run_sets(
        [int(s) for s in sets], small=small, large=large, strategies=strategies,
        orders=orders, batch_rows=batch_rows, settle_timeout=settle_timeout,
        memtable_small=memtable_small, memtable_big=memtable_big, lookups=lookups,
        processes=processes, big_unique=big_unique, out=out)


@click.command("spark", context_settings=CONTEXT,
               short_help="Population through Spark workers vs in-process.")
@click.option("--small", type=int, default=100_000, show_default=True, help="Customers.")
@click.option("--large", type=int, default=1_000_000, show_default=True, help="Sales rows.")
@click.option("--shards", default="2,8", show_default=True,
              help="Shard counts to run, comma-separated.")
@click.option("--cores", default="2", show_default=True, help="Spark's local[N].")
@click.option("--strategy", default="auto", show_default=True, help="Population strategy.")
@click.option("--changes", type=int, default=20_000, show_default=True,
              help="Rows of the change set applied after population.")
@click.option("--files", type=int, default=4, show_default=True,
              help="Parquet files of sales.")
@batch_rows_option()
@out_option()
@click.option("--keep", is_flag=True, help="Keep the data and state directories.")
def spark(small: int, large: int, shards: str, cores: str, strategy: str, changes: int,
          files: int, batch_rows: int, out: Path, keep: bool) -> int:
    """Population driven from Spark mapInArrow workers, vs the in-process driver.

    The same synthetic data loaded in this process and through spark_io.SparkJoin into
    each --shards count on local[--cores]; then a small change set applied both ways.
    Needs the spark extra and Java 17.  Writes spark-<stamp>.json and .md into --out
    (details: bench/spark_population.py).

    \b
    Examples:
      joinstate bench spark
      joinstate bench spark --small 10000 --large 100000 --shards 2
    """
    from bench import spark_population

    try:
        shard_counts = [int(s) for s in shards.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--shards {shards!r}: give shard counts separated by commas, "
                       "e.g. 2,8") from None
    return spark_population.run_benchmark(
        small=small, large=large, shards=shard_counts, cores=cores, strategy=strategy,
        changes=changes, files=files, batch_rows=batch_rows, out=out, keep=keep)


@click.command("recompute", context_settings=CONTEXT,
               short_help="Incremental apply vs recompute per batch; the rule.")
@sf_option(1.0)
@sizes_option(recompute_suite.SIZES, "the table's rows")
@click.option("--kinds", default=",".join(recompute_suite.KINDS), show_default=True,
              callback=listed(recompute_suite.KINDS),
              help="Batch kinds: sales (right side), customer (left side).")
@repeat_option(1, "Runs per path and size (the median is reported).")
@click.option("--probes", default="auto", show_default=True,
              callback=listed(("auto", "point")),
              help="StoreOptions.probe modes to measure, comma-separated: auto (probe cache "
              "allowed), point (every probe reads RocksDB).")
@seed_option()
@out_option()
@workdir_option("Where the stores go (default: a temporary directory, removed after).")
@cache_dir_option()
def recompute(sf: float, sizes: tuple[float, ...], kinds: tuple[str, ...], repeat: int,
              probes: tuple[str, ...], seed: int, out: Path, workdir: Path | None,
              cache_dir: Path | None) -> int:
    """Incremental apply vs recompute per change batch, and the planner's rule.

    TPC-DS customer x store_sales populated once; then per kind and size, the same
    change batch applied to two copies of the state, incrementally and by recompute,
    both timed, their outputs and counters compared, with the planner's choice beside.
    Writes recompute.json and recompute.md into --out (details: bench/recompute.py).

    \b
    Examples:
      joinstate bench recompute --sf 1
      joinstate bench recompute --sf 0.1 --sizes 0.01 --kinds sales
    """
    res = recompute_suite.run(sf, sizes, kinds, repeat, seed, out, workdir, cache_dir, probes)
    click.echo(recompute_suite.to_markdown(res))
    click.echo(f"\nwrote {out / 'recompute.json'} and {out / 'recompute.md'}")
    if not res["ok"]:
        return _check_failed(": the two paths disagree (outputs or counters)")
    return EXIT_OK


@click.command("q4", context_settings=CONTEXT,
               short_help="TPC-DS q4 as a live pipeline, checked by DuckDB.")
@sf_option(0.1)
@sizes_option((0.0001, 0.001, 0.01), "all sales rows")
@repeat_option(3, "Batches per size.")
@out_option()
@click.option("--no-unshared", is_flag=True,
              help="Skip the second pass with share_indexes=False.")
@seed_option()
@click.option("--check", type=click.Choice(["each", "size", "end"]), default="each",
              show_default=True, help="Check against DuckDB after each batch kind, size, or "
              "only at the end (population is always checked).")
@click.option("--chunk-rows", type=int, default=200_000, show_default=True,
              help="Population push size.")
@click.option("--qualify", type=int, default=None,
              help="Customers given sales that put them in q4's answer after population "
              "(default: 0.1% of the customers, at least 3; 0: none).")
@click.option("--recompute-runs", type=int, default=3, show_default=True,
              help="DuckDB recomputations per measurement (the median is reported).")
@click.option("--spark-sql", is_flag=True,
              help="Also time Spark SQL (local) computing q4 from scratch on the final "
              "tables, its answer checked against DuckDB's.")
@workdir_option()
@strategies_option(PIPELINE_STRATEGIES, PIPELINE_STRATEGIES,
                   "Population strategies to compare first, each into a fresh store ('' "
                   "to skip).", empty_ok=True)
@cache_dir_option()
def q4(sf: float, sizes: tuple[float, ...], repeat: int, out: Path, no_unshared: bool,
       seed: int, check: str, chunk_rows: int, qualify: int | None, recompute_runs: int,
       spark_sql: bool, workdir: Path | None, strategies: tuple[str, ...],
       cache_dir: Path | None) -> int:
    """TPC-DS query 4 as a live pipeline in this process: timed change batches vs DuckDB.

    Population per strategy, then, with shared indexes and without, --repeat change
    batches of each --sizes (new and deleted sales in three channels, customer updates,
    a date_dim correction), every output checked against DuckDB, DuckDB's recompute
    beside.  Writes q4.json and q4.md into --out (details: bench/q4.py).

    \b
    Examples:
      joinstate bench q4 --sf 1
      joinstate bench q4 --sf 0.01 --sizes 0.001 --repeat 1 --strategies auto
    """
    from bench import q4 as q4_suite

    res = q4_suite.run_q4(sf, sizes, repeat, out, unshared=not no_unshared, seed=seed,
                          workdir=workdir, cache_dir=cache_dir, chunk_rows=chunk_rows,
                          check_every=check, qualify=qualify, recompute_runs=recompute_runs,
                          strategies=list(strategies), spark_sql=spark_sql)
    click.echo(q4_suite.to_markdown(res))
    click.echo(f"\nwrote {out / 'q4.json'} and {out / 'q4.md'}")
    if not res["ok"]:
        bad = [p["name"] for p in res["passes"] if not p["ok"]]
        return _check_failed(f" in pass(es) {bad}: the pipeline's outputs differ from "
                             "DuckDB's")
    return EXIT_OK


@click.command("q4spark", context_settings=CONTEXT,
               short_help="TPC-DS q4 on local Spark (SparkPipeline), checked.")
@sf_option(0.01)
@shards_option(2, "RocksDB shards per stage.")
@click.option("--share", type=float, default=0.001, show_default=True,
              help="Change batch size as a share of the sales rows.")
@seed_option()
@out_option()
@workdir_option("Keep the Spark state and inputs here (default: a temporary directory, "
                "removed after).")
@click.option("--populate-only", is_flag=True, default=False,
              help="Only the two populations and their checks (SF10 on a 24 GB machine: "
                   "the in-process pipeline's memory for retractions does not fit).")
def q4spark(sf: float, shards: int, share: float, seed: int, out: Path,
            workdir: Path | None, populate_only: bool) -> int:
    """TPC-DS q4 on local Spark (spark_io.SparkPipeline) beside in-process, checked.

    Population and change batches (the four kinds together) in-process and as
    SparkPipeline operations (one Spark job each), an empty and a 20-row micro-batch
    through foreach_batch_sink, and a two-table view from SparkPipeline.from_sql; every
    answer compared with DuckDB, every figure with the load average and a table of the
    issue's targets.  Needs the spark extra and Java 17.  Writes q4-spark.json and
    q4-spark.md into --out (details: bench/q4spark.py).

    \b
    Examples:
      joinstate bench q4spark
      joinstate bench q4spark --sf 0.01 --shards 2 --share 0.001
      joinstate bench q4spark --sf 10 --populate-only
    """
    from bench import q4spark as q4spark_suite

    res = q4spark_suite.run(sf, shards, share, seed, out, workdir,
                            populate_only=populate_only)
    click.echo(f"\nreport: {out / 'q4-spark.md'} (and q4-spark.json)")
    if not res["ok"]:
        return _check_failed(": the Spark pipeline's outputs differ from DuckDB's")
    return EXIT_OK


@click.command("sparkjoin", context_settings=CONTEXT,
               short_help="In-process vs SparkJoin vs Spark's own streaming join.")
@sf_option(1.0)
@shards_option(2, "RocksDB shards of SparkJoin.")
@click.option("--cores", type=int, default=2, show_default=True, help="Spark's local[N].")
@click.option("--strategy", default="auto", show_default=True, help="Population strategy.")
@click.option("--micro-rows", type=int, default=600, show_default=True,
              help="New sales rows of the small micro-batch.")
@click.option("--skip", default="", callback=listed(("inproc", "sparkjoin", "sss"),
                                                    empty_ok=True),
              help="Ways to skip, comma-separated: inproc, sparkjoin, sss.")
@click.option("--read", default="auto", show_default=True,
              callback=listed(("auto", "files", "shuffle")),
              help="SparkJoin.populate read= ways to run, comma-separated (auto, files, "
              "shuffle); micro-batches run after the first.")
@out_option()
@workdir_option("Keep the inputs and state here (default: a temporary directory, removed "
                "after).")
def sparkjoin(sf: float, shards: int, cores: int, strategy: str, micro_rows: int,
              skip: tuple[str, ...], read: tuple[str, ...], out: Path,
              workdir: Path | None) -> int:
    """TPC-DS customer x store_sales: in-process vs SparkJoin vs Spark's own streaming join.

    The same join three ways on the same Parquet (one writer in this process;
    spark_io.SparkJoin.populate; Spark Structured Streaming's stream-stream join with the
    RocksDB state store), then empty and small micro-batches, every output checked
    against DuckDB.  Needs the spark extra and Java 17.  Writes sparkjoin.json and .md
    into --out (details: bench/spark_tpcds.py).

    \b
    Examples:
      joinstate bench sparkjoin --sf 1
      joinstate bench sparkjoin --sf 0.1 --skip sss --read files,shuffle
    """
    from bench import spark_tpcds

    res = spark_tpcds.run(sf, shards=shards, cores=cores, strategy=strategy,
                          micro_rows=micro_rows, out=out, workdir=workdir, skip=skip,
                          reads=read)
    click.echo(spark_tpcds.to_markdown(res))
    click.echo(f"\nreport: {out / 'sparkjoin.md'}")
    return EXIT_OK if res["ok"] else EXIT_CHECK_FAILED


@click.command("source-check", context_settings=CONTEXT,
               short_help="What checking a source's retractions costs (q4).")
@sf_option(1.0)
@click.option("--rounds", type=int, default=3, show_default=True,
              help="Populations per mode (checked, unchecked).")
@click.option("--chunk-rows", type=int, default=200_000, show_default=True,
              help="Population push size.")
@click.option("--skip-live", is_flag=True, help="Skip the live-push measurement.")
@out_option()
@workdir_option()
def source_check(sf: float, rounds: int, chunk_rows: int, skip_live: bool, out: Path,
                 workdir: Path | None) -> int:
    """What checking a pipeline source's retractions costs, on TPC-DS q4.

    q4 populated with every source checked (the default) and unchecked, alternating,
    --rounds times each; then live pushes on a one-source pipeline.  Writes
    source_check.json (and .md) into --out (details: bench/source_check.py).

    \b
    Examples:
      joinstate bench source-check --sf 1
      joinstate bench source-check --sf 0.01 --rounds 1 --skip-live
    """
    from bench import source_check as source_check_suite

    res = source_check_suite.run_check(sf, rounds, chunk_rows, skip_live=skip_live,
                                       workdir=workdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "source_check.json").write_text(json.dumps(res, indent=2, default=str))
    if res["live"]:
        md = source_check_suite.to_markdown(res)
        (out / "source_check.md").write_text(md)
        click.echo(md)
    else:
        click.echo(json.dumps({k: v for k, v in res["population"].items() if k != "runs"},
                              indent=2, default=str))
    return EXIT_OK


SUITES: tuple[Command, ...] = (core, demo, live, population, q4, q4spark, recompute,
                               source_check, spark, sparkjoin, tpcds)
"""Every suite command, in the order ``joinstate bench --help`` lists them."""
