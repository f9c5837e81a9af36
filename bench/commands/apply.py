"""``joinstate apply``: push a change file into a join's side or a pipeline's source.

A join is pushed through :meth:`joinstate.Join.push`; a pipeline needs its Python
definition (``--pipeline module:function``), rebuilt on a fresh ``joinstate.Pipeline``
and checked against the definition the store holds before anything is pushed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

import joinstate
from bench.commands.common import (
    CONTEXT,
    EXIT_OK,
    SIDES,
    CliError,
    describe_progress,
    drop_hint,
    in_flags,
    one_line,
    progress_of,
    read_changes,
    require_existing,
    rich_console,
    single_store,
    write_parquet,
)
from joinstate.changes import CHANGE_TYPE, to_changes
from joinstate.names import pipeline_spec_key
from joinstate.schema import WEIGHT, weights_of

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import pyarrow as pa
    from rich.console import Console

    from joinstate.side import SideName

__all__ = ["apply"]


def _weight_split(table: pa.Table, what: str = "output") -> tuple[int, int]:
    """(inserted, deleted) copies of a weighted change set, exactly.

    The weights are checked first (``what`` names the change set in the message): a
    NULL or a type that does not fit int64 is an error naming the column and the remedy,
    never a numpy warning about a cast.
    """
    w = weights_of(table, what)
    return _exact_sum(w[w > 0]), -_exact_sum(w[w < 0])


def _exact_sum(values: np.ndarray) -> int:
    """The sum of int64 ``values`` as a Python int (an int64 sum could wrap)."""
    if float(abs(values.astype("float64")).sum()) < 2.0**62:
        return int(values.sum())
    return sum(values.tolist())


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


def _definition(spec: str) -> Callable[[], object]:
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
                       f"{type(exc).__name__}: {one_line(str(exc))}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise CliError(f"--pipeline {spec}: {module_name!r} has no {attr!r}; name the "
                           "function that returns the pipeline's graph (e.g. define_q4)")
        target = getattr(target, part)
    if not callable(target):
        raise CliError(f"--pipeline {spec}: {attr!r} is a {type(target).__name__}, not a "
                       "function returning a joinstate.Graph")
    return cast("Callable[[], object]", target)


def _attach_pipeline(store: joinstate.StateStore, name: str, spec: str) -> joinstate.Pipeline:
    """Pipeline ``name`` of ``store``: the graph the ``--pipeline`` function returns, attached.

    The function takes no argument and returns a :class:`joinstate.Graph` (a function
    that built the pipeline on a ``joinstate.Pipeline`` argument, as before the graph was
    its own object, is refused with that remedy).
    """
    define = _definition(spec)
    facts = joinstate.inspect.describe(store, name)
    share = facts.get("share_indexes")
    try:
        graph = define()
    except joinstate.JoinStateError as exc:
        raise CliError(f"--pipeline {spec}: the definition failed: {exc}") from exc
    except TypeError as exc:
        raise CliError(f"--pipeline {spec}: calling it with no argument raised TypeError: "
                       f"{one_line(str(exc))}; the function must take no argument and "
                       "return a joinstate.Graph") from exc
    except Exception as exc:
        raise CliError(f"--pipeline {spec}: the definition raised {type(exc).__name__}: "
                       f"{one_line(str(exc))}") from exc
    if not isinstance(graph, joinstate.Graph):
        raise CliError(f"--pipeline {spec} returned {type(graph).__name__}, not a "
                       "joinstate.Graph; the function must return the pipeline's graph "
                       "(joinstate.Graph().output(...))")
    p = joinstate.Pipeline(store, name, graph,
                           share_indexes=share if isinstance(share, bool | dict) else True)
    try:
        p.compile()
    except joinstate.JoinSpecMismatchError as exc:
        raise CliError(f"--pipeline {spec} does not define the pipeline stored in "
                       f"{store.path}: {exc}. Pass the function it was created with"
                       ) from exc
    return p


def _not_populating(path: Path, name: str, markers: dict[str, bytes | None]) -> None:
    """Refuse a change to a join or pipeline whose population has not finished.

    Its progress markers say which input batches are loaded; a change pushed in between
    belongs to no input batch, so the resumed population (state and outputs) would no
    longer be that of its inputs.
    """
    progress = {s: progress_of(m) for s, m in markers.items() if m is not None}
    if progress:
        loaded = describe_progress(progress, list(progress))
        raise CliError(
            f"{name!r} in {path} has a population in progress ({loaded}); changes apply "
            "once it is live: finish it ('joinstate populate ... --resume' for a join), or "
            f"{drop_hint(path, name)}")


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
            "its definition: add --pipeline module:function (the function that returns its "
            "joinstate.Graph, e.g. bench.q4:define_q4)")
    if pipeline is not None and not is_pipeline:
        joins = store.joins()
        if name in joins:
            raise CliError(f"{name!r} is a join, not a pipeline; drop --pipeline")
        pipelines = joinstate.inspect.stored_names(store)
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
            write_parquet(to_changes(table) if cdf else table, output / f"{o}.parquet")
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
        console = rich_console()
        for o, table in outs.items():
            if table.num_rows:
                console.print(f"output {o}:", markup=False)
                _preview(to_changes(table) if cdf else table, console)


@click.command(context_settings=CONTEXT,
               short_help="Push a change file into a join or pipeline; write the output.")
@click.argument("state_dir", type=click.Path(path_type=Path))
@click.argument("join_name", metavar="NAME")
@click.argument("side", metavar="SIDE|SOURCE")
@click.argument("changes", metavar="CHANGES.parquet")
@click.option("--pipeline", "pipeline", metavar="MODULE:FUNCTION",
              help="NAME is a pipeline: a function of no argument returning its "
              "joinstate.Graph (as it was created), e.g. bench.q4:define_q4 or "
              "defs.py:define.  Needed to push into a pipeline's source; the store keeps "
              "the definition only as JSON.")
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
    path = single_store(state_dir, "apply")
    require_existing(path)
    _check_output(output, pipeline is not None)
    with joinstate.StateStore(path) as store:
        _check_name(store, join_name, side, pipeline)
        delta = read_changes(changes)
        ins, dels = _weight_split(delta, f"CHANGES {changes}")
        try:
            if pipeline is not None:
                p = _attach_pipeline(store, join_name, pipeline)
                if side not in p.sources:
                    raise CliError(f"pipeline {join_name!r} has no source {side!r}; its "
                                   f"sources: {', '.join(p.sources)}")
                _not_populating(path, join_name, {s: p.progress(s) for s in p.sources})
                replay = commit_id is not None and p.committed(commit_id)
                outs = p.push(side, delta, commit_id=commit_id)
            else:
                join = store.join(join_name)
                _not_populating(path, join_name, {s: join.progress(s) for s in SIDES})
                replay = commit_id is not None and join.committed(commit_id)
                outs = {"": join.push(cast("SideName", side), delta, commit_id=commit_id)}
        except joinstate.StateCorruptedError:
            raise
        except joinstate.JoinStateError as exc:
            raise CliError(in_flags(str(exc), [("commit_id=", "--commit-id ")])) from exc
    if pipeline is not None:
        _report_pipeline_apply(join_name, side, ins, dels, outs, output, replay, cdf)
        return EXIT_OK
    out = outs[""]
    if output is not None:
        write_parquet(to_changes(out) if cdf else out, output)
    oi, od = _weight_split(out)
    verb = "already applied (recorded output returned, nothing changed):" if replay \
        else "applied"
    click.echo(
        f"{verb} {ins:,} inserted and {dels:,} deleted rows to the {side} side of join "
        f"{join_name}; output: {out.num_rows:,} rows ({oi:,} inserted, {od:,} deleted)"
        + (f", written to {output}" if output is not None else "")
    )
    if output is None and out.num_rows:
        _preview(to_changes(out) if cdf else out, rich_console())
    return EXIT_OK

