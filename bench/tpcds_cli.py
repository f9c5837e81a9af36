"""``joinstate bench tpcds``: TPC-DS q4 kept live, checked by DuckDB, reported with charts.

The main job.  The command (:mod:`bench.commands.suites`) parses options and calls
:func:`run_and_report`; :func:`run` runs the phases below and hands the results to
:mod:`bench.report`, showing each phase's progress as it goes (:class:`Steps`).

1. **data**: q4's five tables at ``--sf`` (:func:`bench.q4.load`, cached Parquet).
2. **population per strategy**: the whole q4 pipeline loaded into a fresh store once
   per strategy and round, the order reversed every other round (symmetric, asymmetric,
   auto, then auto, asymmetric, symmetric), so neither a cold page cache nor a warm one
   can make a strategy look better than it is; the report gives each strategy's fastest
   run and the spread.  The driver samples RocksDB over the load (L0 files, pending
   compaction bytes, write stalls, each index's and aggregate's size); the timeline of
   each strategy's fastest run is charted under labels in SQL terms
   (:func:`bench.labels.state_labels`).
3. **change batches** (:func:`bench.q4.run_pass`): the pipeline populated once more
   (``auto``, its outputs integrated), then ``--repeat`` batches per ``--sizes`` share
   of the sales rows: new sales, deleted sales, customer updates, a date_dim correction;
   each output checked against DuckDB computing q4 from scratch on the same tables.
4. **recompute**: DuckDB and, with ``spark=True``, Spark SQL computing q4 from scratch
   on the final tables (Spark SQL's answer checked against DuckDB's).
5. with ``spark=True``, **SparkPipeline** (:func:`spark_pipeline`, through
   ``spark_io.SparkPipeline``'s public API only): the same graph on local Spark,
   ``shards`` shards, populated from the same Parquet files and given change batches of
   the four kinds at once, each checked against DuckDB.
6. the **recorded runs** (``bench/q4_recorded.json``: earlier measurements at SF0.1, SF1
   and SF10) go into the results, so the report can chart how a fixed-size change and a
   recompute grow with scale beside this run's own figures.

Every argument is checked before anything runs (a wrong strategy must not cost a
benchmark run first); a bad one raises :class:`BenchArgumentError` naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.report import MissingDependencyError, ReportFiles, require_matplotlib, write_report
from joinstate.errors import JoinStateError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from rich.console import Console

__all__ = ["DEFAULT_CHUNK_ROWS", "DEFAULT_ROUNDS", "DEFAULT_SF", "DEFAULT_SIZES",
           "DEFAULT_STRATEGIES", "RECORDED", "BenchArgumentError", "Steps", "best_runs",
           "check_arguments", "population_rounds", "run", "run_and_report"]

DEFAULT_SF = 0.3
"""The main job's scale: 1.6M rows.  At SF1 (5.2M rows) one population of q4 takes
25-35 s on the 2-core VM when it is quiet, and the job runs seven of them plus Spark: well
over five minutes.  SF0.3 keeps the whole job near three minutes when quiet, and is large
enough for the strategies' compaction behaviour (L0 files, pending compaction bytes) to
show; how the costs grow beyond it comes from the recorded runs (:data:`RECORDED`)."""
DEFAULT_SIZES = (0.0001, 0.001, 0.01)
DEFAULT_STRATEGIES = ("symmetric", "asymmetric", "auto")
DEFAULT_ROUNDS = 2
DEFAULT_CHUNK_ROWS = 100_000
"""Rows per population push.  Half the pipeline driver's 200,000, so that a population
spans enough pushes for its timeline to have points (the driver samples RocksDB between
pushes, at most every 0.25 s)."""
CHECKS = ("each", "size", "end")
RECORDED = Path(__file__).with_name("q4_recorded.json")
"""Earlier measured runs of q4 at SF0.1, SF1 and SF10 (docs/benchmarks.md has their table)."""


class BenchArgumentError(JoinStateError, ValueError):
    """An option of ``joinstate bench tpcds`` is out of range; the message names it."""


def check_arguments(sf: float, strategies: Sequence[str], sizes: Sequence[float],
                    repeat: int, spark: bool, shards: int, spark_share: float | None,
                    chunk_rows: int, check: str, rounds: int = DEFAULT_ROUNDS) -> None:
    """Raise BenchArgumentError for the first bad argument, MissingDependencyError if needed.

    Also checks, for ``spark=True``, that pyspark imports and Java can be found, so a
    run never fails after minutes of in-process work for want of them.
    """
    from population.driver import FACES
    pipeline_strategies = FACES["pipeline"].strategies

    if not sf > 0:
        raise BenchArgumentError(f"--sf {sf!r}: the scale factor must be > 0 (e.g. 0.3)")
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
    if rounds < 1:
        raise BenchArgumentError(f"--rounds {rounds}: give at least 1 population per "
                                 "strategy (2 or more to see the spread)")
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


def population_rounds(strategies: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the population runs: as given, then reversed, alternately.

    With two rounds every strategy runs once early and once late, so a warm-up or a
    filling page cache favours none of them.
    """
    return [list(strategies) if r % 2 == 0 else list(reversed(strategies))
            for r in range(rounds)]


