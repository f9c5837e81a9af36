"""The population driver's own command: populate one join from Parquet or synthetic data.

``python -m population STATE_DIR ...`` runs it on its own; the ``joinstate`` command
carries the same command as ``joinstate bench populate``.  A thin layer over
:func:`population.populate`: it opens (or creates) a state store, declares the join,
loads both sides, prints the driver's report and optionally writes it as JSON.  Errors
are one line on stderr with exit status 2.

It lives here, not beside the other subcommands, because ``python -m population`` must
not reach up into the packages above this one.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pyarrow.parquet as pq

import joinstate
from population.driver import ORDERS, populate
from population.strategy import PRESETS

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["command", "main"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PROG = "python -m population"


def _cols(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def _inputs(left: str | None, right: str | None, left_key: str | None,
            right_key: str | None, left_unique: str | None, right_unique: str | None,
            synthetic: str | None, batch_rows: int
            ) -> tuple[Any, Any, joinstate.Side, joinstate.Side]:
    if synthetic:
        from population import synthetic as syn

        try:
            n_c, n_s = (int(x) for x in synthetic.split(","))
        except ValueError:
            raise joinstate.JoinStateError(
                f"--synthetic {synthetic!r} must be two integers, e.g. 100000,3000000"
            ) from None
        return (syn.customer_batches(n_c, batch_rows), syn.sales_batches(n_s, n_c, batch_rows),
                joinstate.Side(syn.CUSTOMER_SCHEMA, key=["c_customer_sk"],
                               unique_key=["c_customer_sk"]),
                joinstate.Side(syn.SALES_SCHEMA, key=["ss_customer_sk"]))
    given = {"left": left, "right": right, "left-key": left_key, "right-key": right_key}
    for flag, value in given.items():
        if not value:
            raise joinstate.JoinStateError(f"--{flag} is required unless --synthetic is given")
    assert left is not None and right is not None  # checked just above
    schemas = []
    for f in (left, right):
        try:
            schemas.append(pq.read_schema(f))
        except (OSError, ValueError) as exc:
            raise joinstate.JoinStateError(f"cannot read Parquet file {f!r}: {exc}") from exc
    ls = joinstate.Side(schemas[0], key=_cols(left_key) or [], unique_key=_cols(left_unique))
    rs = joinstate.Side(schemas[1], key=_cols(right_key) or [], unique_key=_cols(right_unique))
    return left, right, ls, rs


@click.command("populate", context_settings={"help_option_names": ["-h", "--help"],
                                             "max_content_width": 100},
               short_help="The population driver alone, on synthetic or Parquet data.")
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.option("--left", metavar="PATH", help="Parquet file of the left side.")
@click.option("--right", metavar="PATH", help="Parquet file of the right side.")
@click.option("--left-key", help="Left join key column(s), comma-separated.")
@click.option("--right-key", help="Right join key column(s), comma-separated.")
@click.option("--left-unique", help="Left unique key column(s), if any.")
@click.option("--right-unique", help="Right unique key column(s), if any.")
@click.option("--synthetic", metavar="CUSTOMERS,SALES",
              help="Synthetic customer (left) x store_sales (right) row counts, instead of "
              "--left/--right.")
@click.option("--join", "join_name", default="population", show_default=True,
              help="Join name.")
@click.option("--how", default="inner", show_default=True, help="Join type.")
@click.option("--strategy", type=click.Choice([*PRESETS, "auto"]), default="auto",
              show_default=True, help="Population strategy.")
@click.option("--order", type=click.Choice(ORDERS), default="small-first", show_default=True,
              help="Batch order.")
@click.option("--batch-rows", type=int, default=65_536, show_default=True,
              help="Rows per batch.")
@click.option("--write-buffer-mb", type=int, default=64, show_default=True,
              help="Memtable size, MiB.")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted population of the join (same inputs).")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the report as JSON here.")
@click.option("--no-progress", is_flag=True, help="Never draw a progress display.")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def command(state_dir: Path, left: str | None, right: str | None, left_key: str | None,
            right_key: str | None, left_unique: str | None, right_unique: str | None,
            synthetic: str | None, join_name: str, how: str, strategy: str, order: str,
            batch_rows: int, write_buffer_mb: int, resume: bool, json_path: Path | None,
            no_progress: bool, verbose: bool) -> int:
    """Populate one join from Parquet files or synthetic TPC-DS-shaped data; print the report.

    The population driver on its own (also 'python -m population'): the store is created
    if missing, the join declared, both sides loaded with the chosen strategy and order,
    the join switched to the live phase, and the driver's report printed (strategy and
    why, rows/s per side, bytes written, L0 files, stalls).  For Parquet directories,
    globs, the output change set and a progress display per side, use 'joinstate
    populate'.

    \b
    Examples:
      joinstate bench populate state/ --synthetic 100000,3000000 --strategy asymmetric
      python -m population state/ --left customer.parquet --left-key c_customer_sk \\
          --left-unique c_customer_sk --right store_sales.parquet \\
          --right-key ss_customer_sk --strategy auto
    """
    if verbose:  # the command, not the library, configures logging
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    lsrc, rsrc, ls, rs = _inputs(left, right, left_key, right_key, left_unique, right_unique,
                                 synthetic, batch_rows)
    options = joinstate.StoreOptions(write_buffer_size=write_buffer_mb << 20)
    with joinstate.StateStore(state_dir, options) as store:
        join = store.join(join_name, left=ls, right=rs, how=how)  # type: ignore[arg-type]
        if resume:
            report = populate(join, lsrc, rsrc, progress=not no_progress, resume=True)
        else:
            report = populate(join, lsrc, rsrc, strategy=strategy, order=order,
                              progress=not no_progress, batch_rows=batch_rows)
    click.echo(report.summary())
    if json_path is not None:
        json_path.write_text(report.to_json())
    return 0


def _one_line(text: str) -> str:
    return " ".join(_ANSI.sub("", str(text)).split())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m population``: run :data:`command`; returns the exit status.

    Errors are one line on stderr (``error: ...``) with exit status 2, as the
    ``joinstate`` command reports them.
    """
    try:
        rv = command.main(args=list(argv) if argv is not None else None, prog_name=PROG,
                          standalone_mode=False)
    except click.UsageError as exc:
        click.echo(f"error: {_one_line(exc.format_message())} (see '{PROG} --help')",
                   err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"error: {_one_line(exc.format_message())}", err=True)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("error: interrupted", err=True)
        return 130
    except joinstate.JoinStateError as exc:
        click.echo(f"error: {_one_line(str(exc))}", err=True)
        return 2
    return rv if isinstance(rv, int) else 0
