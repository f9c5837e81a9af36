"""The ``joinstate`` command: inspect, verify, change, populate and plan state stores; bench.

A thin layer over library calls, for data engineers at a terminal::

    joinstate inspect STATE_DIR [--json]       every join and pipeline: phase, progress, sizes
    joinstate verify STATE_DIR                 read every block, check every counter
    joinstate apply STATE_DIR JOIN SIDE CHANGES.parquet [--output OUT.parquet]
    joinstate apply STATE_DIR PIPELINE SOURCE CHANGES.parquet --pipeline module:function
    joinstate populate STATE_DIR JOIN --left ... --right ... --left-key ... --right-key ...
    joinstate drop STATE_DIR NAME --yes          delete a join (or pipeline) and its state
    joinstate plan --sql @q.sql --source NAME=PATH ...   the planner's decisions
    joinstate view create|apply|read|inspect|verify|list STATE NAME ...   SQL views
    joinstate bench tpcds [--sf 0.01] [--spark] [--out DIR]   TPC-DS q4, report with charts
    joinstate bench SUITE [options]            every benchmark suite (core, q4, live ...)
    joinstate bench populate STATE_DIR ...     the population driver alone (synthetic data)

Errors are one line on stderr naming the problem and what to do, with exit status 2
(1 when the state is corrupted: ``verify``'s "inconsistent" answer, or when a benchmark's
answer differs from DuckDB's); ``--debug`` anywhere on the command line shows the
traceback instead.  ``inspect`` and ``verify`` open stores read-only: safe while a writer
runs.  A Spark state directory (one ``shard-NNNNN`` store per shard) is inspected and
verified shard by shard.  Pipelines are inspected from what the store holds (their
definition is stored as JSON); pushing into one needs its Python definition.

The command lives in the top package (``bench``), so it may use every layer below;
each subcommand is one module of :mod:`bench.commands`.  ``python -m bench SUITE`` is
``joinstate bench SUITE``, and ``python -m population`` is ``joinstate bench populate``.
pyspark is imported only by the subcommands that run Spark.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import click
import pyarrow as pa

import joinstate
from bench.commands.apply import apply
from bench.commands.common import (
    CONTEXT,
    EXIT_CHECK_FAILED,
    EXIT_CORRUPTED,
    EXIT_ERROR,
    EXIT_OK,
    CliError,
    one_line,
)
from bench.commands.plan import plan
from bench.commands.populate import populate
from bench.commands.store import drop, inspect, verify
from bench.commands.suites import SUITES
from bench.commands.view import view
from population.cli import command as population_command

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "EXIT_CHECK_FAILED", "EXIT_CORRUPTED", "EXIT_ERROR", "EXIT_OK", "bench", "bench_main",
    "cli", "demo_main", "main",
]


def _error_code(exc: BaseException, prog: str) -> int:
    """Print ``exc`` as one line on stderr; return the exit status."""
    if type(exc).__name__ == "NoArgsIsHelpError" and isinstance(exc, click.UsageError):
        exc.show()  # click >= 8.2: the group's help, as for --help
        return EXIT_ERROR
    if isinstance(exc, click.UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else prog
        click.echo(f"error: {one_line(exc.format_message())} (see '{where} --help')",
                   err=True)
        return EXIT_ERROR
    if isinstance(exc, click.ClickException):
        click.echo(f"error: {one_line(exc.format_message())}", err=True)
        return EXIT_ERROR
    if isinstance(exc, click.exceptions.Abort | KeyboardInterrupt):
        click.echo("error: interrupted", err=True)
        return 130
    if isinstance(exc, CliError):
        click.echo(f"error: {one_line(str(exc))}", err=True)
        return exc.code
    if isinstance(exc, joinstate.StateCorruptedError):
        click.echo(f"error: state corrupted: {one_line(str(exc))}", err=True)
        return EXIT_CORRUPTED
    if isinstance(exc, joinstate.JoinStateError | OSError | pa.ArrowException):
        click.echo(f"error: {one_line(str(exc))}", err=True)
        return EXIT_ERROR
    click.echo(f"error: unexpected {type(exc).__name__}: {one_line(str(exc))} (rerun "
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


@click.group(cls=_Group, context_settings=CONTEXT)
@click.option("--debug", is_flag=True,
              help="Show tracebacks and debug logs (accepted anywhere on the command line).")
@click.version_option(joinstate.__version__, prog_name="joinstate")
def cli(debug: bool) -> None:
    """Inspect, verify, change, populate and plan joinstate state stores; run benchmarks.

    \b
    Examples:
      joinstate inspect state/                  every join and pipeline in a store
      joinstate inspect state/ --json           the same, machine-readable
      joinstate verify state/                   exit 0 consistent, 1 corrupted, 2 error
      joinstate apply state/ sales right changes.parquet --output out.parquet
      joinstate apply state/ q4 store_sales changes.parquet --pipeline bench.q4:define_q4
      joinstate populate state/ sales --left customer/ --left-key c_customer_sk \\
          --right 'store_sales/*.parquet' --right-key ss_customer_sk --output out/
      joinstate drop state/ sales --yes         delete a join and all of its state
      joinstate plan --sql @q.sql --source customer=customer/ --source sales=sales/
      joinstate view create state/ v --sql @v.sql --source sales=sales/ \\
          --source customer=customer.parquet --unique customer=c_customer_sk
      joinstate view apply state/ v sales changes.parquet    a change file into a table
      joinstate view read state/ v --output v.parquet        what the view holds now
      joinstate bench tpcds --sf 0.01 --spark   TPC-DS q4 vs DuckDB, report with charts

    Errors are one line; exit status 2 (1 for corrupted state or a failed check).
    """


@cli.group(cls=_Group, context_settings=CONTEXT,
           short_help="Benchmark suites, checked; results in bench-results/.")
def bench() -> None:
    """Benchmarks that check their answers and write their results (bench-results/).

    Most suites need the bench extra (DuckDB, matplotlib): pip install 'joinstate[bench]';
    spark, q4spark, sparkjoin and --spark also need the spark extra and Java 17.  Each
    suite's --help says what it measures; 'python -m bench SUITE' runs the same.

    \b
    Examples:
      joinstate bench tpcds                             SF0.01, in this process
      joinstate bench tpcds --sf 0.01 --spark --out report/
      joinstate bench core --left-rows 10000 --right-rows 100000
      joinstate bench populate state/ --synthetic 100000,3000000 --strategy asymmetric
    """


for _command in (inspect, verify, apply, populate, drop, plan, view):
    cli.add_command(_command)
for _command in SUITES:
    bench.add_command(_command)
bench.add_command(population_command, "populate")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``joinstate`` command; returns the exit status (the console script's entry)."""
    code: int = cli.main(args=argv, prog_name="joinstate", standalone_mode=False)
    return code


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench SUITE ...``: ``joinstate bench SUITE ...``; returns the exit status."""
    code: int = bench.main(args=argv, prog_name="python -m bench", standalone_mode=False)
    return code


def demo_main(argv: Sequence[str] | None = None) -> int:
    """``joinstate-demo ...``: ``joinstate bench demo ...``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    code: int = bench.main(args=["demo", *args], prog_name="joinstate bench",
                           standalone_mode=False)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
