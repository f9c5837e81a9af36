"""``joinstate populate``: create a join and load both sides from Parquet, then go live.

A thin layer over :func:`population.populate`: the inputs are opened as Arrow datasets,
their batches counted into a rich progress display (on a terminal only), the output
change set written per input batch, and a failure leaves either nothing (no new join,
no new store) or a partial population that ``--resume`` continues.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_args

import click
import pyarrow as pa

import joinstate
import population
from bench.commands.common import (
    CONTEXT,
    EXIT_OK,
    SIDES,
    CliError,
    describe_progress,
    drop_hint,
    in_flags,
    one_line,
    open_dataset,
    progress_of,
    rich_console,
    single_store,
    split_columns,
    write_parquet,
)
from joinstate.changes import CHANGE_TYPE, to_changes
from joinstate.join import How
from joinstate.schema import WEIGHT
from joinstate.summary import human_bytes
from population.sources import parquet_batches, parquet_rows
from population.strategy import PRESETS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import pyarrow.dataset as pads
    from rich.console import Console

__all__ = ["populate"]


def _counting(batches: Iterator[pa.RecordBatch], advance: Callable[[int], None]
              ) -> Iterator[pa.RecordBatch]:
    """``batches``, calling ``advance`` with each one's rows once it is applied.

    (The driver asks for the next batch once the previous one has been applied.)
    """
    for batch in batches:
        yield batch
        advance(batch.num_rows)


def _choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise CliError(f"{flag} {value!r}: choose one of {', '.join(choices)}")


def _side(data: pads.Dataset, side: str, key: str, unique: str | None) -> joinstate.Side:
    """The join side of ``--left``/``--right`` and its key flags, errors in flag terms."""
    try:
        return joinstate.Side(data.schema, key=split_columns(key) or [],
                              unique_key=split_columns(unique))
    except joinstate.SchemaMismatchError as exc:
        raise CliError(in_flags(str(exc), [
            ("Side.key", f"--{side}-key"), ("Side.unique_key", f"--{side}-unique"),
            ("the schema (columns:", f"the --{side} input (its columns:"),
            ("Side.schema", f"the --{side} input"),
        ])) from exc


def _populate_terms(path: Path, name: str) -> list[tuple[str, str]]:
    """The population driver's API terms, as the populate command's flags (longest first)."""
    drop = f"'joinstate drop {path} {name} --yes'"
    return [
        ("population.populate(..., resume=True)", "this command and --resume"),
        (f"store.drop_join({name!r}), create the join again and populate it from scratch",
         f"{drop} and populate it again"),
        (f"store.drop_join({name!r})", drop),
        ("resume=True", "--resume"), ("batch_rows=", "--batch-rows "),
        ("batch_rows ", "--batch-rows "), ("strategy=", "--strategy "),
        ("order=", "--order "), ("these arguments", "these flags"),
        ("the input of the left side", "the --left input"),
        ("the input of the right side", "the --right input"),
        ("the left side's input", "the --left input"),
        ("the right side's input", "the --right input"),
        ("the left side's", "--left's"), ("the right side's", "--right's"),
        ("drop the old state", drop_hint(path, name)),
    ]



def _after_failure(store: joinstate.StateStore, name: str, created_join: bool
                   ) -> tuple[bool, str]:
    """What a failed population left: (nothing loaded?, what to say of it).

    Nothing loaded: the join this run created is dropped, so the store is as it was.
    Something loaded: it stays, a partial population ``--resume`` continues.
    """
    try:
        if name not in store.joins():
            return True, "nothing was loaded"
        join = store.join(name)
        if join.phase == "live":
            return False, f"join {name!r} is unchanged"
        progress = {s: progress_of(join.progress(s)) for s in SIDES}
        if all(v is None for v in progress.values()) and not any(join.rows(s) for s in SIDES):
            if created_join:
                store.drop_join(name)
                return True, f"nothing was loaded and join {name!r} was not kept"
            return True, "nothing was loaded"
    except (joinstate.JoinStateError, OSError) as exc:
        return False, f"what join {name!r} holds now could not be read ({one_line(str(exc))})"
    return False, (
        f"join {name!r} in {store.path} holds a partial population "
        f"({describe_progress({s: v for s, v in progress.items() if v is not None})}): "
        "rerun this command with --resume to continue it (the batches loaded are checked "
        f"against the inputs), or {drop_hint(store.path, name)}")


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


@click.command(context_settings=CONTEXT,
               short_help="Create a join, load both sides from Parquet, go live.")
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
    become columns) or globs.  The store is created if missing.  A run that fails (a
    damaged file: the error names it and its row group) keeps what it committed: with
    nothing loaded it leaves no new join and no new store; otherwise --resume continues
    the partial population, or 'joinstate drop' removes it.  The output change set
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
    path = single_store(state_dir, "populate")
    _choice("--strategy", strategy, (*PRESETS, "auto"))
    if order is not None:
        _choice("--order", order, population.ORDERS)
    data = {"left": open_dataset(left, "--left"), "right": open_dataset(right, "--right")}
    keys = {"left": (left_key, left_unique), "right": (right_key, right_unique)}
    sides = {s: _side(data[s], s, *keys[s]) for s in SIDES}
    try:
        sizes: dict[str, int] = {s: parquet_rows(data[s], f"--{s}") for s in SIDES}
    except population.PopulationError as exc:
        raise CliError(str(exc)) from exc
    rows_per_batch = batch_rows or 65_536

    written: list[int] = [0]

    def sink(out: pa.Table, batch: population.OutputBatch) -> None:
        assert output is not None
        table = to_changes(out) if cdf else out
        write_parquet(table, output / f"part-{batch.side}-{batch.index:08d}.parquet")
        written[0] += 1

    err = rich_console(stderr=True)
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
        batches = parquet_batches(data[side], rows_per_batch, f"--{side}")
        yield from _counting(batches, advance(side))

    terms = _populate_terms(path, join_name)
    new_store = not path.exists()
    new_output = output is not None and not output.exists()
    keep, opened = True, False
    try:
        with joinstate.StateStore(path) as store:
            opened = True
            created_join = join_name not in store.joins()
            try:
                join = store.join(join_name, left=sides["left"], right=sides["right"],
                                  how=cast("How", how))
                if join.phase == "live":
                    raise CliError(
                        f"join {join_name!r} in {path} is already live (populated); apply "
                        f"changes with 'joinstate apply {path} {join_name} SIDE "
                        f"CHANGES.parquet', or {drop_hint(path, join_name)} to populate it "
                        "again")
                if resume:  # cut the inputs as the interrupted run did, or their digests differ
                    for s in SIDES:
                        marker = progress_of(join.progress(s))
                        if isinstance(marker, dict) and isinstance(marker.get("batch_rows"), int):
                            rows_per_batch = marker["batch_rows"]
                if output is not None:
                    output.mkdir(parents=True, exist_ok=True)
                with bar:
                    rep = population.populate(
                        join, source("left"), source("right"),
                        strategy=strategy, order=order,
                        sink=sink if output is not None else None,
                        progress=False, sizes=sizes, batch_rows=batch_rows, resume=resume,
                    )
            except population.PopulationInterruptedError as exc:
                raise CliError(in_flags(str(exc), terms)) from exc
            except (joinstate.JoinStateError, OSError, pa.ArrowException) as exc:
                empty, left_behind = _after_failure(store, join_name, created_join)
                keep = not (new_store and empty)
                raise CliError(f"{in_flags(str(exc), terms)}; {left_behind}"
                               + ("" if keep else f"; the new state directory {path} was "
                                  "removed")) from exc
            except BaseException:  # Ctrl-C, or an error of the command itself
                keep = not (new_store and _after_failure(store, join_name, created_join)[0])
                raise
    except BaseException:
        if new_store and not opened:  # the store could not even be created
            keep = False
        raise
    finally:
        if not keep and path.exists():
            import shutil

            shutil.rmtree(path)
        if new_output and output is not None and output.is_dir() and not written[0] and \
                not any(output.iterdir()):
            output.rmdir()
    console = rich_console()
    _summary_table(rep, console)
    if output is not None:
        console.print(f"output: {written[0]:,} Parquet file(s) in {output}", markup=False)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(rep.to_json())
    return EXIT_OK

