"""The ``joinstate`` command: inspect, verify, apply changes to and populate state stores.

A thin layer over library calls, for data engineers at a terminal::

    joinstate inspect STATE_DIR [--json]       every join and pipeline: phase, progress, sizes
    joinstate verify STATE_DIR                 read every block, check every counter
    joinstate apply STATE_DIR JOIN SIDE CHANGES.parquet [--output OUT.parquet]
    joinstate apply STATE_DIR PIPELINE SOURCE CHANGES.parquet --pipeline module:function
    joinstate populate STATE_DIR JOIN --left ... --right ... --left-key ... --right-key ...
    joinstate bench tpcds [--sf 0.01] [--spark] [--out DIR]   TPC-DS q4, report with charts

Errors are one line on stderr naming the problem and what to do, with exit status 2
(1 when the state is corrupted: ``verify``'s "inconsistent" answer, or when a benchmark's
answer differs from DuckDB's); ``--debug`` anywhere on the command line shows the
traceback instead.  ``inspect`` and ``verify`` open stores read-only: safe while a writer
runs.  A Spark state directory (one ``shard-NNNNN`` store per shard) is inspected and
verified shard by shard.  Pipelines are inspected from what the store holds (their
definition is stored as JSON); pushing into one needs its Python definition.

Layering: this module is part of the core package but imports ``population`` and
``bench`` only inside the commands that need them, and never imports pyspark.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import json
import logging
import os
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
from joinstate.names import commit_prefix, pipeline_spec_key
from joinstate.schema import WEIGHT
from joinstate.summary import human_bytes, side_facts

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import pyarrow.dataset as pads
    from rich.console import Console

    from joinstate.side import SideName

__all__ = ["EXIT_CHECK_FAILED", "EXIT_CORRUPTED", "EXIT_ERROR", "EXIT_OK", "cli", "main"]

EXIT_OK = 0
EXIT_CORRUPTED = 1
"""The state is inconsistent (``StateCorruptedError``)."""
EXIT_CHECK_FAILED = 1
"""A benchmark's answer differs from DuckDB's (``bench tpcds``; its report says where)."""
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
      joinstate inspect state/                  every join and pipeline in a store
      joinstate inspect state/ --json           the same, machine-readable
      joinstate verify state/                   exit 0 consistent, 1 corrupted, 2 error
      joinstate apply state/ sales right changes.parquet --output out.parquet
      joinstate apply state/ q4 store_sales changes.parquet --pipeline bench.q4:define_q4
      joinstate populate state/ sales --left customer/ --left-key c_customer_sk \\
          --right 'store_sales/*.parquet' --right-key ss_customer_sk --output out/
      joinstate bench tpcds --sf 0.01 --spark   TPC-DS q4 vs DuckDB, report with charts

    Errors are one line; exit status 2 (1 for corrupted state or a failed check).
    """


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``joinstate`` command; returns the exit status (the console script's entry)."""
    code: int = cli.main(args=argv, prog_name="joinstate", standalone_mode=False)
    return code


# ---- stores and inputs ---------------------------------------------------------------


def _shard_dirs(directory: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in directory.iterdir()
                  if p.is_dir() and (m := _SHARD.match(p.name)))


def _stores(state_dir: Path) -> list[tuple[int | None, Path]]:
    """``[(shard or None, store path)]``: the store itself, or every shard of a Spark dir.

    A ``spark_io.SparkJoin`` directory holds ``shard-NNNNN`` stores; a
    ``spark_io.SparkPipeline`` directory one such set per stage (``<stage>/shard-NNNNN``).
    """
    if state_dir.is_dir() and not (state_dir / "CURRENT").exists():
        shards = _shard_dirs(state_dir)
        if shards:
            return [(n, p) for n, p in shards]
        staged = [(n, p) for stage in sorted(state_dir.iterdir())
                  if stage.is_dir() and not stage.name.startswith(("_", "."))
                  for n, p in _shard_dirs(stage)]
        if staged:
            return [(n, p) for n, p in staged]
    return [(None, state_dir)]


def _stage(state_dir: Path, path: Path) -> str | None:
    """The SparkPipeline stage a shard store belongs to (None for other layouts)."""
    return path.parent.name if path.parent != state_dir and path != state_dir else None


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


def _describe_progress(progress: dict[str, Any], names: Sequence[str] = SIDES) -> str:
    """``left 3 batches, 300 rows; right nothing loaded`` (sides, or a pipeline's sources)."""
    parts = []
    for name in names:
        p = progress.get(name)
        if p is None:
            parts.append(f"{name} nothing loaded")
        elif isinstance(p, dict) and "batches" in p:
            parts.append(f"{name} {p['batches']} batches, {p.get('rows', 0):,} rows"
                         f"{', done' if p.get('done') else ''}")
        else:
            parts.append(f"{name} {p}")
    return "; ".join(parts)


def _inspect(path: Path) -> dict[str, list[dict[str, Any]]]:
    """``{"joins": [...], "pipelines": [...]}`` of one store, opened read-only."""
    with joinstate.StateStore(path, read_only=True) as store:
        joins = []
        for name in store.joins():
            join = store.join(name)
            stats = join.stats()
            joins.append({
                "name": name,
                "how": join.how,
                "phase": stats["phase"],
                "population_progress": {s: _progress(join.progress(s)) for s in SIDES},
                "commit_ids": len(store.meta_keys(commit_prefix(name))),
                "sides": {s: side_facts(stats[s]) for s in SIDES},
                "stats": stats,
                "summary": join.summary(stats),
            })
        pipelines = []
        for name in joinstate.Pipeline.stored_names(store):
            facts = joinstate.Pipeline.describe(store, name)
            facts["summary"] = joinstate.Pipeline.summary_of(facts)
            pipelines.append(facts)
        return {"joins": joins, "pipelines": pipelines}


@cli.command(context_settings=CONTEXT)
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(state_dir: Path, as_json: bool) -> int:
    """Show every join and pipeline in a state store (read-only: safe while a writer runs).

    Per join: type, phase, population progress, recorded commit ids; per side: layout,
    rows, entries, distinct keys, bytes, L0 files, auto-compaction.  Per pipeline (read
    from the store: no Python definition needed): phase, sources, outputs, population
    progress, recorded commit ids; per index and aggregate: rows, entries, bytes, L0
    files, auto-compaction.  A Spark state directory (subdirectories shard-NNNNN, or
    <stage>/shard-NNNNN for a SparkPipeline) lists every shard.

    \b
    Examples:
      joinstate inspect state/
      joinstate inspect spark-state/ --json | jq '.stores[].joins[].sides'
      joinstate inspect state/ --json | jq '.stores[].pipelines[].indexes'
    """
    stores: list[dict[str, Any]] = []
    for shard, path in _stores(state_dir):
        stores.append({"shard": shard, "path": str(path), "stage": _stage(state_dir, path),
                       **_inspect(path)})
    if as_json:
        click.echo(json.dumps({"state_dir": str(state_dir), "stores": stores}, indent=2,
                              default=str))
        return EXIT_OK
    for store in stores:
        where = store["path"] if store["shard"] is None else f"shard {store['shard']} " \
            f"({store['path']})"
        if store["stage"] is not None:
            where = f"stage {store['stage']} {where}"
        if len(stores) > 1 or not (store["joins"] or store["pipelines"]):
            click.echo(f"{where}: {len(store['joins'])} join(s), "
                       f"{len(store['pipelines'])} pipeline(s)")
        for j in store["joins"]:
            click.echo(j["summary"])
            progress = j["population_progress"]
            if any(v is not None for v in progress.values()):
                click.echo(f"  population progress: {_describe_progress(progress)}")
            click.echo(f"  recorded commit ids: {j['commit_ids']:,}")
        for p in store["pipelines"]:
            click.echo(p["summary"])
            if p["population_progress"]:
                names = [str(s["name"]) for s in p["sources"]]
                click.echo("  population progress: "
                           f"{_describe_progress(p['population_progress'], names)}")
            click.echo(f"  recorded commit ids: {p['commit_ids']:,}")
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


def _definition(spec: str) -> Callable[[joinstate.Pipeline], object]:
    """The function ``--pipeline`` names: ``package.module:function`` or ``file.py:function``.

    A module is imported with the current directory on ``sys.path`` (as ``python -m``
    does), so a definition next to the data engineer's scripts is found.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"--pipeline {spec!r}: give module:function (e.g. bench.q4:define_q4) "
                       "or path/to/file.py:function")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise CliError(f"--pipeline {spec}: {path} does not exist; give an existing "
                               "Python file, or module:function")
            loader = importlib.util.spec_from_file_location(f"_joinstate_def_{path.stem}",
                                                            path)
            if loader is None or loader.loader is None:
                raise CliError(f"--pipeline {spec}: cannot load {path} as Python")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except CliError:
        raise
    except ImportError as exc:
        raise CliError(f"--pipeline {spec}: cannot import {module_name!r} ({exc}); give a "
                       "module importable from the current directory, or file.py:function"
                       ) from exc
    except Exception as exc:
        raise CliError(f"--pipeline {spec}: importing {module_name!r} raised "
                       f"{type(exc).__name__}: {_one_line(str(exc))}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise CliError(f"--pipeline {spec}: {module_name!r} has no {attr!r}; name the "
                           "function that defines the pipeline (e.g. define_q4)")
        target = getattr(target, part)
    if not callable(target):
        raise CliError(f"--pipeline {spec}: {attr!r} is a {type(target).__name__}, not a "
                       "function taking a joinstate.Pipeline")
    return cast("Callable[[joinstate.Pipeline], object]", target)


def _attach_pipeline(store: joinstate.StateStore, name: str, spec: str) -> joinstate.Pipeline:
    """Pipeline ``name`` of ``store``, rebuilt by the ``--pipeline`` function and compiled."""
    define = _definition(spec)
    facts = joinstate.Pipeline.describe(store, name)
    p = joinstate.Pipeline(store, name, share_indexes=facts.get("share_indexes") is not False)
    try:
        define(p)
    except joinstate.JoinStateError as exc:
        raise CliError(f"--pipeline {spec}: the definition failed: {exc}") from exc
    except Exception as exc:
        raise CliError(f"--pipeline {spec}: the definition raised {type(exc).__name__}: "
                       f"{_one_line(str(exc))}") from exc
    try:
        p.compile()
    except joinstate.JoinSpecMismatchError as exc:
        raise CliError(f"--pipeline {spec} does not define the pipeline stored in "
                       f"{store.path}: {exc}. Pass the function it was created with"
                       ) from exc
    return p


def _check_output(output: Path | None, pipeline: bool) -> None:
    if output is None:
        return
    if pipeline and output.exists() and not output.is_dir():
        raise CliError(f"--output {output}: a pipeline writes one Parquet file per output "
                       "into a directory, and this is a file; give a directory")
    if not pipeline and output.is_dir():
        raise CliError(f"--output {output} is a directory; a join's output is one Parquet "
                       "file: give a file name")


def _check_name(store: joinstate.StateStore, name: str, side: str, pipeline: str | None
                ) -> None:
    """NAME must be a join (SIDE left/right) or, with ``--pipeline``, a pipeline."""
    is_pipeline = store.meta_get(pipeline_spec_key(name)) is not None
    if pipeline is None and is_pipeline:
        raise CliError(
            f"{name!r} is a pipeline in {store.path}; pushing into its source {side!r} needs "
            "its definition: add --pipeline module:function (the function that defines it "
            "on a joinstate.Pipeline, e.g. bench.q4:define_q4)")
    if pipeline is not None and not is_pipeline:
        joins = store.joins()
        if name in joins:
            raise CliError(f"{name!r} is a join, not a pipeline; drop --pipeline")
        pipelines = joinstate.Pipeline.stored_names(store)
        raise CliError(f"no pipeline {name!r} in {store.path} (pipelines: "
                       f"{', '.join(pipelines) or 'none'}; joins: {', '.join(joins) or 'none'})")
    if pipeline is None and side not in SIDES:
        raise CliError(f"SIDE {side!r}: a join has the sides left and right (for a "
                       "pipeline's source, add --pipeline module:function)")


def _report_pipeline_apply(name: str, source: str, ins: int, dels: int,
                           outs: dict[str, pa.Table], output: Path | None, replay: bool,
                           cdf: bool) -> None:
    """Write a pipeline push's outputs (``--output DIR``) and say what happened."""
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        for o, table in outs.items():
            _write_parquet(to_changes(table) if cdf else table, output / f"{o}.parquet")
    verb = "already applied (recorded outputs returned, nothing changed):" if replay \
        else "applied"
    described = []
    for o, table in outs.items():
        oi, od = _weight_split(table)
        described.append(f"{o} {table.num_rows:,} rows ({oi:,} inserted, {od:,} deleted)")
    click.echo(
        f"{verb} {ins:,} inserted and {dels:,} deleted rows to source {source} of pipeline "
        f"{name}; outputs: {'; '.join(described) or 'none'}"
        + (f"; written to {output}/<output>.parquet" if output is not None else "")
    )
    if output is None:
        console = _console()
        for o, table in outs.items():
            if table.num_rows:
                console.print(f"output {o}:", markup=False)
                _preview(to_changes(table) if cdf else table, console)


@cli.command(context_settings=CONTEXT)
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.argument("join_name", metavar="NAME")
@click.argument("side", metavar="SIDE|SOURCE")
@click.argument("changes", metavar="CHANGES.parquet")
@click.option("--pipeline", "pipeline", metavar="MODULE:FUNCTION",
              help="NAME is a pipeline: the function that defines it on a joinstate.Pipeline "
              "(as it was created), e.g. bench.q4:define_q4 or defs.py:define.  Needed to "
              "push into a pipeline's source; the store keeps the definition only as JSON.")
@click.option("--output", "-o", type=click.Path(path_type=Path),
              help="Write the output change set here (Parquet): a file for a join, a "
              "directory for a pipeline (one <output>.parquet per output).")
@click.option("--commit-id", help="Apply exactly once: a retry with the same id and "
              "change returns the recorded output and changes nothing.")
@click.option("--cdf", is_flag=True, help="Write the output as change rows with "
              f"{CHANGE_TYPE} (insert/delete) instead of {WEIGHT}.")
def apply(state_dir: Path, join_name: str, side: str, changes: str, pipeline: str | None,
          output: Path | None, commit_id: str | None, cdf: bool) -> int:
    """Push a change file into a join's side or a pipeline's source; write the output changes.

    NAME is a join (SIDE is left or right) or, with --pipeline, a pipeline (SOURCE is
    one of its sources).  CHANGES is Parquet (a file, a directory or a glob) with the
    side's or source's columns and an int64 _weight (+n inserts n copies, -n deletes
    them); without _weight every row is an insert; with a _change_type column
    (insert/delete, as a Delta change data feed has it) the rows are consolidated
    first.  The batch is atomic: a delete of a row that is not there changes nothing
    and fails.  A pipeline's push is one transaction over all its operators.

    \b
    Examples:
      joinstate apply state/ sales right changes.parquet --output out.parquet
      joinstate apply state/ sales left 'cdc/batch-0017/*.parquet' --commit-id batch-17
      joinstate apply state/ q4 store_sales new-sales.parquet \\
          --pipeline bench.q4:define_q4 --output q4-out/
      joinstate apply state/ per_customer orders orders.parquet --pipeline defs.py:define
    """
    path = _single_store(state_dir, "apply")
    _require_existing(path)
    _check_output(output, pipeline is not None)
    with joinstate.StateStore(path) as store:
        _check_name(store, join_name, side, pipeline)
        delta = _read_changes(changes)
        ins, dels = _weight_split(delta)
        if pipeline is not None:
            p = _attach_pipeline(store, join_name, pipeline)
            if side not in p.sources:
                raise CliError(f"pipeline {join_name!r} has no source {side!r}; its sources: "
                               f"{', '.join(p.sources)}")
            replay = commit_id is not None and p.committed(commit_id)
            outs = p.push(side, delta, commit_id=commit_id)
        else:
            join = store.join(join_name)
            replay = commit_id is not None and join.committed(commit_id)
            outs = {"": join.push(cast("SideName", side), delta, commit_id=commit_id)}
    if pipeline is not None:
        _report_pipeline_apply(join_name, side, ins, dels, outs, output, replay, cdf)
        return EXIT_OK
    out = outs[""]
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


# ---- bench ---------------------------------------------------------------------------


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
        if not sep or name not in paths or not _columns(cols):
            raise CliError(f"--unique {spec!r}: write it as NAME=COL[,COL] for a NAME given "
                           f"with --source (sources: {', '.join(paths) or 'none'})")
        unique[name] = _columns(cols) or []
    return paths, unique


@cli.command(context_settings=CONTEXT)
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
    import tempfile

    import planner

    if (sql is None) == (left is None and right is None):
        msg = ("give either --sql (a view) with its --source inputs, or --left and --right "
               "(one join) with their keys")
        raise CliError(msg)
    if sql is not None:
        paths, unique = _source_specs(sources, uniques)
        text = _sql_text(sql)
        schemas: dict[str, Any] = {}
        stats: dict[str, Any] = {}
        for name, path in paths.items():
            data = _dataset(path, f"--source {name}")
            schemas[name] = planner.Source(data.schema, unique_key=unique.get(name))
            stats[name] = planner.gather(data.files, name, unique_key=unique.get(name))
        with tempfile.TemporaryDirectory(prefix="joinstate-plan-") as tmp, \
                joinstate.StateStore(Path(tmp) / "plan") as store:
            try:
                p = planner.compile(text, schemas, store=store, name="view",
                                    stats={n: s.rows for n, s in stats.items()
                                           if s.rows is not None})
                p.compile()
            except planner.SQLError as exc:
                raise CliError(f"--sql: {_one_line(str(exc))}") from exc
            used = {n: s for n, s in stats.items() if n in p.sources}
            result = planner.plan_pipeline(p, used)
            pipeline_text = p.explain()
    else:
        if not (left and right and left_key and right_key):
            msg = "a join needs --left, --right, --left-key and --right-key"
            raise CliError(msg)
        lk, rk = _columns(left_key) or [], _columns(right_key) or []
        lstats = planner.gather(_dataset(left, "--left").files, "left", keys=[lk],
                                unique_key=_columns(left_unique))
        rstats = planner.gather(_dataset(right, "--right").files, "right", keys=[rk],
                                unique_key=_columns(right_unique))
        result = planner.plan_join(lstats, rstats, how=how, left_key=lk, right_key=rk)
        pipeline_text = ""
    console = _console()
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1, default=str))
        return EXIT_OK
    if pipeline_text:
        console.print(pipeline_text, markup=False, soft_wrap=True)
        console.print("")
    console.print(result.explain(), markup=False, soft_wrap=True)
    return EXIT_OK