class Steps:
    """The job's progress: a rich bar per phase on a terminal, a line per finished step.

    The lines go to ``console`` whether or not it is a terminal (a log shows every step
    and its time); the bar (spinner, steps done, elapsed time) only where rich draws one.
    With ``console=None`` nothing is shown (tests, library use).
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console

    def say(self, line: str) -> None:
        """One line, outside any phase."""
        if self.console is not None:
            self.console.print(line, soft_wrap=True)

    @contextlib.contextmanager
    def phase(self, title: str, total: int | None = None) -> Iterator[Callable[[str], None]]:
        """Show ``title`` with a bar of ``total`` steps; yields ``done(line)`` per step."""
        if self.console is None:
            yield lambda _line: None
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        console = self.console
        console.print(f"[bold]{title}[/bold]", soft_wrap=True)
        t0 = time.perf_counter()
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as bar:
            task = bar.add_task(title.split(":")[0], total=total)

            def done(line: str) -> None:
                console.print(f"  {line}", soft_wrap=True)
                bar.advance(task)

            yield done
        console.print(f"  [dim]{time.perf_counter() - t0:.1f} s[/dim]")


def _run_summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A population run without its samples: time, rate, what RocksDB went through."""
    samples = entry.get("samples") or []
    return {
        "requested": entry["requested"], "strategy": entry["strategy"],
        "round": entry["round"], "position": entry["position"], "s": entry["s"],
        "rows_per_s": entry["rows_per_s"], "actions": entry["actions"],
        "l0_max": max((max(s["l0"].values(), default=0) for s in samples), default=0),
        "pending_max_bytes": max((sum(s["pending"].values()) for s in samples), default=0),
        "stall_s": (samples[-1]["stall_micros"] / 1e6) if samples else 0.0,
        "state_bytes": entry.get("state_bytes"), "peak_rss_bytes": entry.get("peak_rss_bytes"),
    }


def _population_entry(tables: Mapping[str, Any], name: str, workdir: Path,
                      chunk_rows: int) -> dict[str, Any]:
    from bench import q4

    (entry,) = q4.population_strategies(tables, [name], workdir, chunk_rows=chunk_rows)
    return entry


def _pass_entry(pr: Mapping[str, Any]) -> dict[str, Any]:
    """A change-batch pass's population as a population run of ``auto``.

    The pass populates a fresh store with ``auto`` as every other run does (its output
    deltas also go to the checks' integration, a list append per push), so it counts
    as one of ``auto``'s runs instead of costing the job one more population.
    """
    entry = dict(pr["population"])
    entry["state_bytes"] = pr.get("state_bytes_after_population")
    entry["change_batch_pass"] = True
    return entry


