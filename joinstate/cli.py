"""The ``joinstate`` command: inspect, verify, apply changes to and populate state stores.

A thin layer over library calls, for data engineers at a terminal::

    joinstate inspect STATE_DIR [--json]       every join: phase, progress, per-side sizes
    joinstate verify STATE_DIR                 read every block, check every counter
    joinstate apply STATE_DIR JOIN SIDE CHANGES.parquet [--output OUT.parquet]
    joinstate populate STATE_DIR JOIN --left ... --right ... --left-key ... --right-key ...

Errors are one line on stderr naming the problem and what to do, with exit status 2
(1 when the state is corrupted: ``verify``'s "inconsistent" answer); ``--debug``
anywhere on the command line shows the traceback instead.  ``inspect`` and ``verify``
open stores read-only: safe while a writer runs.  A Spark state directory (one
``shard-NNNNN`` store per shard) is inspected and verified shard by shard.

Layering: this module is part of the core package but imports ``population`` only
inside the ``populate`` command, and never imports pyspark.
"""

from __future__ import annotations

import glob
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_args

import click
import pyarrow as pa

import joinstate
from joinstate.changes import CHANGE_TYPE, from_changes, to_changes
from joinstate.join import How
from joinstate.names import commit_prefix
from joinstate.schema import WEIGHT
from joinstate.summary import human_bytes, side_facts, stats_summary

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import pyarrow.dataset as pads
    from rich.console import Console

    from joinstate.side import SideName

__all__ = ["EXIT_CORRUPTED", "EXIT_ERROR", "EXIT_OK", "cli", "main"]

EXIT_OK = 0
EXIT_CORRUPTED = 1
"""The state is inconsistent (``StateCorruptedError``)."""
EXIT_ERROR = 2
"""A usage error, a locked or missing store, a bad input file ..."""

SIDES: tuple[SideName, SideName] = ("left", "right")
_SHARD = re.compile(r"^shard-(\d{5})$")

log = logging.getLogger(__name__)


