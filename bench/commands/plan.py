"""``joinstate plan``: the planner's decisions for a SQL view or one join, read-only.

Statistics come from Parquet footers and a small sample of the key columns; a SQL view
is compiled into a pipeline on a scratch store in a temporary directory, so nothing the
user owns is written.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import click
import pyarrow as pa

import joinstate
import planner
from bench.commands.common import (
    CONTEXT,
    EXIT_OK,
    CliError,
    in_flags,
    open_dataset,
    rich_console,
    split_columns,
)
from joinstate.join import How

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["plan"]


def sample_of(files: Sequence[str], name: str) -> pa.Table | None:
    """A sample of every column of ``files`` for the join order's estimates, or None.

    Estimates are optional: a file that cannot be read here is reported by whatever
    reads it for real.
    """
    try:
        return planner.stats.parquet_sample(files, name)
    except (planner.PlannerError, OSError, pa.ArrowException):
        return None


def _sql_text(sql: str) -> str:
    """``--sql``: the SQL itself, or ``@FILE`` to read it from a file."""
    if sql.startswith("@"):
        path = Path(sql[1:])
        try:
            return path.read_text()
        except OSError as exc:
            raise CliError(f"--sql {sql}: cannot read {path}: {exc.strerror or exc}") from exc
    return sql


def _source_specs(specs: Sequence[str], uniques: Sequence[str]
                  ) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``--source name=PATH`` and ``--unique name=col,col`` options, checked."""
    paths: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise CliError(f"--source {spec!r}: write it as NAME=PATH (a Parquet file, a "
                           "directory of them or a glob)")
        if name in paths:
            raise CliError(f"--source {name!r} is given twice")
        paths[name] = path
    unique: dict[str, list[str]] = {}
    for spec in uniques:
        name, sep, cols = spec.partition("=")
        if not sep or name not in paths or not split_columns(cols):
            raise CliError(f"--unique {spec!r}: write it as NAME=COL[,COL] for a NAME given "
                           f"with --source (sources: {', '.join(paths) or 'none'})")
        unique[name] = split_columns(cols) or []
    return paths, unique


@click.command(context_settings=CONTEXT,
               short_help="The planner's decisions for a SQL view or one join.")
@click.option("--sql", default=None, metavar="SQL|@FILE",
              help="A SQL view (DuckDB's dialect) to compile into a pipeline, or @FILE.")
@click.option("--source", "sources", multiple=True, metavar="NAME=PATH",
              help="An input of the view: its table name and Parquet data (repeatable).")
@click.option("--unique", "uniques", multiple=True, metavar="NAME=COLS",
              help="A source's unique key, comma-separated (repeatable).")
@click.option("--left", default=None, metavar="PATH", help="A join's left input (Parquet).")
@click.option("--right", default=None, metavar="PATH", help="A join's right input.")
@click.option("--left-key", default=None, help="Left join key column(s), comma-separated.")
@click.option("--right-key", default=None, help="Right join key column(s), comma-separated.")
@click.option("--left-unique", default=None, help="Left unique key column(s), if any.")
@click.option("--right-unique", default=None, help="Right unique key column(s), if any.")
@click.option("--how", type=click.Choice(get_args(How)), default="inner", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(sql: str | None, sources: tuple[str, ...], uniques: tuple[str, ...],
         left: str | None, right: str | None, left_key: str | None, right_key: str | None,
         left_unique: str | None, right_unique: str | None, how: str, as_json: bool) -> int:
    """Show the planner's decisions, each with the figure that drove it.

    \b
    For a SQL view over Parquet inputs (the pipeline it compiles to, then the plan):
      joinstate plan --sql @q.sql --source customer=data/customer.parquet \\
                     --source store_sales=data/store_sales/ --unique customer=c_customer_sk
    For one join:
      joinstate plan --left customers.parquet --right sales/ \\
                     --left-key c_customer_sk --right-key ss_customer_sk

    Statistics come from Parquet footers and a small sample of the key columns; nothing
    is loaded.  Read-only: a scratch store in a temporary directory holds the compiled
    pipeline's definition.
    """
    if (sql is None) == (left is None and right is None):
        msg = ("give either --sql (a view) with its --source inputs, or --left and --right "
               "(one join) with their keys")
        raise CliError(msg)
    if sql is not None:
        paths, unique = _source_specs(sources, uniques)
        text = _sql_text(sql)
        schemas: dict[str, Any] = {}
        stats: dict[str, Any] = {}
        files: dict[str, list[str]] = {}
        for name, path in paths.items():
            data = open_dataset(path, f"--source {name}")
            missing = [c for c in unique.get(name, []) if c not in data.schema.names]
            if missing:
                raise CliError(f"--unique {name}={','.join(unique[name])}: {missing} not among "
                               f"the columns of --source {name} ({data.schema.names})")
            schemas[name] = planner.Source(data.schema, unique_key=unique.get(name))
            stats[name] = planner.gather(data.files, name, unique_key=unique.get(name))
            files[name] = data.files
        with tempfile.TemporaryDirectory(prefix="joinstate-plan-") as tmp, \
                joinstate.StateStore(Path(tmp) / "plan") as store:
            try:
                # rows, and a sample of every column: the join order weighs the filters
                p = planner.compile(text, schemas, store=store, name="view", stats={
                    n: s.replace(sample=sample_of(files[n], n))
                    for n, s in stats.items()})
                p.compile()
            except planner.SQLError as exc:
                raise CliError("--sql: " + in_flags(str(exc), [
                    ("pass it in `sources`", "give it with --source NAME=PATH")])) from exc
            used = {n: s for n, s in stats.items() if n in p.sources}
            result = planner.plan_population(p, used)
            pipeline_text = p.explain()
    else:
        if not (left and right and left_key and right_key):
            msg = "a join needs --left, --right, --left-key and --right-key"
            raise CliError(msg)
        lk, rk = split_columns(left_key) or [], split_columns(right_key) or []
        lstats = planner.gather(open_dataset(left, "--left").files, "left", keys=[lk],
                                unique_key=split_columns(left_unique))
        rstats = planner.gather(open_dataset(right, "--right").files, "right", keys=[rk],
                                unique_key=split_columns(right_unique))
        result = planner.plan_join(lstats, rstats, how=how, left_key=lk, right_key=rk)
        pipeline_text = ""
    console = rich_console()
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1, default=str))
        return EXIT_OK
    if pipeline_text:
        console.print(pipeline_text, markup=False, soft_wrap=True)
        console.print("")
    console.print(result.explain(), markup=False, soft_wrap=True)
    return EXIT_OK