def _pass_slot(strategies: Sequence[str], rounds: int) -> int | None:
    """Index, in run order, of the population the change-batch pass stands for (auto's last)."""
    slots = [n for names in population_rounds(strategies, rounds) for n in names]
    hits = [i for i, n in enumerate(slots) if n == "auto"]
    return hits[-1] if hits else None


def _say_run(done: Callable[[str], None], entry: Mapping[str, Any],
             summary: Mapping[str, Any]) -> None:
    done(f"{entry['strategy']} (round {entry['round']}): {entry['s']:.1f} s, "
         f"{entry['rows_per_s']:,.0f} rows/s; L0 files up to {summary['l0_max']}, pending "
         f"compaction up to {summary['pending_max_bytes'] / 2**20:,.0f} MiB, write stalls "
         f"{summary['stall_s']:.1f} s")


def best_runs(entries: Sequence[dict[str, Any]], runs: Sequence[Mapping[str, Any]],
              strategies: Sequence[str]) -> list[dict[str, Any]]:
    """Each strategy's fastest run in full, with every run's seconds and its SQL labels."""
    from bench import q4
    from bench.labels import state_labels

    graph = q4.define_q4()
    out = []
    for name in strategies:
        mine = [e for e in entries if e["requested"] == name]
        entry = min(mine, key=lambda e: e["s"])
        families = list(entry["samples"][-1]["l0"]) if entry.get("samples") else []
        entry["labels"] = state_labels(graph, "q4", families)
        entry["runs_s"] = [x["s"] for x in runs if x["requested"] == name]
        entry["picked"] = sorted({x["strategy"] for x in runs if x["requested"] == name})
        out.append(entry)
    return out