@cli.group(context_settings=CONTEXT)
def bench() -> None:
    """Benchmarks that check their answers and write a report with charts.

    Needs the bench extra (DuckDB, matplotlib): pip install 'joinstate[bench]'; --spark
    also needs the spark extra and Java 17.

    \b
    Examples:
      joinstate bench tpcds                             SF0.01, in this process
      joinstate bench tpcds --sf 0.01 --spark --out report/
    """


def _floats(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{option} {text!r}: give numbers separated by commas, e.g. "
                       "0.0001,0.001,0.01") from None


@bench.command("tpcds", context_settings=CONTEXT)
@click.option("--sf", type=float, default=0.01, show_default=True,
              help="TPC-DS scale factor (generated once by DuckDB, cached as Parquet).")
@click.option("--strategies", default="symmetric,asymmetric,auto", show_default=True,
              help="Population strategies to compare, comma-separated (symmetric, "
              "asymmetric, auto), each into a fresh store.")
@click.option("--sizes", default="0.0001,0.001,0.01", show_default=True,
              help="Change-batch sizes as shares of all sales rows, comma-separated.")
@click.option("--spark/--no-spark", default=False, show_default=True,
              help="Also run q4 on local Spark (spark_io.SparkPipeline); needs Java 17.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Report directory  [default: bench-results/tpcds-sf<SF>]")