class CliError(Exception):
    """A one-line error the command reports (message and exit status)."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# ---- the group: one-line errors, --debug ---------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error_code(exc: BaseException, prog: str) -> int:
    """Print ``exc`` as one line on stderr; return the exit status."""
    if type(exc).__name__ == "NoArgsIsHelpError" and isinstance(exc, click.UsageError):
        exc.show()  # click >= 8.2: the group's help, as for --help
        return EXIT_ERROR
    if isinstance(exc, click.UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else prog
        click.echo(f"error: {_one_line(exc.format_message())} (see '{where} --help')",
                   err=True)
        return EXIT_ERROR
    if isinstance(exc, click.ClickException):
        click.echo(f"error: {_one_line(exc.format_message())}", err=True)
        return EXIT_ERROR
    if isinstance(exc, click.exceptions.Abort | KeyboardInterrupt):
        click.echo("error: interrupted", err=True)
        return 130
    if isinstance(exc, CliError):
        click.echo(f"error: {_one_line(str(exc))}", err=True)
        return exc.code
    if isinstance(exc, joinstate.StateCorruptedError):
        click.echo(f"error: state corrupted: {_one_line(str(exc))}", err=True)
        return EXIT_CORRUPTED
    if isinstance(exc, joinstate.JoinStateError | OSError | pa.ArrowException):
        click.echo(f"error: {_one_line(str(exc))}", err=True)
        return EXIT_ERROR
    click.echo(f"error: unexpected {type(exc).__name__}: {_one_line(str(exc))} (rerun "
               "with --debug for the traceback, and please report it)", err=True)
    return EXIT_ERROR


class _Group(click.Group):
    """A click group whose errors are one line and whose exit status is the command's."""

    def main(
        self, args: Sequence[str] | None = None, prog_name: str | None = None,
        complete_var: str | None = None, standalone_mode: bool = True, **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        end = argv.index("--") if "--" in argv else len(argv)
        debug = "--debug" in argv[:end]
        if debug:
            argv = [a for i, a in enumerate(argv) if not (a == "--debug" and i < end)]
            logging.basicConfig(level=logging.DEBUG,
                                format="%(levelname)s %(name)s: %(message)s")
        prog = prog_name or "joinstate"
        try:
            rv = super().main(argv, prog, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else EXIT_OK
        except (Exception, KeyboardInterrupt) as exc:
            if debug:
                raise
            code = _error_code(exc, prog)
        if standalone_mode:
            sys.exit(code)
        return code


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(cls=_Group, context_settings=CONTEXT)
@click.option("--debug", is_flag=True,
              help="Show tracebacks and debug logs (accepted anywhere on the command line).")
@click.version_option(joinstate.__version__, prog_name="joinstate")
def cli(debug: bool) -> None:
    """Inspect, verify, change and populate joinstate state stores.

    \b
    Examples:
      joinstate inspect state/                  every join in a store (or Spark state dir)
      joinstate inspect state/ --json           the same, machine-readable
      joinstate verify state/                   exit 0 consistent, 1 corrupted, 2 error
      joinstate apply state/ sales right changes.parquet --output out.parquet
      joinstate populate state/ sales --left customer/ --left-key c_customer_sk \\
          --right 'store_sales/*.parquet' --right-key ss_customer_sk --output out/

    Errors are one line; exit status 2 (1 for corrupted state).
    """


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``joinstate`` command; returns the exit status (the console script's entry)."""
    code: int = cli.main(args=argv, prog_name="joinstate", standalone_mode=False)
    return code


# ---- stores and inputs ---------------------------------------------------------------


def _stores(state_dir: Path) -> list[tuple[int | None, Path]]:
    """``[(shard or None, store path)]``: the store itself, or every shard of a Spark dir."""
    if state_dir.is_dir() and not (state_dir / "CURRENT").exists():
        shards = sorted(
            (int(m.group(1)), p) for p in state_dir.iterdir()
            if p.is_dir() and (m := _SHARD.match(p.name))
        )
        if shards:
            return [(n, p) for n, p in shards]
    return [(None, state_dir)]


def _single_store(state_dir: Path, command: str) -> Path:
    """The store ``command`` writes to: an existing, unsharded state store."""
    stores = _stores(state_dir)
    if stores[0][0] is not None:
        raise CliError(
            f"{state_dir} is a Spark state directory ({len(stores)} shards); {command} "
            "works on one store: use spark_io.SparkJoin for sharded joins, or pass one "
            "shard's directory"
        )
    return state_dir


def _require_existing(state_dir: Path) -> None:
    if not (state_dir / "CURRENT").exists():
        raise CliError(
            f"no state store at {state_dir}; create one with 'joinstate populate' (or "
            "joinstate.StateStore) first"
        )


def _columns(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def _dataset(spec: str, what: str) -> pads.Dataset:
    """A Parquet file, a directory of them (as Spark writes), or a glob, as one dataset.

    Hive-style ``key=value`` directories under a directory (or under the fixed part of
    a glob) become columns, as Spark reads them back; files starting with ``_`` or
    ``.`` (``_SUCCESS``, ``.crc``) are skipped.
    """
    import pyarrow.dataset as ds

    kwargs: dict[str, Any] = {"format": "parquet"}
    if any(ch in spec for ch in "*?["):
        files = [f for f in sorted(glob.glob(spec, recursive=True)) if Path(f).is_file()]
        if not files:
            raise CliError(f"{what}: the pattern {spec!r} matches no files; check the path")
        fixed = []
        for part in Path(spec).parts:
            if any(ch in part for ch in "*?["):
                break
            fixed.append(part)
        source: Any = files
        kwargs.update(partitioning="hive", partition_base_dir=str(Path(*fixed or ["."])))
    elif Path(spec).is_dir():
        source = spec
        kwargs["partitioning"] = "hive"
    elif Path(spec).exists():
        source = spec
    else:
        raise CliError(f"{what}: {spec} does not exist; give a Parquet file, a directory "
                       "of Parquet files or a glob")
    try:
        return ds.dataset(source, **kwargs)
    except (OSError, pa.ArrowException) as exc:
        raise CliError(f"{what}: cannot read {spec} as Parquet: {_one_line(str(exc))}"
                       ) from exc


def _read_changes(spec: str) -> pa.Table:
    """A change file as a weighted change set (``_weight``, ``_change_type`` or neither)."""
    try:
        table = _dataset(spec, "CHANGES").to_table()
    except (OSError, pa.ArrowException) as exc:
        raise CliError(f"CHANGES: cannot read {spec}: {_one_line(str(exc))}") from exc
    if CHANGE_TYPE in table.column_names:
        return from_changes(table)
    return table


def _write_parquet(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# ---- inspect -------------------------------------------------------------------------


def _progress(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw.decode("utf-8", "replace")}


def _describe_progress(progress: dict[str, Any]) -> str:
    parts = []
    for side in SIDES:
        p = progress.get(side)
        if p is None:
            parts.append(f"{side} nothing loaded")
        elif "batches" in p:
            parts.append(f"{side} {p['batches']} batches, {p.get('rows', 0):,} rows"
                         f"{', done' if p.get('done') else ''}")
        else:
            parts.append(f"{side} {p}")
    return "; ".join(parts)


def _inspect_store(path: Path) -> list[dict[str, Any]]:
    with joinstate.StateStore(path, read_only=True) as store:
        out = []
        for name in store.joins():
            join = store.join(name)
            stats = join.stats()
            out.append({
                "name": name,
                "how": join.how,
                "phase": stats["phase"],
                "population_progress": {s: _progress(join.progress(s)) for s in SIDES},
                "commit_ids": len(store.meta_keys(commit_prefix(name))),
                "sides": {s: side_facts(stats[s]) for s in SIDES},
                "stats": stats,
            })
        return out


@cli.command(context_settings=CONTEXT)
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(state_dir: Path, as_json: bool) -> int:
    """Show every join in a state store (read-only: safe while a writer runs).

    Per join: type, phase, population progress, recorded commit ids; per side: layout,
    rows, distinct keys, bytes, L0 files, auto-compaction.  A Spark state directory
    (subdirectories shard-NNNNN) lists every shard.

    \b
    Examples:
      joinstate inspect state/
      joinstate inspect spark-state/ --json | jq '.stores[].joins[].sides'
    """
    stores: list[dict[str, Any]] = []
    for shard, path in _stores(state_dir):
        stores.append({"shard": shard, "path": str(path), "joins": _inspect_store(path)})
    if as_json:
        click.echo(json.dumps({"state_dir": str(state_dir), "stores": stores}, indent=2,
                              default=str))
        return EXIT_OK
    for store in stores:
        where = store["path"] if store["shard"] is None else f"shard {store['shard']} " \
            f"({store['path']})"
        if len(stores) > 1 or not store["joins"]:
            click.echo(f"{where}: {len(store['joins'])} join(s)")
        for j in store["joins"]:
            click.echo(stats_summary(j["stats"]))
            progress = j["population_progress"]
            if any(v is not None for v in progress.values()):
                click.echo(f"  population progress: {_describe_progress(progress)}")
            click.echo(f"  recorded commit ids: {j['commit_ids']:,}")
    return EXIT_OK


# ---- verify --------------------------------------------------------------------------


@cli.command(context_settings=CONTEXT)
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def verify(state_dir: Path, as_json: bool) -> int:
    """Read every block of a store and check every join's counters (read-only).

    Exit status: 0 consistent, 1 corrupted (StateCorruptedError), 2 any other error
    (no store, unreadable path ...).  A Spark state directory is verified shard by shard.

    \b
    Examples:
      joinstate verify state/ && echo consistent
    """
    results = []
    for shard, path in _stores(state_dir):
        with joinstate.StateStore(path, read_only=True) as store:
            results.append({"shard": shard, "path": str(path), **store.verify()})
    if as_json:
        click.echo(json.dumps({"state_dir": str(state_dir), "consistent": True,
                               "stores": results}, indent=2))
        return EXIT_OK
    n_joins = 0
    for r in results:
        prefix = "" if r["shard"] is None else f"shard {r['shard']}: "
        for name, sides in r["joins"].items():
            n_joins += 1
            counts = "; ".join(
                f"{s} {c['rows']:,} rows in {c['entries']:,} entries"
                + (f" (+{c['null_rows']:,} NULL-key rows)" if c.get("null_rows") else "")
                for s, c in sides.items()
            )
            click.echo(f"{prefix}join {name}: {counts}")
    click.echo(f"consistent: {n_joins} join(s) in {len(results)} store(s) at {state_dir}")
    return EXIT_OK


# ---- apply ---------------------------------------------------------------------------


def _weight_split(table: pa.Table) -> tuple[int, int]:
    """(inserted, deleted) copies of a weighted change set."""
    import numpy as np

    if WEIGHT not in table.column_names:
        return table.num_rows, 0
    w = np.asarray(table.column(WEIGHT).to_numpy(), dtype=np.int64)
    return int(w[w > 0].sum()), int(-w[w < 0].sum())


def _preview(table: pa.Table, console: Console, limit: int = 10) -> None:
    from rich.table import Table

    t = Table(show_header=True, header_style="bold")
    for name in table.column_names:
        t.add_column(name, overflow="fold")
    for row in table.slice(0, limit).to_pylist():
        t.add_row(*("NULL" if v is None else str(v) for v in row.values()))
    console.print(t)
    if table.num_rows > limit:
        console.print(f"... {table.num_rows - limit:,} more rows", markup=False)


@cli.command(context_settings=CONTEXT)
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.argument("join_name", metavar="JOIN")
@click.argument("side", type=click.Choice(SIDES))
@click.argument("changes", metavar="CHANGES.parquet")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the output change set here (Parquet).")
@click.option("--commit-id", help="Apply exactly once: a retry with the same id and "
              "change returns the recorded output and changes nothing.")
@click.option("--cdf", is_flag=True, help="Write the output as change rows with "
              f"{CHANGE_TYPE} (insert/delete) instead of {WEIGHT}.")
def apply(state_dir: Path, join_name: str, side: str, changes: str, output: Path | None,
          commit_id: str | None, cdf: bool) -> int:
    """Push a change file into one side of an existing join; write the output changes.

    CHANGES is Parquet (a file, a directory or a glob) with the side's columns and an
    int64 _weight (+n inserts n copies, -n deletes them); without _weight every row is
    an insert; with a _change_type column (insert/delete, as a Delta change data feed
    has it) the rows are consolidated first.  The batch is atomic: a delete of a row
    that is not there changes nothing and fails.

    \b
    Examples:
      joinstate apply state/ sales right changes.parquet --output out.parquet
      joinstate apply state/ sales left 'cdc/batch-0017/*.parquet' --commit-id batch-17
    """
    path = _single_store(state_dir, "apply")
    _require_existing(path)
    delta = _read_changes(changes)
    ins, dels = _weight_split(delta)
    with joinstate.StateStore(path) as store:
        join = store.join(join_name)
        replay = commit_id is not None and join.committed(commit_id)
        out = join.push(cast("SideName", side), delta, commit_id=commit_id)
    if output is not None:
        _write_parquet(to_changes(out) if cdf else out, output)
    oi, od = _weight_split(out)
    verb = "already applied (recorded output returned, nothing changed):" if replay \
        else "applied"
    click.echo(
        f"{verb} {ins:,} inserted and {dels:,} deleted rows to the {side} side of join "
        f"{join_name}; output: {out.num_rows:,} rows ({oi:,} inserted, {od:,} deleted)"
        + (f", written to {output}" if output is not None else "")
    )
    if output is None and out.num_rows:
        _preview(to_changes(out) if cdf else out, _console())
    return EXIT_OK


# ---- populate ------------------------------------------------------------------------


def _counting(dataset: pads.Dataset, batch_rows: int, advance: Callable[[int], None]
              ) -> Iterator[pa.RecordBatch]:
    """The dataset's batches, calling ``advance`` with each one's rows once it is applied.

    (The driver asks for the next batch once the previous one has been applied.)
    """
    for batch in dataset.to_batches(batch_size=batch_rows):
        if batch.num_rows:
            yield batch
            advance(batch.num_rows)


def _summary_table(report: Any, console: Console) -> None:
    from rich.table import Table

    t = Table(title=f"join {report.join}: populated", title_justify="left")
    for name, justify in (("side", "left"), ("rows", "right"), ("batches", "right"),
                          ("seconds", "right"), ("rows/s", "right"),
                          ("bulk rows", "right"), ("SST files", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for name, s in report.sides.items():
        t.add_row(name, f"{s.rows:,}", f"{s.batches:,}", f"{s.seconds:.2f}",
                  f"{s.rows_per_second:,.0f}", f"{s.bulk_entries:,}", f"{s.sst_files:,}")
    console.print(t)
    lines = [
        f"strategy {report.strategy.get('name')}: {report.reason or 'given'}; order "
        f"{report.order}, small side {report.small_side} ({report.small_side_from})",
        f"output {report.output_rows:,} rows (weight {report.output_weight:,}); wall "
        f"{report.wall_seconds:.2f} s = {report.rows_per_second:,.0f} rows/s; phase "
        f"{report.phase}",
        f"written {human_bytes(report.bytes_written)}, state {human_bytes(report.state_bytes)}"
        f", L0 max {max(report.l0_max.values(), default=0)}, stalls "
        f"{report.stall_seconds:.2f} s, peak RSS {human_bytes(report.peak_rss)}",
    ]
    if report.resumed:
        lines.insert(0, "resumed: " + ", ".join(
            f"{s} after {r['batches']} batches ({r['rows']:,} rows)"
            for s, r in sorted(report.resumed.items())))
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)


@cli.command(context_settings=CONTEXT)
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.argument("join_name", metavar="JOIN")
@click.option("--left", "left", required=True, metavar="PATH",
              help="Left input: a Parquet file, a directory of them, or a glob.")
@click.option("--right", "right", required=True, metavar="PATH", help="Right input, likewise.")
@click.option("--left-key", required=True, help="Left join key column(s), comma-separated.")
@click.option("--right-key", required=True, help="Right join key column(s), comma-separated.")
@click.option("--left-unique", help="Left unique key column(s), if the left rows have one.")
@click.option("--right-unique", help="Right unique key column(s), if any.")
@click.option("--how", type=click.Choice(get_args(How)), default="inner", show_default=True,
              help="Join type.")
@click.option("--strategy", default="auto", show_default=True,
              help="Population strategy: auto, symmetric, asymmetric or bulk.")
@click.option("--order", default=None,
              help="Batch order: small-first (default), interleaved or as-given.")
@click.option("--batch-rows", type=click.IntRange(min=1), default=None,
              help="Rows per batch (default 65,536).")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted population of JOIN (same inputs).")
@click.option("--output", "-o", type=click.Path(path_type=Path, file_okay=False),
              help="Write the output change set here, one Parquet file per input batch.")
@click.option("--cdf", is_flag=True,
              help=f"Write the output as change rows with {CHANGE_TYPE} instead of {WEIGHT}.")
@click.option("--report", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the population report as JSON here.")
@click.option("--no-progress", is_flag=True, help="Never draw the progress display.")
def populate(
    state_dir: Path, join_name: str, left: str, right: str, left_key: str, right_key: str,
    left_unique: str | None, right_unique: str | None, how: str, strategy: str,
    order: str | None, batch_rows: int | None, resume: bool, output: Path | None, cdf: bool,
    report: Path | None, no_progress: bool,
) -> int:
    """Create JOIN in STATE_DIR and load both sides from Parquet, then go live.

    Inputs are Parquet files, directories (as Spark writes them; hive partitions
    become columns) or globs.  The store is created if missing.  The output change set
    of the initial load goes to --output DIR as part-<side>-<batch>.parquet files (a
    resumed run rewrites the files of the batches it delivers again).  Runs in this
    process on one store (no --spark: for sharded state use spark_io.SparkJoin).

    \b
    Examples:
      joinstate populate state/ sales --left customer.parquet --left-key c_customer_sk \\
          --left-unique c_customer_sk --right 'store_sales/*.parquet' \\
          --right-key ss_customer_sk --output out/
      joinstate populate state/ sales ... --resume      # after an interruption
    """
    import population  # lazily: the core does not depend on the population layer

    path = _single_store(state_dir, "populate")
    data = {"left": _dataset(left, "--left"), "right": _dataset(right, "--right")}
    keys = {"left": (left_key, left_unique), "right": (right_key, right_unique)}
    sides = {
        s: joinstate.Side(data[s].schema, key=_columns(keys[s][0]) or [],
                          unique_key=_columns(keys[s][1]))
        for s in SIDES
    }
    sizes: dict[str, int] = {s: data[s].count_rows() for s in SIDES}
    rows_per_batch = batch_rows or 65_536

    written: list[int] = [0]

    def sink(out: pa.Table, batch: population.OutputBatch) -> None:
        assert output is not None
        table = to_changes(out) if cdf else out
        _write_parquet(table, output / f"part-{batch.side}-{batch.index:08d}.parquet")
        written[0] += 1

    err = _console(stderr=True)
    show = not no_progress and err.is_terminal
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description:<6}"), BarColumn(),
        TextColumn("{task.completed:>14,.0f} / {task.total:,.0f} rows"),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
        console=err, disable=not show, transient=False,
    )
    tasks: dict[str, TaskID] = {s: bar.add_task(s, total=sizes[s], rate="") for s in SIDES}
    started: dict[str, float] = {}
    loaded: dict[str, int] = dict.fromkeys(SIDES, 0)

    def advance(side: str) -> Callable[[int], None]:
        def step(n: int) -> None:
            now = time.perf_counter()
            t0 = started.setdefault(side, now)
            loaded[side] += n
            rate = f"{loaded[side] / (now - t0):>12,.0f} rows/s" if now > t0 else ""
            bar.update(tasks[side], advance=n, rate=rate)
        return step

    def source(side: str) -> Iterator[pa.RecordBatch]:
        started.setdefault(side, time.perf_counter())
        yield from _counting(data[side], rows_per_batch, advance(side))

    with joinstate.StateStore(path) as store:
        join = store.join(join_name, left=sides["left"], right=sides["right"],
                          how=cast("How", how))
        if resume:  # cut the inputs as the interrupted run did, or their digests differ
            for s in SIDES:
                marker = _progress(join.progress(s))
                if isinstance(marker, dict) and isinstance(marker.get("batch_rows"), int):
                    rows_per_batch = marker["batch_rows"]
        if output is not None:
            output.mkdir(parents=True, exist_ok=True)
        try:
            with bar:
                rep = population.populate(
                    join, source("left"), source("right"),
                    strategy=strategy, order=order, sink=sink if output is not None else None,
                    progress=False, sizes=sizes, batch_rows=batch_rows, resume=resume,
                )
        except population.PopulationInterruptedError as exc:
            if resume:
                raise
            raise CliError(f"{exc}. On the command line: rerun with --resume") from exc
    console = _console()
    _summary_table(rep, console)
    if output is not None:
        console.print(f"output: {written[0]:,} Parquet file(s) in {output}", markup=False)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(rep.to_json())
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