def spark_pipeline(session: Any, tables: Mapping[str, Any], paths: Mapping[str, Path],
                   shards: int, share: float, seed: int, batches: int, workdir: Path,
                   steps: Steps) -> dict[str, Any]:
    """q4 on ``spark_io.SparkPipeline``: population, then change batches, each checked.

    Population reads the cached Parquet files (what a Spark job would read); qualifying
    sales (as in-process) are one ``apply``; then ``batches`` change batches of ``share``,
    each the four kinds at once (new sales, deleted sales, customer updates, a date_dim
    correction) in one ``apply`` of every changed source: one Spark job, one commit.
    After each step both outputs, integrated from every change set returned, are checked
    against DuckDB on the tables as they now stand.  Returns ``{"steps": [...], "ok"}``
    in the shape :mod:`bench.report` reads (seconds exclude writing the changes to
    Parquet and the checks).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    import spark_io
    from bench import q4

    res: dict[str, Any] = {"suite": "q4-spark", "shards": shards, "share": share,
                           "steps": []}
    ref = q4.Reference()
    integrated = q4.Integrated()
    (workdir / "in").mkdir(parents=True, exist_ok=True)

    def collect(outs: Mapping[str, Any]) -> None:
        integrated.add({name: df.toArrow() for name, df in outs.items()})

    def frame(name: str, table: Any) -> Any:
        path = workdir / "in" / f"{name}.parquet"
        pq.write_table(table, path)
        return session.read.parquet(str(path))

    with steps.phase(f"SparkPipeline: q4 on local[2], {shards} shards: population, "
                     f"qualifying sales, {batches} change batch(es) of {share:.2%}, each "
                     "checked against DuckDB", total=2 + batches) as done:
        try:
            def step(label: str, seconds: float, applies: int,
                     current: Mapping[str, Any]) -> None:
                c = q4.check(integrated, ref, current, label)
                res["steps"].append({"step": label, "seconds": round(seconds, 3),
                                     "applies": applies, "ok": c["ok"],
                                     "q4_rows": c["q4"]["want_rows"],
                                     "year_total_rows": c["year_total"]["want_rows"]})
                done(f"{label}: {seconds:.1f} s; "
                     f"{'matches DuckDB' if c['ok'] else 'DIFFERS FROM DuckDB'}")

            sp = spark_io.SparkPipeline(session, q4.define_q4(), workdir / "state",
                                        shards=shards, name="q4")
            t0 = time.perf_counter()
            collect(sp.populate({n: str(paths[n]) for n in q4.TABLES}))
            step("population", time.perf_counter() - t0, 1, tables)
            work = q4.Workload(tables, seed)
            qualify = max(3, round(0.001 * tables["customer"].num_rows))
            pushes = work.qualifying_sales(qualify)
            changes = {s: frame(f"qualify-{s}", d) for s, d in pushes}
            t0 = time.perf_counter()
            collect(sp.apply(changes))
            seconds = time.perf_counter() - t0
            for s, d in pushes:
                work.apply(s, d)
            step(f"qualifying sales ({qualify} customers)", seconds, 1, work.tables)
            for b in range(batches):
                pushes = [x for kind in q4.KINDS for x in work.batch(kind, share)]
                by_source: dict[str, list[Any]] = {}
                for s, d in pushes:
                    by_source.setdefault(s, []).append(d)
                changes = {s: frame(f"batch{b}-{s}", pa.concat_tables(ds))
                           for s, ds in by_source.items()}
                t0 = time.perf_counter()
                collect(sp.apply(changes))
                seconds = time.perf_counter() - t0
                for s, d in pushes:
                    work.apply(s, d)
                rows = sum(d.num_rows for _, d in pushes)
                step(f"batch {b + 1}: the four kinds at once ({rows:,} rows)", seconds, 1,
                     work.tables)
        finally:
            ref.close()
    res["ok"] = all(s["ok"] for s in res["steps"])
    return res


def load_recorded(path: Path = RECORDED) -> dict[str, Any]:
    """The recorded runs (what they measured, the machine, one entry per run)."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def run(sf: float = DEFAULT_SF, strategies: Sequence[str] = DEFAULT_STRATEGIES,
        sizes: Sequence[float] = DEFAULT_SIZES, *, spark: bool = False,
        rounds: int = DEFAULT_ROUNDS, repeat: int = 3, shards: int = 2,
        spark_share: float | None = None, unshared: bool = False, streaming: bool = False,
        seed: int = 0, chunk_rows: int = DEFAULT_CHUNK_ROWS, check: str = "each",
        recompute_runs: int = 3, workdir: Path | None = None, cache_dir: Path | None = None,
        spark_repeat: int = 2, steps: Steps | None = None) -> dict[str, Any]:
    """Run the phases (module docstring); return the dict :func:`bench.report.write_report` takes.

    ``results["ok"]`` is whether every DuckDB check passed.  ``spark_repeat``: change
    batches on SparkPipeline (the first also warms its Python workers); ``streaming`` adds
    customer ⋈ store_sales as Spark Structured Streaming's own join (with ``spark``).
    """
    from bench import q4
    from bench.live import _git

    strategies = list(strategies)
    sizes = [float(s) for s in sizes]
    check_arguments(sf, strategies, sizes, repeat, spark, shards, spark_share, chunk_rows,
                    check, rounds)
    steps = steps or Steps()
    share = spark_share if spark_share is not None else default_spark_share(sizes)
    t_start = time.perf_counter()
    phases: dict[str, float] = {}
    results: dict[str, Any] = {
        "suite": "tpcds-q4", "sf": sf, "strategies": strategies, "sizes": sizes,
        "rounds": rounds, "repeat": repeat, "spark_requested": spark,
        "shards": shards if spark else None, "spark_share": share if spark else None,
        "chunk_rows": chunk_rows, "seed": seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "phases": phases, "recorded": load_recorded(),
    }
    tmp = Path(workdir / "in-process" if workdir is not None
               else tempfile.mkdtemp(prefix="joinstate-tpcds-"))
    tmp.mkdir(parents=True, exist_ok=True)
    session: Any = None
    try:
        t0 = time.perf_counter()
        with steps.phase(f"data: TPC-DS SF{sf:g}, the five tables q4 reads (generated by "
                         "DuckDB once, then cached)", total=1) as done:
            tables = q4.load(sf, cache_dir)
            done(", ".join(f"{n} {t.num_rows:,}" for n, t in tables.items()) + " rows")
        phases["data"] = time.perf_counter() - t0
        qualify = max(3, round(0.001 * tables["customer"].num_rows))
        res: dict[str, Any] = {
            "suite": "q4", "sf": sf, "sizes": sizes, "repeat": repeat, "seed": seed,
            "check_every": check, "chunk_rows": chunk_rows, "qualify": qualify,
            "started": results["started"], "git": _git(),
            "load_average_start": list(os.getloadavg()),
            "rows": {n: t.num_rows for n, t in tables.items()},
        }
        results["q4"] = res

        passes: list[dict[str, Any]] = []
        final: Mapping[str, Any] = tables

        def change_batches(name: str, shared: bool) -> dict[str, Any]:
            nonlocal final
            t0 = time.perf_counter()
            n_steps = 3 + len(sizes) * repeat * len(q4.KINDS)
            with steps.phase(f"change batches, indexes {name}: populate (auto), then "
                             f"{repeat} batch(es) of each kind per size "
                             f"{', '.join(f'{s:.2%}' for s in sizes)} of the sales, each "
                             f"checked against DuckDB ({check})", total=n_steps) as done:
                pr = q4.run_pass(name, shared, tables, sizes, repeat, seed, tmp,
                                 chunk_rows=chunk_rows, check_every=check, qualify=qualify,
                                 on_step=lambda what, ms: done(f"{what}: {ms:,.0f} ms"))
            final = pr.pop("final_tables")
            passes.append(pr)
            shutil.rmtree(tmp / name, ignore_errors=True)
            phases[f"change batches ({name})"] = time.perf_counter() - t0
            return pr

        # Population runs in alternated order; the shared change-batch pass populates
        # with auto, so it stands in for auto's last run (one population fewer).
        slots = [(r + 1, pos + 1, n) for r, names in enumerate(population_rounds(
            strategies, rounds)) for pos, n in enumerate(names)]
        pass_at = _pass_slot(strategies, rounds)
        entries: list[dict[str, Any]] = []
        runs: list[dict[str, Any]] = []
        i = 0
        while i < len(slots):
            if i == pass_at:
                entry = _pass_entry(change_batches("shared", True))
                entry.update(requested="auto", round=slots[i][0], position=slots[i][1])
                entries.append(entry)
                runs.append(_run_summary(entry))
                steps.say(f"  (that population was auto's run {slots[i][0]} of {rounds})")
                i += 1
                continue
            j = pass_at if pass_at is not None and pass_at > i else len(slots)
            t0 = time.perf_counter()
            with steps.phase(f"population per strategy: runs {i + 1}-{j} of {len(slots)} "
                             f"({len(strategies)} strategies x {rounds} round(s), order "
                             "reversed each round, a fresh store each)",
                             total=j - i) as done:
                for r, pos, name in slots[i:j]:
                    entry = _population_entry(tables, name, tmp, chunk_rows)
                    entry.update(requested=name, round=r, position=pos)
                    entries.append(entry)
                    runs.append(_run_summary(entry))
                    _say_run(done, entry, runs[-1])
            phases[f"population runs {i + 1}-{j}"] = time.perf_counter() - t0
            i = j
        if pass_at is None:
            change_batches("shared", True)
        if unshared:
            change_batches("unshared", False)
        res["population_runs"] = runs
        res["population_strategies"] = best_runs(entries, runs, strategies)
        res["passes"] = passes
        res["final_rows"] = {n: t.num_rows for n, t in final.items()}

        t0 = time.perf_counter()
        session = None
        with steps.phase("recompute: q4 from scratch on the final tables, DuckDB"
                         + (" and Spark SQL (local[2])" if spark else ""),
                         total=2 if spark else 1) as done:
            rc = q4.duckdb_recompute(final, recompute_runs)
            res["duckdb_recompute"] = rc
            done(f"DuckDB: {rc['answer']['median_ms']:,.0f} ms (median of {recompute_runs})")
            res["spark_sql_recompute"] = None
            if spark:
                import spark_io
                from bench import spark_sql

                # One JVM for Spark SQL and SparkPipeline; stopped after the latter.
                session = spark_io.local_session("joinstate-q4")
                sq = spark_sql.recompute(final, recompute_runs, spark=session)
                res["spark_sql_recompute"] = sq
                done(f"Spark SQL: {sq['answer']['median_ms']:,.0f} ms (median of "
                     f"{recompute_runs}; first {sq['answer']['first_ms']:,.0f} ms); answer "
                     f"{'equals' if sq['matches_duckdb'] else 'DIFFERS FROM'} DuckDB's")
        phases["recompute"] = time.perf_counter() - t0
        res["load_average_end"] = list(os.getloadavg())
        res["ok"] = all(p["ok"] for p in res["passes"]) and (
            res["spark_sql_recompute"] is None
            or bool(res["spark_sql_recompute"]["matches_duckdb"]))
    except BaseException:
        if session is not None:
            session.stop()
        raise
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)

    results["spark"] = None
    if spark:
        from bench import tpcds

        t0 = time.perf_counter()
        spark_dir = workdir / "spark" if workdir is not None else Path(
            tempfile.mkdtemp(prefix="joinstate-tpcds-spark-"))
        try:
            paths = tpcds.tables(sf, q4.TABLES, q4.TABLES, cache_dir=cache_dir)
            results["spark"] = spark_pipeline(session, tables, paths, shards, share, seed,
                                              spark_repeat, spark_dir, steps)
        except Exception as exc:
            # Minutes of in-process figures are already measured: a Spark failure fails
            # the run (exit 1, the report's first line) instead of losing them.
            text = str(exc).strip()
            error = (f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text
                     else type(exc).__name__)
            steps.say(f"  SparkPipeline FAILED: {error}")
            results["spark"] = {"suite": "q4-spark", "sf": sf, "shards": shards,
                                "share": share, "steps": [], "ok": False, "error": error}
        finally:
            session.stop()
            if workdir is None:
                shutil.rmtree(spark_dir, ignore_errors=True)
        results["spark"].update(sf=sf, shards=shards)
        phases["SparkPipeline"] = time.perf_counter() - t0
        if streaming:
            # The baseline a Spark user would otherwise pick, on the same generated data:
            # customer x store_sales in-process, through SparkJoin, and as Spark
            # Structured Streaming's own stream-stream join (RocksDB state store).
            from bench import spark_tpcds

            t0 = time.perf_counter()
            with steps.phase("customer ⋈ store_sales: in-process vs SparkJoin vs Spark "
                             "Structured Streaming's own join", total=None):
                results["baseline"] = spark_tpcds.run(
                    sf, shards=shards,
                    workdir=None if workdir is None else workdir / "baseline")
            phases["Structured Streaming baseline"] = time.perf_counter() - t0
    results["seconds"] = round(time.perf_counter() - t_start, 2)
    results["ok"] = bool(results["q4"].get("ok")) and (
        results["spark"] is None or bool(results["spark"].get("ok"))) and bool(
        results.get("baseline", {}).get("ok", True))
    return results


def run_and_report(out: Path, **kwargs: Any) -> tuple[dict[str, Any], ReportFiles]:
    """:func:`run`, then :func:`bench.report.write_report` into ``out``."""
    if out.exists() and not out.is_dir():
        raise BenchArgumentError(f"--out {out}: a file is in the way; give a directory")
    results = run(**kwargs)
    return results, write_report(results, out)
