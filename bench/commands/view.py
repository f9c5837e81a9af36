"""``joinstate view``: a SQL view over Parquet data, kept up to date from the command line.

::

    joinstate view create STATE NAME --sql @view.sql --source NAME=PATH ... [--unique NAME=COLS]
    joinstate view apply STATE NAME SOURCE CHANGES.parquet [--commit-id ID] [--output OUT]
    joinstate view read STATE NAME [--output FILE.parquet|FILE.csv] [--limit N]
    joinstate view inspect STATE NAME [--json]
    joinstate view verify STATE NAME
    joinstate view list STATE

Library calls only: ``create`` compiles the SQL into a pipeline of the store
(:func:`planner.compile`) and loads every source it reads (:func:`population.populate`);
``apply`` pushes one change file into one source (``Pipeline.push``: one transaction,
exactly once with ``--commit-id``); ``read`` returns the maintained answer
(``Pipeline.read``, the final ORDER BY and LIMIT applied).

What the store keeps of a view.  :func:`planner.compile` keeps the SQL as written
beside the pipeline's definition, with each source's Arrow schema and unique key and the
row counts it was compiled with (:mod:`planner.views`); this command adds, as the
record's metadata, the path each source was loaded from and the final LIMIT.  That makes
the store self-contained: ``apply``, ``read``, ``inspect`` and ``verify`` need only the
state directory and the view's name (:func:`planner.reopen` compiles the recorded SQL
again, which the compiler checks against the stored definition: a mismatch is refused,
never pushed into).  The record lives and dies with the pipeline: ``joinstate drop``
removes both.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import pyarrow as pa

import joinstate
import planner
import population
from bench.commands.common import (
    CONTEXT,
    EXIT_OK,
    CliError,
    describe_progress,
    drop_hint,
    in_flags,
    one_line,
    open_dataset,
    progress_of,
    read_changes,
    require_existing,
    rich_console,
    single_store,
    write_parquet,
)
from bench.commands.plan import _source_specs, _sql_text, sample_of
from joinstate.changes import CHANGE_TYPE, to_changes
from joinstate.names import pipeline_spec_key, validate_name
from joinstate.schema import WEIGHT, weights_of
from planner.sql import SQLPlan
from planner.sql import plan as plan_sql
from population.sources import parquet_batches, parquet_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    import pyarrow.dataset as pads
    from rich.console import Console

__all__ = ["ViewRecord", "ViewSource", "view"]

STRATEGIES = ("auto", "symmetric", "asymmetric")
"""Population strategies of a pipeline (bulk SST ingestion needs writes that never read
state, and a view's pushes read its aggregates and indexes)."""

BATCH_ROWS = 200_000
"""Rows per push while populating (each push pays the fixed cost of every operator)."""

PREVIEW_ROWS = 10
"""Rows of a change set shown on the terminal after ``apply``."""


# ---- the record -------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewSource:
    """One source of a view as it was created: schema, unique key, path and row count."""

    name: str
    schema: pa.Schema
    unique_key: tuple[str, ...] | None
    path: str
    rows: int

    def columns(self) -> str:
        """``sk int64, ck int32, ...``."""
        return ", ".join(f"{f.name} {f.type}" for f in self.schema)


@dataclass(frozen=True)
class ViewRecord:
    """A view's SQL as written and its sources; :meth:`text` is what is compiled."""

    sql: str
    sources: tuple[ViewSource, ...]
    limit: int | None = None
    """The final LIMIT: the view's change sets are those of the whole answer, and the
    limit applies when it is read."""

    def metadata(self) -> dict[str, Any]:
        """What the command keeps in the planner's view record: paths and the LIMIT."""
        return {"paths": {s.name: s.path for s in self.sources}, "limit": self.limit}

    @classmethod
    def of(cls, record: planner.ViewRecord) -> ViewRecord | None:
        """The command's view of the planner's record; None if the command did not make it."""
        meta = record.metadata
        paths = meta.get("paths")
        if not isinstance(paths, dict) or not record.sources:
            return None
        sources = tuple(
            ViewSource(n, schema, uk, str(paths.get(n, "?")), int(record.rows.get(n, 0)))
            for n, (schema, uk) in record.sources.items())
        limit = meta.get("limit")
        return cls(record.sql, sources, limit if isinstance(limit, int) else None)

    def planner_sources(self) -> dict[str, planner.Source]:
        """What :func:`planner.compile` takes: name -> schema and unique key."""
        return {s.name: planner.Source(s.schema, unique_key=s.unique_key)
                for s in self.sources}

    def rows(self) -> dict[str, int]:
        """Row counts at creation (the statistics the view was compiled with)."""
        return {s.name: s.rows for s in self.sources}

    def same_sql(self, sql: str) -> bool:
        """Whether ``sql`` is this view's SQL, up to whitespace."""
        return sql.split() == self.sql.split()


def _quoted(sql: str, limit: int = 300) -> str:
    text = one_line(sql)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _recorded(store: joinstate.StateStore, name: str) -> ViewRecord | None:
    """The record of view ``name`` (None for a pipeline not created by this command)."""
    record = planner.stored_view(store, name)
    return None if record is None else ViewRecord.of(record)


def _views(store: joinstate.StateStore) -> tuple[list[str], list[str]]:
    """(views, other pipelines) of ``store``."""
    names = joinstate.inspect.stored_names(store)
    views = [n for n in names if _recorded(store, n) is not None]
    return views, [n for n in names if n not in views]


def _require_view(store: joinstate.StateStore, path: Path, name: str) -> ViewRecord:
    """The record of view ``name``, or an error saying what the store holds instead."""
    if store.meta_get(pipeline_spec_key(name)) is None:
        views, others = _views(store)
        extra = f"; pipelines made in Python: {', '.join(others)}" if others else ""
        joins = store.joins()
        if name in joins:
            raise CliError(f"{name!r} in {path} is a join, not a view; change it with "
                           f"'joinstate apply {path} {name} SIDE CHANGES.parquet'")
        raise CliError(f"no view {name!r} in {path} (views: {', '.join(views) or 'none'}"
                       f"{extra}); create one with 'joinstate view create'")
    record = _recorded(store, name)
    if record is None:
        raise CliError(
            f"pipeline {name!r} in {path} was not created by 'joinstate view create' (the "
            "store holds no record of its sources); push into it with 'joinstate apply "
            f"{path} {name} SOURCE CHANGES.parquet --pipeline module:function'")
    return record


def _attach(store: joinstate.StateStore, path: Path, name: str, record: ViewRecord
            ) -> joinstate.Pipeline:
    """View ``name`` compiled from its record, checked against the stored definition."""
    try:
        return planner.reopen(store, name)
    except (joinstate.JoinSpecMismatchError, planner.SQLError) as exc:
        raise CliError(
            f"view {name!r} in {path}: its recorded SQL no longer compiles to the definition "
            f"the store holds (was it created by another joinstate version?): "
            f"{one_line(str(exc))}; {drop_hint(path, name)} and create it again") from exc


def _markers(p: joinstate.Pipeline) -> dict[str, Any]:
    return {s: progress_of(m) for s in p.sources if (m := p.progress(s)) is not None}


def _require_live(p: joinstate.Pipeline, path: Path, what: str) -> None:
    """Refuse ``what`` on a view whose population has not finished."""
    if p.phase == "live":
        return
    markers = _markers(p)
    if markers:
        raise CliError(
            f"view {p.name!r} in {path} has a population in progress "
            f"({describe_progress(markers, list(markers))}); {what} once it is live: "
            "finish it with the same 'joinstate view create' command and --resume, or "
            f"{drop_hint(path, p.name)}")
    raise CliError(f"view {p.name!r} in {path} is not populated; run its 'joinstate view "
                   f"create' command again to load it, or {drop_hint(path, p.name)}")


# ---- sources --------------------------------------------------------------------------


def _valid_name(flag: str, name: str) -> None:
    """A view or table name the store accepts (it names column families and keys)."""
    try:
        validate_name("view", name)
    except joinstate.SchemaMismatchError:
        raise CliError(f"{flag}: a name is 1-128 letters, digits, '_' or '-'") from None


def _check_files(data: pads.Dataset, flag: str) -> None:
    """Every file of a source has the first file's column types (footers only).

    A dataset takes its schema from one file and casts the others while they are read;
    a file holding another type would fail halfway through a load, or be cast.
    """
    first: Any = None
    for fragment in data.get_fragments():
        try:
            physical = fragment.physical_schema
        except (OSError, pa.ArrowException) as exc:
            raise CliError(f"{flag}: cannot read the footer of {fragment.path}: "
                           f"{one_line(str(exc))}") from exc
        if first is None:
            first = fragment
        for field in physical:
            i = data.schema.get_field_index(field.name)
            if i >= 0 and data.schema.field(i).type != field.type:
                raise CliError(
                    f"{flag}: {fragment.path} has column {field.name!r} as {field.type}, "
                    f"{first.path} as {data.schema.field(i).type}; every file of a source "
                    "needs the same column types: rewrite the file, or leave it out")


def _open_sources(specs: Sequence[str], uniques: Sequence[str]
                  ) -> tuple[dict[str, pads.Dataset], dict[str, ViewSource]]:
    """``--source``/``--unique`` flags as datasets and record entries, checked."""
    paths, unique = _source_specs(specs, uniques)
    datasets: dict[str, pads.Dataset] = {}
    sources: dict[str, ViewSource] = {}
    for name, spec in paths.items():
        flag = f"--source {name}"
        _valid_name(f"{flag}={spec}", name)
        data = open_dataset(spec, flag)
        missing = [c for c in unique.get(name, []) if c not in data.schema.names]
        if missing:
            raise CliError(f"--unique {name}={','.join(unique[name])}: {missing} not among "
                           f"the columns of {flag} ({', '.join(data.schema.names)})")
        _check_files(data, flag)
        try:
            rows = parquet_rows(data, flag)
        except population.PopulationError as exc:
            raise CliError(str(exc)) from exc
        datasets[name] = data
        uk = unique.get(name)
        sources[name] = ViewSource(name, data.schema, tuple(uk) if uk else None, spec, rows)
    return datasets, sources


def _sql_terms() -> list[tuple[str, str]]:
    return [("pass it in `sources`", "give it with --source NAME=PATH"),
            ("Source(unique_key=", "--unique ("), ("stats[", "row counts[")]


def _compiled(sql: str, name: str, sources: Mapping[str, ViewSource]) -> SQLPlan:
    """``sql`` compiled without a store (the sources it reads ...): errors in flag terms."""
    try:
        return plan_sql(sql, {n: planner.Source(s.schema, unique_key=s.unique_key)
                                  for n, s in sources.items()},
                            name=name, stats={n: s.rows for n, s in sources.items()})
    except (planner.SQLError, joinstate.SchemaMismatchError) as exc:
        raise CliError("--sql: " + in_flags(str(exc), _sql_terms())) from exc


# ---- the group ------------------------------------------------------------------------


@click.group(context_settings=CONTEXT,
             short_help="SQL views over Parquet: create, apply changes, read, inspect.")
def view() -> None:
    """A SQL view over Parquet data, kept up to date as its tables change; no Python needed.

    create compiles the SQL (DuckDB's dialect) into a pipeline in STATE and loads every
    table it reads; apply pushes a change file (Parquet with _weight: +1 insert, -1
    delete; an update is a delete and an insert) into one table and prints how the view
    changed; read prints or writes what the view holds now.  The store keeps the SQL and
    the tables' schemas, so every command after create needs only STATE and NAME.

    \b
    Examples:
      joinstate view create state/ per_region --sql @per_region.sql \\
          --source sales='data/sales/*.parquet' --source customer=data/customer.parquet \\
          --unique customer=c_customer_sk
      joinstate view apply state/ per_region sales changes-0001.parquet --commit-id 0001
      joinstate view read state/ per_region                 a table on the terminal
      joinstate view read state/ per_region --output per_region.parquet
      joinstate view inspect state/ per_region              SQL, sources, state sizes
      joinstate view verify state/ per_region               exit 0 consistent, 1 corrupted
      joinstate drop state/ per_region --yes                delete it and all of its state
    """


# ---- create ---------------------------------------------------------------------------


def _population_terms(path: Path, name: str) -> list[tuple[str, str]]:
    """The population driver's API terms as this command's flags (longest first)."""
    drop = f"'joinstate drop {path} {name} --yes'"
    return [
        (f"or discard it with store.drop_pipeline({name!r}), define the pipeline again and "
         "populate it from scratch", f"or discard it with {drop} and create the view again"),
        (f"store.drop_pipeline({name!r})", drop),
        ("populate(..., resume=True)", "this command and --resume"),
        ("resume=True", "--resume"), ("batch_rows=", "--batch-rows "),
        ("batch_rows ", "--batch-rows "), ("strategy=", "--strategy "),
        ("these arguments", "these flags"), (f"pipeline {name!r}", f"view {name!r}"),
    ]


def _existing(store: joinstate.StateStore, path: Path, name: str, sql: str,
              sources: Mapping[str, ViewSource]) -> ViewRecord | None:
    """The record of a view ``name`` that ``create`` may continue; None if there is none.

    Another view (or pipeline, or join) under the name is refused, quoting its SQL; the
    same view is refused once live, and continued (its row counts reused, so it compiles
    to the stored definition) while its population is unfinished.
    """
    if name in store.joins():
        raise CliError(f"{name!r} in {path} is a join; choose another view NAME")
    if store.meta_get(pipeline_spec_key(name)) is None:
        return None
    record = _recorded(store, name)
    if record is None:
        raise CliError(f"{path} holds a pipeline {name!r} that was not created by "
                       f"'joinstate view create'; choose another view NAME, or "
                       f"{drop_hint(path, name)}")
    if not record.same_sql(sql):
        raise CliError(
            f"view {name!r} in {path} maintains other SQL; {drop_hint(path, name)} and create "
            f"it again, or choose another NAME. Its SQL: {_quoted(record.sql)}")
    for s in record.sources:
        new = sources.get(s.name)
        if new is None:
            raise CliError(f"view {name!r} in {path} reads {s.name!r}: give it with --source "
                           f"{s.name}=PATH (it was created from {s.path})")
        if not new.schema.equals(s.schema) or new.unique_key != s.unique_key:
            raise CliError(
                f"--source {s.name}: its columns ({new.columns()}"
                + (f"; unique {','.join(new.unique_key)}" if new.unique_key else "")
                + f") are not those view {name!r} was created with ({s.columns()}"
                + (f"; unique {','.join(s.unique_key)}" if s.unique_key else "")
                + f"); {drop_hint(path, name)} to create it from these files")
    facts = joinstate.inspect.describe(store, name)
    if facts["phase"] == "live":
        raise CliError(
            f"view {name!r} in {path} exists already and is live; change it with 'joinstate "
            f"view apply {path} {name} SOURCE CHANGES.parquet', read it with 'joinstate view "
            f"read {path} {name}', or {drop_hint(path, name)} to create it again")
    return record  # a population in progress: the driver refuses it, or resumes it


def _progress_bar(console: Console, show: bool, totals: Mapping[str, int]) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    width = max((len(n) for n in totals), default=6)
    bar = Progress(
        TextColumn(f"{{task.description:<{width}}}"), BarColumn(),
        TextColumn("{task.completed:>14,.0f} / {task.total:,.0f} rows"),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
        console=console, disable=not show, transient=False,
    )
    return bar


def _counted(batches: Iterator[pa.RecordBatch], step: Callable[[int], None]
             ) -> Iterator[pa.RecordBatch]:
    """``batches``, calling ``step`` with each one's rows once the driver asks for the next."""
    for batch in batches:
        yield batch
        step(batch.num_rows)


def _after_failure(store: joinstate.StateStore, path: Path, name: str, created: bool
                   ) -> tuple[bool, str]:
    """What a failed population left: (nothing kept?, what to say of it)."""
    try:
        if store.meta_get(pipeline_spec_key(name)) is None:
            return True, "nothing was loaded"
        facts = joinstate.inspect.describe(store, name)
        progress = facts["population_progress"]
        if not progress:
            if created:
                store.drop_pipeline(name)
                return True, f"nothing was loaded and view {name!r} was not kept"
            return False, "nothing was loaded"
    except (joinstate.JoinStateError, OSError) as exc:
        return False, f"what view {name!r} holds now could not be read ({one_line(str(exc))})"
    return False, (
        f"view {name!r} in {path} holds a partial population ("
        f"{describe_progress(progress, list(progress))}): rerun this command with --resume "
        "to continue it (the batches loaded are checked against the files; later ones may "
        f"be new, e.g. a corrected file), or {drop_hint(path, name)}")


@view.command(context_settings=CONTEXT,
              short_help="Compile a SQL view and load its tables from Parquet.")
@click.argument("state_dir", metavar="STATE", type=click.Path(path_type=Path))
@click.argument("name")
@click.option("--sql", required=True, metavar="SQL|@FILE",
              help="The view: a SELECT in DuckDB's dialect, or @FILE to read it from a file.")
@click.option("--source", "sources", multiple=True, required=True, metavar="NAME=PATH",
              help="A table the SQL reads: its name and its data, a Parquet file, a directory "
              "of them or a glob (repeatable).")
@click.option("--unique", "uniques", multiple=True, metavar="NAME=COL[,COL]",
              help="A table's unique key (no two rows share its values): lookups on it need "
              "less state (repeatable).")
@click.option("--strategy", default="auto", show_default=True,
              help=f"Population strategy: {', '.join(STRATEGIES)}.")
@click.option("--batch-rows", type=click.IntRange(min=1), default=None,
              help=f"Rows per pushed batch while loading (default {BATCH_ROWS:,}).")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted load of NAME (same SQL and sources).")
@click.option("--no-progress", is_flag=True, help="Never draw the progress display.")
def create(state_dir: Path, name: str, sql: str, sources: tuple[str, ...],
           uniques: tuple[str, ...], strategy: str, batch_rows: int | None, resume: bool,
           no_progress: bool) -> int:
    """Create view NAME in STATE from --sql over the --source tables, and load it.

    The SQL is compiled into a pipeline (joinstate plan --sql shows how) and every table
    it reads is loaded from its Parquet data, smallest first; the view is then live.
    Tables given but not read by the SQL are not loaded.  STATE is created if missing.
    Refused before anything is written: SQL outside what is maintained, an unknown table
    or column, files of one table with different column types.  A load that fails keeps
    nothing if nothing was loaded, else a partial load that --resume continues.

    \b
    Examples:
      joinstate view create state/ per_region --sql @per_region.sql \\
          --source sales=data/sales/ --source customer=data/customer.parquet \\
          --unique customer=c_customer_sk
      joinstate view create state/ big_orders \\
          --sql "SELECT o_id, o_amount FROM orders WHERE o_amount > 1000" \\
          --source orders='orders/*.parquet'
      joinstate view create state/ per_region ... --resume     # after an interruption
    """
    path = single_store(state_dir, "view create")
    _valid_name(f"NAME {name!r}", name)
    if strategy not in STRATEGIES:
        raise CliError(f"--strategy {strategy!r}: choose one of {', '.join(STRATEGIES)} (a "
                       "view's loads read its state, so it cannot be bulk-loaded)")
    text = _sql_text(sql)
    datasets, given = _open_sources(sources, uniques)
    compiled = _compiled(text, name, given)
    used = set(compiled.sources)
    err = rich_console(stderr=True)
    for n in given:
        if n not in used:
            err.print(f"note: the SQL does not read --source {n}; it is not loaded",
                      markup=False)
    fresh = ViewRecord(text, tuple(given[n] for n in given if n in used), compiled.limit)
    new_store = not path.exists()
    keep, opened = True, False
    terms = _population_terms(path, name)
    try:
        with joinstate.StateStore(path) as store:
            opened = True
            record = _existing(store, path, name, text, given) or fresh
            created = store.meta_get(pipeline_spec_key(name)) is None
            try:
                p = planner.compile(record.sql, record.planner_sources(), store=store,
                                    name=name, stats=_estimates(record, datasets),
                                    metadata=record.metadata())
            except (planner.SQLError, joinstate.JoinSpecMismatchError) as exc:
                keep = not new_store
                raise CliError("--sql: " + in_flags(str(exc), _sql_terms())) from exc
            try:
                report = _populate(p, datasets, record, strategy, batch_rows, resume,
                                   show=not no_progress and err.is_terminal, console=err)
            except population.PopulationInterruptedError as exc:
                raise CliError(in_flags(str(exc), terms)) from exc
            except (joinstate.JoinStateError, OSError, pa.ArrowException) as exc:
                empty, left = _after_failure(store, path, name, created)
                keep = not (new_store and empty)
                raise CliError(f"{in_flags(str(exc), terms)}; {left}"
                               + ("" if keep else f"; the new state directory {path} was "
                                  "removed")) from exc
            except BaseException:  # Ctrl-C, or an error of the command itself
                keep = not (new_store and _after_failure(store, path, name, created)[0])
                raise
            rows = p.read(name).num_rows
    except BaseException:
        if new_store and not opened:
            keep = False
        raise
    finally:
        if not keep and path.exists():
            shutil.rmtree(path)
    _print_created(report, name, path, rows)
    return EXIT_OK


def _estimates(record: ViewRecord, datasets: Mapping[str, pads.Dataset]
               ) -> dict[str, planner.SourceStats]:
    """Row counts and a sample of each source's files: the join order weighs its filters.

    A view created again (``--resume``) keeps the join order it was created with.  A
    file that cannot be sampled leaves that source without an estimate: the load names
    the damage when it reaches it.
    """
    return {n: planner.stats.given(n, rows).replace(
        sample=sample_of(datasets[n].files, n) if n in datasets else None)
        for n, rows in record.rows().items()}


def _populate(p: joinstate.Pipeline, datasets: Mapping[str, pads.Dataset],
              record: ViewRecord, strategy: str, batch_rows: int | None, resume: bool, *,
              show: bool, console: Console) -> Any:
    """Load every source of ``p`` from its dataset, with a bar per source on a terminal."""
    rows_per_batch = batch_rows or BATCH_ROWS
    if resume:  # cut the files as the interrupted run did, or their digests differ
        for s in p.sources:
            marker = progress_of(p.progress(s))
            if isinstance(marker, dict) and isinstance(marker.get("batch_rows"), int):
                rows_per_batch = marker["batch_rows"]
    totals = {s.name: s.rows for s in record.sources}
    bar = _progress_bar(console, show, totals)
    tasks = {n: bar.add_task(n, total=totals[n], rate="") for n in totals}
    started: dict[str, float] = {}
    loaded = dict.fromkeys(totals, 0)

    def stepper(name: str) -> Callable[[int], None]:
        def step(n: int) -> None:
            now = time.perf_counter()
            t0 = started.setdefault(name, now)
            loaded[name] += n
            rate = f"{loaded[name] / (now - t0):>12,.0f} rows/s" if now > t0 else ""
            bar.update(tasks[name], advance=n, rate=rate)
        return step

    def batches(name: str) -> Iterator[pa.RecordBatch]:
        started.setdefault(name, time.perf_counter())
        yield from _counted(parquet_batches(datasets[name], rows_per_batch,
                                            f"--source {name}"), stepper(name))

    with bar:
        return population.populate(
            p, sources={n: batches(n) for n in totals}, strategy=strategy,
            sizes=totals, batch_rows=batch_rows, resume=resume, progress=False)


def _print_created(report: Any, name: str, path: Path, rows: int) -> None:
    from rich.table import Table

    console = rich_console()
    t = Table(title=f"view {name}: loaded", title_justify="left")
    for col, justify in (("source", "left"), ("rows", "right"), ("pushes", "right"),
                         ("seconds", "right"), ("rows/s", "right")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for s in report.sources:
        t.add_row(s.name, f"{s.rows:,}", f"{s.batches:,}", f"{s.seconds:.2f}",
                  f"{s.rows_per_second:,.0f}")
    console.print(t)
    skipped = [f"{s.name} after {s.skipped_batches:,} batch"
               f"{'es' if s.skipped_batches != 1 else ''}"
               for s in report.sources if s.skipped_batches]
    if skipped:
        console.print(f"resumed: {', '.join(skipped)} loaded before (checked, not loaded "
                      "again)", markup=False, soft_wrap=True)
    console.print(f"strategy {report.strategy}; {report.rows:,} rows in "
                  f"{report.seconds:.2f} s; view {name} holds {rows:,} rows now",
                  markup=False, soft_wrap=True)
    console.print(f"read it: joinstate view read {path} {name}", markup=False,
                  soft_wrap=True)


# ---- apply ----------------------------------------------------------------------------


def _split(table: pa.Table, what: str) -> tuple[int, int]:
    """(inserted, deleted) copies of a weighted change set, weights checked first."""
    w = weights_of(table, what)
    return _exact_sum(w[w > 0]), -_exact_sum(w[w < 0])


def _exact_sum(values: np.ndarray) -> int:
    """The sum of int64 ``values`` as a Python int (an int64 sum could wrap)."""
    if float(np.abs(values.astype("float64")).sum()) < 2.0**62:
        return int(values.sum())
    return sum(values.tolist())


def _preview(table: pa.Table, console: Console, limit: int, total: int | None = None
             ) -> None:
    """The first ``limit`` rows of ``table`` as a rich table, and how many were left out."""
    from rich.table import Table

    t = Table(show_header=True, header_style="bold")
    for name in table.column_names:
        t.add_column(name, overflow="fold",
                     justify="right" if pa.types.is_integer(table.schema.field(name).type)
                     or pa.types.is_floating(table.schema.field(name).type)
                     or pa.types.is_decimal(table.schema.field(name).type) else "left")
    for row in table.slice(0, limit).to_pylist():
        t.add_row(*("NULL" if v is None else str(v) for v in row.values()))
    console.print(t)
    n = table.num_rows if total is None else total
    if n > limit:
        console.print(f"... {n - limit:,} more rows (of {n:,}; --output FILE writes them "
                      "all)", markup=False)
    else:
        console.print(f"{n:,} row{'s' if n != 1 else ''}", markup=False)


@view.command(context_settings=CONTEXT,
              short_help="Apply a change file to one table of a view.")
@click.argument("state_dir", metavar="STATE", type=click.Path(path_type=Path))
@click.argument("name")
@click.argument("source")
@click.argument("changes", metavar="CHANGES.parquet")
@click.option("--commit-id", help="Apply exactly once: a retry with the same id and change "
              "returns the recorded view changes and changes nothing.")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write how the view changed (a change set with _weight) to this Parquet file.")
@click.option("--cdf", is_flag=True, help=f"Write it as change rows with {CHANGE_TYPE} "
              f"(insert/delete) instead of {WEIGHT}.")
def apply(state_dir: Path, name: str, source: str, changes: str, commit_id: str | None,
          output: Path | None, cdf: bool) -> int:
    """Apply CHANGES to table SOURCE of view NAME; print (or write) how the view changed.

    CHANGES is Parquet (a file, a directory or a glob) with SOURCE's columns and an
    int64 _weight: +1 inserts a row, -1 deletes it, an update is both; without _weight
    every row is an insert; a _change_type column (insert/delete, as a change data feed
    has it) works too.  The change is atomic: a delete of a row the table does not hold
    (compared on every column) changes nothing and fails.

    \b
    Examples:
      joinstate view apply state/ per_region sales new-sales.parquet
      joinstate view apply state/ per_region customer 'cdc/0017/*.parquet' --commit-id 0017
      joinstate view apply state/ per_region sales changes.parquet --output view-changes.parquet
    """
    path = single_store(state_dir, "view apply")
    require_existing(path)
    if output is not None and output.is_dir():
        raise CliError(f"--output {output} is a directory; give a Parquet file name")
    with joinstate.StateStore(path) as store:
        record = _require_view(store, path, name)
        p = _attach(store, path, name, record)
        if source not in p.sources:
            raise CliError(f"view {name!r} has no table {source!r}; it reads "
                           f"{', '.join(p.sources)}")
        _require_live(p, path, "changes apply")
        delta = read_changes(changes)
        ins, dels = _split(delta, f"CHANGES {changes}")
        replay = commit_id is not None and p.committed(commit_id)
        err = rich_console(stderr=True)
        try:
            with err.status(f"applying {delta.num_rows:,} rows to {source} ...") \
                    if err.is_terminal else contextlib.nullcontext():
                outs = p.push(source, delta, commit_id=commit_id)
        except joinstate.StateCorruptedError:
            raise
        except joinstate.JoinStateError as exc:
            raise CliError(in_flags(str(exc), [
                ("commit_id=", "--commit-id "), ("commit id", "--commit-id"),
                (f"pipeline {name!r}", f"view {name!r}"),
                (f"source {source!r}", f"table {source!r} ({changes})")])) from exc
    out = outs[name]
    if output is not None:
        write_parquet(to_changes(out) if cdf else out, output)
    oi, od = _split(out, "the view's changes")
    verb = ("already applied (recorded view changes returned, nothing changed):" if replay
            else "applied")
    click.echo(f"{verb} {ins:,} inserted and {dels:,} deleted rows to {source}; view {name}: "
               f"{oi:,} rows inserted, {od:,} deleted"
               + (f" (of its whole answer: LIMIT {record.limit} applies when it is read)"
                  if record.limit is not None else "")
               + (f"; written to {output}" if output is not None else ""))
    if output is None and out.num_rows:
        _preview(to_changes(out) if cdf else out, rich_console(), PREVIEW_ROWS)
    return EXIT_OK


# ---- read -----------------------------------------------------------------------------

_FORMATS = (".parquet", ".csv")


@view.command(context_settings=CONTEXT, short_help="What a view holds now.")
@click.argument("state_dir", metavar="STATE", type=click.Path(path_type=Path))
@click.argument("name")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write every row to this file: .parquet or .csv.")
@click.option("--limit", type=int, default=20, show_default=True,
              help="Rows shown on the terminal (without --output).")
def read(state_dir: Path, name: str, output: Path | None, limit: int) -> int:
    """Print what view NAME holds now (its ORDER BY and LIMIT applied), or write it.

    Opens the store read-only: safe while another command changes the view (it reads
    the state as of its start).

    \b
    Examples:
      joinstate view read state/ per_region
      joinstate view read state/ per_region --limit 100
      joinstate view read state/ per_region --output per_region.parquet
      joinstate view read state/ per_region --output per_region.csv
    """
    if output is not None and output.suffix.lower() not in _FORMATS:
        raise CliError(f"--output {output}: give a file ending in .parquet or .csv")
    if limit < 1:
        raise CliError(f"--limit {limit}: give at least 1")
    path = single_store(state_dir, "view read")
    require_existing(path)
    with joinstate.StateStore(path, read_only=True) as store:
        record = _require_view(store, path, name)
        p = _attach(store, path, name, record)
        _require_live(p, path, "it can be read")
        err = rich_console(stderr=True)
        with err.status(f"reading view {name} ...") if err.is_terminal \
                else contextlib.nullcontext():
            table = p.read(name)
    if output is None:
        _preview(table, rich_console(), limit)
        return EXIT_OK
    if output.suffix.lower() == ".csv":
        import pyarrow.csv as pacsv

        output.parent.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(table, output)
    else:
        write_parquet(table, output)
    click.echo(f"view {name}: {table.num_rows:,} rows written to {output}")
    return EXIT_OK


# ---- inspect, verify, list ------------------------------------------------------------


def _describe(store: joinstate.StateStore, path: Path, name: str) -> dict[str, Any]:
    record = _require_view(store, path, name)
    p = _attach(store, path, name, record)
    facts = joinstate.inspect.describe(store, name)
    rows = p.read(name).num_rows if p.phase == "live" else None
    return {
        "name": name, "state_dir": str(path), "sql": record.sql.strip(),
        "sources": [{"name": s.name, "path": s.path, "unique_key": s.unique_key,
                     "rows_at_create": s.rows,
                     "columns": {f.name: str(f.type) for f in s.schema}}
                    for s in record.sources],
        "phase": facts["phase"], "rows": rows, "explain": p.explain(), "pipeline": facts,
    }


@view.command(context_settings=CONTEXT,
              short_help="A view's SQL, tables, state and progress (read-only).")
@click.argument("state_dir", metavar="STATE", type=click.Path(path_type=Path))
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--explain", is_flag=True, help="Also print the operators the SQL compiled to.")
def inspect(state_dir: Path, name: str, as_json: bool, explain: bool) -> int:
    """Show view NAME: its SQL, its tables, its rows, and per index and aggregate its state.

    Read-only: safe while another command changes the view.

    \b
    Examples:
      joinstate view inspect state/ per_region
      joinstate view inspect state/ per_region --json | jq .pipeline.indexes
    """
    path = single_store(state_dir, "view inspect")
    require_existing(path)
    with joinstate.StateStore(path, read_only=True) as store:
        facts = _describe(store, path, name)
    if as_json:
        click.echo(json.dumps(facts, indent=2, default=str))
        return EXIT_OK
    rows = "" if facts["rows"] is None else f": {facts['rows']:,} rows"
    click.echo(f"view {name} in {path} ({facts['phase']}){rows}")
    progress = facts["pipeline"]["population_progress"]
    if progress:
        click.echo(f"  population progress: {describe_progress(progress, list(progress))}")
    click.echo("SQL:")
    for line in facts["sql"].splitlines():
        click.echo(f"  {line}")
    click.echo("tables:")
    for s in facts["sources"]:
        unique = f", unique {','.join(s['unique_key'])}" if s["unique_key"] else ""
        click.echo(f"  {s['name']}: from {s['path']} ({s['rows_at_create']:,} rows at "
                   f"create{unique}); " + ", ".join(f"{c} {t}" for c, t in s["columns"].items()))
    click.echo(joinstate.inspect.summary_of(facts["pipeline"]))
    click.echo(f"  recorded commit ids: {facts['pipeline']['commit_ids']:,}")
    if explain:
        click.echo(facts["explain"])
    return EXIT_OK


@view.command(context_settings=CONTEXT,
              short_help="Read every block of a view's store, check its counters.")
@click.argument("state_dir", metavar="STATE", type=click.Path(path_type=Path))
@click.argument("name")
def verify(state_dir: Path, name: str) -> int:
    """Check view NAME: every block of STATE read, every counter of the view checked.

    Also checks that the recorded SQL still compiles to the stored definition.  Exit
    status 0 consistent, 1 corrupted, 2 any other error.  Read-only.

    \b
    Examples:
      joinstate view verify state/ per_region && echo consistent
    """
    path = single_store(state_dir, "view verify")
    require_existing(path)
    with joinstate.StateStore(path, read_only=True) as store:
        record = _require_view(store, path, name)
        _attach(store, path, name, record)
        result = store.verify()
    parts = result.get("pipelines", {}).get(name, {})
    ix, agg = parts.get("indexes", {}), parts.get("aggregates", {})
    rows = sum(c["rows"] + c["null_rows"] for c in ix.values())
    entries = sum(c["entries"] + c["null_entries"] for c in ix.values())
    records = parts.get("source_rows", {})
    click.echo(
        f"consistent: view {name}: {len(ix)} indexes ({rows:,} rows in {entries:,} entries), "
        f"{len(agg)} aggregates ({sum(a['groups'] for a in agg.values()):,} groups)"
        + (f", {len(records)} table row records" if records else "")
        + f"; its SQL compiles to the stored definition; every block of {path} read")
    return EXIT_OK


@view.command(name="list", context_settings=CONTEXT, short_help="The views of a store.")
@click.argument("state_dir", metavar="STATE", type=click.Path(path_type=Path))
def list_views(state_dir: Path) -> int:
    """List the views of STATE: name, phase, tables and SQL (read-only).

    \b
    Examples:
      joinstate view list state/
    """
    path = single_store(state_dir, "view list")
    require_existing(path)
    with joinstate.StateStore(path, read_only=True) as store:
        views, others = _views(store)
        lines = []
        for n in views:
            record = _recorded(store, n)
            assert record is not None
            facts = joinstate.inspect.describe(store, n)
            lines.append(f"{n} ({facts['phase']}; tables "
                         f"{', '.join(s.name for s in record.sources)}): "
                         f"{one_line(record.sql)}")
    for line in lines:
        click.echo(line)
    if not views:
        click.echo(f"no views in {path}")
    if others:
        click.echo(f"pipelines made in Python (not views): {', '.join(others)}")
    return EXIT_OK