@click.option("--repeat", type=int, default=3, show_default=True,
              help="Change batches per size (medians are reported).")
@click.option("--shards", type=int, default=2, show_default=True,
              help="RocksDB shards per Spark stage (with --spark).")
@click.option("--spark-share", type=float, default=None,
              help="Spark's batch size (it runs one batch of each kind)  [default: the "
              "middle of --sizes]")
@click.option("--unshared/--no-unshared", default=True, show_default=True,
              help="Also run a pass with one index per operator input (shared vs unshared).")
@click.option("--chunk-rows", type=int, default=50_000, show_default=True,
              help="Rows per population push (the timeline has a sample per push).")
@click.option("--check", type=click.Choice(["each", "size", "end"]), default="each",
              show_default=True, help="Check against DuckDB after each batch kind, size, or "
              "only at the end (population is always checked).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False),
              help="Keep the RocksDB directories here (default: a temporary directory).")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              help="TPC-DS Parquet cache (default: $JOINSTATE_TPCDS_CACHE or "
              "~/.cache/joinstate/tpcds).")
def tpcds(sf: float, strategies: str, sizes: str, spark: bool, out: Path | None,
          repeat: int, shards: int, spark_share: float | None, unshared: bool,
          chunk_rows: int, check: str, seed: int, workdir: Path | None,
          cache_dir: Path | None) -> int:
    """TPC-DS query 4 kept live by a pipeline, every answer checked against DuckDB.

    Runs bench.q4: the q4 pipeline populated once per --strategies (samples of RocksDB
    over time), then, with shared indexes and without, --repeat change batches of each
    --sizes (new sales, deleted sales, customer updates, a date_dim correction), each
    checked against DuckDB computing q4 from scratch; with --spark, q4 on local Spark
    (bench.q4spark).  Writes report.json, report.md and PNG charts (population timelines,
    population time, change batches vs recompute, shared vs unshared) into --out and
    prints where.  Exit status 0 if every answer matched DuckDB, 1 if one differed (the
    report says where), 2 for a usage error.

    \b
    Examples:
      joinstate bench tpcds
      joinstate bench tpcds --sf 0.01 --spark --out bench-results/tpcds
      joinstate bench tpcds --sf 0.1 --strategies auto --sizes 0.001 --repeat 1
    """
    from bench import tpcds_cli  # lazily: the core does not depend on the bench layer

    strategy_list = [x.strip() for x in strategies.split(",") if x.strip()]
    size_list = _floats(sizes, "--sizes")
    out_dir = out if out is not None else Path("bench-results") / f"tpcds-sf{sf:g}"
    tpcds_cli.check_arguments(sf, strategy_list, size_list, repeat, spark, shards,
                              spark_share, chunk_rows, check)
    # Arrow's query engine prints a C++ warning per unaligned input buffer (tables
    # decoded from IPC); it changes nothing here, so keep the terminal readable.
    os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")
    err = _console(stderr=True)

    def say(line: str) -> None:
        err.print(f"[bold]joinstate bench tpcds[/bold]: {line}", soft_wrap=True)

    results, files = tpcds_cli.run_and_report(
        out_dir, sf=sf, strategies=strategy_list, sizes=size_list, spark=spark,
        repeat=repeat, shards=shards, spark_share=spark_share, unshared=unshared, seed=seed,
        chunk_rows=chunk_rows, check=check, workdir=workdir, cache_dir=cache_dir, say=say)
    from bench.report import check_counts, failures

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


if __name__ == "__main__":
    raise SystemExit(main())
